"""Soak (CPU version for CI): hundreds of random all-reduces, each checked exactly.

Every rank draws the same sequence from a shared seed: sizes from 1 element to ~80 KB,
every dtype and op, sync and async interleaved with several calls outstanding. Staging
memory is allocated once and must never grow or move.
"""

from __future__ import annotations

import random

import pytest
import torch

import ringreduce

from .cases import DTYPES, OPS, check_equal, expected, rank_input
from .multiproc import run_test_ranks

CALLS = 300


def _soak_worker(rank: int, world: int) -> None:
    rng = random.Random(2026)
    cpu = torch.device("cpu")
    budget = 64 * 1024
    with ringreduce.Communicator(machines=2, min_bytes=0, slice_bytes=4096,
                                 staging_bytes=budget) as comm:
        buffers = comm._res.buffers
        staging = (buffers.staging_bytes.data_ptr(), buffers.staging_bytes.numel())
        assert staging[1] <= budget, staging
        pending: list[tuple[torch.Tensor, object, int, torch.dtype, object, int]] = []
        for call in range(CALLS):
            n = rng.choice([1, 2, 3, 5, rng.randint(1, 20_000)])
            dtype, op = rng.choice(DTYPES), rng.choice(OPS)
            t = rank_input(rank, n, dtype, cpu, salt=call)
            fut = comm.all_reduce(t, op=op, async_op=rng.random() < 0.5)
            pending.append((t, fut, n, dtype, op, call))
            if len(pending) > rng.randint(0, 6):  # drain a few outstanding calls now and then
                for done in pending:
                    _settle(done, world)
                pending = []
        for done in pending:
            _settle(done, world)
        assert (buffers.staging_bytes.data_ptr(), buffers.staging_bytes.numel()) == staging
        assert comm.op_number == CALLS


def _settle(done: tuple, world: int) -> None:  # type: ignore[type-arg]
    t, fut, n, dtype, op, call = done
    if fut is not None:
        fut.wait()
    check_equal(t, expected(world, n, dtype, op, torch.device("cpu"), salt=call),
                f"soak call {call}: n={n} {dtype} {op}")


@pytest.mark.slow
def test_soak_random_calls_all_exact() -> None:
    run_test_ranks(_soak_worker, 4)
