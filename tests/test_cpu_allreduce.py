"""CPU multi-process tests: the real pipeline over gloo sub-groups, bit-exact."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce.plan import slicing

from .cases import count_stage_calls, interleaved, sizes_for, sweep
from .multiproc import run_test_ranks
from .probe_spy import probed_as_training_issues

CPU = torch.device("cpu")
TOPOLOGIES = [(2, 2), (1, 4), (4, 1), (3, 2), (2, 3)]  # (machines, devices per machine)
SIX_RANKS = {(3, 2), (2, 3)}
"""The full run's topologies (slow): the quick run's 2 x 2, 1 x 4 and 4 x 1 take every
route, dtype and op; these add three machines and three devices per machine."""


def _topologies(topologies: list[tuple[int, int]]) -> list[Any]:
    return [pytest.param(m, d, id=f"{m}x{d}",
                         marks=[pytest.mark.slow] if (m, d) in SIX_RANKS else [])
            for m, d in topologies]


def _sweep_worker(rank: int, world: int, machines: int) -> None:
    devices = world // machines
    # 256-byte slices: up to 8 slices at these sizes, with a tail on the last one.
    with ringreduce.Communicator(machines=machines, min_bytes=0, slice_bytes=256) as comm:
        topo = comm.topology
        assert (topo.machines, topo.devices_per_machine) == (machines, devices)
        assert topo.machine_index == rank // devices and topo.device_index == rank % devices
        counts = count_stage_calls(comm)
        assert sweep(comm, sizes_for(devices, machines), CPU) > 0
        interleaved(comm, [1, 33, 250], CPU)
    if machines > 1:
        assert counts.get("flat_all_reduce", 0) == 0, counts
        assert counts["collect"] == counts["diffuse"] > 0, counts
        assert counts["exchange_signature"] > 0, counts  # the end-of-call check ran
    else:
        assert set(counts) == {"flat_all_reduce"}, counts
    if devices > 1 and machines > 1:
        assert counts["reduce_scatter"] == counts["all_gather"] == counts["collect"], counts
    else:
        assert "reduce_scatter" not in counts and "all_gather" not in counts, counts


@pytest.mark.parametrize("machines,devices", _topologies(TOPOLOGIES))
def test_every_size_dtype_op_is_exact(machines: int, devices: int) -> None:
    run_test_ranks(_sweep_worker, machines * devices, machines)


ONE_SLICE_TOPOLOGIES = [(2, 2), (3, 2), (2, 3), (4, 1)]


def _spy_calls(comm: ringreduce.Communicator) -> list[str]:
    """The transport's stage calls of ``comm`` from now on, in order, as
    "method:communicator"."""
    transport = comm._res.transport
    calls: list[str] = []
    for name in ("reduce_scatter_into", "all_reduce_on", "all_gather_into",
                 "exchange_signature", "collect", "diffuse"):
        real = getattr(transport, name)

        def spied(comm_name: str, *a: object, _real=real, _name=name) -> None:
            calls.append(f"{_name}:{comm_name}")
            _real(comm_name, *a)

        setattr(transport, name, spied)
    return calls


def _unsliced_calls(devices: int, apart: bool) -> list[str]:
    """One call's stage calls under one slice, or two-level (``apart``: the end-of-call
    check after the all-gather, not in the rail's and the all-gather's groups)."""
    inside = ["reduce_scatter_into:reduce_scatter"] if devices > 1 else []
    tail = ["all_reduce_on:world"] if devices > 1 else []
    gather = ["all_gather_into:all_gather"] if devices > 1 else []
    machine_check = ["exchange_signature:all_gather"] if devices > 1 else []
    if apart:
        return [*inside, "all_reduce_on:collect", *tail, *gather,
                "exchange_signature:collect", *machine_check]
    return [*inside, "all_reduce_on:collect", *tail, "exchange_signature:collect",
            *gather, *machine_check]


def _one_slice_worker(rank: int, world: int, machines: int) -> None:
    """plan='one-slice': three collectives a call (a tail of n mod D elements rides the
    rail's group as a world all-reduce), every size, dtype and op exact, the
    end-of-call check on both hops, the plan named in the flight record."""
    devices = world // machines
    with ringreduce.Communicator(machines=machines, min_bytes=0, plan="one-slice") as comm:
        assert comm._res.plan.one_slice and "plan=one-slice" in comm.describe()
        calls = _spy_calls(comm)
        n = 5 * devices + (1 if devices > 1 else 0)  # a tail when D > 1
        assert sweep(comm, [n], CPU, dtypes=(torch.float32,), ops=(dist.ReduceOp.SUM,)) == 1
        assert calls == _unsliced_calls(devices, apart=False), calls
        last = comm._res.guard.recorder.last()
        assert last is not None and last.route == "one-slice" and "plan=" in last.why
        assert sweep(comm, sizes_for(devices, machines), CPU) > 0
        interleaved(comm, [1, 33, 250], CPU)


def _two_level_worker(rank: int, world: int, machines: int) -> None:
    """The probe's timings with two-level the fastest: two-level is chosen and every
    call of a hierarchical size takes it (flight record, describe()), issuing the three
    collectives with the end-of-call check after them; every size, dtype and op exact,
    and float32 sums bit for bit those of one slice (the same collectives)."""
    devices = world // machines
    timings = [slicing.Timing(nbytes, {slicing.FLAT: (3.0 * nbytes,),
                                       slicing.ONE_SLICE: (1.05 * nbytes,),
                                       slicing.TWO_LEVEL: (1.0 * nbytes,),
                                       slicing.PIPELINED: (1.1 * nbytes,)})
               for nbytes in (4 << 20, 16 << 20)]
    chosen = slicing.choose(timings)
    assert chosen.at(1).two_level and chosen.at(1 << 30).two_level, chosen
    with ringreduce.Communicator(machines=machines, min_bytes=0) as comm, \
            ringreduce.Communicator(machines=machines, min_bytes=0, plan="one-slice") as one:
        comm._res.plan = chosen  # what probe.compare leaves, from these timings
        assert "two-level is the fastest, by 5.0% over one-slice" in comm.describe()
        calls = _spy_calls(comm)
        n = 5 * devices + (1 if devices > 1 else 0)  # a tail when D > 1
        assert sweep(comm, [n], CPU, dtypes=(torch.float32,), ops=(dist.ReduceOp.SUM,)) == 1
        assert calls == _unsliced_calls(devices, apart=True), calls
        last = comm._res.guard.recorder.last()
        assert last is not None and last.route == slicing.TWO_LEVEL, last
        assert last.why == chosen.at(n * 4).why
        assert sweep(comm, sizes_for(devices, machines), CPU) > 0
        interleaved(comm, [1, 33, 250], CPU)
        gen = torch.Generator().manual_seed(rank)
        for numel in (1, devices * 1000, devices * 1000 + 1):
            x = torch.randn(numel, generator=gen)
            mine, theirs = x.clone(), x.clone()
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                comm.all_reduce(mine, op=op)
                one.all_reduce(theirs, op=op)
                assert torch.equal(mine.view(torch.int32), theirs.view(torch.int32)), numel


@pytest.mark.parametrize("machines,devices", _topologies(ONE_SLICE_TOPOLOGIES))
def test_one_slice_plan_is_exact(machines: int, devices: int) -> None:
    run_test_ranks(_one_slice_worker, machines * devices, machines)


@pytest.mark.parametrize("machines,devices", _topologies([(2, 2), (2, 3)]))
def test_two_level_is_taken_where_the_probe_found_it_fastest_and_is_exact(
        machines: int, devices: int) -> None:
    run_test_ranks(_two_level_worker, machines * devices, machines)


def _diffuse_p2p_worker(rank: int, world: int) -> None:
    """Diffuse as a send and a receive per other machine (the internal
    diffuse_gather=False), with two other machines: the same results as the all-gather."""
    with ringreduce.Communicator(machines=3, min_bytes=0, slice_bytes=256,
                                 diffuse_gather=False) as comm:
        assert comm.config.diffuse_gather is False and "diffuse_gather=0" in comm.describe()
        assert sweep(comm, sizes_for(2, 3), CPU, dtypes=(torch.float32, torch.int64)) > 0


def test_diffuse_by_sends_and_receives_is_exact() -> None:
    run_test_ranks(_diffuse_p2p_worker, 6)


def _slices_worker(rank: int, world: int) -> None:
    """A tensor of many slices with a tail: the exact stage-call count proves the
    hierarchical route ran once per slice (and not a flat all-reduce)."""
    with ringreduce.Communicator(machines=2, min_bytes=0, slice_bytes=256) as comm:
        counts = count_stage_calls(comm)
        n = 10 * 64 + 3  # fp32: 64 elements a slice -> 10 full slices + 3 elements
        assert sweep(comm, [n], CPU, dtypes=(torch.float32,), ops=(dist.ReduceOp.SUM,)) == 1
    assert counts == {"reduce_scatter": 11, "collect": 11, "diffuse": 11, "all_gather": 11,
                      "exchange_signature": 1}, counts  # and one end-of-call check


def test_slices_flow_through_every_stage() -> None:
    run_test_ranks(_slices_worker, 4)


def _call_size_worker(rank: int, world: int) -> None:
    """The default slice size follows the call size (layout.call_slice_bytes): at 2 x 2 a
    call of 4 MiB and 4 bytes goes as four slices (rounded up to whole units, not four
    and a sliver), one of 2 MiB as two of the smallest (1 MiB), each exact."""
    with ringreduce.Communicator(machines=2, min_bytes=0) as comm:
        counts = count_stage_calls(comm)
        n = (4 << 20) // 4 + 1  # fp32
        assert sweep(comm, [n], CPU, dtypes=(torch.float32,), ops=(dist.ReduceOp.SUM,)) == 1
        assert counts["collect"] == 4, counts
        assert sweep(comm, [(2 << 20) // 4], CPU, dtypes=(torch.float32,),
                     ops=(dist.ReduceOp.SUM,)) == 1
        assert counts["collect"] == 6, counts


def test_a_small_call_goes_as_four_slices() -> None:
    run_test_ranks(_call_size_worker, 4)


def _fast_path_worker(rank: int, world: int) -> None:
    with ringreduce.Communicator(machines=2) as comm:  # default min_bytes: 1 MiB
        counts = count_stage_calls(comm)
        assert sweep(comm, [1000], CPU, dtypes=(torch.float32,)) == 4
        assert counts == {"flat_all_reduce": 4}, counts
        t = torch.ones(comm.config.min_bytes // 4)  # exactly min_bytes: hierarchical
        comm.all_reduce(t)
        assert torch.equal(t, torch.full_like(t, world))
        assert counts["collect"] > 0, counts


def test_small_tensors_take_the_flat_route() -> None:
    run_test_ranks(_fast_path_worker, 4)


def _standalone_worker(rank: int, world: int) -> None:
    t = torch.full((300,), float(rank))
    ringreduce.all_reduce(t)
    assert torch.equal(t, torch.full((300,), float(sum(range(world)))))
    fut = ringreduce.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
    assert fut is not None and torch.equal(fut.wait(), torch.full((300,), float(sum(range(world)))))
    ringreduce.release_cached()


def test_standalone_all_reduce_with_env_machines() -> None:
    run_test_ranks(_standalone_worker, 4,
                   env={"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"})


def _host_detection_worker(rank: int, world: int) -> None:
    with ringreduce.Communicator(min_bytes=0) as comm:
        t = comm.topology
        assert (t.machines, t.devices_per_machine) == (2, 3), t
        assert t.ranks == ((0, 2, 4), (1, 3, 5)), t  # machines by host id, not rank blocks
        assert sweep(comm, [50], CPU, dtypes=(torch.int64,)) == 4


def test_machines_detected_from_host_identity() -> None:
    hosts = [{"NCCL_HOSTID": f"host{rank % 2}"} for rank in range(6)]
    run_test_ranks(_host_detection_worker, 6, env=hosts)


def _uneven_worker(rank: int, world: int) -> None:
    with ringreduce.Communicator(min_bytes=0) as comm:
        assert comm.topology.machines == 1 and "'big': 2, 'small': 1" in \
            comm.topology.flat_reason, comm.topology
        assert sweep(comm, [50], CPU, dtypes=(torch.int64,)) == 4
        records = list(comm._res.guard.recorder._records)
        assert {r.route for r in records} == {"flat"}


def test_unequal_machines_take_the_flat_route() -> None:
    """As gloo and NCCL reduce such groups: flat, exact, never an error."""
    hosts = ("big", "big", "small")
    run_test_ranks(_uneven_worker, 3, env=[{"NCCL_HOSTID": h} for h in hosts])


def _probe_choice_worker(rank: int, world: int) -> None:
    """A choice like the construction probe's (it runs on CUDA only; here set after
    construction): small calls flat and exact, large ones one slice on the int8 wire.
    Each call takes its size's route, says why, and the exact ones are exact."""
    from ringreduce.plan import slicing
    small = slicing.Timing(64, {"flat": (1e-4,), "one-slice": (2e-4,), "pipelined": (3e-4,),
                                "wire": (1.5e-4,)})
    large = slicing.Timing(1024, {"flat": (3e-3,), "one-slice": (1e-3,), "pipelined": (2e-3,),
                                  "wire": (2e-4,)})
    with ringreduce.Communicator(machines=2, min_bytes=0, wire="int8") as comm:
        comm._res.plan = slicing.choose([small, large])
        assert comm._res.plan.split_bytes == 256
        assert "below 256 bytes" not in comm.describe()  # MiB, as a probe's sizes are
        assert comm._res.plan.summary in comm.describe()
        records = comm._res.guard.recorder

        def call(numel: int, dtype: torch.dtype, **kw: str) -> tuple[str, str]:
            t = torch.arange(numel, dtype=dtype) % 7 + rank  # small integers: exact sums
            ref = t.clone()
            comm.all_reduce(t, **kw)
            dist.all_reduce(ref)
            last = records.last()
            assert last is not None
            if not last.route.startswith("compressed"):
                assert torch.equal(t, ref), (numel, dtype, last.route)
            return last.route, last.why

        assert call(16, torch.float32) == ("flat", comm._res.plan.below.why)  # 64 B: exact
        assert call(16, torch.int32)[0] == "flat"
        assert call(16, torch.float32, wire="int8")[0] == "compressed int8"  # asked for
        route, why = call(256, torch.float32)
        assert route == "compressed int8" and why == comm._res.plan.why
        assert call(256, torch.int32) == ("one-slice", comm._res.plan.why)


def test_each_call_takes_the_route_chosen_for_its_size() -> None:
    run_test_ranks(_probe_choice_worker, 4)


def _probe_timing_worker(rank: int, world: int, wire: str | None) -> None:
    """The construction probe (CUDA only in a Communicator) run here on gloo, at sizes
    scaled down for it: its calls have training's shape (probe_spy.py)."""
    with ringreduce.Communicator(machines=2, min_bytes=0, wire=wire) as comm:
        probed_as_training_issues(comm, (4096, 16384))


@pytest.mark.parametrize("wire", [None, "int8"])
def test_the_probe_times_calls_queued_asynchronously_as_training_issues_them(
        wire: str | None) -> None:
    run_test_ranks(_probe_timing_worker, 4, wire)
