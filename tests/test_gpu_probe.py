"""GPU tests of the construction probe (execution/probe.py, plan/slicing.py): what it
chose is what describe() reports, and every call takes the route chosen for its size,
exact where the route is exact; with an 8-bit wire, the wire only where the probe found
it faster; two-level (the probe times it beside one slice) gives every other route's
results, bit for bit where they add alike. At 2 x 2 (two GPUs at least: one GPU a
machine takes no probe). Run with ``pytest -m gpu``; skipped without CUDA or nccl4py.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce.plan import slicing

from .cases import rank_input
from .gpu import GPU_MARKS, GPUS, gpu_env
from .multiproc import run_test_ranks
from .probe_spy import probed_as_training_issues

pytestmark = [*GPU_MARKS, pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (2 x 2)")]

MiB = 1 << 20
ROUTE_NAMES = {slicing.FLAT: "flat", slicing.ONE_SLICE: "one-slice",
               slicing.TWO_LEVEL: "two-level", slicing.PIPELINED: "hierarchical"}
"""The flight record's route (less the issuer, " (native)") of each plan."""
SIZES = (1 * MiB, 4 * MiB, 12 * MiB, 16 * MiB, 64 * MiB)
"""Below, at and between the probe's sizes, and above them."""


def _route(comm: ringreduce.Communicator) -> tuple[str, str]:
    record = comm._res.guard.recorder.last()
    assert record is not None
    return record.route.split(" (")[0], record.why


def _probed(comm: ringreduce.Communicator, lossy: bool) -> slicing.Choice:
    """The probe ran, as many calls as it says, on both sizes; describe() says its choice."""
    choice = comm._res.plan
    min_bytes = comm.config.min_bytes
    assert comm._res.probe_calls == slicing.probe_calls(min_bytes, lossy), comm._res.probe_calls
    sizes = slicing.probe_sizes(min_bytes)
    assert (choice.below is not None) == (len(sizes) == 2), choice
    for size, chosen in zip(sizes, (choice.at(s) for s in sizes), strict=True):
        assert chosen.plan in slicing.ROUTES, chosen
        assert f"probe at {size / MiB:g} MiB" in chosen.reason, chosen.reason
        assert ("wire" in chosen.reason) == lossy, chosen.reason
        assert lossy or chosen.wire
    assert choice.summary in comm.describe(), comm.describe()
    return choice


def _exact_worker(rank: int, world: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator() as comm:
        choice = _probed(comm, lossy=False)
        for nbytes in SIZES:
            for dtype in (torch.float32, torch.int32):
                t = rank_input(rank, nbytes // 4, dtype, dev)
                ref = t.clone()
                comm.all_reduce(t)
                dist.all_reduce(ref)
                route, why = _route(comm)
                if nbytes < comm.config.min_bytes:
                    assert route == "flat", (nbytes, route)
                    continue
                chosen = choice.at(nbytes)
                assert (route, why) == (ROUTE_NAMES[chosen.plan], chosen.why), (nbytes, route)
                assert torch.equal(t, ref), (nbytes, dtype, route)
        if rank == 0:
            print(comm.describe())


def test_gpu_calls_take_the_route_the_probe_chose() -> None:
    run_test_ranks(_exact_worker, 4, backend="nccl", env=gpu_env(2, 2), timeout=300)


def _wire_worker(rank: int, world: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(wire="int8") as comm:
        choice = _probed(comm, lossy=True)
        for nbytes in SIZES[1:]:
            chosen = choice.at(nbytes)
            t = rank_input(rank, nbytes // 4, torch.float32, dev)
            ref = t.clone()
            comm.all_reduce(t)
            dist.all_reduce(ref)
            route, why = _route(comm)
            assert why == chosen.why, (nbytes, why)
            if chosen.wire:
                assert route == "compressed int8", (nbytes, route)
                continue
            # exact was as fast: the float32 call is exact, on the exact route chosen
            assert route == ROUTE_NAMES[chosen.plan] and torch.equal(t, ref), (nbytes, route)
        # a call's own wire= takes the wire whatever the probe chose
        t = rank_input(rank, 4 * MiB, torch.float32, dev)
        comm.all_reduce(t, wire="int8")
        assert _route(comm)[0] == "compressed int8"
        if rank == 0:
            print(comm.describe())


def test_gpu_a_lossy_wire_is_taken_only_where_the_probe_found_it_faster() -> None:
    run_test_ranks(_wire_worker, 4, backend="nccl", env=gpu_env(2, 2), timeout=300)


def _timing_shape_worker(rank: int, world: int) -> None:
    """The probe's calls on CUDA have training's shape (probe_spy.py), with and without
    a wire, and its tensors are given back: nothing it made stays allocated."""
    for wire in (None, "int8"):
        with ringreduce.Communicator(wire=wire) as comm:
            before = torch.cuda.memory_allocated()
            probed_as_training_issues(comm)
            kept = torch.cuda.memory_allocated() - before
            assert kept < slicing.PROBE_BYTES, kept  # not one of its PROBE_ROUNDS tensors


def test_gpu_the_probe_times_calls_queued_as_training_issues_them() -> None:
    run_test_ranks(_timing_shape_worker, 4, backend="nccl", env=gpu_env(2, 2), timeout=300)


def _given_worker(rank: int, world: int) -> None:
    with ringreduce.Communicator(plan="pipelined", wire="int8") as comm:
        assert comm._res.probe_calls == 0
        assert comm._res.plan == slicing.given("pipelined") and comm._res.plan.wire
        dev = torch.device("cuda", torch.cuda.current_device())
        t = rank_input(rank, 4 * MiB, torch.int32, dev)
        comm.all_reduce(t)
        assert _route(comm)[0] == "hierarchical"


def test_gpu_a_given_plan_is_taken_without_a_probe() -> None:
    run_test_ranks(_given_worker, 4, backend="nccl", env=gpu_env(2, 2), timeout=300)


def _replicas_agree(t: torch.Tensor) -> None:
    """Every rank holds the same bits."""
    every = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(every, t)
    for other in every[1:]:
        assert torch.equal(every[0].view(torch.int32), other.view(torch.int32))


def _two_level_worker(rank: int, world: int) -> None:
    """plan='two-level' against one slice, the pipeline and NCCL, at a probe size, a
    DDP bucket and a size with a tail (n mod D): small integers in float32 and int32
    equal on every route (exact sums); random float32 bit for bit one slice's (the
    same collectives), every replica the same. Three calls of each, so that the native
    issuer's traced program is replayed (its first sight runs from Python)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    plans = (slicing.TWO_LEVEL, slicing.ONE_SLICE, slicing.PIPELINED)
    comms = {p: ringreduce.Communicator(plan=p) for p in plans}
    try:
        gen = torch.Generator(device=dev).manual_seed(rank)
        for numel in (4 * MiB // 4, 25 * MiB // 4, 25 * MiB // 4 + 1):
            for _ in range(3):
                for dtype in (torch.float32, torch.int32):
                    ref = rank_input(rank, numel, dtype, dev)
                    outs = {p: ref.clone() for p in plans}
                    for p, t in outs.items():
                        comms[p].all_reduce(t)
                        assert _route(comms[p])[0] == ROUTE_NAMES[p], (p, _route(comms[p]))
                    dist.all_reduce(ref)
                    for p, t in outs.items():
                        assert torch.equal(t, ref), (numel, dtype, p)
                x = torch.randn(numel, generator=gen, device=dev)
                for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                    two, one = x.clone(), x.clone()
                    comms[slicing.TWO_LEVEL].all_reduce(two, op=op)
                    comms[slicing.ONE_SLICE].all_reduce(one, op=op)
                    assert torch.equal(two.view(torch.int32), one.view(torch.int32)), numel
                    _replicas_agree(two)
        record = comms[slicing.TWO_LEVEL]._res.guard.recorder.last()
        assert record is not None and record.route.startswith("two-level"), record
        assert "plan=two-level" in comms[slicing.TWO_LEVEL].describe()
    finally:
        for comm in comms.values():
            comm.close()


def test_gpu_two_level_gives_the_other_routes_results() -> None:
    run_test_ranks(_two_level_worker, 4, backend="nccl", env=gpu_env(2, 2), timeout=300)
