"""Fault injection on the CPU path: dead and absent peers become errors, not hangs;
mismatched calls are caught before communicating (RINGREDUCE_DEBUG)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time

import pytest
import torch

import ringreduce

from .multiproc import run_ranks

DEADLINE = 4.0
SLACK = 8.0  # process scheduling on a 2-core CI machine with 4 ranks
STAGE_ERROR = (r"stage '(reduce_scatter|collect|diffuse|all_gather)' failed on rank \d "
               r"in operation #2 \(slice \d+, tensor of {n} x torch.float32\), peers")
BIG = 8 << 20  # 32 MiB: 8 slices, long enough on gloo that a kill lands mid-operation


def _survivor(rank: int, n: int = 100_000) -> None:
    comm = ringreduce.Communicator(machines=2, min_bytes=0)
    comm.all_reduce(torch.ones(10))  # everyone healthy first
    started = time.monotonic()
    with pytest.raises(ringreduce.RingReduceError, match=STAGE_ERROR.format(n=n)):
        comm.all_reduce(torch.ones(n))
    elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + SLACK, f"rank {rank} took {elapsed:.1f} s to notice"
    with pytest.raises(ringreduce.RingReduceError, match="refuses new work"):
        comm.all_reduce(torch.ones(10))


def _absent_worker(rank: int, world: int, folder: str) -> None:
    if rank == 3:
        ringreduce.Communicator(machines=2, min_bytes=0).all_reduce(torch.ones(10))
        time.sleep(DEADLINE + SLACK + 2)  # alive, but never makes the second call
        return
    _survivor(rank)
    with open(os.path.join(folder, f"flight-{rank}.json")) as f:
        dump = json.load(f)
    last = dump["operations"][-1]
    assert (last["op_number"], last["numel"], last["finished"]) == (2, 100_000, None), last
    assert dump["operations"][0]["finished"] is not None


def test_rank_that_never_calls_becomes_an_error() -> None:
    with tempfile.TemporaryDirectory() as folder:
        env = {"RINGREDUCE_TIMEOUT": str(DEADLINE),
               "RINGREDUCE_FLIGHT_FILE": os.path.join(folder, "flight-{rank}.json")}
        run_ranks(_absent_worker, 4, folder, env=env, timeout=120)


def _killed_worker(rank: int, world: int) -> None:
    if rank == 3:
        comm = ringreduce.Communicator(machines=2, min_bytes=0)
        comm.all_reduce(torch.ones(10))
        comm.all_reduce(torch.ones(BIG), async_op=True)
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)  # dies in the middle of the operation
    _survivor(rank, BIG)


def test_rank_killed_mid_operation_becomes_an_error() -> None:
    run_ranks(_killed_worker, 4, env={"RINGREDUCE_TIMEOUT": str(DEADLINE)}, timeout=120,
              expect_exit={3: -signal.SIGKILL})


def _mismatch_worker(rank: int, world: int) -> None:
    comm = ringreduce.Communicator(machines=2, min_bytes=0)
    n = 101 if rank == 1 else 100
    rule = (r"collective mismatch at operation #1: rank \d calls all_reduce\(numel=\d+, "
            r"dtype=torch.float32, op=sum\), rank \d calls all_reduce\(numel=\d+")
    with pytest.raises(ringreduce.RingReduceError, match=rule) as info:
        comm.all_reduce(torch.ones(n))
    assert "numel=101" in str(info.value) and "rank 1" in str(info.value)
    t = torch.ones(100)
    comm.all_reduce(t)  # nothing was communicated: still usable, still in step
    assert torch.equal(t, torch.full((100,), float(world)))
    comm.close()


def test_mismatched_calls_raise_on_every_rank() -> None:
    run_ranks(_mismatch_worker, 4, env={"RINGREDUCE_DEBUG": "1"}, timeout=120)
