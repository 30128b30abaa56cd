"""Checks shared by the CPU (gloo) and GPU (NCCL) multi-process tests.

Inputs are small integers, so every sum, max, min and average is exact in every
dtype; the expected result is computed locally from every rank's input (no
communication), in float64/int64, and compared bit for bit (the inputs and the
reference: benchmarks/workloads/exact.py, which the soak uses too). Also a spy counting
the stage operations a communicator ran, and the "ringreduce" backend's collectives
other than its engine's.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist

import ringreduce
from benchmarks.workloads.exact import DTYPES, OPS, expected, rank_input
from ringreduce.integrations.backend import RingReduceGroup

__all__ = ["DTYPES", "OPS", "all_gather_single", "block_sweep", "check_equal",
           "count_stage_calls", "expected", "interleaved", "other_collectives", "rank_input",
           "reduce_scatter_single", "sizes_for", "sweep", "world_group"]


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


def count_stage_calls(comm: ringreduce.Communicator) -> dict[str, int]:
    """Spy on the real transport: count how often each stage operation ran."""
    counts: dict[str, int] = {}
    transport = comm._res.transport
    for name in ("reduce_scatter", "collect", "diffuse", "all_gather", "flat_all_reduce",
                 "exchange_signature"):
        real = getattr(transport, name)

        def counted(*a: object, _real=real, _name=name) -> None:
            counts[_name] = counts.get(_name, 0) + 1
            _real(*a)

        setattr(transport, name, counted)
    return counts


# The "ringreduce" backend (tests/test_cpu_backend.py; test_gpu.py runs other_collectives).
CPU = torch.device("cpu")


def world_group() -> RingReduceGroup:
    """The default group, a group of the "ringreduce" backend."""
    group = dist.group.WORLD
    assert isinstance(group, RingReduceGroup) and dist.get_backend() == "ringreduce"
    return group


# torch 2.13 names them *_single and warns on the old names, the only ones older torch has
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


def other_collectives(rank: int, world: int, rounds: int,
                      device: torch.device = CPU) -> None:
    """Every collective the group hands to the backend itself, with its result checked,
    ``rounds`` times. torch's own fallback for these deadlocked about one run in ten
    (gloo's worker waiting for the GIL while holding its queue lock, the caller holding
    the GIL and waiting for the lock), so a few hundred rounds would hang without the
    hand-off; the run's deadline turns a hang into a failure. The GPU backend test runs
    it on CUDA tensors (NCCL's side). Then one reduce_scatter_tensor and one
    all_gather_into_tensor: the engine's, and the only calls it got."""
    f32: dict[str, Any] = {"dtype": torch.float32, "device": device}
    engine_calls = {kind: e.op_number for kind, e in world_group()._engines.items()}
    for i in range(rounds):
        pieces = [torch.zeros(2, **f32) for _ in range(world)]
        dist.all_gather(pieces, torch.full((2,), float(rank + i), **f32))
        assert all(torch.equal(p, torch.full((2,), float(r + i), **f32))
                   for r, p in enumerate(pieces))
        b = torch.full((3,), float(rank), **f32)
        dist.broadcast(b, src=i % world)
        assert torch.equal(b, torch.full((3,), float(i % world), **f32))
        dist.barrier()
    exchanged = torch.zeros(world, **f32)
    dist.all_to_all_single(exchanged, torch.full((world,), float(rank), **f32))
    assert torch.equal(exchanged, torch.arange(world, **f32))
    peer = rank ^ 1
    got = torch.zeros(2, **f32)
    if rank % 2 == 0:
        dist.send(torch.full((2,), float(rank), **f32), peer)
        dist.recv(got, peer)
    else:
        dist.recv(got, peer)
        dist.send(torch.full((2,), float(rank), **f32), peer)
    assert torch.equal(got, torch.full((2,), float(peer), **f32))
    # None of them was the engine's.
    assert {kind: e.op_number for kind, e in world_group()._engines.items()} == engine_calls
    scattered = torch.zeros(2, **f32)
    reduce_scatter_single(scattered, torch.arange(world * 2, **f32))
    assert torch.equal(scattered, world * torch.arange(rank * 2, rank * 2 + 2, **f32))
    gathered = torch.zeros(world * 2, **f32)
    all_gather_single(gathered, torch.full((2,), float(rank), **f32))
    assert torch.equal(gathered, torch.arange(world, **f32).repeat_interleave(2))
    engine = world_group().communicator(device)
    assert engine.op_number == engine_calls.get(device.type, 0) + 2, engine.op_number
