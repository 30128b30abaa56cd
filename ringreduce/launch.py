"""Moved to :mod:`ringreduce.benchmark.launch`; kept so older scripts still import it."""

from __future__ import annotations

from ringreduce.benchmark.launch import (
    Launch,
    default_nprocs,
    detect,
    free_port,
    init_method,
    nccl_variables,
    run_ranks,
)

__all__ = ["Launch", "default_nprocs", "detect", "free_port", "init_method", "nccl_variables",
           "run_ranks"]
