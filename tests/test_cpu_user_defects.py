"""Issue 34, as a user meets it, on CPU (gloo): 16-bit gradients through the DDP hook
on both routes, a closed communicator's ``wait_idle``, ``ringreduce.all_reduce`` on a
rank outside the group, and the name of a refused op."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce.safety import checks

from .cases import count_stage_calls
from .multiproc import run_test_ranks
from .training import check_big_gradients


def _hook_worker(rank: int, world: int, min_bytes: int | None, route: str) -> None:
    comm = ringreduce.Communicator(machines=2, min_bytes=min_bytes)
    assert (comm.topology.machines, comm.topology.devices_per_machine) == (2, 2)
    counts = count_stage_calls(comm)
    check_big_gradients(comm, torch.device("cpu"), route)
    if route == "flat":
        assert counts.get("flat_all_reduce", 0) == 2 and "collect" not in counts, counts
    else:
        # reduce_scatter is where fp16 overflowed: the machine's two ranks summed in fp16
        assert counts.get("reduce_scatter", 0) >= 2 and "flat_all_reduce" not in counts, counts
    comm.close()


@pytest.mark.parametrize(("min_bytes", "route"), [(0, "hierarchical"), (None, "flat"),
                                                  (1 << 30, "flat")],
                         ids=["hierarchical", "flat-default", "flat-large-min-bytes"])
def test_ddp_hook_16bit_gradients_match_plain_ddp_where_the_sum_overflows(
        min_bytes: int | None, route: str) -> None:
    run_test_ranks(_hook_worker, 4, min_bytes, route)


def _closed_worker(rank: int, world: int) -> None:
    comm = ringreduce.Communicator(machines=2)
    t = torch.ones(8)
    comm.all_reduce(t)
    assert comm.wait_idle()
    comm.close()
    with pytest.raises(ringreduce.RingReduceError, match="Communicator is closed; create a new"):
        comm.wait_idle()


def test_wait_idle_after_close_says_the_communicator_is_closed() -> None:
    run_test_ranks(_closed_worker, 4)


MEMBERS = [0, 1]


def _outside_worker(rank: int, world: int) -> None:
    """Members reduce as dist.all_reduce does; the other ranks do what torch does for
    them (warn, change nothing, return None), synchronous and asynchronous alike."""
    group = dist.new_group(MEMBERS)  # collective: every rank calls it
    for async_op in (False, True):
        t = torch.full((8,), float(rank + 1))
        reference, before = t.clone(), t.clone()
        work = dist.all_reduce(reference, group=group, async_op=async_op)
        if rank in MEMBERS:
            ours = ringreduce.all_reduce(t, group=group, async_op=async_op)
            for pending in (work, ours):
                if pending is not None:
                    pending.wait()
            assert torch.equal(t, reference) and t[0] == 3, (t, reference)
            continue
        assert work is None and torch.equal(reference, before), "torch's own reference moved"
        with pytest.warns(UserWarning, match="does not belong to the given group"):
            ours = ringreduce.all_reduce(t, group=group, async_op=async_op)
        assert ours is None, f"returned {ours!r} on a rank outside the group"
        assert torch.equal(t, before), "a rank outside the group changed the tensor"
    ringreduce.release_cached()


def test_all_reduce_on_a_rank_outside_the_group_does_nothing() -> None:
    run_test_ranks(_outside_worker, 4, timeout=120)  # before the fix, non-members hung


def test_refused_premul_sum_is_named_readably() -> None:
    premul = dist._make_nccl_premul_sum(2.0)
    with pytest.raises(TypeError, match=r"op ReduceOp\.PREMUL_SUM is not supported") as info:
        checks.op_name(premul)
    assert "object at" not in str(info.value), str(info.value)
    with pytest.raises(TypeError, match=r"op ReduceOp\.BAND is not supported"):
        checks.op_name(dist.ReduceOp.BAND)


def test_reduce_op_objects_name_their_op() -> None:
    """``dist.ReduceOp(dist.ReduceOp.SUM)`` is an object that wraps SUM, as the
    process-group options carry it: the same op as the enum value."""
    for enum_value, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"),
                             (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.MIN, "min")):
        assert checks.op_name(dist.ReduceOp(enum_value)) == name
