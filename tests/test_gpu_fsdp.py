"""GPU tests of ringreduce.fsdp: FSDP2 on NCCL with its reduce-scatter through ringreduce.

The CPU tests' cases (test_cpu_fsdp.py) on CUDA, at SMALL (2 x 2 with two GPUs, else
2 x 1, where the exact route is NCCL's own reduce-scatter: one device a machine has
nothing to reduce inside it): parameters and gradients bit-identical to plain FSDP2 on
NCCL after several steps (integer gradients, and N a power of two, so NCCL's AVG, a
multiplication by 1/N, is exact too), reshard_after_forward True and False, bf16
parameters reducing in fp32; a given Communicator; each quantized wire's error bound;
FSDP2 training with an int8 rail. Run with ``pytest -m gpu``; skipped without CUDA or
nccl4py.
"""

from __future__ import annotations

import importlib.util

import pytest

from .fsdp import worker
from .gpu import GPUS, SMALL, gpu_env
from .multiproc import run_test_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("nccl") is None, reason="needs nccl4py"),
]


def test_gpu_fsdp_matches_plain_fsdp() -> None:
    machines, devices = SMALL
    run_test_ranks(worker, machines * devices, machines,
                   ("exact", "given", "compressed", "training"), "cuda", backend="nccl",
                   env=gpu_env(machines, devices), timeout=300)
