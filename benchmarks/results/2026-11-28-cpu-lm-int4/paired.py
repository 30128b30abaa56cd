"""This folder's training runs, each mode against fp32 at the same seed (the same
initial weights and batches): the paired differences of the train loss (last 100 steps)
and of the validation loss, and their mean; fp32's own row gives its range and standard
deviation over seeds. Run from this folder: ``python paired.py``."""

from __future__ import annotations

import json
import statistics as st
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = {"base.json": "", "base_more.json": "", "block64.json": "-b64",
         "block64_more.json": "-b64", "nofeedback.json": "-nofb", "nofeedback_more.json": "-nofb",
         "mixed.json": "-c4d8"}
"""Each run file and the suffix its int4 runs' mode takes here."""
MODES = ("fp32", "int8", "int4", "int4-b64", "int4-nofb", "int4-c4d8")


def load() -> dict[tuple[str, int], dict]:
    runs = {}
    for name, tag in FILES.items():
        if (HERE / name).exists():
            for r in json.loads((HERE / name).read_text()):
                mode = r["mode"] + (tag if r["mode"] == "int4" else "")
                runs[mode, r["seed"]] = r
    return runs


def cells(values: list[float]) -> str:
    return " ".join(f"{x:+.4f}" for x in values) + f" | mean {st.mean(values):+.4f}"


def main() -> None:
    runs = load()
    fp32 = {s: r for (m, s), r in runs.items() if m == "fp32"}
    for key in ("train_last", "valid"):
        print(f"# {key}: mean over seeds; each seed's difference from fp32 at that seed")
        for mode in MODES:
            seeds = sorted(s for m, s in runs if m == mode)
            if not seeds:
                continue
            values = [runs[mode, s][key] for s in seeds]
            if mode == "fp32":
                detail = f"range {min(values):.4f}..{max(values):.4f}, sd {st.stdev(values):.4f}"
            else:
                detail = cells([runs[mode, s][key] - fp32[s][key] for s in seeds])
            print(f"{mode:>10} seeds {','.join(map(str, seeds)):<12} {st.mean(values):.4f}  "
                  f"{detail}")


if __name__ == "__main__":
    main()
