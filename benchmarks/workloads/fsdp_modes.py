"""The FSDP2 benchmark's modes (fsdp_train.py describes each) and the options of one
run; how a mode shards the transformer (the meshes, ``fully_shard`` per block) and routes
its collectives through ringreduce (``attach``). fsdp_train.py trains with them.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

import ringreduce

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
    hook_feedback: bool | None = None  # the Communicators' error feedback on the wire; None:
    # ringreduce's default (Config.hook_feedback)

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
                                       min_bytes=opts.min_bytes,
                                       hook_feedback=opts.hook_feedback)
        ringreduce.fsdp.apply(model, comm, wire=mode.wire)
        return [comm]
    # The shard group is one machine's devices, the replicate group one device of every
    # machine: each Communicator is told its own topology (RINGREDUCE_MACHINES, which
    # emulate.py exports for the world, would split the shard group too).
    shard = ringreduce.Communicator(meshes.hsdp.get_group("shard"), machines=1,
                                    min_bytes=opts.min_bytes, hook_feedback=opts.hook_feedback)
    replicate = ringreduce.Communicator(meshes.hsdp.get_group("replicate"),
                                        machines=opts.machines, min_bytes=opts.min_bytes,
                                        hook_feedback=opts.hook_feedback)
    ringreduce.fsdp.apply(model, shard, wire=mode.wire, replicate=replicate)
    return [shard, replicate]
