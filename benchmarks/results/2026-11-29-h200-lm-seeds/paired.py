"""int4 (no error feedback, the default) against DDP fp32 at the same seed over ten seeds:
seeds 0-4 on two H200s (`2026-11-29-h200x2-lm-feedback`, read through its paired.py) and
seeds 5-9 on one H200 (this folder's run 1, fp32 5-9 and int4 5-8; run 2, int4 9, and 5
again). Each pair is of one kind: NCCL's fp32 does not repeat across kinds, so
every int4 run is paired with fp32 of its own kind and seed, and each kind's fp32 range is
its own.

    python benchmarks/results/2026-11-29-h200-lm-seeds/paired.py
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
X2 = HERE.parent / "2026-11-29-h200x2-lm-feedback" / "paired.py"


def _x2() -> object:
    spec = importlib.util.spec_from_file_location("x2_paired", X2)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_gpu() -> dict[tuple[str, int], dict[str, float]]:
    """(mode, seed) -> losses of this folder's runs 1 and 2; a repeat (int4 seed 5, run 2
    with the bucket-table kernel) must match to the last digit."""
    found: dict[tuple[str, int], dict[str, float]] = {}
    for archive in ("run1-textlm-logs.tar.gz", "run2-textlm-int4-logs.tar.gz"):
        with tarfile.open(HERE / archive) as tar:
            member = tar.extractfile("./textlm_ddp.json")
            assert member is not None
            for r in json.load(member):
                assert r["identical"], (r["mode"], r["seed"])
                mode = r["mode"] if r["mode"] == "fp32" else f"{r['mode']} fb off"
                losses = {"train": r["train_last"], "valid": r["valid"]}
                assert found.setdefault((mode, r["seed"]), losses) == losses, (mode, r["seed"])
    return found


def main() -> None:
    x2 = _x2()
    kinds = {"nvidia-h200-x2": x2.runs(), "nvidia-h200": one_gpu()}  # type: ignore[attr-defined]
    for what in ("train", "valid"):
        pooled: list[float] = []
        above = total = 0
        for kind, found in kinds.items():
            fp32 = {s: v[what] for (m, s), v in found.items() if m == "fp32"}
            seeds = sorted(s for m, s in found if m == "int4 fb off" and s in fp32)
            diffs = [found["int4 fb off", s][what] - fp32[s] for s in seeds]
            top = max(fp32.values())
            up = sum(found["int4 fb off", s][what] > top for s in seeds)
            print(f"# {what} {kind}: fp32 seeds {sorted(fp32)} range "
                  f"{min(fp32.values()):.4f}..{top:.4f} sd {statistics.stdev(fp32.values()):.4f}"
                  f"; int4 - fp32 at seeds {','.join(map(str, seeds))}: "
                  + " ".join(f"{d:+.4f}" for d in diffs)
                  + f"; above this kind's fp32 range at {up} of {len(seeds)}")
            pooled += diffs
            above += up
            total += len(seeds)
        print(f"  {what} pooled, {len(pooled)} pairs: mean {statistics.mean(pooled):+.4f}"
              f"{x2.interval(pooled)}; sd of the differences "  # type: ignore[attr-defined]
              f"{statistics.stdev(pooled):.4f}; above its kind's fp32 range at {above} of {total}")


if __name__ == "__main__":
    main()
