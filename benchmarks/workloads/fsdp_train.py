"""FSDP2 training of the transformer workload (transformer_model.py) six ways, for
benchmarks/fsdp.py: plain FSDP2 and native HSDP on the process group's own backend,
and both with ringreduce's reduce-scatter (FSDP2) or replicate all-reduce (HSDP),
exact and with an int8 rail. Every mode trains a model built from the same seed on the
same batches per rank, with the same Adam and warm-up (workloads.py).

Modes (``MODES``), run in sequence in one process set: each builds its model,
optimizer and communicators fresh, trains every step, is checked and closed before the
next starts:
  fsdp-nccl     ``fully_shard`` on every Block, then the root, over the world (1-D
                mesh) on the default group (NCCL; gloo on CPU)
  hsdp-nccl     native HSDP: the same on a 2-D mesh (replicate = machines, shard = a
                machine's devices; machines are contiguous ranks)
  rr            fsdp-nccl + ``ringreduce.fsdp.apply(model, comm)``: the gradient
                reduce-scatter inside the machine, then along the rail, in fp32
  rr-int8       rr with ``wire="int8"``: the rail hop quantized, error feedback per module
  rr-hsdp       torch's "custom HSDP": ``fully_shard(mesh=mesh["shard"])`` and
                ``apply(model, shard_comm, replicate=replicate_comm)``: the replicate
                all-reduce through ringreduce (M machines x 1), fp32; the shard group is
                one machine, so its reduce-scatter takes NCCL's own route (fsdp.py)
  rr-hsdp-int8  rr-hsdp with ``wire="int8"`` on the replicate all-reduce (the shard
                group has no rail, so apply keeps its reduce-scatter exact)
Checks, each a RuntimeError naming the mode: every loss finite; a ringreduce mode's
every Communicator made at least one call per step; HSDP modes end with bit-identical
parameters on every replica (a checksum of each shard, all-gathered over the replicate
group). 1-D FSDP keeps each element on one rank only: there is nothing to compare.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import ringreduce

from .dlrm import FINAL_STEPS, ModeRun, default_target, mean_over_ranks, reach, synchronized
from .dlrm_model import Spec
from .transformer_model import Block, TransformerSpec
from .workloads import DEFAULT_BATCH, DEFAULT_LR, Workload, workload


@dataclasses.dataclass(frozen=True)
class Mode:
    """``hsdp``: replicas across machines; ``ringreduce``: through ringreduce.fsdp.apply;
    ``wire``: the rail's quantized format (None: exact)."""

    hsdp: bool
    ringreduce: bool
    wire: str | None = None


MODES = {
    "fsdp-nccl": Mode(hsdp=False, ringreduce=False),
    "hsdp-nccl": Mode(hsdp=True, ringreduce=False),
    "rr": Mode(hsdp=False, ringreduce=True),
    "rr-int8": Mode(hsdp=False, ringreduce=True, wire="int8"),
    "rr-hsdp": Mode(hsdp=True, ringreduce=True),
    "rr-hsdp-int8": Mode(hsdp=True, ringreduce=True, wire="int8"),
}
NCCL_MODES = ("fsdp-nccl", "hsdp-nccl")
"""The modes on the default group's own collectives (NCCL_ALGO applies to them)."""
REFERENCE = "fsdp-nccl"
"""The mode repeated at further seeds, whose first loss sets the default target."""
TARGET_FRACTION = 0.75
"""The default target loss: this fraction of the way from the first step's loss to the
floor (floor + 0.25 x (first - floor)). The DDP benchmark's 24 x 512 transformer got
0.8 of the way at steps 19-21 of 60 (workloads.py), so 0.75 falls inside the timed steps
of the default 60 without being reached during warm-up."""
DEFAULT_SPEC = TransformerSpec(layers=6)
"""6 blocks x width 512, vocab 4096: 92 MB (88 MiB) of fp32 gradients in 7 FSDP modules
(6 blocks of 12.6 MB, the root's 17 MB of embeddings and output layer). fsdp-nccl at
2 x 2 capped at 10 Gbit/s a machine (1.25 GB/s): NCCL's ring crosses each machine's
link once per direction with 3/4 of every all-gather and reduce-scatter, so a step
sends 0.75 x (92 forward gather + 75.5 backward gather of the resharded blocks + 92
reduce-scatter) = 195 MB a machine, 0.16 s at the link rate, about 0.2 s with NCCL's
socket efficiency and the short arithmetic (8 x 128 tokens a rank). Per machine and
step, hsdp-nccl and rr-hsdp send 92 MB (each rank all-reduces its 46 MB shard with one
peer: 0.07 s), rr 172 MB (the reduce-scatter's half crosses once), rr-int8 about 138,
rr-hsdp-int8 about 25."""


@dataclasses.dataclass(frozen=True)
class Options:
    """One run; the same on every rank. ``machines``: virtual machines of contiguous
    ranks (the HSDP mesh's replicate dimension, ringreduce's ``machines``);
    ``target_loss`` None: TARGET_FRACTION of the way from fsdp-nccl's first loss to the
    floor."""

    modes: tuple[str, ...] = tuple(MODES)
    transformer: TransformerSpec = DEFAULT_SPEC
    batch: int = DEFAULT_BATCH["transformer"]  # sequences per rank
    steps: int = 60
    warmup: int = 10
    lr: float = DEFAULT_LR["transformer"]
    seed: int = 0
    seeds: int = 1  # fsdp-nccl also runs at seed + 1 .. seed + seeds - 1
    reshard_after_forward: bool = True  # FSDP's default
    target_loss: float | None = None
    machines: int = 1
    min_bytes: int | None = None  # the Communicators' min_bytes; None: ringreduce's default

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"Options(modes={self.modes}): unknown {unknown or '(none)'}; "
                             f"use some of {', '.join(MODES)}")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"Options(warmup={self.warmup}, steps={self.steps}): need 0 <= "
                             "warmup < steps (the steps after warm-up are timed)")
        if self.batch < 1 or self.lr <= 0 or self.machines < 1:
            raise ValueError(f"Options(batch={self.batch}, lr={self.lr}, machines="
                             f"{self.machines}): each must be positive")
        if self.seeds < 1 or (self.seeds > 1 and REFERENCE not in self.modes):
            raise ValueError(f"Options(seeds={self.seeds}): at least 1, and more repeat "
                             f"{REFERENCE}: add it to the modes")
        if self.target_loss is not None and self.target_loss <= 0:
            raise ValueError(f"Options(target_loss={self.target_loss}): must be positive; "
                             "None for the default")

    def workload(self) -> Workload:
        return workload("transformer", Spec(), self.transformer)


@dataclasses.dataclass(frozen=True)
class Meshes:
    """The world as a 1-D mesh (FSDP2) and as (replicate, shard) = (machines, devices)."""

    world: DeviceMesh
    hsdp: DeviceMesh

    def of(self, mode: Mode) -> DeviceMesh:
        """Native HSDP shards on the 2-D mesh; custom HSDP on its shard dimension alone
        (ringreduce then all-reduces across replicas)."""
        if not mode.hsdp:
            return self.world
        return self.hsdp["shard"] if mode.ringreduce else self.hsdp


def make_meshes(device: torch.device, machines: int) -> Meshes:
    """Both meshes, once per process: each mesh dimension is a process group, and groups
    made per mode would pile up NCCL communicators."""
    world = dist.get_world_size()
    if world % machines:
        raise ValueError(f"{world} ranks do not split into {machines} machines of equal "
                         "size; pass --machines that divides the world")
    return Meshes(init_device_mesh(device.type, (world,)),
                  init_device_mesh(device.type, (machines, world // machines),
                                   mesh_dim_names=("replicate", "shard")))


def sharded(model: nn.Module, mesh: DeviceMesh, reshard: bool) -> nn.Module:
    """``fully_shard`` on each transformer block, then on the root (embeddings, final
    norm, output layer): one reduce-scatter per block and one for the root a step."""
    for block in [m for m in model.modules() if isinstance(m, Block)]:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def attach(mode: Mode, model: nn.Module, meshes: Meshes,
           opts: Options) -> list[ringreduce.Communicator]:
    """Route the mode's collectives through ringreduce; returns the Communicators, built
    here (so their calls can be counted and they can be closed with the mode)."""
    if not mode.ringreduce:
        return []
    if not mode.hsdp:
        comm = ringreduce.Communicator(meshes.world.get_group(), machines=opts.machines,
                                       min_bytes=opts.min_bytes)
        ringreduce.fsdp.apply(model, comm, wire=mode.wire)
        return [comm]
    # The shard group is one machine's devices, the replicate group one device of every
    # machine: each Communicator is told its own topology (RINGREDUCE_MACHINES, which
    # emulate.py exports for the world, would split the shard group too).
    shard = ringreduce.Communicator(meshes.hsdp.get_group("shard"), machines=1,
                                    min_bytes=opts.min_bytes)
    replicate = ringreduce.Communicator(meshes.hsdp.get_group("replicate"),
                                        machines=opts.machines, min_bytes=opts.min_bytes)
    ringreduce.fsdp.apply(model, shard, wire=mode.wire, replicate=replicate)
    return [shard, replicate]


@dataclasses.dataclass(frozen=True)
class Steps:
    """One mode's training: every step's loss (this rank's), the timed seconds (this
    rank's), and per Communicator its calls in all steps and in the timed ones."""

    losses: torch.Tensor
    seconds: float
    calls: list[int]
    timed_calls: list[int]


def train(model: nn.Module, work: Workload, batches: list[Any], opts: Options,
          device: torch.device, comms: list[ringreduce.Communicator]) -> Steps:
    """Adam over ``batches``; the host clock between two synchronisations around the
    steps after warm-up, nothing synchronised in between (losses stay on the device)."""
    optimizer, schedule = work.optimizer(model.parameters(), opts.lr)
    world = dist.group.WORLD
    assert world is not None, "the benchmark's ranks initialised torch.distributed"
    losses = torch.zeros(len(batches), device=device)
    built = [c.op_number for c in comms]  # after a CUDA construction probe's calls
    at_start, start = built, 0.0
    for step, batch in enumerate(batches):
        if step == opts.warmup:
            start = synchronized(device, world)
            at_start = [c.op_number for c in comms]
        losses[step] = work.step(model, batch, optimizer, schedule)
    seconds = synchronized(device, world) - start
    return Steps(losses, seconds, [c.op_number - b for c, b in zip(comms, built, strict=True)],
                 [c.op_number - a for c, a in zip(comms, at_start, strict=True)])


def check_routed(name: str, comms: list[ringreduce.Communicator], steps: Steps,
                 count: int) -> None:
    """A ringreduce mode whose Communicator made fewer calls than steps did not train
    through ringreduce (a hook not installed, or FSDP reducing on its own)."""
    for comm, calls in zip(comms, steps.calls, strict=True):
        if calls < count:
            raise RuntimeError(f"{name}: the Communicator over {comm.topology.world_size} "
                               f"ranks made {calls} calls in {count} steps; every FSDP "
                               "module's backward should have called it once a step")


def check_replicas(name: str, model: nn.Module, meshes: Meshes) -> None:
    """Every replica's shards bit-identical to the first's: per parameter, the integer
    sum of its float32 bit patterns (order-free, so any difference in a few elements
    shows), all-gathered over the replicate group. The verdict is the world's, so every
    rank raises, not only those of the replicate group that differs."""
    group = meshes.hsdp.get_group("replicate")
    sums = torch.stack([local(p).view(torch.int32).to(torch.int64).sum()
                        for p in model.parameters()])
    gathered = [torch.empty_like(sums) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, sums, group=group)
    differ = [i for i, g in enumerate(gathered) if not torch.equal(g, gathered[0])]
    verdict = torch.tensor([len(differ)], device=sums.device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MAX)
    if verdict.item():
        mine = f"here replicas {differ} differ from replica 0" if differ else \
            "this rank's replicas agree"
        raise RuntimeError(f"{name}: the final parameters differ across replicas "
                           f"(rank {dist.get_rank()}: {mine}, per-parameter checksums "
                           f"{[g.tolist() for g in gathered]})")


def local(p: nn.Parameter) -> torch.Tensor:
    """This rank's shard of an FSDP2 parameter (a DTensor)."""
    return (p.to_local() if isinstance(p, DTensor) else p).detach()


def train_mode(name: str, opts: Options, seed: int, work: Workload, batches: list[Any],
               meshes: Meshes, device: torch.device) -> ModeRun:
    """A fresh model from ``seed``, sharded and routed as mode ``name`` says, trained on
    ``batches`` and checked; the losses are the mean over ranks."""
    mode = MODES[name]
    model = sharded(work.build(seed).to(device), meshes.of(mode), opts.reshard_after_forward)
    comms = attach(mode, model, meshes, opts)
    try:
        steps = train(model, work, batches, opts, device, comms)
        check_routed(name, comms, steps, opts.steps)
        if mode.hsdp:
            check_replicas(name, model, meshes)
        engine = " | ".join(c.describe() for c in comms)
    finally:
        for comm in comms:
            comm.close()
    return summarize(name, seed, steps, engine, opts)


def summarize(name: str, seed: int, steps: Steps, engine: str, opts: Options) -> ModeRun:
    """The mean loss over ranks, the slowest rank's seconds; refuses non-finite losses."""
    world = dist.get_world_size()
    losses, seconds = steps.losses, torch.tensor([steps.seconds], device=steps.losses.device)
    dist.all_reduce(losses)  # SUM, then divide: gloo has no AVG
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    mean = (losses / world).tolist()
    if not all(math.isfinite(x) for x in mean):
        raise RuntimeError(f"{name}: non-finite loss at steps "
                           f"{[i for i, x in enumerate(mean) if not math.isfinite(x)]}: {mean}")
    timed, sec = opts.steps - opts.warmup, float(seconds.item())
    return ModeRun(name, mean, timed, sec, timed * opts.batch * world / sec,
                   sum(steps.calls), sum(steps.timed_calls), engine, seed=seed,
                   final_loss=sum(mean[-FINAL_STEPS:]) / len(mean[-FINAL_STEPS:]))


def seed_plan(opts: Options) -> list[tuple[int, tuple[str, ...]]]:
    """(seed, modes) in the order they run: every mode at the run's seed first."""
    return [(opts.seed, opts.modes)] + \
        [(opts.seed + k, (REFERENCE,)) for k in range(1, opts.seeds)]


def run_modes(opts: Options, device: torch.device) -> list[ModeRun]:
    """Every mode of ``opts`` at ``opts.seed``, then fsdp-nccl at each further seed,
    inside an initialised process group; each run carries its floor and its way to the
    one target of the run."""
    meshes, work = make_meshes(device, opts.machines), opts.workload()
    world = dist.group.WORLD
    assert world is not None, "the benchmark's ranks initialised torch.distributed"
    runs = []
    for seed, modes in seed_plan(opts):
        batches = work.batches(opts.steps, opts.batch, seed, dist.get_rank(), device)
        floor = mean_over_ranks(work.floor(batches), device, world)
        for name in modes:
            run = train_mode(name, opts, seed, work, batches, meshes, device)
            runs.append(dataclasses.replace(run, floor=floor))
            if device.type == "cuda":
                gc.collect()  # FSDP's hooks hold the model in reference cycles
                torch.cuda.empty_cache()  # the next mode starts from the same free memory
    first = next((r for r in runs if r.mode == REFERENCE), runs[0])
    target = opts.target_loss or default_target(first, TARGET_FRACTION)
    return [reach(run, target) for run in runs]
