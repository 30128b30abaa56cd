"""Two DDP workloads trained several ways: NCCL, ringreduce's comm hook, the "ringreduce"
torch.distributed backend and torch's own comm hooks; loss curves, time to a target loss
and samples/s side by side.

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
Run only when asked for, torch's own comm hooks on the NCCL (gloo) group, what a user
already has:
  nccl-hook  ``default_hooks.allreduce_hook``: a Python hook as ringreduce's is, the
             baseline for the hook's host time
  bf16-hook  ``default_hooks.bf16_compress_hook``: the bucket all-reduced in bfloat16
  fp16-hook  ``default_hooks.fp16_compress_hook``: the bucket all-reduced in float16
  powersgd   ``powerSGD_hook.powerSGD_hook`` with error feedback and warm start, rank
             ``--powersgd-rank`` (4); the first ``--powersgd-start`` (10) steps all-reduce
             uncompressed, as torch advises (at least 2, for DDP's bucket rebuild after
             step 1; about a tenth of training; no fewer than the learning rate's
             warm-up steps, 10 for the transformer), so at the default ``--warmup 10``
             every timed step is compressed
In the hook modes every hook call of the timed steps is timed on the host: the
autograd thread's time inside the hook until it returns its Future (``hook_us``).
A process initialises its default group once, so when ``backend`` is asked for, the
default group is created as "cpu:gloo,cuda:ringreduce" ("cpu:ringreduce" on CPU) and
the other modes run on ``dist.new_group(backend="nccl")`` (gloo on CPU); otherwise the
default group is plain NCCL/gloo and serves them directly. The backend's
engine takes no arguments, so ``--machines``/``--min-bytes`` reach it as
RINGREDUCE_MACHINES/RINGREDUCE_MIN_BYTES (the hook's Communicator gets them directly).
Learning: the data come from a fixed hidden teacher (dlrm_model.py, transformer_model.py),
so the loss falls towards a known floor, the teacher's own loss on the same data. Each
mode reports its final loss (the mean of the last ``FINAL_STEPS`` steps' losses) and the
step, and the seconds at its timed step rate, at which its loss first reaches
``--target-loss`` (default: a third (dlrm) or 0.8 (transformer) of the way from the
first step's loss, the same in every mode, to the floor; workloads.py says why).
``--seeds N`` trains nccl again at seeds seed+1 .. seed+N-1, so the seed-to-seed spread
of those figures says how far apart two modes must be to differ.
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
    python benchmarks/dlrm.py --device cpu --rows 2000 --batch 64 --steps 40 --warmup 4 \\
        --modes nccl,bf16-hook,powersgd --powersgd-start 4 --seeds 3
    python benchmarks/dlrm.py --device cpu --model transformer --layers 2 --width 64 \\
        --steps 12 --warmup 2
"""

from __future__ import annotations

import dataclasses
import math
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
from .workloads import DEFAULT_BATCH, DEFAULT_LR, MODELS, TARGET_FRACTION, Workload, workload

MODES = ("nccl", "hook", "backend")
"""The modes run by default."""
TORCH_HOOKS: dict[str, Callable[[dist.ProcessGroup, dist.GradBucket], Any]] = {
    "nccl-hook": default_hooks.allreduce_hook,
    "bf16-hook": default_hooks.bf16_compress_hook,
    "fp16-hook": default_hooks.fp16_compress_hook,
}
"""torch's stateless hooks, each on the plain group."""
EXTRA_MODES = (*TORCH_HOOKS, "powersgd")
"""Accepted, run only when asked for."""
FINAL_STEPS = 5
"""The final loss is the mean over this many last steps: one batch's loss is noisy."""


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
    model: str = "dlrm"
    transformer: TransformerSpec = dataclasses.field(default_factory=TransformerSpec)
    powersgd_rank: int = 4  # PowerSGDState(matrix_approximation_rank=...)
    powersgd_start: int = 10  # PowerSGDState(start_powerSGD_iter=...)
    seeds: int = 1  # nccl also runs at seed + 1 .. seed + seeds - 1
    target_loss: float | None = None

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


@dataclasses.dataclass(frozen=True)
class ModeRun:
    mode: str
    losses: list[float]  # mean over ranks, every step (warm-up included)
    timed_steps: int
    seconds: float  # the slowest rank's
    samples_per_s: float
    engine_calls: int  # collectives the ringreduce engine ran (0 without an engine)
    timed_engine_calls: int  # of those, in the timed steps
    engine: str  # the engine's configuration ("" without an engine)
    hook_us: tuple[float, ...] = ()  # host time of each hook call in the timed steps
    seed: int = 0
    floor: float = 0.0  # the teacher's loss on this seed's batches, mean over ranks
    final_loss: float = 0.0  # mean of the last FINAL_STEPS losses
    target_loss: float = 0.0  # the run's one target, the same for every mode and seed
    steps_to_target: int | None = None  # first step whose loss <= target; None: never
    seconds_to_target: float | None = None  # those steps at the timed seconds per step


def synchronized(device: torch.device, group: dist.ProcessGroup) -> float:
    """The host clock once every rank's queued work is done (a tiny all-reduce lines
    the ranks up, so no rank's timing starts while another is still warming up)."""
    flag = torch.zeros(1, device=device)
    dist.all_reduce(flag, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def train_mode(mode: str, opts: Options, seed: int, work: Workload, batches: list[Any],
               groups: Groups, device: torch.device) -> ModeRun:
    """Train a fresh model from ``seed`` for ``len(batches)`` steps with one mode's
    all-reduce."""
    cuda = device.type == "cuda"
    ddp = DDP(work.build(seed).to(device),
              device_ids=[device] if cuda else None, bucket_cap_mb=opts.bucket_mb,
              process_group=groups.ringreduce if mode == "backend" else groups.plain)
    comm = engine(mode, opts, groups, device)
    calls_before = calls_timed = comm.op_number if comm else 0
    clock = HookClock()
    register_hook(ddp, mode, opts, groups.plain, comm, clock)
    optimizer, schedule = work.optimizer(ddp.parameters(), opts.lr)
    losses = torch.zeros(len(batches), device=device)
    start = 0.0
    try:
        for step, batch in enumerate(batches):
            if step == opts.warmup:
                start = synchronized(device, groups.plain)
                calls_timed = comm.op_number if comm else 0
                clock.on = True
            losses[step] = work.step(ddp, batch, optimizer, schedule)
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
    timed, sec, mean = opts.steps - opts.warmup, float(seconds.item()), (losses / world).tolist()
    return ModeRun(mode, mean, timed, sec, timed * opts.batch * world / sec, calls,
                   timed_calls, described, tuple(clock.times_us), seed=seed,
                   final_loss=sum(mean[-FINAL_STEPS:]) / len(mean[-FINAL_STEPS:]))


def register_hook(ddp: DDP, mode: str, opts: Options, plain: dist.ProcessGroup,
                  comm: ringreduce.Communicator | None, clock: HookClock) -> None:
    """The mode's comm hook, timed by ``clock``; nccl and backend have none."""
    if mode == "hook":
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
    """Every mode of ``opts`` at ``opts.seed``, then nccl at each further seed, inside an
    initialised process group; each run carries its floor and its way to the target."""
    groups, work = make_groups(device), opts.workload()
    refusal = gloo_refusal(opts, work) if device.type == "cpu" else None
    if refusal:
        raise ValueError(refusal)
    runs = []
    for seed, modes in seed_plan(opts):
        batches = work.batches(opts.steps, opts.batch, seed, dist.get_rank(), device)
        floor = mean_over_ranks(work.floor(batches), device, groups.plain)
        for mode in modes:
            run = train_mode(mode, opts, seed, work, batches, groups, device)
            runs.append(dataclasses.replace(run, floor=floor))
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the next mode starts from the same free memory
    target = opts.target_loss or default_target(runs[0], TARGET_FRACTION[opts.model])
    return [reach(run, target) for run in runs]


def gloo_refusal(opts: Options, work: Workload) -> str | None:
    """Why these options cannot run on gloo (CPU), or None. torch's powerSGD_hook waits
    for an all-reduce inside the completion callback of another; gloo runs those
    callbacks on its worker threads, so with two buckets in flight every rank hangs
    (seen on torch 2.13; one bucket a step runs)."""
    cap = int(opts.bucket_mb * 2**20)  # bucket_cap_mb counts MiB
    if "powersgd" not in opts.modes or work.grad_bytes <= cap:
        return None
    return (f"mode powersgd on gloo needs one DDP bucket a step (torch's powerSGD_hook "
            f"hangs gloo with two in flight), but {work.grad_bytes} bytes of gradients "
            f"exceed the bucket cap of {opts.bucket_mb:g} MiB: pass --bucket-mb "
            f"{math.ceil(work.grad_bytes / 2**20)} or more (Options.bucket_mb), or run on CUDA")


def seed_plan(opts: Options) -> list[tuple[int, tuple[str, ...]]]:
    """(seed, modes) in the order they run: every mode at the run's seed first."""
    return [(opts.seed, opts.modes)] + [(opts.seed + k, ("nccl",)) for k in range(1, opts.seeds)]


def mean_over_ranks(value: float, device: torch.device, group: dist.ProcessGroup) -> float:
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total, group=group)  # SUM, then divide: gloo has no AVG
    return float(total.item()) / dist.get_world_size(group)


def default_target(first: ModeRun, fraction: float) -> float:
    """``fraction`` of the way from the first step's loss to the floor. The first step's
    loss is the same in every mode (the same weights on the same batch)."""
    return first.losses[0] - fraction * (first.losses[0] - first.floor)


def reach(run: ModeRun, target: float) -> ModeRun:
    """``run`` with the step at which its loss first was at most ``target``, and that
    many steps at its timed seconds per step (warm-up steps run slower, once)."""
    step = next((i for i, loss in enumerate(run.losses) if loss <= target), None)
    seconds = None if step is None else step * run.seconds / run.timed_steps
    return dataclasses.replace(run, target_loss=target, steps_to_target=step,
                               seconds_to_target=seconds)
