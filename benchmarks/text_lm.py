"""Training of a byte-level language model on natural text (benchmarks/workloads/text.py,
``--corpus``: the standard library's docstrings, comments and documentation topics, or the
topics alone, the corpus of earlier results), fp32 against torch's bf16 hook and ringreduce's
wires in DDP, and FSDP2/HSDP on torch's collectives against ``ringreduce.fsdp.apply``.

Every mode of ``--wire`` (workloads/text_report.py names them: ``fp32``, ``bf16-hook``,
a wire such as ``int8``; ``fsdp-nccl``, ``hsdp-int4``, ...) trains a fresh model from a
seed, in one process set, one after the other: the ``--spread`` modes (default fp32) at
every ``--seed``, first (seed by seed, so a set cut short keeps whole pairs), then the
others at the first seed. Batches: windows of the
training documents drawn per rank and seed (the same in every mode); validation: the
held-out documents. Each run prints the mean train loss over its last 100 steps (over
ranks), the validation loss, samples/s over the steps after ``--warmup`` and whether
the replicas ended bit-identical (DDP; HSDP's replicas are checked, raising if they
differ; plain FSDP2 keeps one copy: n/a); the JSON (``--json``: every step's loss too)
is rewritten after every run, so a process set cut short keeps what it finished. Last,
a table: each run's losses against fp32's seed spread, its samples/s against fp32 and the bf16 hook.
``--merge A.json B.json`` prints that table for runs of several process sets.

The default model, 6 x 512 (19.2 M parameters, 77 MB of fp32 gradients a step), is
network-bound at 2 x 2 capped at 10 Gbit/s a machine: fp32's all-reduce moves about the
gradient's bytes across each machine's link a step under NCCL's tree, 62 ms at
1.25 GB/s, where the step's arithmetic (8 x 128 bytes a rank) takes a few ms.

    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 --link-cap 10gbit \\
        --script benchmarks/text_lm.py -- --wire fp32,int4,int8,bf16-hook --seed 0,1,2
    python benchmarks/text_lm.py --nprocs 4 --machines 2 --steps 30 --width 64 --layers 2 \\
        --wire fp32,bf16-hook,int4,fsdp-nccl,hsdp-int8   # CPU smoke run
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ringreduce
from benchmarks.workloads import fsdp_cli, fsdp_modes, fsdp_train, text, text_report
from benchmarks.workloads import transformer_model as tm
from benchmarks.workloads.dlrm_modes import TORCH_HOOKS
from benchmarks.workloads.text_report import LmMode
from ringreduce.benchmark.launch import Launch, run_ranks
from ringreduce.config import Config
from ringreduce.plan.slicing import PLANS

LAST = 100
"""Steps whose mean train loss is reported (all of them in a shorter run)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--machines", type=int, default=None,
                   help="ringreduce's machines and HSDP's replicas (emulate.py passes it)")
    p.add_argument("--wire", default="fp32",
                   help="comma-separated modes: fp32 (DDP's all-reduce), bf16-hook, a "
                        "ringreduce wire (int8, int4, fp8, bf16), "
                        "fsdp-/hsdp- + nccl, exact or a wire")
    p.add_argument("--seed", default="0", help="comma-separated seeds of the --spread modes; "
                                               "the others run at the first")
    p.add_argument("--spread", default="fp32", help="modes run at every --seed")
    p.add_argument("--corpus", choices=text.CORPORA, default=text.DEFAULT,
                   help="stdlib: docstrings, comments and pydoc topics (~3.2 MB, ~1.4 epochs "
                        "in 1000 steps of 4 x 8 x 128 bytes); topics: pydoc_data/topics.py "
                        "alone (~0.47 MB), as earlier results")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=20, help="steps before the clock starts")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-warmup", type=int, default=50)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--plan", choices=PLANS,
                   help="the wire modes' Communicator(plan=...): a given plan always takes "
                        "the wire (a study of its loss); default: the probe's choice, which "
                        "takes exact where it is as fast as the wire (each run's JSON and "
                        "log say which: 'engine')")
    p.add_argument("--wire-block", type=int,
                   help="the DDP wire modes' Communicator(wire_block=...): values per "
                        "quantization block (a multiple of 8; a power of two for int4); "
                        "default: the library's")
    p.add_argument("--hook-feedback", choices=("on", "off"),
                   help="the ringreduce modes' Communicators(hook_feedback=...): error "
                        "feedback on the quantized wire (DDP's hook, ringreduce.fsdp's "
                        "hooks in the fsdp-/hsdp- modes) or none; default: the library's "
                        "(off)")
    p.add_argument("--nprocs", type=int, help="ranks to spawn without a launcher")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when there is one")
    p.add_argument("--json", help="write every run's numbers here (rank 0), after each run")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="print the table of these runs' JSON files and exit")
    return p


def plan(args: argparse.Namespace) -> list[tuple[LmMode, int]]:
    """(mode, seed) in the order they run: the spread modes at every seed, seed by seed,
    then the rest at the first seed. Checked before any process starts."""
    modes = text_report.parse_modes(args.wire)
    spread = set(args.spread.split(","))
    seeds = [int(s) for s in args.seed.split(",")]
    if not 0 <= args.warmup < args.steps:
        raise ValueError(f"--steps {args.steps} --warmup {args.warmup}: need 0 <= warmup < "
                         "steps (the steps after warm-up are timed)")
    _check_wire_options(args, modes)
    return [(m, s) for s in seeds for m in modes if m.name in spread] + \
        [(m, seeds[0]) for m in modes if m.name not in spread]


def _check_wire_options(args: argparse.Namespace, modes: list[LmMode]) -> None:
    """--hook-feedback reaches every ringreduce mode's Communicators (DDP's and the
    sharded modes', one knob for every hook); --wire-block the DDP wire modes' only:
    refused with a sharded mode (fsdp_modes takes the library's block), and a block the
    wires refuse is refused here, by Config's own check."""
    options = _wire_options(args)
    sharded = [m.name for m in modes if m.fsdp is not None]
    if "wire_block" in options and sharded:
        raise ValueError(f"--wire-block applies to DDP's wire modes only; drop it or run "
                         f"{sharded} separately")
    for wire in {m.wire for m in modes if m.wire is not None}:
        Config(wire=wire, **options)


def setup(mode: LmMode, model: nn.Module, args: argparse.Namespace,
          meshes: fsdp_modes.Meshes | None,
          device: torch.device) -> tuple[nn.Module, list[ringreduce.Communicator]]:
    """The model wrapped or sharded as ``mode`` says, and the Communicators it uses."""
    if mode.fsdp is not None:
        assert meshes is not None, "rank_main makes the meshes when a mode shards"
        sharded = fsdp_modes.sharded(model, meshes.of(mode.fsdp), True)
        opts = fsdp_modes.Options(machines=meshes.hsdp.size(0), min_bytes=0,
                                  hook_feedback=_wire_options(args).get("hook_feedback"))
        return sharded, fsdp_modes.attach(mode.fsdp, sharded, meshes, opts)
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None,
              bucket_cap_mb=args.bucket_mb)
    if mode.name == text_report.BF16_HOOK:
        cuda = device.type == "cuda"
        ddp.register_comm_hook(None, TORCH_HOOKS[mode.name] if cuda else _bf16_on_gloo)
    if mode.wire is None:
        return ddp, []
    comm = ringreduce.Communicator(machines=args.machines, min_bytes=0, wire=mode.wire,
                                   plan=args.plan, **_wire_options(args))
    ddp.register_comm_hook(comm, ringreduce.ddp_hook)
    return ddp, [comm]


def _wire_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Communicator keywords of --wire-block and --hook-feedback, only those given
    (the library's defaults otherwise)."""
    options: dict[str, Any] = {}
    if args.wire_block is not None:
        options["wire_block"] = args.wire_block
    if args.hook_feedback is not None:
        options["hook_feedback"] = args.hook_feedback == "on"
    return options


def _bf16_on_gloo(state, bucket):  # type: ignore[no-untyped-def]
    """torch's bf16_compress_hook, for the CPU smoke run: DDP refuses the hook by its
    name unless NCCL runs it, though gloo all-reduces bfloat16 too. Unannotated: DDP
    compares a hook's annotations with the evaluated types, and this module's are
    strings."""
    return TORCH_HOOKS[text_report.BF16_HOOK](state, bucket)


def train(args: argparse.Namespace, mode: LmMode, seed: int, corpus: text.Corpus,
          meshes: fsdp_modes.Meshes | None, device: torch.device) -> dict[str, Any]:
    """One run: a fresh model from ``seed``, ``args.steps`` steps."""
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = text.spec(args.width, args.layers, args.heads, args.seq)
    model, comms = setup(mode, text.build(spec, seed).to(device), args, meshes, device)
    batches = text.batches(corpus.train, spec.seq, args.steps, args.batch, seed, rank, device)
    adam = torch.optim.Adam(model.parameters(), lr=args.lr)
    ramp = torch.optim.lr_scheduler.LinearLR(adam, 0.1, 1.0, total_iters=args.lr_warmup)
    losses = torch.zeros(args.steps, device=device)
    start = 0.0
    engine = " | ".join(c.describe() for c in comms)  # the probe's route, wire or exact
    try:
        for step, batch in enumerate(batches):
            if step == args.warmup:
                start = _synchronized(device)
            adam.zero_grad()
            loss = tm.loss(model, batch)
            loss.backward()
            adam.step()
            ramp.step()
            losses[step] = loss.detach()
        seconds = _synchronized(device) - start
        identical = _replicas(mode, model, meshes, device)
    finally:
        for comm in comms:
            comm.close()
    dist.all_reduce(losses)  # SUM (gloo has no AVG), divided below
    losses /= world
    valid = text.validation_loss(model.module if isinstance(model, DDP) else model,
                                 corpus.valid, spec.seq, device)
    run = {"mode": mode.name, "seed": seed, "steps": args.steps, "world": world,
           "train_last": float(losses[-LAST:].mean()), "valid": valid,
           "losses": losses.tolist(),  # every step's, mean over ranks: spikes, descent
           "samples_per_s": (args.steps - args.warmup) * args.batch * world / seconds,
           "identical": identical, "params": tm.grad_bytes(spec) // 4, "engine": engine,
           **({"wire_options": _wire_options(args)} if comms else {})}
    if mode.fsdp is not None and device.type == "cuda":
        del model, adam, ramp
        gc.collect()  # FSDP's hooks hold the model in reference cycles
        torch.cuda.empty_cache()
    return run


def _replicas(mode: LmMode, model: nn.Module, meshes: fsdp_modes.Meshes | None,
              device: torch.device) -> bool | None:
    """DDP: whether every rank holds the same parameters; HSDP: True, or RuntimeError
    (fsdp_train.check_replicas); plain FSDP2: None (each element lives on one rank)."""
    if mode.fsdp is None:
        return _identical(model, device)
    if not mode.fsdp.hsdp:
        return None
    assert meshes is not None
    fsdp_train.check_replicas(mode.name, model, meshes)
    return True


def _synchronized(device: torch.device) -> float:
    flag = torch.zeros(1, device=device)
    dist.all_reduce(flag)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _identical(model: nn.Module, device: torch.device) -> bool:
    """Whether every rank holds the same parameters, bit for bit (their int32 views'
    sum and position-weighted sum agree: MAX == MIN over ranks)."""
    bits = torch.cat([p.detach().reshape(-1).view(torch.int32).to(torch.int64)
                      for p in model.parameters()])
    weights = torch.arange(1, bits.numel() + 1, device=device, dtype=torch.int64) % 65_521
    check = torch.stack([bits.sum(), (bits * weights).sum()])
    hi, lo = check.clone(), check.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return bool(torch.equal(hi, lo))


def rank_main(args: argparse.Namespace, launch: Launch, device: torch.device) -> list[dict]:
    corpus, runs, order = text.corpus(args.corpus), [], plan(args)
    meshes = None
    if any(m.fsdp is not None for m, _ in order):
        machines = fsdp_cli.machines(args, device.type == "cuda")
        meshes = fsdp_modes.make_meshes(device, machines)
    if launch.rank == 0:
        spec = text.spec(args.width, args.layers, args.heads, args.seq)
        params = tm.grad_bytes(spec) // 4
        print(f"# {corpus.describe()}; decoder {spec.layers} x {spec.width}, {spec.heads} "
              f"heads, seq {spec.seq}: {params / 1e6:.2f} M parameters ({4 * params / 1e6:.0f} "
              f"MB of fp32 gradients a step); batch {args.batch} a rank, {launch.world_size} "
              f"ranks, machines {args.machines}, Adam {args.lr} ({args.lr_warmup}-step ramp), "
              f"{args.steps} steps, device {device}", flush=True)
    for mode, seed in order:
        run = train(args, mode, seed, corpus, meshes, device)
        runs.append(run)
        if launch.rank == 0:
            print(f"{mode.name:>12} seed {seed}: train (last {min(LAST, args.steps)}) "
                  f"{run['train_last']:.4f}  valid {run['valid']:.4f}  "
                  f"{run['samples_per_s']:.0f} samples/s  identical {run['identical']}",
                  flush=True)
            if run["engine"]:
                print(f"# {mode.name} seed {seed} engine: {run['engine']}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(runs, indent=1))
    if launch.rank == 0:
        print("\n".join(text_report.table(runs)), flush=True)
    return runs


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.merge:
        runs = [r for f in args.merge if Path(f).exists()
                for r in json.loads(Path(f).read_text())]
        print("\n".join(text_report.table(runs)))
        return
    plan(args)  # bad modes or steps: refused here, before any process starts
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    run_ranks(functools.partial(rank_main, args), args.nprocs, cuda=cuda)


if __name__ == "__main__":
    main()
