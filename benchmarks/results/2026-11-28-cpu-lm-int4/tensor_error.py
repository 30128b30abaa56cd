"""Where one compressed all-reduce's error lands, per parameter tensor, on the byte-level
LM's real gradients (the CPU training runs' shape): for each wire and block, each
tensor's relative L2 error (L2 of the error over L2 of the fp64 sum, that tensor's
coordinates only), the fraction of its coordinates whose |error| exceeds |true sum|,
and its RMS against the RMS of the DDP bucket it sits in.

The buckets are DDP's own: a one-rank gloo DDP with a hook that records each bucket's
parameters (after DDP's rebuild at the first step), so tensors sit at the offsets the
hook hands ringreduce; each bucket is one call of benchmarks/wire_study.py's one_call
(M machines' partials, compressed.py's codec in torch ops, blocks counted from the
bucket's start, as compressed.py counts them: the bucket padded to D*M*block values,
each of its D*M rows a whole number of blocks). No error feedback.

    python benchmarks/results/2026-11-28-cpu-lm-int4/tensor_error.py --warm 300
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import wire_study
from benchmarks.workloads import text
from benchmarks.workloads import transformer_model as tm

CPU = torch.device("cpu")


def bucket_layout(model: nn.Module, batch: Any) -> list[list[str]]:
    """Each DDP bucket's parameter names, in the bucket's order (one gloo rank)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            names = {id(p): n for n, p in model.named_parameters()}
            seen: dict[int, list[str]] = {}

            def hook(state, bucket):  # type: ignore[no-untyped-def]
                # unannotated: DDP compares a hook's annotations with evaluated types
                seen[bucket.index()] = [names[id(p)] for p in bucket.parameters()]
                fut: torch.futures.Future = torch.futures.Future()
                fut.set_result(bucket.buffer())
                return fut

            ddp = DDP(model, bucket_cap_mb=25.0)
            ddp.register_comm_hook(None, hook)
            for _ in range(2):  # DDP rebuilds its buckets after the first step
                seen.clear()
                tm.loss(ddp, batch).backward()
            model.zero_grad()
            return [seen[i] for i in sorted(seen)]
        finally:
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank")
    p.add_argument("--machines", type=int, default=2)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--warm", type=int, default=300, help="Adam steps (rank 0's batches) first")
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--variants", default="int4:256,int4:64,int8:256,int8:64")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    spec = text.spec(args.width, args.layers, args.heads, args.seq)
    data = text.corpus("stdlib")
    model = text.build(spec, 0)
    ranks = args.machines * args.devices
    train = text.batches(data.train, spec.seq, args.warm, args.batch, 0, 0, CPU)
    per_rank = [text.batches(data.train, spec.seq, args.samples, args.batch, 1, r, CPU)
                for r in range(ranks)]
    layout = bucket_layout(model, train[0])
    params = dict(model.named_parameters())
    variants = [(w, int(b)) for w, b in (v.split(":") for v in args.variants.split(","))]
    sums: dict[tuple[str, int], dict[str, list[float]]] = {}
    print(f"# {spec.layers} x {spec.width}, {args.machines} x {args.devices} ranks, batch "
          f"{args.batch}, {args.warm} Adam steps first, {args.samples} gradients; buckets: "
          + ", ".join(f"{len(b)} tensors" for b in layout))
    for grads in wire_study._gradients(model, tm.loss, train, per_rank, args.samples):
        flat = {}  # tensor name -> its slice of each rank's flat gradient
        offset = 0
        for name, param in model.named_parameters():
            flat[name] = [g[offset:offset + param.numel()] for g in grads]
            offset += param.numel()
        for bucket in layout:
            rank_bufs = [torch.cat([flat[n][r] for n in bucket]) for r in range(ranks)]
            exact = torch.stack(rank_bufs).double().sum(0)
            d = args.devices
            parts = torch.stack([sum(rank_bufs[m * d + i] for i in range(1, d)) + rank_bufs[m * d]
                                 if d > 1 else rank_bufs[m * d] for m in range(args.machines)])
            bucket_rms = float(exact.pow(2).mean().sqrt())
            for wire, block in variants:
                got = wire_study.one_call(parts, wire_study.VARIANTS[wire], block, None,
                                          ranks).double()
                err = got - exact
                stats = sums.setdefault((wire, block), {})
                at = 0
                for n in bucket:
                    k = params[n].numel()
                    e, x = err[at:at + k], exact[at:at + k]
                    at += k
                    row = stats.setdefault(n, [0.0, 0.0, 0.0, 0.0, 0.0])
                    row[0] += float(e.pow(2).sum())
                    row[1] += float(x.pow(2).sum())
                    row[2] += float((e.abs() > x.abs()).double().mean()) / args.samples
                    row[3] += float(x.pow(2).mean().sqrt()) / bucket_rms / args.samples
                    row[4] = k
    order = [n for b in layout for n in b]
    head = " ".join(f"{f'{w}:{b}':>16}" for w, b in variants)
    print(f"# per tensor, bucket order: relative L2 error | fraction |err| > |true| "
          f"(sums of squares over the {args.samples} gradients)")
    print(f"{'tensor':<34} {'numel':>7} {'rms/bucket':>10} {head}")
    for n in order:
        first = sums[variants[0]][n]
        cells = " ".join(f"{(sums[v][n][0] / sums[v][n][1]) ** 0.5:>8.3f} {sums[v][n][2]:>7.3f}"
                         for v in variants)
        print(f"{n:<34} {int(first[4]):>7} {first[3]:>10.3g} {cells}")
    total = " ".join(f"{_whole(sums[v], order):>16.3f}" for v in variants)
    print(f"{'whole model':<34} {'':>7} {'':>10} {total}")
    fracs = []
    for v in variants:
        numel = sum(sums[v][n][4] for n in order)
        fracs.append(sum(sums[v][n][2] * sums[v][n][4] for n in order) / numel)
    print(f"{'coords |err|>|true| (all)':<34} {'':>7} {'':>10} "
          + " ".join(f"{f:>16.3f}" for f in fracs))


def _whole(stats: dict[str, list[float]], order: list[str]) -> float:
    """The whole model's relative L2 error from its tensors' sums of squares."""
    return (sum(stats[n][0] for n in order) / sum(stats[n][1] for n in order)) ** 0.5


if __name__ == "__main__":
    main()
