"""Two DDP workloads trained three ways: NCCL, ringreduce's comm hook, and the
"ringreduce" torch.distributed backend; loss curves and samples/s side by side.

The workloads (``--model``); every mode trains a model built from the same seed on the
same batches:
  dlrm         (the default; dlrm_model.py) 8 embedding tables x 125,000 rows x 32,
               128 MB of fp32 embedding gradients in a few large buckets, so the
               all-reduce's bandwidth, not the arithmetic, sets the step time
  transformer  (transformer_model.py) a decoder-only language model, 24 blocks x width
               512 by default (320 MB of gradients, six weight matrices a block): with
               many blocks DDP calls the all-reduce over a hundred times a step, so its
               per-call host time shows (the table's calls/step: 146 for 48 x 512 at
               4 MB buckets, 74 for 24 x 512). Buckets below ``min_bytes`` (2 MiB by
               default) take NCCL's own all-reduce (the documented fast path), so keep
               ``--bucket-mb`` at 4 or more for the hierarchy to serve them
Samples are DLRM samples or transformer sequences (``--seq`` tokens each).

Modes (``--modes``, run one after another in one process lifetime):
  nccl     plain DDP on the process group's own backend (NCCL; gloo with --device cpu)
  hook     DDP + ``register_comm_hook(ringreduce.Communicator(...), ringreduce.ddp_hook)``
  backend  DDP on a process group of the "ringreduce" backend, no hook
  nccl-hook  (not run unless asked for) DDP + torch's own ``allreduce_hook`` on NCCL: a
           Python comm hook as ringreduce's is, the baseline for the hook's host time
In the hook modes every hook call of the timed steps is timed on the host: the
autograd thread's time inside the hook until it returns its Future (``hook_us``).
A process initialises its default group once, so when ``backend`` is asked for, the
default group is created as "cpu:gloo,cuda:ringreduce" ("cpu:ringreduce" on CPU) and
the nccl and hook modes run on ``dist.new_group(backend="nccl")`` (gloo on CPU);
otherwise the default group is plain NCCL/gloo and serves them directly. The backend's
engine takes no arguments, so ``--machines``/``--min-bytes`` reach it as
RINGREDUCE_MACHINES/RINGREDUCE_MIN_BYTES (the hook's Communicator gets them directly).
Timing: steps after ``--warmup``, host clock between two device synchronisations;
samples/s counts the global batch; the slowest rank's time counts. calls/step counts
the engine's calls in the timed steps only: DDP reduces the first step in one bucket
and buckets by ``--bucket-mb`` from the second step on.

    torchrun --nproc-per-node 4 benchmarks/dlrm.py --modes nccl,hook,backend --json d.json
    torchrun --nproc-per-node 4 benchmarks/dlrm.py --model transformer --layers 48 \\
        --width 512 --bucket-mb 4 --modes nccl,hook,backend
    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 --physical-gpus 2 \\
        --script benchmarks/dlrm.py -- --modes nccl,hook,backend --plot dlrm.png
    python benchmarks/dlrm.py --device cpu --rows 2000 --batch 64 --steps 12 --warmup 2
    python benchmarks/dlrm.py --device cpu --model transformer --layers 2 --width 64 \\
        --steps 12 --warmup 2
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

from ..integrations.backend import RingReduceGroup
from .dlrm_model import Spec
from .transformer_model import TransformerSpec
from .workloads import DEFAULT_BATCH, DEFAULT_LR, MODELS, Workload, workload

MODES = ("nccl", "hook", "backend")
"""The modes run by default."""
EXTRA_MODES = ("nccl-hook",)
"""Accepted, run only when asked for."""


@dataclasses.dataclass(frozen=True)
class Options:
    """One run; the same on every rank. ``spec`` shapes the dlrm model, ``transformer``
    the transformer; ``batch`` and ``lr`` left at 0 become the model's defaults."""

    modes: tuple[str, ...] = MODES
    spec: Spec = dataclasses.field(default_factory=Spec)
    batch: int = 0  # per rank; 0: DEFAULT_BATCH[model]
    steps: int = 60
    warmup: int = 10
    lr: float = 0.0  # plain SGD; 0: DEFAULT_LR[model]
    seed: int = 0
    bucket_mb: float = 25.0  # DDP's default bucket cap
    machines: int | None = None  # Communicator(machines=...); None: from host ids
    min_bytes: int | None = None  # Communicator(min_bytes=...); None: its default
    model: str = "dlrm"
    transformer: TransformerSpec = dataclasses.field(default_factory=TransformerSpec)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"Options(model={self.model!r}): use one of {', '.join(MODELS)}")
        if self.batch < 0 or self.lr < 0:
            raise ValueError(f"Options(batch={self.batch}, lr={self.lr}): need batch >= 0 "
                             "and lr >= 0 (0: the model's default)")
        # Frozen: the defaults are filled in once, here, so every reader sees real values.
        if self.batch == 0:
            object.__setattr__(self, "batch", DEFAULT_BATCH[self.model])
        if self.lr == 0:
            object.__setattr__(self, "lr", DEFAULT_LR[self.model])

    def workload(self) -> Workload:
        """The chosen model's build, batches and loss (workloads.py)."""
        return workload(self.model, self.spec, self.transformer)


@dataclasses.dataclass(frozen=True)
class Groups:
    """``plain``: NCCL/gloo, for the nccl and hook modes; ``ringreduce``: the default
    group when it was created with the ringreduce backend, else None."""

    plain: dist.ProcessGroup
    ringreduce: RingReduceGroup | None


def make_groups(device: torch.device) -> Groups:
    world = dist.group.WORLD
    assert world is not None, "the benchmark's ranks initialised torch.distributed"
    if not isinstance(world, RingReduceGroup):
        return Groups(world, None)
    return Groups(dist.new_group(backend="nccl" if device.type == "cuda" else "gloo"), world)


@dataclasses.dataclass(frozen=True)
class ModeRun:
    mode: str
    losses: list[float]  # mean over ranks, every step (warm-up included)
    timed_steps: int
    seconds: float  # the slowest rank's
    samples_per_s: float
    engine_calls: int  # collectives the ringreduce engine ran (0 in nccl mode)
    timed_engine_calls: int  # of those, in the timed steps
    engine: str  # the engine's configuration ("" in nccl mode)
    hook_us: tuple[float, ...] = ()  # host time of each hook call in the timed steps


def synchronized(device: torch.device, group: dist.ProcessGroup) -> float:
    """The host clock once every rank's queued work is done (a tiny all-reduce lines
    the ranks up, so no rank's timing starts while another is still warming up)."""
    flag = torch.zeros(1, device=device)
    dist.all_reduce(flag, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def train_mode(mode: str, opts: Options, work: Workload, batches: list[Any], groups: Groups,
               device: torch.device) -> ModeRun:
    """Train a fresh model for ``len(batches)`` steps with one mode's all-reduce."""
    cuda = device.type == "cuda"
    ddp = DDP(work.build(opts.seed).to(device),
              device_ids=[device] if cuda else None, bucket_cap_mb=opts.bucket_mb,
              process_group=groups.ringreduce if mode == "backend" else groups.plain)
    comm = engine(mode, opts, groups, device)
    calls_before = calls_timed = comm.op_number if comm else 0
    clock = HookClock()
    if mode == "hook":
        ddp.register_comm_hook(comm, clock.wrap(ringreduce.ddp_hook))
    elif mode == "nccl-hook":
        ddp.register_comm_hook(groups.plain, clock.wrap(default_hooks.allreduce_hook))
    sgd = torch.optim.SGD(ddp.parameters(), lr=opts.lr)
    losses = torch.zeros(len(batches), device=device)
    start = 0.0
    try:
        for step, batch in enumerate(batches):
            if step == opts.warmup:
                start = synchronized(device, groups.plain)
                calls_timed = comm.op_number if comm else 0
                clock.on = True
            sgd.zero_grad()
            loss = work.loss(ddp, batch)
            loss.backward()
            sgd.step()
            losses[step] = loss.detach()
        seconds = torch.tensor([synchronized(device, groups.plain) - start], device=device)
        calls, timed_calls, described = (
            (comm.op_number - calls_before, comm.op_number - calls_timed, comm.describe())
            if comm else (0, 0, ""))
    finally:
        if comm is not None and mode == "hook":
            comm.close()
    world = dist.get_world_size(groups.plain)
    dist.all_reduce(losses, group=groups.plain)  # SUM, then divide: gloo has no AVG
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=groups.plain)
    timed, sec = opts.steps - opts.warmup, float(seconds.item())
    return ModeRun(mode, (losses / world).tolist(), timed, sec,
                   timed * opts.batch * world / sec, calls, timed_calls, described,
                   tuple(clock.times_us))


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
    (built on first use and kept by the group), or None for nccl."""
    if mode == "hook":
        return ringreduce.Communicator(groups.plain, machines=opts.machines,
                                       min_bytes=opts.min_bytes)
    if mode == "backend":
        if groups.ringreduce is None:
            raise ValueError("mode 'backend' needs the default process group created with "
                             "the ringreduce backend: run dlrm.py with 'backend' in --modes, "
                             "or dist.init_process_group('cpu:gloo,cuda:ringreduce') first")
        return groups.ringreduce.communicator(device)
    return None


def run_modes(opts: Options, device: torch.device) -> list[ModeRun]:
    """Every mode of ``opts`` in turn, inside an initialised process group."""
    groups, work = make_groups(device), opts.workload()
    batches = work.batches(opts.steps, opts.batch, opts.seed, dist.get_rank(), device)
    runs = []
    for mode in opts.modes:
        runs.append(train_mode(mode, opts, work, batches, groups, device))
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next mode starts from the same free memory
    return runs
