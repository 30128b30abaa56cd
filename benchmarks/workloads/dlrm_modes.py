"""The DDP benchmark's modes (dlrm.py describes each): which there are, the options of
one run, and what a mode adds to DDP: the process group it trains on, its comm hook
(timed on the host) and the ringreduce engine behind the hook or the backend. dlrm.py
trains with them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from ringreduce.integrations.backend import RingReduceGroup

from .dlrm_model import Spec
from .transformer_model import TransformerSpec
from .workloads import DEFAULT_BATCH, DEFAULT_LR, MODELS, Workload, workload

MODES = ("nccl", "hook", "backend")
"""The modes run by default."""
TORCH_HOOKS: dict[str, Callable[[dist.ProcessGroup, dist.GradBucket], Any]] = {
    "nccl-hook": default_hooks.allreduce_hook,
    "bf16-hook": default_hooks.bf16_compress_hook,
    "fp16-hook": default_hooks.fp16_compress_hook,
}
"""torch's stateless hooks, each on the plain group."""
WIRE_HOOKS = {f"hook-{wire}": wire for wire in ("int8", "fp8", "int4", "bf16")}
"""ringreduce's hook with that wire (Communicator(wire=...)), so that formats compare
within one process set; plain ``hook`` takes RINGREDUCE_WIRE (the default: none)."""
EXTRA_MODES = (*TORCH_HOOKS, "powersgd", *WIRE_HOOKS)
"""Accepted, run only when asked for."""


@dataclasses.dataclass(frozen=True)
class Options:
    """One run; the same on every rank. ``spec`` shapes the dlrm model, ``transformer``
    the transformer; ``batch`` and ``lr`` left at 0 become the model's defaults;
    ``target_loss`` None: TARGET_FRACTION[model] of the way from the first loss to the
    floor."""

    modes: tuple[str, ...] = MODES
    spec: Spec = dataclasses.field(default_factory=Spec)
    batch: int = 0  # per rank; 0: DEFAULT_BATCH[model]
    steps: int = 60
    warmup: int = 10
    lr: float = 0.0  # Adam's (workloads.py); 0: DEFAULT_LR[model]
    seed: int = 0
    bucket_mb: float = 25.0  # DDP's default bucket cap
    machines: int | None = None  # Communicator(machines=...); None: from host ids
    min_bytes: int | None = None  # Communicator(min_bytes=...); None: its default
    issuer: str | None = None  # the hook's Communicator(issuer=...); None: its default
    model: str = "dlrm"
    transformer: TransformerSpec = dataclasses.field(default_factory=TransformerSpec)
    powersgd_rank: int = 4  # PowerSGDState(matrix_approximation_rank=...)
    powersgd_start: int = 10  # PowerSGDState(start_powerSGD_iter=...)
    seeds: int = 1  # nccl also runs at seed + 1 .. seed + seeds - 1
    target_loss: float | None = None
    read_loss: bool = False  # the host reads each step's loss, as a loop logging it does

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"Options(model={self.model!r}): use one of {', '.join(MODELS)}")
        if self.batch < 0 or self.lr < 0:
            raise ValueError(f"Options(batch={self.batch}, lr={self.lr}): need batch >= 0 "
                             "and lr >= 0 (0: the model's default)")
        self._check_learning()
        # Frozen: the defaults are filled in once, here, so every reader sees real values.
        if self.batch == 0:
            object.__setattr__(self, "batch", DEFAULT_BATCH[self.model])
        if self.lr == 0:
            object.__setattr__(self, "lr", DEFAULT_LR[self.model])

    def _check_learning(self) -> None:
        if self.powersgd_rank < 1 or self.powersgd_start < 2:
            raise ValueError(f"Options(powersgd_rank={self.powersgd_rank}, powersgd_start="
                             f"{self.powersgd_start}): need rank >= 1 and start >= 2 (with "
                             "error feedback and warm start, torch compresses from step 2 "
                             "on at the earliest, after DDP rebuilt its buckets)")
        if self.seeds < 1 or (self.seeds > 1 and "nccl" not in self.modes):
            raise ValueError(f"Options(seeds={self.seeds}, modes={self.modes}): seeds >= 1, "
                             "and more than one repeats the nccl mode: add nccl to the modes")
        if self.target_loss is not None and self.target_loss <= 0:
            raise ValueError(f"Options(target_loss={self.target_loss}): must be positive; "
                             "None for the default")

    def workload(self) -> Workload:
        """The chosen model's build, batches, loss, optimizer and floor (workloads.py)."""
        return workload(self.model, self.spec, self.transformer)


@dataclasses.dataclass(frozen=True)
class Groups:
    """``plain``: NCCL/gloo, for every mode but backend; ``ringreduce``: the default
    group when it was created with the ringreduce backend, else None."""

    plain: dist.ProcessGroup
    ringreduce: RingReduceGroup | None


def make_groups(device: torch.device) -> Groups:
    world = dist.group.WORLD
    assert world is not None, "the benchmark's ranks initialised torch.distributed"
    if not isinstance(world, RingReduceGroup):
        return Groups(world, None)
    return Groups(dist.new_group(backend="nccl" if device.type == "cuda" else "gloo"), world)


def register_hook(ddp: DDP, mode: str, opts: Options, plain: dist.ProcessGroup,
                  comm: ringreduce.Communicator | None, clock: HookClock) -> None:
    """The mode's comm hook, timed by ``clock``; nccl and backend have none."""
    if mode == "hook" or mode in WIRE_HOOKS:
        ddp.register_comm_hook(comm, clock.wrap(ringreduce.ddp_hook))
    elif mode in TORCH_HOOKS:
        ddp.register_comm_hook(plain, clock.wrap(TORCH_HOOKS[mode]))
    elif mode == "powersgd":
        # Error feedback and warm start are torch's defaults and its advice; spelt out
        # because they are what this mode claims to measure.
        state = powerSGD_hook.PowerSGDState(
            plain, matrix_approximation_rank=opts.powersgd_rank,
            start_powerSGD_iter=opts.powersgd_start, use_error_feedback=True,
            warm_start=True)
        ddp.register_comm_hook(state, clock.wrap(powerSGD_hook.powerSGD_hook))


class HookClock:
    """Times a DDP comm hook's calls on the host (what the autograd thread pays per
    bucket) once ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.times_us: list[float] = []

    def wrap(self, hook: Callable[[Any, dist.GradBucket], Any]) -> Callable[..., Any]:
        # Unannotated on purpose: DDP compares a hook's annotations with the evaluated
        # types, and this module's annotations are strings (hook.py says more).
        def timed(state, bucket):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            fut = hook(state, bucket)
            if self.on:
                self.times_us.append((time.perf_counter() - start) * 1e6)
            return fut

        return timed


def engine(mode: str, opts: Options, groups: Groups,
           device: torch.device) -> ringreduce.Communicator | None:
    """The hook's Communicator (new, on the plain group), the backend's own engine
    (built on first use and kept by the group), or None for the other modes."""
    if mode == "hook" or mode in WIRE_HOOKS:
        return ringreduce.Communicator(groups.plain, machines=opts.machines,
                                       min_bytes=opts.min_bytes, issuer=opts.issuer,
                                       wire=WIRE_HOOKS.get(mode))
    if mode == "backend":
        if groups.ringreduce is None:
            raise ValueError("mode 'backend' needs the default process group created with "
                             "the ringreduce backend: run dlrm.py with 'backend' in --modes, "
                             "or dist.init_process_group('cpu:gloo,cuda:ringreduce') first")
        return groups.ringreduce.communicator(device)
    return None
