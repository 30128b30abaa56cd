"""Checks shared by the CPU (gloo) and GPU (NCCL) multi-process tests.

Inputs are small integers, so every sum, max, min and average is exact in every
dtype; the expected result is computed locally from every rank's input (no
communication), in float64/int64, and compared bit for bit.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

import ringreduce
from ringreduce.benchmark.exact import DTYPES, OPS, expected, rank_input

__all__ = ["DTYPES", "OPS", "block_sweep", "check_equal", "expected", "interleaved",
           "rank_input", "sizes_for", "sweep"]


def check_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.equal(got.cpu(), want.cpu()):
        diff = (got.cpu().double() != want.cpu().double()).nonzero().flatten()
        first = diff[:5]
        raise AssertionError(f"{what}: {diff.numel()} wrong elements, first at {first.tolist()}: "
                             f"got {got.cpu()[first].tolist()}, want {want.cpu()[first].tolist()}")


def sweep(comm: ringreduce.Communicator, sizes: list[int], device: torch.device,
          dtypes: tuple[torch.dtype, ...] = DTYPES, ops: tuple[object, ...] = OPS) -> int:
    """Every (size, dtype, op), alternating sync and async; returns the call count."""
    rank, world = dist.get_rank(), dist.get_world_size()
    calls = 0
    for (n, dtype, op), use_async in zip(itertools.product(sizes, dtypes, ops),
                                         itertools.cycle((False, True))):
        t = rank_input(rank, n, dtype, device, salt=calls)
        fut = comm.all_reduce(t, op=op, async_op=use_async)
        if use_async:
            assert fut is not None and fut.wait() is t
        else:
            assert fut is None
        check_equal(t, expected(world, n, dtype, op, device, salt=calls),
                    f"n={n} {dtype} {op} async={use_async} on {comm.topology}")
        calls += 1
    return calls


def interleaved(comm: ringreduce.Communicator, sizes: list[int], device: torch.device) -> None:
    """Many outstanding async all-reduces of different sizes and dtypes, then wait."""
    rank, world = dist.get_rank(), dist.get_world_size()
    jobs = []
    for salt, (n, dtype) in enumerate(itertools.product(sizes, DTYPES)):
        t = rank_input(rank, n, dtype, device, salt)
        jobs.append((t, comm.all_reduce(t, async_op=True), n, dtype, salt))
    for t, fut, n, dtype, salt in jobs:
        fut.wait()
        check_equal(t, expected(world, n, dtype, dist.ReduceOp.SUM, device, salt),
                    f"interleaved n={n} {dtype}")


def sizes_for(devices: int, machines: int) -> list[int]:
    """0, 1, primes, sizes around the D*M padding boundary, and several slices."""
    g = devices * machines
    return sorted({0, 1, 2, 3, 5, 7, 13, g - 1, g, g + 1, 2 * g + 3, 97, 257})


def block_sweep(comm: ringreduce.Communicator, sizes: list[int], device: torch.device,
                dtypes: tuple[torch.dtype, ...] = DTYPES, ops: tuple[object, ...] = OPS) -> int:
    """reduce_scatter and all_gather at every (block size, dtype, op), alternating
    sync and async, against results computed locally; returns the call count."""
    rank, world = dist.get_rank(), dist.get_world_size()
    calls = 0
    for (n, dtype, op), use_async in zip(itertools.product(sizes, dtypes, ops),
                                         itertools.cycle((False, True))):
        out = torch.full((n,), 99, dtype=dtype, device=device)
        fut = comm.reduce_scatter(out, rank_input(rank, world * n, dtype, device, calls), op=op,
                                  async_op=use_async)
        assert (fut is not None and fut.wait() is out) if use_async else fut is None
        want = expected(world, world * n, dtype, op, device, calls)[rank * n:(rank + 1) * n]
        check_equal(out, want, f"reduce_scatter n={n} {dtype} {op} on {comm.topology}")
        calls += 1
        gathered = torch.full((world * n,), 99, dtype=dtype, device=device)
        fut = comm.all_gather(gathered, rank_input(rank, n, dtype, device, calls),
                              async_op=use_async)
        assert (fut is not None and fut.wait() is gathered) if use_async else fut is None
        want = torch.cat([rank_input(r, n, dtype, device, calls) for r in range(world)])
        check_equal(gathered, want, f"all_gather n={n} {dtype} on {comm.topology}")
        calls += 1
    return calls
