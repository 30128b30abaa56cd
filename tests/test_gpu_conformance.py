"""Issue 14's two defects on CUDA: tensors autograd tracks reduce in place (Communicator
and the ``ringreduce`` backend, DDP with create_graph=True), and a failed operation's
Work raises from ``wait()`` once the watchdog has found it, ``is_success()`` False.

At the two-machine topologies of RINGREDUCE_GPU_TOPOLOGIES (default 2 x 1; tests/gpu.py
gives ranks that share a GPU host ids of their own and passes the machine count). Run with
``pytest -m gpu``; skipped without CUDA or nccl4py.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time

import pytest
import torch
import torch.distributed as dist

import ringreduce

from .conformance import backend_tracked_worker, create_graph_worker, tracked_worker
from .gpu import GPU_MARKS, KILLED_UNDER_MPS, gpu_env, topologies
from .multiproc import run_test_ranks

pytestmark = GPU_MARKS
TOPOLOGIES = [f"{m}x{d}" for m, d in topologies() if m == 2] or ["2x1"]
"""Two machines: the workers build ``Communicator(machines=2)``."""
DEADLINE = 10.0
SLACK = 15.0  # abort and NCCL teardown with ranks sharing one GPU


def one_gpu_env(topology: str, **extra: str) -> list[dict[str, str]]:
    machines, devices = (int(x) for x in topology.split("x"))
    return [{**e, "RINGREDUCE_MIN_BYTES": "0", **extra} for e in gpu_env(machines, devices)]


def _world(topology: str) -> int:
    machines, devices = (int(x) for x in topology.split("x"))
    return machines * devices


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_gpu_tensors_autograd_tracks_reduce_in_place(topology: str) -> None:
    run_test_ranks(tracked_worker, _world(topology), backend="nccl", env=one_gpu_env(topology))


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_gpu_backend_reduces_tracked_tensors_and_ddp_create_graph(topology: str) -> None:
    run_test_ranks(backend_tracked_worker, _world(topology), backend="ringreduce",
                   env=one_gpu_env(topology))
    run_test_ranks(create_graph_worker, _world(topology), backend="ringreduce",
                   env=one_gpu_env(topology))


def _failed_work_worker(rank: int, world: int) -> None:
    faulthandler.dump_traceback_later(DEADLINE + SLACK + 30, exit=True)
    dev = torch.device("cuda", torch.cuda.current_device())
    engine = dist.group.WORLD.communicator(dev)  # type: ignore[union-attr]
    t = torch.ones(1 << 20, device=dev)
    dist.all_reduce(t)
    engine.wait_idle()
    assert torch.equal(t, torch.full_like(t, float(world)))
    big = 64 << 20  # 256 MiB: in flight long after the kill
    if rank == world - 1:
        for _ in range(2):
            dist.all_reduce(torch.ones(big, device=dev), async_op=True)
        time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
    works: list[dist.Work] = []
    started = time.monotonic()
    with pytest.raises(ringreduce.RingReduceError, match=r"stage '\w+' failed.* peers"):
        # NCCL may already refuse to issue the second call (the peer is gone): then the
        # call itself raises, as the next call after a failure does (README, "When
        # things fail"; seen in run 34 of 2026-11-25-h100-issue-order)
        for _ in range(2):
            work = dist.all_reduce(torch.ones(big, device=dev), async_op=True)
            assert work is not None
            works.append(work)
        while time.monotonic() - started < DEADLINE + SLACK:
            for work in works:
                work.wait()  # a stream wait; raises once the watchdog found the failure
            time.sleep(0.05)
    if works:  # issued before the failure was known: its Work fails by the deadline
        while works[-1].exception() is None and time.monotonic() - started < DEADLINE + SLACK:
            time.sleep(0.05)
        assert not works[-1].is_success(), "a failed operation's Work must not report success"
        assert isinstance(works[-1].exception(), ringreduce.RingReduceError)
    with pytest.raises(ringreduce.RingReduceError, match="refuses new work"):
        dist.all_reduce(torch.ones(10, device=dev))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch's own NCCL teardown with a dead peer is not under test


@KILLED_UNDER_MPS
def test_gpu_backend_failed_work_raises_from_wait() -> None:
    env = one_gpu_env("2x1", RINGREDUCE_TIMEOUT=str(DEADLINE))
    run_test_ranks(_failed_work_worker, 2, backend="ringreduce", env=env, timeout=180,
                   expect_exit={1: -signal.SIGKILL})
