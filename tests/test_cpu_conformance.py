"""What gloo and NCCL do, ringreduce does: tensors autograd tracks reduce in place, and a
failed operation raises from the call that asks for its result (issue 14's two defects,
found by PyTorch's own distributed tests). CPU, 4 ranks as 2 machines x 2, hierarchy forced.
The autograd workers (tests/conformance.py) run on CUDA too (tests/test_gpu_conformance.py).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

import ringreduce

from .conformance import backend_tracked_worker, create_graph_worker, tracked_worker
from .multiproc import run_test_ranks

HIERARCHY = {"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"}


def test_tensors_autograd_tracks_reduce_in_place() -> None:
    run_test_ranks(tracked_worker, 4)


def test_backend_reduces_tensors_autograd_tracks() -> None:
    run_test_ranks(backend_tracked_worker, 4, backend="ringreduce", env=HIERARCHY)


def test_ddp_create_graph_on_the_backend() -> None:
    run_test_ranks(create_graph_worker, 4, backend="ringreduce", env=HIERARCHY)


DEADLINE = 4.0
SLACK = 8.0  # 4 ranks on 2 cores
BIG = 8 << 20  # 32 MiB on gloo: the kill lands while the operation runs


def _failed_work_worker(rank: int, world: int, how: str) -> None:
    t = torch.ones(10)
    dist.all_reduce(t)  # healthy first
    if rank == 3:
        dist.all_reduce(torch.ones(BIG), async_op=True)
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(BIG)
    started = time.monotonic()
    with pytest.raises(ringreduce.RingReduceError, match=r"stage '\w+' failed .* peers"):
        if how == "sync":
            dist.all_reduce(t)
        elif how == "work":
            work = dist.all_reduce(t, async_op=True)
            assert work is not None
            try:
                work.wait()
            finally:
                assert work.is_completed() and not work.is_success(), "a failed work"
                assert isinstance(work.exception(), ringreduce.RingReduceError)
        else:
            work = dist.all_reduce(t, async_op=True)
            assert work is not None
            work.get_future().wait()
    assert time.monotonic() - started < DEADLINE + SLACK
    with pytest.raises(ringreduce.RingReduceError, match="refuses new work"):
        dist.all_reduce(torch.ones(10))


@pytest.mark.parametrize("how", ["sync", "work", "future"])
def test_a_failed_all_reduce_raises_from_the_call_that_asks(how: str) -> None:
    env = {**HIERARCHY, "RINGREDUCE_TIMEOUT": str(DEADLINE)}
    run_test_ranks(_failed_work_worker, 4, how, backend="ringreduce", env=env, timeout=120,
                   expect_exit={3: -signal.SIGKILL})
