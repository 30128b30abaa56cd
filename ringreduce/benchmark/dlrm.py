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

import argparse
import dataclasses
import datetime
import functools
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

from ..integrations.backend import RingReduceGroup
from .dlrm_model import Spec
from .launch import Launch, detect, nccl_variables, run_ranks
from .transformer_model import TransformerSpec
from .workloads import DEFAULT_BATCH, DEFAULT_LR, MODELS, Workload, workload

MODES = ("nccl", "hook", "backend")
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
    if mode == "hook":
        ddp.register_comm_hook(comm, ringreduce.ddp_hook)
    sgd = torch.optim.SGD(ddp.parameters(), lr=opts.lr)
    losses = torch.zeros(len(batches), device=device)
    start = 0.0
    try:
        for step, batch in enumerate(batches):
            if step == opts.warmup:
                start = synchronized(device, groups.plain)
                calls_timed = comm.op_number if comm else 0
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
                   timed * opts.batch * world / sec, calls, timed_calls, described)


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


def table(runs: list[ModeRun]) -> str:
    """mode, steps, samples/s, ratio and max |loss diff| against nccl, final loss, and the
    engine's calls per timed step (DDP's bucket count; "-" in nccl mode, which has no
    engine)."""
    ref = next((r for r in runs if r.mode == "nccl"), None)
    lines = [f"{'mode':<8} {'steps':>5} {'samples/s':>11} {'vs nccl':>7} {'final loss':>10} "
             f"{'max|dloss| vs nccl':>18} {'calls/step':>10}"]
    for r in runs:
        ratio = f"{r.samples_per_s / ref.samples_per_s:.2f}" if ref else "n/a"
        diff = f"{max(abs(a - b) for a, b in zip(r.losses, ref.losses, strict=True)):.3g}" \
            if ref else "n/a"
        calls = "-" if r.mode == "nccl" else f"{r.timed_engine_calls / r.timed_steps:.4g}"
        lines.append(f"{r.mode:<8} {r.timed_steps:>5} {r.samples_per_s:>11.1f} {ratio:>7} "
                     f"{r.losses[-1]:>10.6f} {diff:>18} {calls:>10}")
    return "\n".join(lines)


def describe(opts: Options, launch: Launch, device: torch.device) -> str:
    work = opts.workload()
    return (f"# {work.shape}, "
            f"{work.grad_bytes / 1e6:.1f} MB fp32 gradients; world {dist.get_world_size()} "
            f"({launch.launcher}), machines {opts.machines or 'from host ids'}, "
            f"batch {opts.batch}/rank, {opts.steps} steps ({opts.warmup} warm-up), "
            f"lr {opts.lr}, seed {opts.seed}, device {device.type}, "
            f"default group {dist.get_backend_config()}")


def write_outputs(args: argparse.Namespace, opts: Options, launch: Launch,
                  device: torch.device, runs: list[ModeRun]) -> None:
    if args.json:
        meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                "argv": sys.argv[1:], "torch": torch.__version__,
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "launcher": launch.launcher, "world_size": dist.get_world_size(),
                "backend_config": str(dist.get_backend_config()),
                "grad_bytes": opts.workload().grad_bytes, "options": dataclasses.asdict(opts),
                "nccl_env": nccl_variables()}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "runs": [dataclasses.asdict(r) for r in runs]}, f,
                      indent=1)
    if args.plot:
        plot(runs, args.plot, describe(opts, launch, device).lstrip("# "))


def plot(runs: list[ModeRun], path: str, title: str) -> None:
    import matplotlib  # optional dependency: only --plot needs it

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        ax.plot(range(len(r.losses)), r.losses, label=f"{r.mode} ({r.samples_per_s:.0f}/s)")
    ax.set(xlabel="step", ylabel="training loss (mean over ranks)")
    ax.set_title(title, fontsize=7, wrap=True)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rank_main(args: argparse.Namespace, opts: Options, launch: Launch,
              device: torch.device) -> list[dict[str, Any]]:
    """One rank's run; plain dicts back, because spawned ranks pickle their result and a
    class of a script run as __main__ would not unpickle in the parent."""
    runs = run_modes(opts, device)
    if dist.get_rank() == 0:
        print(describe(opts, launch, device), flush=True)
        print(table(runs), flush=True)
        write_outputs(args, opts, launch, device, runs)
    return [dataclasses.asdict(r) for r in runs]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add, d = p.add_argument, Options()
    add("--modes", "--mode", default=",".join(d.modes), help="comma list of nccl, hook, backend")
    add("--device", choices=("cuda", "cpu"), help="default: cuda when there")
    add("--model", choices=MODELS, default=d.model, help="the workload (see above)")
    add_model_arguments(p, d)
    add("--batch", type=int, help="samples (dlrm) or sequences (transformer) per rank; "
        f"default {', '.join(f'{v} ({k})' for k, v in DEFAULT_BATCH.items())}")
    for name in ("steps", "warmup", "seed"):
        add(f"--{name}", type=int, default=getattr(d, name))
    add("--lr", type=float, help="plain SGD's; default "
        f"{', '.join(f'{v} ({k})' for k, v in DEFAULT_LR.items())}")
    add("--bucket-mb", type=float, default=d.bucket_mb, help="DDP bucket_cap_mb")
    add("--machines", type=int, help="virtual machines of hook and backend modes; "
        "default: from host ids (2 for standalone CPU runs)")
    add("--min-bytes", type=int, help="min_bytes of hook and backend modes' engines")
    add("--nprocs", type=int, help="processes to spawn without a launcher (default 4 on CPU)")
    add("--json", help="write {meta, runs} here")
    add("--plot", help="write the loss curves here (PNG, needs matplotlib)")
    return p


def add_model_arguments(p: argparse.ArgumentParser, d: Options) -> None:
    """Each model's shape; the other model's are ignored."""
    dlrm = p.add_argument_group("dlrm model (--model dlrm)").add_argument
    dlrm("--tables", type=int, default=d.spec.tables)
    dlrm("--rows", type=int, default=d.spec.rows, help="rows per table")
    dlrm("--dim", type=int, default=d.spec.dim)
    dlrm("--bag", type=int, default=d.spec.bag, help="ids per bag")
    tf = p.add_argument_group("transformer model (--model transformer)").add_argument
    tf("--layers", type=int, default=d.transformer.layers)
    tf("--width", type=int, default=d.transformer.width)
    tf("--heads", type=int, default=d.transformer.heads)
    tf("--seq", type=int, default=d.transformer.seq, help="tokens per sequence")
    tf("--vocab", type=int, default=d.transformer.vocab)


def options(args: argparse.Namespace, cuda: bool) -> Options:
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES] + (["(none)"] if not modes else [])
    if bad:
        raise SystemExit(f"--modes {args.modes!r}: unknown {bad}; use a comma list of "
                         f"{', '.join(MODES)}")
    if not 0 <= args.warmup < args.steps:
        raise SystemExit(f"--warmup {args.warmup} --steps {args.steps}: need 0 <= warmup < "
                         "steps (the steps after warm-up are timed)")
    machines = args.machines
    if machines is None and not cuda and detect().launcher == "standalone":
        machines = 2 if (args.nprocs or 4) % 2 == 0 else 1  # as ringreduce.bench on CPU
    spec = Spec(tables=args.tables, rows=args.rows, dim=args.dim, bag=args.bag)
    try:
        transformer = TransformerSpec(vocab=args.vocab, width=args.width, layers=args.layers,
                                      heads=args.heads, seq=args.seq)
    except ValueError as e:
        raise SystemExit(f"{e} (--vocab, --width, --layers, --heads, --seq)") from None
    for name in ("batch", "lr"):  # 0 would ask Options for the model's default
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise SystemExit(f"--{name} {getattr(args, name)}: must be positive; leave it out "
                             f"for the model's default")
    return Options(modes=modes, spec=spec, batch=args.batch or 0, steps=args.steps,
                   warmup=args.warmup, lr=args.lr or 0.0, seed=args.seed,
                   bucket_mb=args.bucket_mb, machines=machines, min_bytes=args.min_bytes,
                   model=args.model, transformer=transformer)


def backend_env(opts: Options) -> dict[str, str]:
    """--machines/--min-bytes for the backend's engine, which has no arguments."""
    env = {"RINGREDUCE_MACHINES": opts.machines, "RINGREDUCE_MIN_BYTES": opts.min_bytes}
    return {k: str(v) for k, v in env.items() if v is not None}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = build_parser().parse_args(argv)
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    opts = options(args, cuda)
    backend = None
    if "backend" in opts.modes:
        backend = "cpu:gloo,cuda:ringreduce" if cuda else "cpu:ringreduce"
        # The backend builds its engine from Config's variables: give it the hook's
        # settings (set before the ranks start, so spawned ranks inherit them).
        os.environ.update(backend_env(opts))
    return run_ranks(functools.partial(rank_main, args, opts), args.nprocs, backend=backend,
                     cuda=cuda)


if __name__ == "__main__":
    main()
