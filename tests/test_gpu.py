"""GPU tests: the CUDA pipeline over real NCCL communicators (nccl4py), bit-exact.

Virtual machines are emulated on one host (each rank's environment: tests/gpu.py): rank
(m, d) sets ``NCCL_HOSTID=vm<m>`` and uses GPU d, so NCCL routes rail traffic over its
network transport. When a machine has more devices than the host has GPUs, its ranks
share GPUs (run them under CUDA MPS, as the GPU run script does): NCCL refuses two ranks
of one host id on one GPU, so each of those ranks gets its own host id (``vm<m>r<d>``)
and the machine count is passed explicitly (``RINGREDUCE_MACHINES``).

Topologies: ``RINGREDUCE_GPU_TOPOLOGIES`` (default ``2x1``; e.g. ``2x1,2x2,4x2``), each
running the exact sweep with its stage-operation count, block collectives, CUDA-graph
capture and replay, the DDP hook and the backend against plain DDP; the fault tests
(test_gpu_faults.py) use the same list. The wire format, the no-sync check and the
graph lifecycle run at one topology (SMALL).
Run with ``pytest -m gpu``; skipped without CUDA or nccl4py.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from ringreduce.plan import layout, slicing

from .cases import (
    OPS,
    block_sweep,
    check_equal,
    count_stage_calls,
    expected,
    interleaved,
    other_collectives,
    rank_input,
    sizes_for,
    sweep,
)
from .gpu import GPU_MARKS, IDS, SMALL, TOPOLOGIES, gpu_env
from .multiproc import run_test_ranks
from .training import model, train

pytestmark = GPU_MARKS


def _exact_worker(rank: int, world: int, machines: int) -> None:
    """all_reduce (every dtype x op, sizes with and without padding, many slices),
    against torch's NCCL too; the stage operations counted; block collectives."""
    devices = world // machines
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(min_bytes=0, slice_bytes=4096, plan="pipelined") as comm:
        assert (comm.topology.machines, comm.topology.devices_per_machine) == (machines, devices)
        _count_stages(comm, dev)
        sizes = [*sizes_for(devices, machines), 65537, (1 << 18) + 3]
        assert sweep(comm, sizes, dev) > 0
        interleaved(comm, [1, 1000, 4097, 300_001], dev)
        t = rank_input(rank, 1_000_003, torch.float32, dev)
        ref = t.clone()
        comm.all_reduce(t)
        dist.all_reduce(ref)  # torch's NCCL all-reduce as the reference
        assert torch.equal(t, ref)
    with ringreduce.Communicator(min_bytes=0, plan="one-slice") as comm:
        _one_slice(comm, rank, devices, machines, dev)
    with ringreduce.Communicator() as comm:  # defaults: the probe's plan, 1 MiB flat threshold
        plan = comm._res.plan
        assert plan.plan in slicing.ROUTES and "probe" in plan.reason, plan
        probe_calls = slicing.probe_calls(comm.config.min_bytes, lossy=False)
        assert comm._res.probe_calls == probe_calls, comm.op_number
        sweep(comm, [1000, 3 << 20], dev, dtypes=(torch.float32, torch.bfloat16))
    _blocks(rank, world, machines, dev)


def _one_slice(comm: ringreduce.Communicator, rank: int, devices: int, machines: int,
               dev: torch.device) -> None:
    """The one-slice plan on NCCL: every size (tails of n mod D), dtype and op exact,
    synchronous and asynchronous, interleaved, and bit for bit torch's NCCL on floats."""
    assert sweep(comm, [*sizes_for(devices, machines), 65537, (1 << 18) + 3], dev) > 0
    interleaved(comm, [1, 1000, 4097, 300_001], dev)
    record = comm._res.guard.recorder.last()
    assert record is not None and record.route.startswith("one-slice"), record
    g = torch.Generator(device=dev).manual_seed(rank)
    t = torch.randn(1_000_003, device=dev, generator=g)
    comm.all_reduce(t, op=dist.ReduceOp.AVG)
    hi, lo = t.clone(), t.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    assert torch.equal(hi, lo), "ranks disagree after a one-slice AVG"


def _check_pairs(comm: ringreduce.Communicator) -> None:
    """A wave's two stages of a pair go to one NCCL communicator."""
    comms = comm._res.comms
    pairs = [("collect", "diffuse")]
    if comm.topology.devices_per_machine > 1:
        pairs.append(("reduce_scatter", "all_gather"))
    assert all(comms[a] is comms[b] for a, b in pairs), comms


def _count_stages(comm: ringreduce.Communicator, dev: torch.device) -> None:
    """A silent flat route (or a stage skipped) fails here: one call of several slices
    with a padding tail must issue every active stage once per slice, and no flat
    all-reduce; a call below min_bytes must issue exactly one flat all-reduce."""
    topo = comm.topology
    _check_pairs(comm)
    counts = count_stage_calls(comm)
    n = 10 * 1024 + 3  # fp32, 4 KiB slices: 10 full slices and a tail
    t = rank_input(topo.rank, n, torch.float32, dev)
    comm.all_reduce(t)
    check_equal(t, expected(topo.world_size, n, torch.float32, dist.ReduceOp.SUM, dev),
                "counted call")
    slices = len(layout.plan_slices(n, 4, topo.devices_per_machine, topo.machines,
                                    comm._res.slice_bytes))
    want = {"collect": slices, "diffuse": slices,
            "exchange_signature": len(comm._res.call_check.hops)}  # the end check's hops
    if topo.devices_per_machine > 1:
        want |= {"reduce_scatter": slices, "all_gather": slices}
    assert slices >= 10 and counts == want, (counts, want)
    comm.config = dataclasses.replace(comm.config, min_bytes=1 << 20)
    comm.all_reduce(torch.ones(1000, device=dev))
    assert counts == {**want, "flat_all_reduce": 1}, counts
    comm.config = dataclasses.replace(comm.config, min_bytes=0)
    transport = comm._res.transport
    for name in (*want, "flat_all_reduce"):
        delattr(transport, name)  # the spies go; the class's methods are back


def _blocks(rank: int, world: int, machines: int, dev: torch.device) -> None:
    with ringreduce.Communicator(min_bytes=0) as comm:
        assert comm.topology.machines == machines
        block_sweep(comm, [0, 1, 3, 1000, 65537], dev)
        n = (1 << 18) + 1
        data = rank_input(rank, world * n, torch.float32, dev)
        got, ref = torch.empty(n, device=dev), torch.empty(n, device=dev)
        comm.reduce_scatter(got, data)
        dist.reduce_scatter_tensor(ref, data)  # torch's NCCL as the reference
        check_equal(got, ref, "reduce_scatter vs torch")
        got, ref = torch.empty(world * n, device=dev), torch.empty(world * n, device=dev)
        comm.all_gather(got, data[:n])
        dist.all_gather_into_tensor(ref, data[:n])
        check_equal(got, ref, "all_gather vs torch")


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_collectives_are_exact_and_hierarchical(machines: int, devices: int) -> None:
    run_test_ranks(_exact_worker, machines * devices, machines, backend="nccl",
                   env=gpu_env(machines, devices), timeout=300)


def _wire_worker(rank: int, world: int, wire: torch.dtype) -> None:
    """Small integers are 16-bit values too: the wire (native/wire.cu's casts and the
    wire add) must not change them; slices of 4 KiB give padding tails and many slots."""
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(min_bytes=0, slice_bytes=4096, wire_dtype=wire) as comm:
        sizes = [1, 5, 97, 1000, 4097, (1 << 20) + 3]
        ops = tuple(o for o in OPS if o != dist.ReduceOp.AVG or world & (world - 1) == 0)
        sweep(comm, sizes, dev, dtypes=(torch.float32, torch.bfloat16), ops=ops)
        g = torch.Generator(device=dev).manual_seed(rank)
        t = torch.randn(1_000_003, device=dev, generator=g)
        comm.all_reduce(t)
        assert torch.equal(t, t.to(wire).float()), "results are not wire-format values"
        hi, lo = t.clone(), t.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        assert torch.equal(hi, lo), "ranks disagree: replicas would drift apart"


def _each(worker: Callable[..., None], values: tuple[object, ...]) -> Callable[..., None]:
    return functools.partial(_run_each, worker, values)


def _run_each(worker: Callable[..., None], values: tuple[object, ...], rank: int,
              world: int) -> None:
    """Several cases in one set of processes: NCCL setup is most of a small case's time."""
    for value in values:
        worker(rank, world, value)


def test_gpu_wire_format_is_exact_on_small_integers_and_identical() -> None:
    run_test_ranks(_each(_wire_worker, (torch.bfloat16, torch.float16)), SMALL[0] * SMALL[1],
                   backend="nccl", env=gpu_env(*SMALL))


def _no_sync_worker(rank: int, world: int) -> None:
    """Synchronous and asynchronous calls on the plan the probe chose."""
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(min_bytes=0) as comm:
        t = rank_input(rank, 3_000_001, torch.float32, dev)
        comm.all_reduce(t)  # warm up: the first call may allocate
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host-device sync now raises
        try:
            for _ in range(3):
                comm.all_reduce(t)
                fut = comm.all_reduce(t, async_op=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert fut is not None
        fut.wait()
        torch.cuda.synchronize()


def test_gpu_all_reduce_never_syncs_the_host() -> None:
    run_test_ranks(_no_sync_worker, SMALL[0] * SMALL[1], backend="nccl", env=gpu_env(*SMALL))


def _graph_worker(rank: int, world: int) -> None:
    """The caller captures comm.all_reduce in a CUDA graph of its own and replays it
    on new data: exact. Closing after the graph is deleted is clean."""
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(min_bytes=0, slice_bytes=1 << 20) as comm:
        t = rank_input(rank, 3_000_017, torch.float32, dev)
        comm.all_reduce(t)  # warm up outside the capture (allocations, NCCL connections)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            comm.all_reduce(t)
        for salt in (1, 2):
            t.copy_(rank_input(rank, t.numel(), torch.float32, dev, salt))
            graph.replay()
            check_equal(t, expected(world, t.numel(), torch.float32, dist.ReduceOp.SUM, dev,
                                    salt), f"replay with salt {salt}")
        del graph  # NCCL frees a communicator only once the graphs that captured it are gone




def _live_graph_worker(rank: int, world: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    comm = ringreduce.Communicator(min_bytes=0)
    t = rank_input(rank, 3_000_017, torch.float32, dev)
    comm.all_reduce(t)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        comm.all_reduce(t)
    graph.replay()
    with pytest.raises(ringreduce.RingReduceError, match="del graph"):
        comm.close()  # NCCL would wait for the graph forever; ringreduce says so instead
    assert graph is not None


def test_gpu_close_with_a_live_graph_raises_instead_of_hanging() -> None:
    run_test_ranks(_live_graph_worker, SMALL[0] * SMALL[1], backend="nccl", env=gpu_env(*SMALL),
                   timeout=120)


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_callers_cuda_graph_captures_exactly(machines: int, devices: int) -> None:
    """The caller's own capture of ringreduce's calls, replayed."""
    run_test_ranks(_graph_worker, machines * devices, backend="nccl",
                   env=gpu_env(machines, devices), timeout=300)


def _backend_worker(rank: int, world: int, machines: int) -> None:
    """The "ringreduce" backend (dist.all_reduce, DDP without a hook) and the DDP hook
    on a Communicator, both against DDP on a plain NCCL group."""
    from ringreduce.integrations.backend import RingReduceGroup

    dev = torch.device("cuda", torch.cuda.current_device())
    group = dist.group.WORLD
    assert isinstance(group, RingReduceGroup)
    calls = sweep(_DistAsComm(), [1, 1000, 300_001], dev)
    engine = group.communicator(dev)
    assert engine.op_number == calls + engine._res.probe_calls
    assert engine.topology.machines == machines
    nccl = dist.new_group(backend="nccl")
    reference = train(DDP(model().to(dev), bucket_cap_mb=0.01, process_group=nccl), rank, 6, dev)
    got = train(DDP(model().to(dev), bucket_cap_mb=0.01), rank, 6, dev)  # no hook: the backend
    for a, b in zip(got, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert engine.op_number > calls
    with ringreduce.Communicator(nccl, min_bytes=0, slice_bytes=4096) as comm:
        # find_unused_parameters: DDP all-reduces its unused-parameter map on its NCCL
        # group right after the last bucket's hook (test_native_cuda: with the worker)
        for unused in (False, True):
            hooked = DDP(model().to(dev), bucket_cap_mb=0.01, process_group=nccl,
                         find_unused_parameters=unused)
            hooked.register_comm_hook(comm, ringreduce.ddp_hook)
            for a, b in zip(train(hooked, rank, 6, dev), reference, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert comm.op_number > 0
    other_collectives(rank, world, 20, dev)  # what the group hands to NCCL's backend


class _DistAsComm:
    """dist.all_reduce on the default group, shaped like Communicator.all_reduce."""

    topology = "the ringreduce backend"

    def all_reduce(self, t: torch.Tensor, op: object, async_op: bool) -> object:
        work = dist.all_reduce(t, op=op, async_op=async_op)
        return work.get_future().then(lambda f: t) if async_op else None


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_ddp_backend_and_hook_match_plain_ddp(machines: int, devices: int) -> None:
    env = [{**e, "RINGREDUCE_MIN_BYTES": "0"} for e in gpu_env(machines, devices)]
    run_test_ranks(_backend_worker, machines * devices, machines, backend="ringreduce", env=env,
                   timeout=300)
