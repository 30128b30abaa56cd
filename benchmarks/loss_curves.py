"""Loss curves of several DDP runs (benchmarks/dlrm.py --json files) against fp32's
seed-to-seed spread, and the time each mode takes to a late loss target.

    python3 benchmarks/loss_curves.py int8.json bf16.json seeds.json [--window 50]

A step's loss is one batch's, noisy, so curves are compared as trailing means over
``--window`` steps. The fp32 envelope is, per step, the least and the greatest of the
``nccl`` runs' means over every seed given (plain DDP on NCCL: seeds differ in initial
weights and in batches). For every other run it reports: its largest gap to the nccl
run of its own seed (same weights, same batches), at how many steps that gap exceeds
the envelope's width (the seed-to-seed spread there), at how many its mean lies above
the envelope (worse than every fp32 seed; below it is not a loss) and by how much at
most, and the step and seconds (at its own timed
seconds per step) at which its mean first reaches the target. The default target is
the highest final mean among the nccl seeds: a loss every fp32 seed reaches by the
end, so reaching it early is a real difference (a target crossed in the first steps,
as a third of the way from the first loss to the floor is, says nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Run:
    name: str  # the file's stem
    mode: str
    seed: int
    losses: tuple[float, ...]
    seconds_per_step: float
    samples_per_s: float


def load(paths: Sequence[Path]) -> list[Run]:
    runs = []
    for path in paths:
        for r in json.loads(path.read_text())["runs"]:
            runs.append(Run(path.stem, r["mode"], r["seed"], tuple(r["losses"]),
                            r["seconds"] / r["timed_steps"], r["samples_per_s"]))
    return runs


def trailing(losses: Sequence[float], window: int) -> list[float]:
    """Mean of the last ``window`` losses at each step from ``window - 1`` on."""
    if not 0 < window <= len(losses):
        raise ValueError(f"window {window} must be in 1..{len(losses)} (the run's steps)")
    out, total = [], sum(losses[:window - 1])
    for i in range(window - 1, len(losses)):
        total += losses[i]
        out.append(total / window)
        total -= losses[i - window + 1]
    return out


def report(runs: Sequence[Run], window: int, target: float | None = None) -> str:
    fp32 = [r for r in runs if r.mode == "nccl"]
    if not fp32:
        raise ValueError("no nccl run among the files: the envelope needs plain DDP's")
    curves = {id(r): trailing(r.losses, window) for r in runs}
    low = [min(v) for v in zip(*(curves[id(r)] for r in fp32), strict=True)]
    high = [max(v) for v in zip(*(curves[id(r)] for r in fp32), strict=True)]
    spread = [h - lo for h, lo in zip(high, low, strict=True)]
    if target is None:
        target = max(curves[id(r)][-1] for r in fp32)
    lines = [f"# trailing means over {window} steps; fp32 envelope: nccl at seeds "
             f"{sorted({r.seed for r in fp32})}, final spread {spread[-1]:.5f}, largest "
             f"{max(spread):.5f}; target {target:.5f}",
             f"{'file':<14} {'mode':<10} {'seed':>4} {'samples/s':>10} {'final':>8} "
             f"{'max|gap| same seed':>18} {'gap>spread':>10} {'steps above':>11} "
             f"{'max above':>9} {'target step':>11} {'s':>7}"]
    for r in runs:
        twin = next((f for f in fp32 if f.seed == r.seed and f.name == r.name), None) or \
            next((f for f in fp32 if f.seed == r.seed), None)
        gaps = [] if twin is None or twin is r else \
            [abs(a - b) for a, b in zip(curves[id(r)], curves[id(twin)], strict=True)]
        lines.append(_row(r, curves[id(r)], gaps, spread, high, target, window))
    return "\n".join(lines)


def _row(r: Run, curve: list[float], gaps: list[float], spread: list[float],
         high: list[float], target: float, window: int) -> str:
    gap = f"{max(gaps):.5f}" if gaps else "-"
    wide = str(sum(g > w for g, w in zip(gaps, spread, strict=True))) if gaps else "-"
    above = [v - h for v, h in zip(curve, high, strict=True) if v > h]
    step = next((i + window - 1 for i, v in enumerate(curve) if v <= target), None)
    seconds = "-" if step is None else f"{step * r.seconds_per_step:.2f}"
    return (f"{r.name:<14} {r.mode:<10} {r.seed:>4} {r.samples_per_s:>10.0f} "
            f"{curve[-1]:>8.5f} {gap:>18} {wide:>10} {len(above):>11} "
            f"{(max(above) if above else 0.0):>9.5f} {'-' if step is None else step:>11} "
            f"{seconds:>7}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="benchmarks/dlrm.py --json outputs")
    p.add_argument("--window", type=int, default=50, help="steps per trailing mean")
    p.add_argument("--target", type=float, default=None,
                   help="loss target of the trailing mean (default: the highest final "
                        "mean of the nccl seeds)")
    args = p.parse_args(argv)
    print(report(load(args.files), args.window, args.target))


if __name__ == "__main__":
    main()
