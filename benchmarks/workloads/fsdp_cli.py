"""The FSDP2 benchmark's command line and report (benchmarks/fsdp.py runs ``main``):
train every mode on every rank (fsdp_train.py), and on rank 0 write the JSON and print
one table last; ``--merge`` joins runs of the NCCL modes under other NCCL_ALGO settings
and takes each NCCL mode's faster algorithm as its reference.

    torchrun --nproc-per-node 4 benchmarks/fsdp.py --machines 2 --json f.json
    python3 benchmarks/emulate.py --physical-gpus 2 --machines 2 --gpus-per-machine 2 \\
        --link-cap 10gbit --script benchmarks/fsdp.py -- --json f.json
    NCCL_ALGO=allreduce:tree python3 benchmarks/emulate.py ... --script benchmarks/fsdp.py \\
        -- --modes fsdp-nccl,hsdp-nccl --json tree.json
    python3 benchmarks/fsdp.py --merge f.json tree.json
    python3 benchmarks/fsdp.py --device cpu --layers 2 --width 64 --steps 12 --warmup 2

Without a launcher it spawns 4 ranks on CPU (2 machines x 2), one per GPU on CUDA.
NCCL reads NCCL_ALGO once per process, so each algorithm needs its own process set;
``allreduce:tree`` touches HSDP's replicate all-reduce only (NCCL's reduce-scatter and
all-gather have no tree), which is why the NCCL modes are run under it too.
Timing: the steps after ``--warmup``, host clock between two device synchronisations;
samples/s counts the global batch (sequences of ``--seq`` tokens), the slowest rank's
time counts. calls/step: ringreduce's calls per timed step, every Communicator of the
mode together ("-" without one). The final loss is the mean of the last FINAL_STEPS
steps' losses; the target step is the first whose loss reaches ``--target-loss``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ringreduce.benchmark.launch import Launch, detect, nccl_variables, run_ranks

from .dlrm import FINAL_STEPS, ModeRun, reach
from .dlrm_cli import seed_spread
from .fsdp_modes import (
    DEFAULT_SPEC,
    MODES,
    NCCL_MODES,
    REFERENCE,
    TARGET_FRACTION,
    Options,
)
from .fsdp_train import run_modes
from .transformer_model import TransformerSpec, grad_bytes

Row = tuple[str, ModeRun]
"""A table row: its label (the mode, and for a merged NCCL mode its algorithm)."""


def rank_main(args: argparse.Namespace, opts: Options, launch: Launch,
              device: torch.device) -> list[dict[str, Any]]:
    """One rank's run; plain dicts back, because spawned ranks pickle their result and a
    class of a script run as __main__ would not unpickle in the parent."""
    # FSDP warns that the root returns a view (the logits), in case the caller changes
    # it in place; the loss only reads it (flatten, cross-entropy), so the warning,
    # once per rank, would only crowd the log.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    runs = run_modes(opts, device)
    if dist.get_rank() == 0:
        header = describe(opts, launch, device)
        if args.json:
            write_json(args.json, report(opts, launch, device, runs, header))
        print(header, flush=True)
        print(table([(r.mode, r) for r in runs if r.seed == opts.seed], runs), flush=True)
    return [dataclasses.asdict(r) for r in runs]


def describe(opts: Options, launch: Launch, device: torch.device) -> str:
    t = opts.transformer
    return (f"# FSDP2 transformer: {t.layers} layers x width {t.width}, {t.heads} heads, "
            f"vocab {t.vocab}, seq {t.seq}, {grad_bytes(t) / 1e6:.1f} MB fp32 gradients; "
            f"world {dist.get_world_size()} ({launch.launcher}) as {opts.machines} machines, "
            f"batch {opts.batch}/rank, {opts.steps} steps ({opts.warmup} warm-up), lr "
            f"{opts.lr}, seed {opts.seed}, reshard_after_forward "
            f"{opts.reshard_after_forward}, device {device.type}, default group "
            f"{dist.get_backend()}, NCCL_ALGO {nccl_algo(nccl_variables())}")


def nccl_algo(env: dict[str, str]) -> str:
    return env.get("NCCL_ALGO", "default")


def report(opts: Options, launch: Launch, device: torch.device, runs: list[ModeRun],
           header: str) -> dict[str, Any]:
    meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "header": header, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "launcher": launch.launcher, "world_size": dist.get_world_size(),
            "grad_bytes": grad_bytes(opts.transformer), "options": dataclasses.asdict(opts),
            "nccl_env": nccl_variables(), "floor": runs[0].floor,
            "target_loss": runs[0].target_loss, "final_steps": FINAL_STEPS}
    return {"meta": meta, "runs": [dataclasses.asdict(r) for r in runs],
            "seed_spread": seed_spread(runs, REFERENCE)}


def write_json(path: str, content: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(content, f, indent=1)


def table(rows: list[Row], runs: list[ModeRun]) -> str:
    """One row per mode: timed steps, samples/s, mean step time, ratios of samples/s to
    the fsdp-nccl and hsdp-nccl rows (the first of each), final loss, the step and
    seconds at which the loss reached the target ("-": never), ringreduce's calls per
    timed step; then fsdp-nccl's spread over seeds in ``runs``, when there are several."""
    refs = {m: next((r for label, r in rows if r.mode == m), None) for m in NCCL_MODES}
    first, width = rows[0][1], max(len(label) for label, _ in rows)
    lines = [f"# loss floor {first.floor:.4f}; target loss {first.target_loss:.4f}; final "
             f"loss: mean of the last {FINAL_STEPS} steps",
             f"{'mode':<{width}} {'steps':>5} {'samples/s':>10} {'step ms':>8} {'vs fsdp':>7} "
             f"{'vs hsdp':>7} {'final loss':>10} {'target step':>11} {'s':>6} "
             f"{'calls/step':>10}"]
    for label, r in rows:
        ratios = [f"{r.samples_per_s / ref.samples_per_s:.2f}" if ref else "n/a"
                  for ref in refs.values()]
        reached = ("-", "-") if r.steps_to_target is None else \
            (str(r.steps_to_target), f"{r.seconds_to_target:.3g}")
        calls = f"{r.timed_engine_calls / r.timed_steps:.4g}" if r.engine else "-"
        lines.append(f"{label:<{width}} {r.timed_steps:>5} {r.samples_per_s:>10.1f} "
                     f"{1e3 * r.seconds / r.timed_steps:>8.1f} {ratios[0]:>7} {ratios[1]:>7} "
                     f"{r.final_loss:>10.6f} {reached[0]:>11} {reached[1]:>6} {calls:>10}")
    spread = seed_spread(runs, REFERENCE)
    if spread:
        lines.append(f"# {REFERENCE} over seeds {spread['seeds']}: final loss "
                     f"{spread['final_loss_mean']:.6f}, spread (max - min) "
                     f"{spread['final_loss_spread']:.3g}; target step "
                     f"{spread['steps_to_target']}")
    return "\n".join(lines)


def merge(paths: list[str], out: str | None) -> str:
    """The first file's runs (every mode), with each NCCL mode's row the fastest of its
    runs over all files (named by NCCL_ALGO); every run measured against the first
    file's target. Returns the table (and writes the rows to ``out``)."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    target = reports[0]["meta"]["target_loss"]
    runs = [(nccl_algo(rep["meta"]["nccl_env"]), reach(_run(d), target))
            for rep in reports for d in rep["runs"] if d["seed"] == _seed(rep)]
    rows, notes, best_algo = [], [], {}
    for mode in dict.fromkeys(r.mode for r in _runs(reports[0])):
        mine = [(algo, r) for algo, r in runs if r.mode == mode]
        if mode not in NCCL_MODES:
            rows.append((mode, mine[0][1]))
            continue
        algo, best = max(mine, key=lambda pair: pair[1].samples_per_s)
        rows.append((f"{mode} ({algo})", best))
        best_algo[mode] = algo
        notes.append(f"# {mode}: " + ", ".join(f"{a} {r.samples_per_s:.1f}/s" for a, r in mine)
                     + f"; best {algo}")
    text = "\n".join([f"# merged {', '.join(paths)}", *notes,
                      table(rows, _runs(reports[0]))])
    if out:
        write_json(out, {"files": paths, "target_loss": target, "nccl_best": best_algo,
                         "rows": [{"label": label, **dataclasses.asdict(r)}
                                  for label, r in rows]})
    return text


def _seed(rep: dict[str, Any]) -> int:
    return int(rep["meta"]["options"]["seed"])


def _run(d: dict[str, Any]) -> ModeRun:
    return ModeRun(**{**d, "hook_us": tuple(d["hook_us"])})


def _runs(rep: dict[str, Any]) -> list[ModeRun]:
    return [_run(d) for d in rep["runs"]]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add, d, t = p.add_argument, Options(), DEFAULT_SPEC
    add("--modes", default=",".join(d.modes), help=f"comma list of {', '.join(MODES)}")
    add("--device", choices=("cuda", "cpu"), help="default: cuda when there")
    for name in ("layers", "width", "heads", "vocab", "seq"):
        add(f"--{name}", type=int, default=getattr(t, name), help="the transformer's shape")
    for name in ("batch", "steps", "warmup", "seed"):
        add(f"--{name}", type=int, default=getattr(d, name))
    add("--lr", type=float, default=d.lr, help="Adam's, ramped up over the first 10 steps")
    add("--seeds", type=int, default=d.seeds,
        help=f"run {REFERENCE} at this many seeds (--seed, --seed + 1, ...) for the "
             "seed-to-seed spread of its final loss and target step")
    add("--reshard-after-forward", action=argparse.BooleanOptionalAction,
        default=d.reshard_after_forward, help="fully_shard's (default: FSDP's, on)")
    add("--target-loss", type=float, help="default: floor + "
        f"{1 - TARGET_FRACTION:g} x ({REFERENCE}'s first loss - floor)")
    add("--machines", type=int, help="virtual machines of contiguous ranks; default: the "
        "launcher's ranks per host (2 for standalone CPU runs)")
    add("--min-bytes", type=int, help="min_bytes of ringreduce's Communicators")
    add("--nprocs", type=int, help="processes to spawn without a launcher (default 4 on CPU)")
    add("--json", help="write {meta, runs, seed_spread} here (with --merge: the rows)")
    add("--merge", nargs="+", metavar="JSON", help="print the table of these runs' JSON "
        "files (the first with every mode), each NCCL mode at its fastest, and exit")
    return p


def machines(args: argparse.Namespace, cuda: bool) -> int:
    """--machines, else the launcher's hosts, else 2 (CPU) or 1 (one GPU host)."""
    if args.machines:
        return int(args.machines)
    launch = detect()
    if launch.launcher != "standalone":
        return max(1, launch.world_size // launch.local_size)
    n = args.nprocs or 4
    return 2 if not cuda and n % 2 == 0 else 1  # as ringreduce.bench on CPU


def options(args: argparse.Namespace, cuda: bool) -> Options:
    try:
        spec = TransformerSpec(vocab=args.vocab, width=args.width, layers=args.layers,
                               heads=args.heads, seq=args.seq)
        return Options(modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
                       transformer=spec, batch=args.batch, steps=args.steps,
                       warmup=args.warmup, lr=args.lr, seed=args.seed, seeds=args.seeds,
                       reshard_after_forward=args.reshard_after_forward,
                       target_loss=args.target_loss, machines=machines(args, cuda),
                       min_bytes=args.min_bytes)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = build_parser().parse_args(argv)
    if args.merge:
        print(merge(args.merge, args.json), flush=True)
        return []
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    return run_ranks(functools.partial(rank_main, args, options(args, cuda)), args.nprocs,
                     cuda=cuda)
