"""The language-model table of this folder's README: every DDP run of runs 1-4 read from
the logs' JSON, each wire run against DDP fp32 at the same seed (same weights, same
batches), per seed and as a mean, with fp32's own range and sd. The wire arithmetic and
fp32's are deterministic on this kind (fp32 seed 0 and the wires repeat to the last digit
across calls), so runs of different calls pair.

    python benchmarks/results/2026-11-29-h200x2-lm-feedback/paired.py
"""

from __future__ import annotations

import json
import math
import statistics
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (archive, error feedback in the wire runs of that set)
SETS = [("run1-textlm-logs.tar.gz", "off"), ("run2-textlm-wires-logs.tar.gz", "on"),
        ("run3-textlm-int8-nofeedback-logs.tar.gz", "off"), ("run4-seeds34-logs.tar.gz", "off")]


def runs() -> dict[tuple[str, int], dict[str, float]]:
    """(mode, seed) -> losses; a wire's mode named with its feedback (int4 on / off)."""
    found: dict[tuple[str, int], dict[str, float]] = {}
    for archive, feedback in SETS:
        with tarfile.open(HERE / archive) as tar:
            member = tar.extractfile("./textlm_ddp.json")
            assert member is not None
            for r in json.load(member):
                mode = r["mode"] if r["mode"] == "fp32" else f"{r['mode']} fb {feedback}"
                losses = {"train": r["train_last"], "valid": r["valid"]}
                if (mode, r["seed"]) in found:  # a repeat: it must match to the last digit
                    assert found[mode, r["seed"]] == losses, (mode, r["seed"])
                found[mode, r["seed"]] = losses
                assert r["identical"], (archive, mode, r["seed"])
    return found


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (no scipy here): bisection on the CDF, Simpson's rule on the
    density from 0."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def cdf(x: float, n: int = 2000) -> float:
        h = x / n
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def interval(diffs: list[float]) -> str:
    """The paired mean difference's 95 % t-interval (needs 2 seeds or more)."""
    if len(diffs) < 2:
        return ""
    half = t_quantile(0.975, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    mean = statistics.mean(diffs)
    return f", 95 % interval {mean - half:+.4f}..{mean + half:+.4f}"


def main() -> None:
    found = runs()
    fp32 = {seed: v for (mode, seed), v in found.items() if mode == "fp32"}
    for what in ("train", "valid"):
        ref = [fp32[s][what] for s in sorted(fp32)]
        print(f"# {what}: fp32 seeds {sorted(fp32)} mean {statistics.mean(ref):.4f} "
              f"range {min(ref):.4f}..{max(ref):.4f} sd {statistics.stdev(ref):.4f}")
        for mode in sorted({m for m, _ in found if m != "fp32"}):
            seeds = sorted(s for m, s in found if m == mode)
            diffs = [found[mode, s][what] - fp32[s][what] for s in seeds]
            above = sum(found[mode, s][what] > max(ref) for s in seeds)
            print(f"{mode:>12} seeds {','.join(map(str, seeds)):<10} "
                  + " ".join(f"{d:+.4f}" for d in diffs)
                  + f" | mean {statistics.mean(diffs):+.4f}{interval(diffs)}; above fp32's "
                    f"range at {above} of {len(seeds)}")


if __name__ == "__main__":
    main()
