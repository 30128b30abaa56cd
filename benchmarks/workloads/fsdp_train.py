"""FSDP2 training of the transformer workload (transformer_model.py) six ways, for
benchmarks/fsdp.py: plain FSDP2 and native HSDP on the process group's own backend,
and both with ringreduce's reduce-scatter (FSDP2) or replicate all-reduce (HSDP),
exact and with an int8 rail. Every mode trains a model built from the same seed on the
same batches per rank, with the same Adam and warm-up (workloads.py).

Modes (``MODES``; they, the options and each mode's sharding and routing are in
fsdp_modes.py), run in sequence in one process set: each builds its model, optimizer
and communicators fresh, trains every step, is checked and closed before the next
starts:
  fsdp-nccl     ``fully_shard`` on every Block, then the root, over the world (1-D
                mesh) on the default group (NCCL; gloo on CPU)
  hsdp-nccl     native HSDP: the same on a 2-D mesh (replicate = machines, shard = a
                machine's devices; machines are contiguous ranks)
  rr            fsdp-nccl + ``ringreduce.fsdp.apply(model, comm)``: the gradient
                reduce-scatter inside the machine, then along the rail, in fp32
  rr-int8       rr with ``wire="int8"``: the rail hop quantized (error feedback per module
                only with Options.hook_feedback: Config.hook_feedback, off by default)
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
from torch.distributed.tensor import DTensor

import ringreduce

from .dlrm import FINAL_STEPS, ModeRun, default_target, mean_over_ranks, reach, synchronized
from .fsdp_modes import (
    MODES,
    REFERENCE,
    TARGET_FRACTION,
    Meshes,
    Options,
    attach,
    make_meshes,
    sharded,
)
from .workloads import Workload


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
