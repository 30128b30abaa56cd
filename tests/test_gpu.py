"""GPU tests: the CUDA pipeline over real NCCL communicators (nccl4py), bit-exact.

Virtual machines are emulated on one host: rank (m, d) sets ``NCCL_HOSTID=vm<m>`` and
uses GPU d, so NCCL routes rail traffic over its network transport. Ranks of
different virtual machines may share a GPU (NCCL accepts that across host ids), so
a 2-GPU machine runs 2 x 2 as well as 1 x 2 and 2 x 1.
Run with ``pytest -m gpu``; skipped without CUDA or nccl4py.
"""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

from .cases import (
    OPS,
    block_sweep,
    check_equal,
    expected,
    interleaved,
    rank_input,
    sizes_for,
    sweep,
)
from .multiproc import run_ranks
from .test_cpu_api import model, train
from .test_cpu_backend import other_collectives

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("nccl") is None, reason="needs nccl4py"),
]
SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1"}
# At most two ranks per GPU: more time-slice one GPU so finely that runs crawl or hang.
TOPOLOGIES = [(m, d) for m, d in [(2, 2), (1, 4), (1, 2), (2, 1), (4, 1)]
              if d <= GPUS and m * d <= 2 * GPUS]
SMALL = (2, 2) if GPUS >= 2 else (2, 1)
"""The multi-machine topology of the single-case tests: 2 x 1 fits one GPU."""


def _env(machines: int, devices: int) -> list[dict[str, str]]:
    return [{**SAFE, "NCCL_HOSTID": f"vm{r // devices}", "RR_TEST_DEVICE": str(r % devices)}
            for r in range(machines * devices)]


def _sweep_worker(rank: int, world: int, machines: int) -> None:
    devices = world // machines
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(min_bytes=0, slice_bytes=4096) as comm:  # hosts -> machines
        assert (comm.topology.machines, comm.topology.devices_per_machine) == (machines, devices)
        sizes = [*sizes_for(devices, machines), 65537, (1 << 20) + 3]
        assert sweep(comm, sizes, dev) > 0
        interleaved(comm, [1, 1000, 4097, 300_001, 1 << 20], dev)
        t = rank_input(rank, 5_000_003, torch.float32, dev)
        ref = t.clone()
        comm.all_reduce(t)
        dist.all_reduce(ref)  # torch's NCCL all-reduce as the reference
        assert torch.equal(t, ref)
    with ringreduce.Communicator() as comm:  # defaults: 1 MiB flat threshold, auto slices
        sweep(comm, [1000, 3 << 20], dev, dtypes=(torch.float32, torch.bfloat16))


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=[f"{m}x{d}" for m, d in TOPOLOGIES])
def test_gpu_every_size_dtype_op_is_exact(machines: int, devices: int) -> None:
    run_ranks(_sweep_worker, machines * devices, machines, backend="nccl",
              env=_env(machines, devices))


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


@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_wire_format_is_exact_on_small_integers_and_identical(wire: torch.dtype) -> None:
    run_ranks(_wire_worker, SMALL[0] * SMALL[1], wire, backend="nccl", env=_env(*SMALL))


def _no_sync_worker(rank: int, world: int, graphs: int) -> None:
    """With graphs, the same tensor is captured at its second call and replayed after:
    neither may synchronise either."""
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(min_bytes=0, graphs=graphs) as comm:
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
        assert graphs == 0 or comm._res.graphs.captures == 1


@pytest.mark.parametrize("graphs", [0, 8], ids=["slow-path", "graphs"])
def test_gpu_all_reduce_never_syncs_the_host(graphs: int) -> None:
    run_ranks(_no_sync_worker, SMALL[0] * SMALL[1], graphs, backend="nccl", env=_env(*SMALL))


def _ddp_worker(rank: int, world: int, graphs: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    reference = train(DDP(model().to(dev), bucket_cap_mb=0.01), rank, 6, dev)
    with ringreduce.Communicator(min_bytes=0, slice_bytes=4096, graphs=graphs) as comm:
        hooked = DDP(model().to(dev), bucket_cap_mb=0.01)
        hooked.register_comm_hook(comm, ringreduce.ddp_hook)
        got = train(hooked, rank, 6, dev)
        for a, b in zip(got, reference, strict=False):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("graphs", [0, 8], ids=["slow-path", "graphs"])
def test_gpu_ddp_hook_matches_plain_ddp(graphs: int) -> None:
    """With graphs, DDP's buckets (the same tensors every step) are replayed."""
    run_ranks(_ddp_worker, SMALL[0] * SMALL[1], graphs, backend="nccl", env=_env(*SMALL))


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


def test_gpu_all_reduce_captures_in_cuda_graph() -> None:
    run_ranks(_graph_worker, SMALL[0] * SMALL[1], backend="nccl", env=_env(*SMALL), timeout=120)


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
    run_ranks(_live_graph_worker, SMALL[0] * SMALL[1], backend="nccl", env=_env(*SMALL),
              timeout=120)


def _replay_worker(rank: int, world: int) -> None:
    """ringreduce's own graphs: the same tensors come back every step (as DDP's buckets
    do), so from their second call on they are captured and replayed; calls on fresh
    tensors, from a second stream, go the slow way in between. Every result exact."""
    dev = torch.device("cuda", torch.cuda.current_device())
    side = torch.cuda.Stream()
    with ringreduce.Communicator(min_bytes=0, slice_bytes=1 << 20, graphs=8) as comm:
        buckets = {torch.float32: torch.empty(3_000_017, device=dev),
                   torch.bfloat16: torch.empty(1_000_003, dtype=torch.bfloat16, device=dev)}
        kept = []
        for step in range(5):
            for (dtype, t), op in itertools.product(buckets.items(), (dist.ReduceOp.SUM,
                                                                       dist.ReduceOp.AVG)):
                t.copy_(rank_input(rank, t.numel(), dtype, dev, step))
                fut = comm.all_reduce(t, op=op, async_op=step % 2 == 1)
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # a fresh tensor, another stream: slow path
                    other = rank_input(rank, 700_001, torch.float32, dev, step)
                    comm.all_reduce(other)
                    kept.append(other)  # alive, so no later tensor reuses its address
                if fut is not None:
                    fut.wait()
                torch.cuda.current_stream().wait_stream(side)
                check_equal(t, expected(world, t.numel(), dtype, op, dev, step),
                            f"step {step}, {dtype}, {op}")
                check_equal(other, expected(world, other.numel(), torch.float32,
                                            dist.ReduceOp.SUM, dev, step), f"other, step {step}")
        graphs = comm._res.graphs
        assert graphs is not None and graphs.captures == 4 and len(graphs) == 4


def test_gpu_repeated_all_reduces_replay_as_graphs_exactly() -> None:
    run_ranks(_replay_worker, SMALL[0] * SMALL[1], backend="nccl", env=_env(*SMALL),
              timeout=240)


def _back_to_back_worker(rank: int, world: int, wire: str) -> None:
    """DDP's pattern with replay on: the same buckets every step, issued back to back
    (async, waited at the end; sync on some steps), so each replay starts while the
    previous one still runs, ordered only by the external slot and stage-tail events
    of the graphs (pipeline.CudaStreams). Different sizes bake different staging
    slots into each graph, and 1 MiB slices give each call several. Every result exact."""
    dev = torch.device("cuda", torch.cuda.current_device())
    wire_dtype = getattr(torch, wire) if wire != "none" else None
    ops = (dist.ReduceOp.SUM, dist.ReduceOp.AVG) if wire_dtype is None else (dist.ReduceOp.SUM,)
    with ringreduce.Communicator(min_bytes=0, slice_bytes=1 << 20, graphs=16,
                                 wire_dtype=wire_dtype) as comm:
        buckets = [torch.empty(n, dtype=dt, device=dev) for n, dt in
                   ((3_000_017, torch.float32), (1_000_003, torch.bfloat16),
                    (2_500_000, torch.float32), (777_777, torch.float32))]
        steps = 7
        for step in range(steps):
            op = ops[step % len(ops)]
            futures = []
            for i, t in enumerate(buckets):
                t.copy_(rank_input(rank, t.numel(), t.dtype, dev, step * 10 + i))
                futures.append(comm.all_reduce(t, op=op, async_op=step % 3 != 2))
            for fut in futures:
                if fut is not None:
                    fut.wait()
            for i, t in enumerate(buckets):
                check_equal(t, expected(world, t.numel(), t.dtype, op, dev, step * 10 + i),
                            f"step {step}, bucket {i}, {op}")
        graphs = comm._res.graphs
        assert graphs is not None and graphs.captures == len(buckets) * len(ops)
        routes = [r.route for r in comm._res.guard.recorder._records]
        assert routes.count("hierarchical (graph)") >= len(buckets) * (steps - 2 * len(ops))


@pytest.mark.parametrize("wire", ["none", "bfloat16"])
def test_gpu_back_to_back_replays_overlap_exactly(wire: str) -> None:
    run_ranks(_back_to_back_worker, SMALL[0] * SMALL[1], wire, backend="nccl",
              env=_env(*SMALL), timeout=240)


def _blocks_worker(rank: int, world: int, machines: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(min_bytes=0) as comm:
        assert comm.topology.machines == machines
        block_sweep(comm, [0, 1, 3, 1000, 65537], dev)
        n = (1 << 20) + 1
        data = rank_input(rank, world * n, torch.float32, dev)
        got, ref = torch.empty(n, device=dev), torch.empty(n, device=dev)
        comm.reduce_scatter(got, data)
        dist.reduce_scatter_tensor(ref, data)  # torch's NCCL as the reference
        check_equal(got, ref, "reduce_scatter vs torch")
        got, ref = torch.empty(world * n, device=dev), torch.empty(world * n, device=dev)
        comm.all_gather(got, data[:n])
        dist.all_gather_into_tensor(ref, data[:n])
        check_equal(got, ref, "all_gather vs torch")


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=[f"{m}x{d}" for m, d in TOPOLOGIES])
def test_gpu_reduce_scatter_and_all_gather_are_exact(machines: int, devices: int) -> None:
    run_ranks(_blocks_worker, machines * devices, machines, backend="nccl",
              env=_env(machines, devices))


def _backend_worker(rank: int, world: int) -> None:
    from ringreduce.backend import RingReduceGroup

    dev = torch.device("cuda", torch.cuda.current_device())
    group = dist.group.WORLD
    assert isinstance(group, RingReduceGroup)
    calls = sweep(_DistAsComm(), [1, 1000, 300_001], dev)
    engine = group.communicator(dev)
    assert engine.op_number == calls and engine.topology.machines == 2
    nccl = dist.new_group(backend="nccl")
    reference = train(DDP(model().to(dev), bucket_cap_mb=0.01, process_group=nccl), rank, 6, dev)
    got = train(DDP(model().to(dev), bucket_cap_mb=0.01), rank, 6, dev)  # no hook: the backend
    for a, b in zip(got, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert engine.op_number > calls
    other_collectives(rank, world, 20, dev)  # what the group hands to NCCL's backend


class _DistAsComm:
    """dist.all_reduce on the default group, shaped like Communicator.all_reduce."""

    topology = "the ringreduce backend"

    def all_reduce(self, t: torch.Tensor, op: object, async_op: bool) -> object:
        work = dist.all_reduce(t, op=op, async_op=async_op)
        return work.get_future().then(lambda f: t) if async_op else None


def test_gpu_backend_all_reduce_and_ddp_without_hook() -> None:
    env = [{**e, "RINGREDUCE_MIN_BYTES": "0"} for e in _env(*SMALL)]
    run_ranks(_backend_worker, SMALL[0] * SMALL[1], backend="ringreduce", env=env)
