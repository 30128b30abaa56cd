"""Several benchmark runs (their ``--json`` files) as one table, one JSON and one plot.

    python -m ringreduce.benchmark.summary out/*.json --json all.json --plot all.png

One line per row of every run: the run (file name), its topology and setting, the size
(or K x size for a row of buckets), ringreduce's route and time, its ratio against
each reference (> 1: ringreduce faster; none on the flat route), link efficiencies,
and every wrong element. benchmarks/gpu.sh prints it last.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .report import FLAT_NOTE, size_label


def load(paths: list[Path]) -> dict[str, dict[str, Any]]:
    runs = {}
    for path in paths:
        with open(path) as f:
            runs[path.stem] = json.load(f)
    return runs


def setting(meta: dict[str, Any]) -> str:
    """capped <rate> / loopback / other, plus the wire format when not the tensor's."""
    opts, fid = meta["options"], meta.get("fidelity", "")
    link = f"capped {opts['link_gbit']:g}G" if opts.get("link_gbit") else \
        "loopback" if "no link cap (all on lo" in fid else "uncapped"
    return link + (f" wire {opts['wire']}" if opts.get("wire") else "")


def table(runs: dict[str, dict[str, Any]]) -> str:
    head = (f"{'run':<18} {'topo':>5} {'setting':<22} {'size':>9} {'route':>5} "
            f"{'rr ms':>9} {'vs flat':>8} {'vs 2lvl':>8} {'eff rr':>6} {'eff flat':>8} "
            f"{'wrong':>5}")
    lines = ["# ratio = reference time / ringreduce time (> 1: ringreduce faster); "
             "eff = link efficiency (T_min / t)", head]
    for name, run in runs.items():
        meta = run["meta"]
        topo = f"{meta['machines']}x{meta['devices']}"
        for row in run["rows"]:
            lines.append(_line(name, topo, setting(meta), row))
    return "\n".join(lines)


def _line(name: str, topo: str, where: str, row: dict[str, Any]) -> str:
    size = size_label(row["size"])
    if row["buckets"] > 1:
        size = f"{row['buckets']}x{size}"
    route = {"hierarchical": "hier", "flat": "flat"}.get(row["route"], "?")
    wrong = sum(row.get(f"{k}_wrong") or 0 for k in ("rr", "ref", "two_level"))
    text = f"{name:<18} {topo:>5} {where:<22} {size:>9} {route:>5} {row['rr_time_us'] / 1e3:>9.2f}"
    if row["route"] == "flat":
        text += f" {FLAT_NOTE:>17}"
    else:
        text += f" {_fmt(row['ratio']):>8} {_fmt(row.get('two_level_ratio')):>8}"
    return text + (f" {_fmt(row.get('rr_link_eff')):>6} {_fmt(row.get('ref_link_eff')):>8}"
                   f" {wrong:>5}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot(runs: dict[str, dict[str, Any]], path: str) -> None:
    """One panel per run: ratio against both references by size, a line at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(runs))
    cols = min(3, n)
    lines = (n + cols - 1) // cols
    fig, axes = plt.subplots(lines, cols, figsize=(5 * cols, 3.6 * lines), squeeze=False)
    for ax, (name, run) in zip(axes.flat, runs.items(), strict=False):
        rows = [r for r in run["rows"] if r["buckets"] == 1 and r["route"] != "flat"]
        sizes = [r["size"] for r in rows]
        ax.plot(sizes, [r["ratio"] for r in rows], marker="s", label="vs flat")
        if any(r.get("two_level_ratio") for r in rows):
            ax.plot(sizes, [r["two_level_ratio"] for r in rows], marker="^", label="vs two-level")
        ax.axhline(1.0, color="grey", linewidth=1)
        meta = run["meta"]
        ax.set_title(f"{name}: {meta['machines']}x{meta['devices']} {setting(meta)}\n"
                     f"{meta['device']}", fontsize=9)
        if sizes:
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [size_label(s) for s in sizes])
        ax.set_ylabel("reference time / ringreduce time", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(runs):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ringreduce.benchmark.summary",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", type=Path, help="bench --json files")
    p.add_argument("--json", help="write {run name: {meta, rows}} here")
    p.add_argument("--plot", help="write the ratio panels here (PNG)")
    args = p.parse_args(argv)
    runs = load(args.runs)
    print(table(runs) if runs else "# no benchmark JSON to summarise")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    if args.plot and runs:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
