"""GPU tests of the 8- and 4-bit wires over real NCCL communicators (nccl4py).

The CPU tests' checks (test_cpu_compressed.py) on CUDA: error bounds per format against
an fp64 NCCL all-reduce, bit-identical results on every rank, inf/nan and zero blocks,
error feedback over repeated calls, and DDP with the hook. At SMALL (2 x 2 with two
GPUs, else 2 x 1), with larger tensors than on the CPU, and the native issuer (when
built) in front of the compressed route. Run with ``pytest -m gpu``; skipped without
CUDA or nccl4py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.distributed as dist

import ringreduce

from .compressed import SIZES, accuracy, feedback, hook_trains, non_finite
from .gpu import GPUS, SMALL, gpu_env
from .multiproc import run_test_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("nccl") is None, reason="needs nccl4py"),
]

GPU_SIZES = (*SIZES, 1_000_003, (1 << 22) + 5)
"""The CPU sizes, then sizes with many blocks per row and a padded tail."""


def _compressed_worker(rank: int, world: int, machines: int) -> None:
    # a plan given: no probe, so every call takes the wire (the probe may find exact
    # as fast: tests/test_gpu_probe.py)
    with ringreduce.Communicator(min_bytes=0, wire="int8", plan="one-slice",
                                 hook_feedback=True) as comm:
        assert comm.topology.machines == machines
        table = accuracy(comm, rank, world, GPU_SIZES)
        non_finite(comm, rank, world)
        feedback(comm, rank)
        t = torch.full((1 << 20,), float(rank), device="cuda")
        fut = comm.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
        assert fut is not None and fut.wait() is t
        # the mean of 0..world-1 on a block of equal values: one step of int8 at most
        torch.testing.assert_close(t, torch.full_like(t, (world - 1) / 2), rtol=1e-2, atol=0)
        hook_trains(comm, rank)
        comm.wait_idle()
    if rank == 0:
        print("\n".join(table))


def test_gpu_compressed_bounds_identity_feedback_and_hook() -> None:
    run_test_ranks(_compressed_worker, SMALL[0] * SMALL[1], SMALL[0], backend="nccl",
                   env=gpu_env(*SMALL), timeout=300)
