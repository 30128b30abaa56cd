"""This folder's training runs against fp32 at the same seed (the same initial weights
and batches), beside the earlier study's (2026-11-28-cpu-lm-int4, whose fp32 and int4
runs this study pairs with: fp32 seed 0 repeated here to the last digit,
fp32_check.json): per mode, each seed's difference from fp32 of the train loss (last
100 steps) and of the validation loss, their mean, the standard error of the mean, and
how many seeds lie above fp32. Run from anywhere: ``python paired.py``; ``--markdown``
prints the README's table."""

from __future__ import annotations

import argparse
import json
import statistics as st
from pathlib import Path

HERE = Path(__file__).resolve().parent
EARLIER = HERE.parent / "2026-11-28-cpu-lm-int4"
FILES = {EARLIER / "base.json": "int4", EARLIER / "base_more.json": "int4",
         EARLIER / "nofeedback.json": "int4 nofb", EARLIER / "nofeedback_more.json": "int4 nofb",
         EARLIER / "mixed.json": "c4d8",
         HERE / "mixed_nofb.json": "c4d8 nofb", HERE / "loco08.json": "int4 loco0.8",
         HERE / "loco08_more.json": "int4 loco0.8",
         HERE / "mixed_loco08.json": "c4d8 loco0.8", HERE / "loco05.json": "int4 loco0.5",
         HERE / "mixed_loco05.json": "c4d8 loco0.5", HERE / "loco09.json": "int4 loco0.9",
         HERE / "mixed_loco09.json": "c4d8 loco0.9", HERE / "noise013.json": "noise 0.13",
         HERE / "noise019.json": "noise 0.19", HERE / "noise009.json": "noise 0.09"}
"""Each run file and the name its int4 runs take here (c4d8: int4 collect, int8
diffuse; nofb: no error memory; locoB: LoCo's moving average, beta B; noise E: the
control, exact sums plus unbiased noise of E x each block's RMS)."""


def load() -> dict[tuple[str, int], dict]:
    runs = {}
    for path, tag in FILES.items():
        if path.exists():
            for r in json.loads(path.read_text()):
                if r["mode"] in ("fp32", "int4"):
                    runs[r["mode"] if r["mode"] == "fp32" else tag, r["seed"]] = r
    return runs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--against", default="fp32", help="the mode each seed pairs with")
    args = p.parse_args()
    runs = load()
    fp32 = {s: r for (m, s), r in runs.items() if m == args.against}
    modes = list(dict.fromkeys(m for m, _ in runs if m not in ("fp32", args.against)))
    for key in ("train_last", "valid"):
        values = [fp32[s][key] for s in sorted(fp32)]
        print(f"# {key} against {args.against}: its seeds {','.join(map(str, sorted(fp32)))}: "
              f"mean {st.mean(values):.4f}, range {min(values):.4f}..{max(values):.4f}, "
              f"sd {st.stdev(values):.4f}")
        for mode in modes:
            seeds = sorted(s for m, s in runs if m == mode and s in fp32)
            d = [runs[mode, s][key] - fp32[s][key] for s in seeds]
            se = st.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
            above = sum(x > 0 for x in d)
            cells = " ".join(f"{x:+.4f}" for x in d)
            if args.markdown:
                own = st.mean(runs[mode, s][key] for s in seeds)
                print(f"| {mode} | {key} | {own:.4f} | {cells} | **{st.mean(d):+.4f}** | "
                      f"{se:.4f} | {above} of {len(d)} |")
            else:
                print(f"{mode:>14} seeds {','.join(map(str, seeds)):<12} {cells} | mean "
                      f"{st.mean(d):+.4f} (se {se:.4f}), above at {above} of {len(d)}")


if __name__ == "__main__":
    main()
