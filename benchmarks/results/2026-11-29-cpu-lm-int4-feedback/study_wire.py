"""A study, not a wire: text_lm.py's training with int4's compressed route changed in two
ways the library does not offer, each chosen on the command line.

``--diffuse int8``: the owner's fp32 sum of the rotated int4 rows is requantized as
rotated int8 (the same signs: they depend on the block only) for diffuse, as the
earlier study's mixed_wire.py did (``--diffuse int4``: the library's route).

``--loco-beta B``: the error memory is a moving average (LoCo, Xie et al. 2024, as
DeepSpeed's ``loco_swizzled_quant_kernel`` implements it; ``err_beta``, default 0.8
there):

    h_t = x_t + e_{t-1}                   (compensated input, as the library's feedback)
    e_t = B * e_{t-1} + (1 - B) * (h_t - Q(h_t))

on both memories (collect, per machine row; diffuse, the owned sum). B = 0 is the
library's error feedback, the same torch ops in the same order (its runs repeat the
library's bit for bit). What crosses per step is x_t + (e_{t-1} - e_t) / (1 - B): the
sum over steps still telescopes (its error (e_0 - e_T) / (1 - B)), while the memory
averages each step's residual with the older ones, so a step's error is
e_{t-1} - r_t with r_t the fresh residual, not r_{t-1} - r_t.

``--noise EPS`` (a control, not a wire): the exact fp32 sum (torch.distributed's
all-reduce on the default group) plus, per block of ``wire_block`` values, independent
Gaussian noise of EPS times the block's RMS, the same on every rank (a generator seeded
by the call count): an error of int4's per-call size (one call, no memory: 0.13) that is
unbiased and independent from step to step, to tell whether the error's size alone
costs the loss.

text_lm.py's ``--no-hook-feedback`` passes no memory (errors None): both changes
honour it (no memory is read or written).

In every rank (spawned ranks import this module as their ``__main__``; the choice
travels in the environment) ``compressed.all_reduce`` is replaced; CPU only (quant.py's
torch ops), so ``--device cpu``, and ``--wire int4`` only. The engine line in the log
still says ``wire=int4``; each rank prints the study's route once to stderr.

    python benchmarks/results/2026-11-29-cpu-lm-int4-feedback/study_wire.py \\
        --diffuse int8 --loco-beta 0.8 --device cpu --nprocs 4 --machines 2 --width 128 \\
        --layers 2 --seq 64 --steps 600 --wire int4 --spread int4 --seed 0,1,2 --json x.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from ringreduce.execution import compressed, quant
from ringreduce.execution.context import CallContext
from ringreduce.execution.feedback import Errors

DIFFUSE = {"int4": quant.FORMATS["int4"],
           "int8": quant.Format("int8-rot", 127.0, 8, "int8", rotated=True)}
"""The diffuse hop's format by name: the library's int4, or rotated int8 (the earlier
study's ``int8-rot``)."""
ENV = "STUDY_WIRE_CHOICE"
"""Where the parent leaves the choice for the spawned ranks (``diffuse:beta``); not
RINGREDUCE_*: the library warns of unknown variables of its prefix."""


class LocoCodec(compressed.Codec):
    """compressed.Codec (torch ops) whose error memory is LoCo's moving average."""

    def __init__(self, fmt: quant.Format, block: int, beta: float, device: torch.device,
                 on: compressed.On | None = None) -> None:
        super().__init__(fmt, block, None, device, on)
        self.beta = beta

    def quantize(self, x: torch.Tensor, out: torch.Tensor, residual: torch.Tensor | None,
                 rotate: bool = True) -> None:
        if residual is None or self.beta == 0.0:
            super().quantize(x, out, residual, rotate)
            return
        kept = residual.clone()
        super().quantize(x, out, residual, rotate)  # residual = h - Q(h), h = R(x) + kept
        residual.mul_(1.0 - self.beta).add_(kept, alpha=self.beta)


def study_all_reduce(t: torch.Tensor, op: str, fmt: quant.Format, block: int,
                     errors: Errors | None, ctx: CallContext, on: compressed.On) -> None:
    """compressed.all_reduce (its CPU path) with the diffuse format and the memory's
    update of the environment's choice."""
    diffuse_name, beta = choice()
    if t.is_cuda or fmt.name != "int4":
        raise ValueError(f"study_wire.py studies int4 on the CPU only, got {fmt.name} on "
                         f"{t.device}; pass --device cpu --wire int4")
    n, topo = t.numel(), ctx.topo
    if n == 0:
        return
    _announce(diffuse_name, beta, errors is not None)
    if diffuse_name == "noise":
        _noisy_exact(t, op, beta, block, topo.world_size)
        return
    k = compressed.padded_row(n, topo.devices_per_machine, topo.machines, block)
    collect = LocoCodec(fmt, block, beta, t.device, on)
    diffuse = LocoCodec(DIFFUSE[diffuse_name], block, beta, t.device, on)
    part = compressed._machine_part(t, k, collect, ctx, on)
    got, mine = compressed._collect(part, collect, errors, ctx, on.stream)
    m, machines = topo.machine_index, got.shape[0]
    got[m].copy_(mine[m])  # this machine's own partial counts as quantized too
    values = torch.empty((machines, k), dtype=torch.float32, device=t.device)
    quant.dequantize(got, fmt, block, values)
    reduced = values[0].clone()
    for j in range(1, machines):  # machines in order, as compressed._add
        reduced.add_(values[j])
    sent = diffuse.packed(1, k)
    residual = None if errors is None else errors.diffuse.view(1, k)
    diffuse.quantize(reduced.view(1, k), sent, residual, rotate=False)
    rows = compressed._diffuse(sent, ctx, on)
    compressed._unpack_into(t, rows, diffuse, op, ctx, on)


def _noisy_exact(t: torch.Tensor, op: str, eps: float, block: int, world: int) -> None:
    """t = the exact sum (or mean) plus eps x each block's RMS x N(0, 1), alike on every
    rank (every rank makes the same calls in the same order)."""
    dist.all_reduce(t)
    if op == "avg":
        t.div_(world)
    n = t.numel()
    padded = torch.zeros(-(-n // block) * block, dtype=torch.float32)
    padded[:n] = t.view(-1)
    blocks = padded.view(-1, block)
    rms = blocks.pow(2).mean(1, keepdim=True).sqrt()
    generator = torch.Generator().manual_seed(1_000_003 + len(_calls))
    _calls.append(True)
    noise = torch.randn(blocks.shape, generator=generator) * rms * eps
    t.view(-1).add_(noise.view(-1)[:n].to(t.dtype))


_calls: list[bool] = []


def choice() -> tuple[str, float]:
    """(diffuse format name, LoCo beta) from the environment (the library's: int4, 0);
    ("noise", eps) for the control."""
    diffuse, value = os.environ.get(ENV, "int4:0").split(":")
    if diffuse == "noise" and float(value) > 0:
        return diffuse, float(value)
    if diffuse not in DIFFUSE or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{ENV}={os.environ.get(ENV)!r}: want diffuse:beta, diffuse one of "
                         f"{tuple(DIFFUSE)}, 0 <= beta < 1, or noise:eps, eps > 0")
    return diffuse, float(value)


_announced: list[bool] = []


def _announce(diffuse: str, beta: float, feedback: bool) -> None:
    if not _announced:
        _announced.append(True)
        route = f"exact sums + noise {beta} x block RMS" if diffuse == "noise" else \
            f"collect int4, diffuse {diffuse}, feedback " + \
            (f"LoCo beta {beta}" if feedback else "off")
        print(f"# study_wire pid {os.getpid()}: {route}", file=sys.stderr, flush=True)


compressed.all_reduce = study_all_reduce  # type: ignore[assignment]


def main() -> None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--diffuse", choices=tuple(DIFFUSE), default="int4")
    p.add_argument("--loco-beta", type=float, default=0.0)
    p.add_argument("--noise", type=float, help="the control: exact sums plus this noise")
    args, rest = p.parse_known_args()
    os.environ[ENV] = f"{args.diffuse}:{args.loco_beta}" if args.noise is None else \
        f"noise:{args.noise}"
    choice()  # refuse a bad choice before any rank starts
    from benchmarks import text_lm
    text_lm.main(rest)


if __name__ == "__main__":
    main()
