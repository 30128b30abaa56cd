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
           (the wire from RINGREDUCE_WIRE; ``hook-<wire>`` for every wire: ``hook-int8``,
           ``hook-int4``, ``hook-fp8``, ``hook-bf16``, run when asked for: that wire, so
           formats compare in one process set)
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
mode reports its final loss (the mean of the last ``FINAL_STEPS`` steps' losses), the mean
of the last ``LAST_STEPS``, its loss on held-out batches (``VALID_STEPS`` batches from
``VALID_SEED``, the same for every mode and seed) after training, and the
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
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .dlrm_modes import Groups, HookClock, Options, engine, make_groups, register_hook
from .workloads import TARGET_FRACTION, Workload

FINAL_STEPS = 5
"""The final loss is the mean over this many last steps: one batch's loss is noisy."""
LAST_STEPS = 100
"""``last_loss`` is the mean over this many last steps (issue 50's measure of a wire)."""
VALID_STEPS = 20
VALID_SEED = 1_000_003
"""Held-out batches: drawn from this seed, the same for every mode and training seed, so
validation losses of different seeds compare on the same data."""


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
    last_loss: float = 0.0  # mean of the last LAST_STEPS losses
    validation: float = 0.0  # mean loss on the held-out batches after training, over ranks


def synchronized(device: torch.device, group: dist.ProcessGroup) -> float:
    """The host clock once every rank's queued work is done (a tiny all-reduce lines
    the ranks up, so no rank's timing starts while another is still warming up)."""
    flag = torch.zeros(1, device=device)
    dist.all_reduce(flag, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def evaluate(work: Workload, model: torch.nn.Module, batches: list[Any]) -> torch.Tensor:
    """The mean loss of ``model`` over ``batches``, without gradients (on the device)."""
    with torch.no_grad():
        return torch.stack([work.loss(model, batch) for batch in batches]).mean()


def train_mode(mode: str, opts: Options, seed: int, work: Workload, batches: list[Any],
               groups: Groups, device: torch.device, held_out: list[Any]) -> ModeRun:
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
            if opts.read_loss:
                losses[step].item()  # the host waits for this step (--read-loss)
        seconds = torch.tensor([synchronized(device, groups.plain) - start], device=device)
        validation = evaluate(work, ddp.module, held_out).reshape(1)
        calls, timed_calls, described = (
            (comm.op_number - calls_before, comm.op_number - calls_timed, comm.describe())
            if comm else (0, 0, ""))
    finally:
        if comm is not None and mode != "backend":  # the backend's engine is the group's
            comm.close()
    world = dist.get_world_size(groups.plain)
    dist.all_reduce(losses, group=groups.plain)  # SUM, then divide: gloo has no AVG
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=groups.plain)
    dist.all_reduce(validation, group=groups.plain)
    timed, sec, mean = opts.steps - opts.warmup, float(seconds.item()), (losses / world).tolist()
    return ModeRun(mode, mean, timed, sec, timed * opts.batch * world / sec, calls,
                   timed_calls, described, tuple(clock.times_us), seed=seed,
                   final_loss=sum(mean[-FINAL_STEPS:]) / len(mean[-FINAL_STEPS:]),
                   last_loss=sum(mean[-LAST_STEPS:]) / len(mean[-LAST_STEPS:]),
                   validation=float(validation.item()) / world)


def run_modes(opts: Options, device: torch.device) -> list[ModeRun]:
    """Every mode of ``opts`` at ``opts.seed``, then nccl at each further seed, inside an
    initialised process group; each run carries its floor and its way to the target."""
    groups, work = make_groups(device), opts.workload()
    refusal = gloo_refusal(opts, work) if device.type == "cpu" else None
    if refusal:
        raise ValueError(refusal)
    runs = []
    held_out = work.batches(VALID_STEPS, opts.batch, VALID_SEED, dist.get_rank(), device)
    for seed, modes in seed_plan(opts):
        began = time.perf_counter()
        batches = work.batches(opts.steps, opts.batch, seed, dist.get_rank(), device)
        floor = mean_over_ranks(work.floor(batches), device, groups.plain)
        phase(f"seed {seed}: batches and floor in {time.perf_counter() - began:.1f} s")
        for mode in modes:
            began = time.perf_counter()
            run = train_mode(mode, opts, seed, work, batches, groups, device, held_out)
            runs.append(dataclasses.replace(run, floor=floor))
            phase(f"seed {seed} {mode}: {time.perf_counter() - began:.1f} s in all, "
                  f"{run.seconds:.1f} s timed")
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the next mode starts from the same free memory
    target = opts.target_loss or default_target(runs[0], TARGET_FRACTION[opts.model])
    return [reach(run, target) for run in runs]


def phase(text: str) -> None:
    """Rank 0's wall time of a run's parts, as it goes: where a long run spends the time
    outside its timed steps (and how far one that does not end got)."""
    if dist.get_rank() == 0:
        print(f"# {text}", flush=True)


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
