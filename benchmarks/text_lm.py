"""DDP training of a byte-level language model on natural text (benchmarks/workloads/
text.py: the Python documentation CPython ships), fp32 against the quantized wires.

Every (wire, seed) of ``--wire`` x ``--seed`` trains a fresh model from that seed, in
one process set, one after the other: ``fp32`` is DDP's own all-reduce (NCCL; gloo on
the CPU), the others ringreduce's DDP hook with ``Communicator(wire=...)`` (error
feedback per bucket, the hook's default). Batches: windows of the training documents
drawn per rank and seed (the same in every wire); validation: the held-out documents.
Each run prints the mean train loss over its last 100 steps (over ranks), the
validation loss, samples/s over the steps after ``--warmup`` and whether the replicas
ended bit-identical; then a table of all runs.

    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 \\
        --script benchmarks/text_lm.py -- --wire fp32,int4,int4-plain --seed 0,1,2
    python benchmarks/text_lm.py --nprocs 4 --machines 2 --steps 30   # CPU smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ringreduce
from benchmarks.workloads import text, transformer_model
from ringreduce.benchmark.launch import Launch, run_ranks

LAST = 100
"""Steps whose mean train loss is reported."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--machines", type=int, default=None,
                   help="ringreduce's machines (emulate.py passes it)")
    p.add_argument("--wire", default="fp32",
                   help="comma-separated: fp32 (DDP's all-reduce) or a ringreduce wire "
                        "(int8, int4, int4-plain, fp8, bf16)")
    p.add_argument("--seed", default="0", help="comma-separated seeds")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=20, help="steps before the clock starts")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-warmup", type=int, default=50)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--nprocs", type=int, help="ranks to spawn without a launcher")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when there is one")
    p.add_argument("--json", help="write every run's numbers here (rank 0)")
    return p


def train(args: argparse.Namespace, wire: str, seed: int, corpus: text.Corpus,
          device: torch.device) -> dict[str, Any]:
    """One run: a fresh model from ``seed``, ``args.steps`` steps of DDP."""
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = text.spec(args.width, args.layers, args.heads, args.seq)
    cuda = device.type == "cuda"
    ddp = DDP(text.build(spec, seed).to(device), device_ids=[device] if cuda else None,
              bucket_cap_mb=args.bucket_mb)
    comm = None
    if wire != "fp32":
        comm = ringreduce.Communicator(machines=args.machines, min_bytes=0, wire=wire)
        ddp.register_comm_hook(comm, ringreduce.ddp_hook)
    batches = text.batches(corpus.train, spec.seq, args.steps, args.batch, seed, rank, device)
    adam = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    ramp = torch.optim.lr_scheduler.LinearLR(adam, 0.1, 1.0, total_iters=args.lr_warmup)
    losses = torch.zeros(args.steps, device=device)
    start = 0.0
    try:
        for step, batch in enumerate(batches):
            if step == args.warmup:
                start = _synchronized(device)
            adam.zero_grad()
            loss = transformer_model.loss(ddp, batch)
            loss.backward()
            adam.step()
            ramp.step()
            losses[step] = loss.detach()
        seconds = _synchronized(device) - start
    finally:
        if comm is not None:
            comm.close()
    dist.all_reduce(losses)  # SUM (gloo has no AVG), divided below
    losses /= world
    valid = text.validation_loss(ddp.module, corpus.valid, spec.seq, device)
    return {"wire": wire, "seed": seed, "steps": args.steps, "world": world,
            "train_last": float(losses[-LAST:].mean()), "valid": valid,
            "samples_per_s": (args.steps - args.warmup) * args.batch * world / seconds,
            "identical": _identical(ddp, device),
            "params": sum(p.numel() for p in ddp.parameters())}


def _synchronized(device: torch.device) -> float:
    flag = torch.zeros(1, device=device)
    dist.all_reduce(flag)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _identical(ddp: DDP, device: torch.device) -> bool:
    """Whether every rank holds the same parameters, bit for bit (their int32 views'
    sum and xor-like checksum agree: MAX == MIN over ranks)."""
    bits = torch.cat([p.detach().reshape(-1).view(torch.int32).to(torch.int64)
                      for p in ddp.parameters()])
    weights = torch.arange(1, bits.numel() + 1, device=device, dtype=torch.int64) % 65_521
    check = torch.stack([bits.sum(), (bits * weights).sum()])
    hi, lo = check.clone(), check.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return bool(torch.equal(hi, lo))


def rank_main(args: argparse.Namespace, launch: Launch, device: torch.device) -> list[dict]:
    corpus = text.corpus()
    runs = []
    if launch.rank == 0:
        spec = text.spec(args.width, args.layers, args.heads, args.seq)
        print(f"# {corpus.describe()}; decoder {spec.layers} x {spec.width}, {spec.heads} "
              f"heads, seq {spec.seq}, batch {args.batch} a rank, {launch.world_size} ranks, "
              f"machines {args.machines}, Adam {args.lr} ({args.lr_warmup}-step ramp), "
              f"device {device}", flush=True)
    for wire in args.wire.split(","):
        for seed in (int(s) for s in args.seed.split(",")):
            run = train(args, wire, seed, corpus, device)
            runs.append(run)
            if launch.rank == 0:
                print(f"{wire:>10} seed {seed}: train (last {LAST}) {run['train_last']:.4f}  "
                      f"valid {run['valid']:.4f}  {run['samples_per_s']:.0f} samples/s  "
                      f"identical {run['identical']}", flush=True)
    if launch.rank == 0:
        _table(runs)
        if args.json:
            Path(args.json).write_text(json.dumps(runs, indent=1))
    return runs


def _table(runs: list[dict]) -> None:
    print(f"{'wire':>10} {'seed':>4} {'train last100':>13} {'valid':>7} {'samples/s':>9} "
          f"{'identical':>9}")
    for r in runs:
        print(f"{r['wire']:>10} {r['seed']:>4} {r['train_last']:>13.4f} {r['valid']:>7.4f} "
              f"{r['samples_per_s']:>9.0f} {r['identical']!s:>9}")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    run_ranks(functools.partial(rank_main, args), args.nprocs, cuda=cuda)


if __name__ == "__main__":
    main()
