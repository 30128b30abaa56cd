"""Issue 34, as a user meets it, on CPU (gloo): 16-bit gradients through the DDP hook
on both routes, a closed communicator's ``wait_idle``, ``ringreduce.all_reduce`` on a
rank outside the group, and the name of a refused op."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from ringreduce.safety import checks

from .multiproc import run_test_ranks
from .test_cpu_allreduce import _count_stage_calls as count_stage_calls

BIG_FP16 = 40000.0
"""Exact in fp16 (a multiple of its spacing 32 there), as is BIG_FP16 / 4 (spacing 8);
the sum of four of them (160000) is past fp16's largest finite value, 65504."""
ELEMENTS = 1000  # 2 KB of fp16: below the default min_bytes, one bucket per dtype


class Big(nn.Module):
    """Zero 16-bit weights whose gradients are the inputs, so every rank's gradient is
    exactly ``x`` (the loss itself is 0, far from overflowing)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.fp16 = nn.Parameter(torch.zeros(ELEMENTS, dtype=torch.float16, device=device))
        self.bf16 = nn.Parameter(torch.zeros(ELEMENTS, dtype=torch.bfloat16, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.fp16 * x.half()).sum().float() + (self.bf16 * x.bfloat16()).sum().float()


def big_gradients(net: nn.Module, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One backward of ``Big`` through ``net`` (DDP with or without the hook): the
    reduced fp16 and bf16 gradients."""
    net.zero_grad()
    net(torch.full((ELEMENTS,), BIG_FP16, device=device)).backward()
    module: Any = net.module if isinstance(net, DDP) else net
    half, bf16 = module.fp16.grad, module.bf16.grad
    assert half is not None and bf16 is not None
    return half.clone(), bf16.clone()


def check_big_gradients(comm: ringreduce.Communicator, device: torch.device, route: str) -> None:
    """The hook returns what plain DDP (on the default group) returns for 16-bit
    gradients whose 4-rank sum overflows fp16 but whose average does not: 40000, bit
    for bit, not inf; the hook's calls took ``route``."""
    plain = big_gradients(DDP(Big(device)), device)
    hooked_ddp = DDP(Big(device))
    hooked_ddp.register_comm_hook(comm, ringreduce.ddp_hook)
    hooked = big_gradients(hooked_ddp, device)
    record = comm._res.guard.recorder.last()
    calls = comm.op_number - comm._res.probe_calls  # the construction probe's come first
    assert calls == 2 and record is not None, "one hook call per 16-bit bucket"
    hierarchical = ("hierarchical", "one-slice")  # either plan (execution/probe.py)
    assert record.route.startswith(hierarchical if route == "hierarchical" else route), \
        f"the hook took the {record.route} route"
    assert torch.equal(plain[0], torch.full_like(plain[0], BIG_FP16)), \
        f"plain DDP's reference changed: {plain[0][:4]}"
    for name, got, want in zip(("float16", "bfloat16"), hooked, plain, strict=True):
        assert torch.isfinite(got).all(), f"{name} gradients overflowed in the hook: {got[:4]}"
        assert torch.equal(got, want), f"{name}: hook {got[:4]} != plain DDP {want[:4]}"
    # bf16 rounds 40000 to 39936 (156 x its spacing 256 there); a quarter is exact too
    assert torch.equal(plain[1], torch.full_like(plain[1], 39936.0)), \
        f"plain DDP's bf16 reference changed: {plain[1][:4]}"


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
