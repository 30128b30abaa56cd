"""The DDP benchmark's command line and report (benchmarks/dlrm.py runs ``main``): parse
the options, train every mode on every rank (dlrm.py), and on rank 0 print the table
and write the JSON and the loss plot. The workloads, modes and timing are described in
dlrm.py's docstring, which is also ``--help``'s text.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import statistics
import sys
from typing import Any

import torch
import torch.distributed as dist

from ringreduce.benchmark.launch import Launch, detect, nccl_variables, run_ranks

from . import dlrm
from .dlrm import FINAL_STEPS, LAST_STEPS, ModeRun, run_modes
from .dlrm_model import Spec
from .dlrm_modes import EXTRA_MODES, MODES, Options
from .transformer_model import TransformerSpec
from .workloads import DEFAULT_BATCH, DEFAULT_LR, LR_WARMUP, MODELS, TARGET_FRACTION


def rank_main(args: argparse.Namespace, opts: Options, launch: Launch,
              device: torch.device) -> list[dict[str, Any]]:
    """One rank's run; plain dicts back, because spawned ranks pickle their result and a
    class of a script run as __main__ would not unpickle in the parent."""
    runs = run_modes(opts, device)
    if dist.get_rank() == 0:
        print(describe(opts, launch, device), flush=True)
        print(table(runs), flush=True)
        write_outputs(args, opts, launch, device, runs)
        print("# outputs written; the process group is torn down next", flush=True)
    return [dataclasses.asdict(r) for r in runs]


def table(runs: list[ModeRun]) -> str:
    """The floor and target; per mode at the run's seed: steps, samples/s, ratio and max
    |loss diff| against nccl, final loss, the step and seconds at which the loss reached
    the target ("-": never), the engine's calls per timed step (DDP's bucket count; "-"
    without an engine) and, in the hook modes, this rank's host time per hook call
    (median and mean, µs); then nccl's spread over seeds, when there are several."""
    main = [r for r in runs if r.seed == runs[0].seed]
    ref = next((r for r in main if r.mode == "nccl"), None)
    lines = [f"# loss floor {runs[0].floor:.4f} (the teacher's own loss on these batches); "
             f"target loss {runs[0].target_loss:.4f}; final loss: mean of the last "
             f"{FINAL_STEPS} steps",
             f"{'mode':<13} {'steps':>5} {'samples/s':>11} {'vs nccl':>7} {'final loss':>10} "
             f"{'max|dloss| vs nccl':>18} {'target step':>11} {'s':>7} {'calls/step':>10} "
             f"{'hook us med/mean':>16} {f'last {LAST_STEPS}':>9} {'valid':>8}"]
    for r in main:
        ratio = f"{r.samples_per_s / ref.samples_per_s:.2f}" if ref else "n/a"
        diff = f"{max(abs(a - b) for a, b in zip(r.losses, ref.losses, strict=True)):.3g}" \
            if ref else "n/a"
        calls = f"{r.timed_engine_calls / r.timed_steps:.4g}" if r.engine else "-"
        hook = (f"{statistics.median(r.hook_us):.1f}/{statistics.fmean(r.hook_us):.1f}"
                if r.hook_us else "-")
        reached = ("-", "-") if r.steps_to_target is None else \
            (str(r.steps_to_target), f"{r.seconds_to_target:.3g}")
        lines.append(f"{r.mode:<13} {r.timed_steps:>5} {r.samples_per_s:>11.1f} {ratio:>7} "
                     f"{r.final_loss:>10.6f} {diff:>18} {reached[0]:>11} {reached[1]:>7} "
                     f"{calls:>10} {hook:>16} {r.last_loss:>9.5f} {r.validation:>8.5f}")
    spread = seed_spread(runs)
    if spread:
        lines.append(f"# nccl over seeds {spread['seeds']}: final loss "
                     f"{spread['final_loss_mean']:.6f}, spread (max - min) "
                     f"{spread['final_loss_spread']:.3g}, stdev {spread['final_loss_stdev']:.3g}; "
                     f"target step {spread['steps_to_target']}")
        lines += [against_spread(r, spread) for r in main if r.mode != "nccl"]
    return "\n".join(lines)


def against_spread(run: ModeRun, spread: dict[str, Any]) -> str:
    """Where ``run``'s last-steps and validation losses fall against nccl's range over
    seeds: inside, or by how much above (below is not a loss)."""
    def where(value: float, key: str) -> str:
        low, high = min(spread[key]), max(spread[key])
        verdict = "inside" if value <= high else f"above by {value - high:.2g}"
        return f"{value:.5f} {verdict} [{low:.5f}, {high:.5f}]"
    return (f"# {run.mode}: last {LAST_STEPS} {where(run.last_loss, 'last_loss')}; "
            f"validation {where(run.validation, 'validation')}")


def seed_spread(runs: list[ModeRun], mode: str = "nccl") -> dict[str, Any] | None:
    """``mode``'s final loss and target step at every seed, when it ran at more than
    one: the differences between modes that the seed alone makes."""
    nccl = [r for r in runs if r.mode == mode]
    if len(nccl) < 2:
        return None
    final = [r.final_loss for r in nccl]
    return {"mode": mode, "seeds": [r.seed for r in nccl], "final_loss": final,
            "final_loss_mean": statistics.fmean(final),
            "final_loss_spread": max(final) - min(final),
            "final_loss_stdev": statistics.stdev(final),
            "steps_to_target": [r.steps_to_target for r in nccl],
            "last_loss": [r.last_loss for r in nccl],
            "validation": [r.validation for r in nccl]}


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
                "nccl_env": nccl_variables(), "floor": runs[0].floor,
                "target_loss": runs[0].target_loss, "final_steps": FINAL_STEPS}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "runs": [dataclasses.asdict(r) for r in runs],
                       "seed_spread": seed_spread(runs)}, f, indent=1)
    if args.plot:
        plot(runs, args.plot, describe(opts, launch, device).lstrip("# "))


def plot(runs: list[ModeRun], path: str, title: str) -> None:
    import matplotlib  # optional dependency: only --plot needs it

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        seed = f", seed {r.seed}" if r.seed != runs[0].seed else ""
        ax.plot(range(len(r.losses)), r.losses,
                label=f"{r.mode}{seed} ({r.samples_per_s:.0f}/s)", alpha=0.5 if seed else 1.0)
    ax.axhline(runs[0].floor, color="grey", linewidth=1, label="floor (the teacher's loss)")
    ax.axhline(runs[0].target_loss, color="grey", linewidth=1, linestyle=":", label="target")
    ax.set(xlabel="step", ylabel="training loss (mean over ranks)")
    ax.set_title(title, fontsize=7, wrap=True)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=dlrm.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add, d = p.add_argument, Options()
    add("--modes", "--mode", default=",".join(d.modes),
        help=f"comma list of {', '.join(MODES + EXTRA_MODES)} (see above)")
    add("--device", choices=("cuda", "cpu"), help="default: cuda when there")
    add("--model", choices=MODELS, default=d.model, help="the workload (see above)")
    add_model_arguments(p, d)
    add("--batch", type=int, help="samples (dlrm) or sequences (transformer) per rank; "
        f"default {', '.join(f'{v} ({k})' for k, v in DEFAULT_BATCH.items())}")
    for name in ("steps", "warmup", "seed"):
        add(f"--{name}", type=int, default=getattr(d, name))
    add("--lr", type=float, help="Adam's (the transformer's ramped up over its first "
        f"{LR_WARMUP['transformer']} steps); default "
        f"{', '.join(f'{v:g} ({k})' for k, v in DEFAULT_LR.items())}")
    add_learning_arguments(p, d)
    add("--bucket-mb", type=float, default=d.bucket_mb, help="DDP bucket_cap_mb")
    add("--read-loss", action="store_true",
        help="read each step's loss on the host, as a loop that logs it every step: the "
             "host then waits for each step, so a hook's host time is its own, not the "
             "wait of a host that ran ahead of a network-bound device (default: losses "
             "stay on the device until the end)")
    add("--machines", type=int, help="virtual machines of hook and backend modes; "
        "default: from host ids (2 for standalone CPU runs)")
    add("--min-bytes", type=int, help="min_bytes of hook and backend modes' engines")
    add("--issuer", choices=("native", "python"),
        help="the hook's Communicator(issuer=...), an internal setting (default: the "
             "library's choice); 'native' also replays one-slice calls")
    add("--nprocs", type=int, help="processes to spawn without a launcher (default 4 on CPU)")
    add("--json", help="write {meta, runs, seed_spread} here")
    add("--plot", help="write the loss curves here (PNG, needs matplotlib)")
    return p


def add_learning_arguments(p: argparse.ArgumentParser, d: Options) -> None:
    add = p.add_argument
    add("--powersgd-rank", type=int, default=d.powersgd_rank,
        help="powersgd mode: the rank of its low-rank approximation")
    add("--powersgd-start", type=int, default=d.powersgd_start,
        help="powersgd mode: steps all-reduced uncompressed first (torch's "
             "start_powerSGD_iter; at least 2; keep it at or below --warmup for the timed "
             "steps to be compressed ones)")
    add("--seeds", type=int, default=d.seeds,
        help="run nccl at this many seeds (--seed, --seed + 1, ...) and report the spread "
             "of its final loss and target step; the other modes run at --seed only")
    add("--target-loss", type=float,
        help="report the step and seconds at which each mode's loss first reaches this; "
             "default: "
             f"{', '.join(f'{v:.2g} ({k})' for k, v in TARGET_FRACTION.items())} of the way "
             "from the first step's loss to the floor")


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
    bad = [m for m in modes if m not in MODES + EXTRA_MODES] + (["(none)"] if not modes else [])
    if bad:
        raise SystemExit(f"--modes {args.modes!r}: unknown {bad}; use a comma list of "
                         f"{', '.join(MODES + EXTRA_MODES)}")
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
    try:
        opts = Options(modes=modes, spec=spec, batch=args.batch or 0, steps=args.steps,
                       warmup=args.warmup, lr=args.lr or 0.0, seed=args.seed,
                       bucket_mb=args.bucket_mb, machines=machines, min_bytes=args.min_bytes,
                       issuer=args.issuer,
                       model=args.model, transformer=transformer,
                       powersgd_rank=args.powersgd_rank, powersgd_start=args.powersgd_start,
                       seeds=args.seeds, target_loss=args.target_loss,
                       read_loss=args.read_loss)
    except ValueError as e:
        raise SystemExit(f"{e} (--powersgd-rank, --powersgd-start, --seeds, --target-loss)") \
            from None
    refusal = None if cuda else dlrm.gloo_refusal(opts, opts.workload())
    if refusal:
        raise SystemExit(refusal)
    return opts


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
