"""The references every row is measured against, in the same processes.

* ``flat``: the process group's own collective (NCCL's all-reduce on GPUs, gloo's on
  CPU) on the whole group: what a user gets without ringreduce.
* ``two_level``: the hierarchy as a user writes it with torch.distributed in ten
  lines, unpipelined: reduce-scatter inside the machine, all-reduce along the rail
  (the same device index on every machine), all-gather inside the machine; the tensor
  padded to a multiple of the devices per machine. It is what ringreduce's pipeline
  must beat to be worth its code.
* ``wire_ref`` (with a 16-bit ``--wire``): what torch's ``bf16_compress_hook`` (and
  ``fp16_compress_hook``) does to a bucket: cast to the wire dtype, all-reduce it there with
  the process group's collective, cast back. The user's cheapest compressed all-reduce.

NCCL under each algorithm (``NCCL_ALGO``) is one more reference, but NCCL reads the variable
once per process: ``--only-references`` runs under it apart, and benchmark.summary takes the
fastest per row as "NCCL best" (:func:`nccl_algo_label` names each run's).

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


def wire_flat(wire: torch.dtype, op: dist.ReduceOp.RedOpType, avg_by_division: bool,
              world: int, bufs: list[Pair]) -> Reduce:
    """The tensor cast to ``wire``, all-reduced there, cast back (casts timed, as the hook
    pays them). The wire copies are made here, once, so the timed loop measures the
    casts and the collective, not allocation."""
    red = dist.ReduceOp.SUM if avg_by_division else op
    scratch = [torch.empty(t.shape, dtype=wire, device=t.device) for _, t in bufs]

    def run(run_bufs: list[Pair]) -> None:
        works = []
        for (_, t), w in zip(run_bufs, scratch, strict=True):
            w.copy_(t)
            works.append(dist.all_reduce(w, op=red, async_op=len(run_bufs) > 1))
        for work, (_, t), w in zip(works, run_bufs, scratch, strict=True):
            if work is not None:
                work.wait()
            t.copy_(w)
            if avg_by_division:
                divide(t, world)
    return run


def nccl_algo_label(value: str | None) -> str:
    """NCCL_ALGO's all-reduce part, as rows name it: unset -> "default";
    "allreduce:tree;broadcast:ring" -> "tree"; "Ring" -> "ring"."""
    if not value:
        return "default"
    parts = [p.strip() for p in value.split(";") if p.strip()]
    for part in parts:
        name, sep, algos = part.partition(":")
        if sep and name.strip().lower() == "allreduce":
            return algos.strip().lower()
    plain = [p for p in parts if ":" not in p]
    return plain[0].lower() if plain else "default"


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
