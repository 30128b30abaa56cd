"""GPU fault injection: a peer that dies or never calls becomes a RingReduceError on the
survivor within the deadline (RINGREDUCE_TIMEOUT) plus slack, never a hang.

2 x 1: two virtual machines (NCCL_HOSTID vm0, vm1) of one GPU each, so collect and
diffuse cross NCCL's socket transport as between real machines; with one GPU both ranks
share GPU 0. The survivor learns of the failure from ``Communicator.wait_idle()``
(blocks until outstanding work is done, or raises the watchdog's RingReduceError) or
from its next ``all_reduce``. Run with ``pytest -m gpu``; skipped without CUDA or nccl4py.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import signal
import sys
import time

import pytest
import torch

import ringreduce

from .multiproc import run_ranks
from .test_gpu import _env

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("nccl") is None, reason="needs nccl4py"),
]

DEADLINE = 10.0
SLACK = 15.0  # abort, NCCL proxy teardown, two processes on one shared GPU
NUMEL = 64 << 20  # 256 MiB of float32: 64 slices, far longer in flight than the kill delay
OPS = 2  # if the victim's first operation beat its kill, the second one still hangs
STAGE_ERROR = r"stage '(collect|add|diffuse)' failed.* in operation #\d+"


def _env_with_deadline() -> list[dict[str, str]]:
    return [{**e, "RINGREDUCE_TIMEOUT": str(DEADLINE)} for e in _env(2, 1)]


def _healthy(dev: torch.device) -> ringreduce.Communicator:
    """A communicator whose rail connections exist: the fault must hit a running
    pipeline, not NCCL's connection setup. A survivor that hangs anyway prints every
    thread's stack (faulthandler) and exits, so the log shows where."""
    faulthandler.dump_traceback_later(DEADLINE + SLACK + 30, exit=True)
    comm = ringreduce.Communicator(min_bytes=0)
    assert (comm.topology.machines, comm.topology.devices_per_machine) == (2, 1)
    t = torch.ones(1 << 20, device=dev)
    comm.all_reduce(t)
    comm.wait_idle()
    torch.cuda.synchronize()
    assert torch.equal(t, torch.full_like(t, 2.0))
    return comm


def _survive(comm: ringreduce.Communicator, dev: torch.device) -> str:
    """Issue OPS large calls whose peer is gone; the error must come within the
    deadline plus slack, and the communicator must refuse work and close promptly."""
    started = time.monotonic()
    with pytest.raises(ringreduce.RingReduceError, match=STAGE_ERROR) as info:
        for _ in range(OPS):
            comm.all_reduce(torch.ones(NUMEL, device=dev))
        comm.wait_idle()
    elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + SLACK, f"took {elapsed:.1f} s to notice"
    message = str(info.value)
    assert str(NUMEL) in message, message  # names the tensor size
    with pytest.raises(ringreduce.RingReduceError, match="refuses new work"):
        comm.all_reduce(torch.ones(10, device=dev))
    closing = time.monotonic()
    comm.close()  # after an abort: no collective destroy waiting for a dead peer
    assert time.monotonic() - closing < SLACK
    return message


def _leave() -> None:
    """Exit the survivor without torch's own NCCL group teardown: with a dead peer that
    teardown is torch's business (and may wait for it), not what these tests measure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _killed_worker(rank: int, world: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    comm = _healthy(dev)
    if rank == 1:
        for _ in range(OPS):
            comm.all_reduce(torch.ones(NUMEL, device=dev), async_op=True)
        time.sleep(0.02)  # the survivor's calls are now in flight
        os.kill(os.getpid(), signal.SIGKILL)
    _survive(comm, dev)
    _leave()


def test_gpu_rank_killed_mid_operation_becomes_an_error() -> None:
    run_ranks(_killed_worker, 2, backend="nccl", env=_env_with_deadline(), timeout=180,
              expect_exit={1: -signal.SIGKILL})


def _absent_worker(rank: int, world: int, connected: bool) -> None:
    """Rank 1 stays alive but never makes the next call. ``connected``: after a healthy
    call; otherwise the survivor's first call must connect to its peer, and blocking NCCL
    communicators wait for that inside the call, on the host."""
    dev = torch.device("cuda", torch.cuda.current_device())
    if connected:
        comm = _healthy(dev)
    else:
        faulthandler.dump_traceback_later(DEADLINE + SLACK + 30, exit=True)
        comm = ringreduce.Communicator(min_bytes=0)
    if rank == 1:
        time.sleep(DEADLINE + SLACK + 5)
        sys.stdout.flush()
        sys.stderr.flush()
        # Its peer aborted the shared communicators; tearing down its own NCCL state is
        # not what this test measures.
        os._exit(0)
    started = time.monotonic()
    message = _survive(comm, dev)
    assert "RINGREDUCE_TIMEOUT" in message, message  # the deadline fired, not an error
    assert time.monotonic() - started >= DEADLINE - 1
    _leave()


def test_gpu_rank_that_never_calls_becomes_an_error() -> None:
    run_ranks(_absent_worker, 2, True, backend="nccl", env=_env_with_deadline(), timeout=180)


def test_gpu_rank_absent_at_connection_setup_becomes_an_error() -> None:
    run_ranks(_absent_worker, 2, False, backend="nccl", env=_env_with_deadline(), timeout=180)
