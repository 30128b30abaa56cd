"""tests/jobs.py's training jobs (issue 49) on GPUs, over NCCL: two DDP models on one
int8 Communicator bit for bit against one Communicator each, DDP (across a bucket
rebuild) and FSDP2 resumed bit for bit, and the "ringreduce" backend exact under
RINGREDUCE_WIRE=int8, at SMALL (2 x 2 with two GPUs, else 2 x 1). Run with
``pytest -m gpu`` (benchmarks/gpu.sh jobs); skipped without CUDA or nccl4py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from . import jobs
from .gpu import GPUS, SMALL, gpu_env
from .multiproc import run_test_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("nccl") is None, reason="needs nccl4py"),
]
WORLD = SMALL[0] * SMALL[1]


def env(**extra: str) -> list[dict[str, str]]:
    return [{**e, "RINGREDUCE_MIN_BYTES": "0", **extra} for e in gpu_env(*SMALL)]


def test_gpu_two_ddp_models_on_one_communicator() -> None:
    run_test_ranks(jobs.two_models, WORLD, backend="nccl", env=env(), timeout=200)


def test_gpu_resumed_int8_ddp_run(tmp_path: Path) -> None:
    run_test_ranks(jobs.ddp_first_half, WORLD, str(tmp_path), backend="nccl", env=env(),
                   timeout=200)
    run_test_ranks(jobs.ddp_resume, WORLD, str(tmp_path), backend="nccl", env=env(),
                   timeout=200)


def test_gpu_resumed_int8_fsdp_run(tmp_path: Path) -> None:
    run_test_ranks(jobs.fsdp_job, WORLD, str(tmp_path), "first", backend="nccl", env=env(),
                   timeout=200)
    run_test_ranks(jobs.fsdp_job, WORLD, str(tmp_path), "resume", backend="nccl", env=env(),
                   timeout=200)


def test_gpu_backend_exact_under_ringreduce_wire() -> None:
    run_test_ranks(jobs.backend_is_exact, WORLD, backend="ringreduce",
                   env=env(RINGREDUCE_WIRE="int8"), timeout=200)
