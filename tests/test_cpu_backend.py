"""The "ringreduce" torch.distributed backend on the CPU path: dist.all_reduce,
reduce_scatter_tensor and all_gather_into_tensor go through the engine (bit-exact,
hierarchical at 2 x 2), everything else through gloo, and DDP without a hook trains
like DDP on gloo (FSDP2 on the backend: test_cpu_fsdp.py)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ringreduce.errors import RingReduceError
from ringreduce.integrations.backend import RingReduceGroup

from .cases import (
    DTYPES,
    OPS,
    all_gather_single,
    block_sweep,
    check_equal,
    expected,
    other_collectives,
    rank_input,
    reduce_scatter_single,
    world_group,
)
from .multiproc import run_test_ranks
from .training import model, train

CPU = torch.device("cpu")
ENV = {"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"}


def _collectives_worker(rank: int, world: int) -> None:
    calls = 0
    for n in (1, 7, 1000):
        for dtype in DTYPES:
            for op in OPS:
                t = rank_input(rank, n, dtype, CPU, calls)
                dist.all_reduce(t, op=op)
                check_equal(t, expected(world, n, dtype, op, CPU, calls), f"{n} {dtype} {op}")
                calls += 1
    engine = world_group().communicator(CPU)
    assert engine.op_number == calls, (engine.op_number, calls)  # all of them were ours
    assert engine.topology.machines == 2
    records = list(engine._res.guard.recorder._records)
    assert {r.route for r in records} == {"hierarchical"}
    calls += block_sweep(_DistBlocks(), [1, 7, 1000], CPU)
    assert engine.op_number == calls, (engine.op_number, calls)
    assert {(r.kind, r.route) for r in engine._res.guard.recorder._records} == \
        {("reduce_scatter", "hierarchical"), ("all_gather", "hierarchical")}
    # Bytes (FSDP2 gathers them when a module's parameters differ in dtype): gloo's.
    gathered_bytes = torch.zeros(world * 3, dtype=torch.uint8)
    all_gather_single(gathered_bytes, torch.full((3,), rank, dtype=torch.uint8))
    assert torch.equal(gathered_bytes, torch.arange(world, dtype=torch.uint8).repeat_interleave(3))
    assert engine.op_number == calls
    # A view that is not contiguous: refused on every rank before anything is sent.
    with pytest.raises(ValueError, match="contiguous"):
        reduce_scatter_single(torch.zeros(2), torch.zeros(2 * world, 2)[:, 0])
    # Not the engine's: PRODUCT goes to gloo, logged once; the engine is not called.
    t = torch.full((5,), 2.0)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    assert torch.equal(t, torch.full((5,), 16.0)) and engine.op_number == calls
    # Other collectives are gloo's, through torch's own dispatch.
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=1)
    assert torch.equal(b, torch.ones(3))
    pieces = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(pieces, torch.full((2,), float(rank)))
    assert torch.equal(torch.cat(pieces), torch.arange(world).repeat_interleave(2).float())
    dist.barrier()
    assert engine.op_number == calls
    work = dist.all_reduce(torch.ones(4), async_op=True)
    assert work is not None and work.wait()


class _DistBlocks:
    """The default group's reduce-scatter and all-gather, shaped like Communicator's
    (for cases.block_sweep)."""

    topology = "the ringreduce backend"

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: object,
                       async_op: bool) -> object:
        work = reduce_scatter_single(output, input, op=op, async_op=async_op)
        return work.get_future().then(lambda f: output) if async_op else None

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool) -> object:
        work = all_gather_single(output, input, async_op=async_op)
        return work.get_future().then(lambda f: output) if async_op else None


def test_backend_all_reduce_goes_through_the_engine(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    run_test_ranks(_collectives_worker, 4, backend="ringreduce", env=ENV)


def test_other_collectives_are_the_backends_and_do_not_deadlock() -> None:
    run_test_ranks(other_collectives, 4, 300, backend="ringreduce", env=ENV, timeout=120)


def _torch_apis_worker(rank: int, world: int) -> None:
    """What users call besides the collectives: object collectives, rooted collectives,
    batched point-to-point, and a subgroup (its own ringreduce engine)."""
    objs: list[object] = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)], objs
    sent: list[object] = [20 if rank == 2 else None]
    dist.broadcast_object_list(sent, src=2)
    assert sent == [20], sent
    t = torch.full((3,), float(rank))
    dist.reduce(t, dst=0)
    assert rank != 0 or torch.equal(t, torch.full((3,), float(sum(range(world)))))
    gathered = [torch.zeros(2) for _ in range(world)] if rank == 1 else None
    dist.gather(torch.full((2,), float(rank)), gathered, dst=1)
    assert gathered is None or all(torch.equal(g, torch.full((2,), float(r)))
                                   for r, g in enumerate(gathered))
    piece = torch.zeros(2)
    dist.scatter(piece, [torch.full((2,), float(r)) for r in range(world)] if rank == 0 else None,
                 src=0)
    assert torch.equal(piece, torch.full((2,), float(rank)))
    peer, got = rank ^ 1, torch.zeros(2)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(rank)), peer),
                                        dist.P2POp(dist.irecv, got, peer)]):
        work.wait()
    assert torch.equal(got, torch.full((2,), float(peer)))
    pair = dist.new_group([0, 1])
    if rank < 2:
        assert isinstance(pair, RingReduceGroup)
        x = torch.full((5,), float(rank + 1))
        dist.all_reduce(x, group=pair)
        assert torch.equal(x, torch.full((5,), 3.0))
        assert pair.communicator(CPU).op_number == 1  # the subgroup's own engine
    dist.barrier()


def test_torch_apis_work_on_the_backend() -> None:
    run_test_ranks(_torch_apis_worker, 4, backend="ringreduce", env=ENV)


def _ddp_worker(rank: int, world: int) -> None:
    gloo = dist.new_group(backend="gloo")
    reference = train(DDP(model(), bucket_cap_mb=0.01, process_group=gloo), rank, steps=6)
    got = train(DDP(model(), bucket_cap_mb=0.01), rank, steps=6)  # the default group: ours
    # Both divide by the world size before summing; the sum order differs (machine
    # partials first), so fp32 results may differ in the last bits.
    for a, b in zip(got, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert world_group().communicator(CPU).op_number >= 6


def test_ddp_without_a_hook_on_the_backend_matches_gloo() -> None:
    run_test_ranks(_ddp_worker, 4, backend="ringreduce", env=ENV)


def test_registration_is_idempotent() -> None:
    import ringreduce.integrations.backend as backend

    backend.register()
    backend.register()
    assert dist.Backend.backend_list.count("ringreduce") == 1
    assert dist.Backend._plugins["RINGREDUCE"].creator_fn is backend.create
    assert dist.Backend("ringreduce") == "ringreduce"


def _mismatch_worker(rank: int, world: int) -> None:
    """A rank calling ``dist.all_reduce`` with another size than its peers, on a kind of
    call none made before: every rank's ``dist.all_reduce`` raises before anything is
    communicated (the engine's new-call check), and the group carries on."""
    with pytest.raises(RingReduceError, match=r"collective mismatch at operation #1: rank \d "
                       r"calls all_reduce\(numel=(3|4),"):
        dist.all_reduce(torch.ones(3 if rank == 2 else 4))
    t = torch.ones(4)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(world)))


def test_a_mismatched_call_raises_from_dist_all_reduce_on_every_rank() -> None:
    run_test_ranks(_mismatch_worker, 4, backend="ringreduce", env=ENV, timeout=120)
