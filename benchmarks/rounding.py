"""Error feedback against stochastic rounding on the 8- and 4-bit wires (issue 37).

The compressed route (ringreduce/execution/compressed.py) quantizes twice per call: each
machine's partial sum before collect, the reduced row before diffuse. Two known ways keep
that from biasing training: round to nearest and carry what rounding dropped into the
next call of the same key (error feedback, the library's choice, on in the DDP hook), or
round stochastically (unbiased per call, nothing kept). This measures both, and each
alone, on the same gradients:

  nearest         round to nearest (quant.py, the library's own code), nothing kept
  nearest+ef      the same with error feedback, as compressed.py keeps it
  stochastic      floor(x / scale + u), u uniform in [0, 1), nothing kept
  stochastic+ef   stochastic rounding with error feedback

One process stands for M machines x D devices (the arithmetic does not depend on where
it runs). Every mode trains its own copy of a small MLP from the same start on the same
batches, each rank's gradient computed on its own batch and the average reduced through
the mode's route; fp32 (the exact average) trains at several seeds for its spread. Per
format and mode it prints the reduction's error against the fp64 average on the mode's
own gradients (relative L2, median over calls), its drift (the relative L2 of the sum
over all calls of the error: what the optimizer integrates) and the final loss (mean of
the last 20 steps) against fp32's.

    python benchmarks/rounding.py [--steps 300] [--seeds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch
from torch import nn

from ringreduce.execution.quant import FORMATS, Format, dequantize, quantize

MODES = ("nearest", "nearest+ef", "stochastic", "stochastic+ef")
WIRES = ("int8", "int4")
"""Formats with integer steps (stochastic rounding of e4m3 is another kernel)."""
BLOCK = 256
FINAL_STEPS = 20


def stochastic(x: torch.Tensor, fmt: Format, block: int, gen: torch.Generator) -> torch.Tensor:
    """x (R, k) quantized per block with stochastic rounding, and dequantized."""
    rows, k = x.shape
    blocks = x.view(rows, k // block, block)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / fmt.qmax
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    noise = torch.rand(blocks.shape, generator=gen)
    q = torch.floor(blocks / safe + noise).clamp_(-fmt.qmax, fmt.qmax)
    return (q * scale).view(rows, k)


def nearest(x: torch.Tensor, fmt: Format, block: int) -> torch.Tensor:
    """x (R, k) through the library's own quantize and dequantize."""
    packed = torch.empty((x.shape[0], fmt.row_bytes(x.shape[1], block)), dtype=torch.uint8)
    quantize(x.contiguous(), fmt, block, packed)
    out = torch.empty_like(x)
    dequantize(packed, fmt, block, out)
    return out


@dataclasses.dataclass
class Route:
    """One mode's compressed all-reduce, with its error-feedback state."""

    fmt: Format
    mode: str
    gen: torch.Generator
    collect: torch.Tensor | None = None
    diffuse: torch.Tensor | None = None

    def _round(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode.startswith("stochastic"):
            return stochastic(x, self.fmt, BLOCK, self.gen)
        return nearest(x, self.fmt, BLOCK)

    def average(self, grads: torch.Tensor) -> torch.Tensor:
        """grads (M, D, n) fp32 -> the route's average (n,): machine partials summed in
        fp32, quantized (collect), summed over machines in order, quantized (diffuse)."""
        machines, devices, n = grads.shape
        k = -(-n // BLOCK) * BLOCK
        partial = torch.zeros(machines, k)
        partial[:, :n] = grads.sum(dim=1)
        feedback = self.mode.endswith("+ef")
        if feedback and self.collect is not None:
            partial += self.collect
        sent = self._round(partial)
        if feedback:
            self.collect = partial - sent
        reduced = sent[0].clone()
        for m in range(1, machines):
            reduced += sent[m]
        if feedback and self.diffuse is not None:
            reduced += self.diffuse
        out = self._round(reduced.view(1, k)).view(k)
        if feedback:
            self.diffuse = reduced - out
        return out[:n] / (machines * devices)


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 10))


def batches(steps: int, ranks: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per step and rank: inputs and soft labels from a fixed random teacher."""
    g = torch.Generator().manual_seed(1000 + seed)
    teacher = torch.randn(64, 10, generator=g) / 2
    out = []
    for _ in range(steps * ranks):
        x = torch.randn(64, 64, generator=g)
        out.append((x, (x @ teacher).softmax(-1)))
    return out


@dataclasses.dataclass
class Result:
    losses: list[float]
    errors: list[float]
    drift: float


def train(route: Route | None, steps: int, machines: int, devices: int, seed: int,
          data: list[tuple[torch.Tensor, torch.Tensor]]) -> Result:
    """``steps`` of Adam on the average of every rank's gradient, through ``route``
    (None: the exact average)."""
    net = model(seed)
    params = list(net.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    ranks = machines * devices
    losses, errors = [], []
    error_sum: torch.Tensor | None = None
    exact_sum: torch.Tensor | None = None
    for step in range(steps):
        grads, loss = [], 0.0
        for r in range(ranks):
            x, y = data[step * ranks + r]
            net.zero_grad()
            value = nn.functional.cross_entropy(net(x), y)
            value.backward()
            loss += value.item() / ranks
            grads.append(torch.cat([p.grad.flatten() for p in params]))
        stacked = torch.stack(grads).view(machines, devices, -1)
        exact = stacked.double().mean(dim=(0, 1))
        got = exact.float() if route is None else route.average(stacked)
        diff = got.double() - exact
        errors.append((diff.norm() / exact.norm()).item())
        error_sum = diff if error_sum is None else error_sum + diff
        exact_sum = exact if exact_sum is None else exact_sum + exact
        offset = 0
        for p in params:
            p.grad = got[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
        losses.append(loss)
    assert error_sum is not None and exact_sum is not None
    return Result(losses, errors, (error_sum.norm() / exact_sum.norm()).item())


def final(r: Result) -> float:
    return statistics.fmean(r.losses[-FINAL_STEPS:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", type=int, default=3, help="fp32 seeds for its spread")
    p.add_argument("--machines", type=int, default=2)
    p.add_argument("--devices", type=int, default=2)
    args = p.parse_args()
    m, d, steps = args.machines, args.devices, args.steps
    data = batches(steps, m * d, 0)
    fp32 = [train(None, steps, m, d, seed, batches(steps, m * d, seed) if seed else data)
            for seed in range(args.seeds)]
    finals = [final(r) for r in fp32]
    print(f"# {m} machines x {d} devices, blocks of {BLOCK}, {steps} steps of Adam; "
          f"final loss: mean of the last {FINAL_STEPS} steps")
    print(f"# fp32 over seeds {list(range(args.seeds))}: final "
          f"{', '.join(f'{f:.5f}' for f in finals)}; spread {max(finals) - min(finals):.5f}")
    print(f"{'wire':<6} {'mode':<14} {'error/call':>11} {'drift':>9} {'final loss':>11} "
          f"{'vs fp32 seed 0':>15}")
    for wire in WIRES:
        for mode in MODES:
            route = Route(FORMATS[wire], mode, torch.Generator().manual_seed(7))
            r = train(route, steps, m, d, 0, data)
            print(f"{wire:<6} {mode:<14} {statistics.median(r.errors):>11.2e} "
                  f"{r.drift:>9.2e} {final(r):>11.5f} {final(r) - finals[0]:>+15.5f}",
                  flush=True)


if __name__ == "__main__":
    main()
