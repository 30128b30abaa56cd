"""The two references every row is measured against, in the same processes.

* ``flat``: the process group's own collective (NCCL's all-reduce on GPUs, gloo's on
  CPU) on the whole group: what a user gets without ringreduce.
* ``two_level``: the hierarchy as a user writes it with torch.distributed in ten
  lines, unpipelined: reduce-scatter inside the machine, all-reduce along the rail
  (the same device index on every machine), all-gather inside the machine; the tensor
  padded to a multiple of the devices per machine. It is what ringreduce's pipeline
  must beat to be worth its code.

gloo has no AVG, so on gloo both references run SUM and then divide (trunc for
integers, as NCCL does): a documented stand-in. The two-level reference does the same
on NCCL too, because an AVG of AVGs truncates twice on integers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..plan.topology import Topology

Pair = tuple[torch.Tensor, torch.Tensor]
"""(input, output) of one call; the same tensor twice for the in-place all-reduce."""
Reduce = Callable[[list[Pair]], None]

# torch 2.13 renames the *_tensor collectives; the benchmark keeps the names users know.
warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.* is deprecated")
warnings.filterwarnings("ignore", message=r".*reduce_scatter_tensor.* is deprecated")


def flat(collective: str, op: dist.ReduceOp.RedOpType, avg_by_division: bool, world: int) -> Reduce:
    """The same collective through torch.distributed on the whole group."""
    red = dist.ReduceOp.SUM if avg_by_division else op
    call = {"all_reduce": lambda i, o, a: dist.all_reduce(o, op=red, async_op=a),
            "reduce_scatter": lambda i, o, a: dist.reduce_scatter_tensor(o, i, op=red,
                                                                         async_op=a),
            "all_gather": lambda i, o, a: dist.all_gather_into_tensor(o, i, async_op=a),
            }[collective]

    def run(bufs: list[Pair]) -> None:
        works = [call(i, o, len(bufs) > 1) for i, o in bufs]
        for work in works:
            if work is not None:
                work.wait()
        if avg_by_division and collective != "all_gather":
            for _, t in bufs:
                divide(t, world)
    return run


def divide(t: torch.Tensor, n: int) -> None:
    t.div_(n, rounding_mode=None if t.is_floating_point() else "trunc")


@dataclass(frozen=True)
class Groups:
    """This rank's machine group and rail group (every rank creates all of them, in
    the same order: ``new_group`` is collective over the world)."""

    machine: dist.ProcessGroup
    rail: dist.ProcessGroup
    devices: int


def make_groups(topo: Topology) -> Groups:
    machine = rail = None
    for ranks in topo.all_intra():
        group = dist.new_group(list(ranks))
        machine = group if topo.rank in ranks else machine
    for ranks in topo.all_rails():
        group = dist.new_group(list(ranks))
        rail = group if topo.rank in ranks else rail
    assert machine is not None and rail is not None
    return Groups(machine, rail, topo.devices_per_machine)


def two_level(groups: Groups, op: dist.ReduceOp.RedOpType, world: int, bufs: list[Pair]) -> Reduce:
    """Reduce-scatter in the machine, all-reduce on the rail, all-gather in the
    machine, one tensor after another. Buffers for the padded copy and the shard are
    made here, once, so the timed loop measures communication, not allocation."""
    avg = op == dist.ReduceOp.AVG
    red = dist.ReduceOp.SUM if avg else op
    d = groups.devices
    scratch = [_scratch(t, d) for _, t in bufs]

    def one(t: torch.Tensor, padded: torch.Tensor | None, shard: torch.Tensor) -> None:
        flat_t = t.view(-1)
        whole = flat_t if padded is None else padded
        if padded is not None:
            padded[:flat_t.numel()].copy_(flat_t)
        dist.reduce_scatter_tensor(shard, whole, op=red, group=groups.machine)
        dist.all_reduce(shard, op=red, group=groups.rail)
        dist.all_gather_into_tensor(whole, shard, group=groups.machine)
        if padded is not None:
            flat_t.copy_(padded[:flat_t.numel()])
        if avg:
            divide(t, world)

    def run(run_bufs: list[Pair]) -> None:
        for (_, t), (padded, shard) in zip(run_bufs, scratch, strict=True):
            one(t, padded, shard)
    return run


def _scratch(t: torch.Tensor, devices: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(padded copy or None when numel divides by D, this rank's shard). The pad is
    left uninitialised: reductions are elementwise, so its values reach only pad
    positions, which are never copied back."""
    n = t.numel()
    padded_n = -(-n // devices) * devices
    padded = None if padded_n == n else torch.empty(padded_n, dtype=t.dtype, device=t.device)
    return padded, torch.empty(padded_n // devices, dtype=t.dtype, device=t.device)
