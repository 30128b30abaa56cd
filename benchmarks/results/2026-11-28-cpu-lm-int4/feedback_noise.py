"""What a run of consecutive compressed all-reduces hands Adam, with and without the
hook's error feedback, on the byte-level LM's real gradients (the CPU training runs'
shape, 2 x 2 emulated ranks, the whole gradient as one bucket).

Per wire and block, over --samples consecutive steps (the model takes one Adam step
between them): each step's relative L2 error of the delivered sum; the error of the sum
over all steps (what error feedback keeps small); Adam's moments (betas 0.9/0.999, eps
1e-8, bias-corrected) run on the delivered and on the exact (fp64) sums side by side:
the last step's update u = m / (sqrt(v) + eps) against the exact stream's (relative L2
of the difference, ratio of the norms), and the median over coordinates of v's ratio.
The collect and diffuse errors are kept exactly as compressed.py keeps them (its Codec,
torch ops): machine m's partial carries its own collect error, the summed row the
diffuse error, both in the rotated domain for int4. A variant ``int4/int8:256`` is a
study of a wire the library does not have: int4 (rotated) on collect, the sum
requantized in int8 (in the rotated domain) for diffuse.

    python benchmarks/results/2026-11-28-cpu-lm-int4/feedback_noise.py --warm 300 --samples 30
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import wire_study
from benchmarks.workloads import text
from benchmarks.workloads import transformer_model as tm
from ringreduce.execution import compressed, quant

CPU = torch.device("cpu")


class Stream:
    """One wire's calls over consecutive steps, its error memories kept (feedback) or not."""

    def __init__(self, fmt: quant.Format, block: int, machines: int, n: int, world: int,
                 feedback: bool, diffuse: quant.Format | None = None) -> None:
        self.k = -(-n // block) * block
        self.n, self.world, self.block = n, world, block
        self.codec = compressed.Codec(fmt, block, None, CPU)
        self.diffuse_codec = None if diffuse is None else compressed.Codec(diffuse, block,
                                                                            None, CPU)
        self.collect = torch.zeros((machines, self.k)) if feedback else None
        self.diffuse = torch.zeros((1, self.k)) if feedback else None

    def call(self, parts: torch.Tensor) -> torch.Tensor:
        x = torch.zeros((parts.shape[0], self.k))
        x[:, :self.n] = parts
        got = self.codec.packed(parts.shape[0], self.k)
        self.codec.quantize(x, got, self.collect)
        if self.diffuse_codec is not None:
            return self._mixed(got)
        # one emulated row owner sums every machine's partial and requantizes
        sent = compressed._add(got, got, self.codec, self._errors(), 0)
        ctx = SimpleNamespace(topo=SimpleNamespace(world_size=self.world), divisors={})
        out = compressed._unpack(sent, self.codec, "sum", torch.float32,
                                 ctx)  # type: ignore[arg-type]
        return out.view(-1)[:self.n].double()

    def _mixed(self, got: torch.Tensor) -> torch.Tensor:
        """compressed._add and _unpack with the sum requantized in the diffuse format
        (in the rotated domain: rotated back once at the end)."""
        assert self.diffuse_codec is not None
        fmt, dfmt = self.codec.fmt, self.diffuse_codec.fmt
        values = torch.empty((got.shape[0], self.k))
        quant.dequantize(got, fmt, self.block, values)
        reduced = values[0].clone()
        for j in range(1, got.shape[0]):
            reduced.add_(values[j])
        sent = self.diffuse_codec.packed(1, self.k)
        self.diffuse_codec.quantize(reduced.view(1, self.k), sent, self.diffuse, rotate=False)
        out = torch.empty((1, self.k))
        quant.dequantize(sent, dfmt, self.block, out)
        if fmt.rotated:
            quant.rotate_back(out, self.block)
        return out.view(-1)[:self.n].double()

    def _errors(self) -> Any:  # compressed._add reads only .diffuse
        return None if self.diffuse is None else SimpleNamespace(diffuse=self.diffuse)


class Adam:
    """Adam's moments of one gradient stream (fp64)."""

    def __init__(self, n: int) -> None:
        self.m, self.v, self.t = torch.zeros(n, dtype=torch.float64), \
            torch.zeros(n, dtype=torch.float64), 0

    def step(self, g: torch.Tensor) -> torch.Tensor:
        self.t += 1
        self.m.mul_(0.9).add_(g, alpha=0.1)
        self.v.mul_(0.999).addcmul_(g, g, value=0.001)
        m, v = self.m / (1 - 0.9 ** self.t), self.v / (1 - 0.999 ** self.t)
        return m / (v.sqrt() + 1e-8)


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
    p.add_argument("--warm", type=int, default=300)
    p.add_argument("--samples", type=int, default=30, help="consecutive steps")
    p.add_argument("--variants", default="int4:256,int4:64,int8:256")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    spec = text.spec(args.width, args.layers, args.heads, args.seq)
    data = text.corpus("stdlib")
    model = text.build(spec, 0)
    ranks, d = args.machines * args.devices, args.devices
    n = sum(q.numel() for q in model.parameters())
    train = text.batches(data.train, spec.seq, args.warm, args.batch, 0, 0, CPU)
    per_rank = [text.batches(data.train, spec.seq, args.samples, args.batch, 1, r, CPU)
                for r in range(ranks)]
    variants = [(w, int(b), fb) for w, b in (v.split(":") for v in args.variants.split(","))
                for fb in (True, False)]
    streams = {v: Stream(wire_study.VARIANTS[v[0].split("/")[0]], v[1], args.machines, n,
                         ranks, v[2], diffuse=None if "/" not in v[0] else
                         wire_study.VARIANTS[v[0].split("/")[1]])
               for v in variants}
    adams = {v: Adam(n) for v in variants}
    exact_adam = Adam(n)
    step_err: dict[tuple[str, int, bool], list[float]] = {v: [] for v in variants}
    total_err = {v: torch.zeros(n, dtype=torch.float64) for v in variants}
    total = torch.zeros(n, dtype=torch.float64)
    updates: dict[tuple[str, int, bool], torch.Tensor] = {}
    exact_update = torch.zeros(n, dtype=torch.float64)
    for grads in wire_study._gradients(model, tm.loss, train, per_rank, args.samples):
        exact = torch.stack(grads).double().sum(0)
        parts = torch.stack([sum(grads[m * d + i] for i in range(1, d)) + grads[m * d]
                             if d > 1 else grads[m * d] for m in range(args.machines)])
        total += exact
        exact_update = exact_adam.step(exact)
        for v in variants:
            got = streams[v].call(parts)
            step_err[v].append(float((got - exact).norm() / exact.norm()))
            total_err[v] += got - exact
            updates[v] = adams[v].step(got)
    print(f"# {spec.layers} x {spec.width}, {args.machines} x {args.devices} ranks, batch "
          f"{args.batch}, {args.warm} Adam steps first, then {args.samples} consecutive "
          f"compressed sums (one bucket of {n} values)")
    print(f"{'wire':>9} {'block':>5} {'feedback':>8} {'step err':>9} {'sum err':>8} "
          f"{'u diff':>7} {'|u|/|u*|':>8} {'v/v* med':>8}")
    for v in variants:
        u = updates[v]
        ratio_v = (adams[v].v / exact_adam.v.clamp_min(1e-300)).median()
        print(f"{v[0]:>9} {v[1]:>5} {v[2]!s:>8} "
              f"{sum(step_err[v]) / len(step_err[v]):>9.4f} "
              f"{float(total_err[v].norm() / total.norm()):>8.4f} "
              f"{float((u - exact_update).norm() / exact_update.norm()):>7.4f} "
              f"{float(u.norm() / exact_update.norm()):>8.4f} {float(ratio_v):>8.4f}")


if __name__ == "__main__":
    main()
