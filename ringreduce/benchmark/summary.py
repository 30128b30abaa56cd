"""Several benchmark runs (their ``--json`` files) as one table, one JSON and one plot.

    python -m ringreduce.benchmark.summary out/*.json --json all.json --plot all.png

One line per row of every run: the run (file name), its topology and setting, the size
(or K x size for a row of buckets), ringreduce's route and time, its ratio against
each reference (> 1: ringreduce faster; none on the flat route), link efficiencies,
and every wrong element. benchmarks/gpu.sh prints it last.

NCCL reads NCCL_ALGO once per process, so NCCL under each algorithm is a run of its own
(``--only-references`` under ``NCCL_ALGO=allreduce:tree``, ...). Per row the merge takes the
fastest NCCL over the runs of the same setting (topology, link, fidelity) at the same size,
buckets and operation as "NCCL best" (``nccl_best_time_us``, ``nccl_best_algo``; the row's own
run for its own algorithm, the others for theirs), likewise NCCL in the wire dtype for 16-bit
wires (``wire_ref_best_*``), and the headline ``best_ref`` / ``best_ref_ratio``: the fastest of
NCCL best, the two-level composition and the wire-dtype NCCL, against ringreduce. Those
references come from other processes than ringreduce's (the only way to run NCCL under
another algorithm); the row's own run still has NCCL default interleaved with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .references import nccl_algo_label
from .report import headline, route_label, size_label

_ALGO_KEYS = {"ref": ("nccl_best_time_us", "nccl_best_algo"),
              "wire_ref": ("wire_ref_best_time_us", "wire_ref_best_algo")}


def load(paths: list[Path]) -> dict[str, dict[str, Any]]:
    runs = {}
    for path in paths:
        with open(path) as f:
            runs[path.stem] = json.load(f)
    return runs


def setting(meta: dict[str, Any]) -> str:
    """capped <rate> / loopback / other, plus the wire format when not the tensor's, plus
    the NCCL algorithm when forced."""
    opts = meta["options"]
    algo = algo_of(meta)
    return (link_of(meta) + (f" wire {opts['wire']}" if opts.get("wire") else "")
            + ("" if algo == "default" else f" nccl {algo}"))


def link_of(meta: dict[str, Any]) -> str:
    opts, fid = meta["options"], meta.get("fidelity", "")
    return f"capped {opts['link_gbit']:g}G" if opts.get("link_gbit") else \
        "loopback" if "no link cap (all on lo" in fid else "uncapped"


def algo_of(meta: dict[str, Any]) -> str:
    """NCCL's all-reduce algorithm, and its socket threads x sockets per thread where the
    run set them (a TCP user's tuning of NCCL's socket transport, a reference of its own)."""
    env = meta.get("nccl_env", {})
    algo = nccl_algo_label(env.get("NCCL_ALGO"))
    threads, socks = env.get("NCCL_SOCKET_NTHREADS"), env.get("NCCL_NSOCKS_PERTHREAD")
    if threads or socks:
        return f"{algo}, sockets {threads or '-'}x{socks or '-'}"
    return algo


def _group(meta: dict[str, Any], row: dict[str, Any]) -> tuple[Any, ...]:
    """Rows that measure the same NCCL call: same setting (topology, link, fidelity: the
    faithful and the one-GPU 2x2 differ only there) and the same call."""
    return (meta["machines"], meta["devices"], link_of(meta), meta.get("fidelity", ""),
            row["size"], row["buckets"], row.get("collective"), row.get("type"),
            row.get("redop"))


def merge(runs: dict[str, dict[str, Any]]) -> None:
    """Fill every ringreduce row's NCCL best, wire-dtype NCCL best and headline from all
    runs (in place; rows of --only-references runs only give)."""
    found: dict[tuple[Any, ...], list[tuple[str, str, str, float]]] = {}
    for name, run in runs.items():
        algo = algo_of(run["meta"])
        for row in run["rows"]:
            for impl in _ALGO_KEYS:
                if row.get(f"{impl}_time_us"):
                    found.setdefault(_group(run["meta"], row), []).append(
                        (name, impl if impl == "ref" else f"wire_ref {row.get('wire')}", algo,
                         row[f"{impl}_time_us"]))
    for name, run in runs.items():
        own = algo_of(run["meta"])
        for row in run["rows"]:
            if row.get("rr_time_us") is None:
                continue
            for impl, (time_key, algo_key) in _ALGO_KEYS.items():
                kind = impl if impl == "ref" else f"wire_ref {row.get('wire')}"
                best = _fastest(found.get(_group(run["meta"], row), []), kind, name, own)
                row[time_key], row[algo_key] = best if best else (None, None)
            row |= headline(row)


def _fastest(seen: list[tuple[str, str, str, float]], kind: str, run: str,
             own: str) -> tuple[float, str] | None:
    """The fastest (time, algorithm) of ``kind``: the row's own run for its own algorithm,
    any run for the others."""
    times = [(t, algo) for name, k, algo, t in seen
             if k == kind and (algo != own or name == run)]
    return min(times) if times else None


def table(runs: dict[str, dict[str, Any]]) -> str:
    """The merged table (call :func:`merge` first): one line per ringreduce row; a
    comment line per --only-references run."""
    head = (f"{'run':<18} {'topo':>5} {'setting':<22} {'size':>9} {'route':>5} "
            f"{'rr ms':>9} {'vs flat':>8} {'vs 2lvl':>8} {'vs NCCL best':>17} "
            f"{'vs best ref':>24} {'eff rr':>6} {'eff flat':>8} {'wrong':>5}")
    lines = ["# ratio = reference time / ringreduce time (> 1: ringreduce faster); vs flat: "
             "NCCL in the same run; NCCL best: the fastest NCCL_ALGO over the runs of the "
             "setting; best ref: the fastest of NCCL best, two-level and NCCL in the wire "
             "dtype (bf16_compress_hook); eff = link efficiency (T_min / t); route flat: "
             "ringreduce took NCCL's own all-reduce (below min_bytes, or the construction "
             "probe found it fastest), its vs flat ~1 by construction", head]
    for name, run in runs.items():
        meta = run["meta"]
        topo = f"{meta['machines']}x{meta['devices']}"
        if all(row.get("rr_time_us") is None for row in run["rows"]):
            wrong = sum(row.get(f"{k}_wrong") or 0 for row in run["rows"]
                        for k in _ALGO_KEYS)
            lines.append(f"# {name}: {topo} {setting(meta)}: references only, "
                         f"{len(run['rows'])} rows, {wrong} wrong")
            continue
        for row in run["rows"]:
            lines.append(_line(name, topo, setting(meta), row))
    return "\n".join(lines)


def _line(name: str, topo: str, where: str, row: dict[str, Any]) -> str:
    size = size_label(row["size"])
    if row["buckets"] > 1:
        size = f"{row['buckets']}x{size}"
    wrong = sum(row.get(f"{k}_wrong") or 0 for k in ("rr", "ref", "two_level", "wire_ref"))
    text = (f"{name:<18} {topo:>5} {where:<22} {size:>9} {route_label(row['route']):>5} "
            f"{row['rr_time_us'] / 1e3:>9.2f}")
    # a flat row's ratios too: the route was chosen (below min_bytes, or the probe found
    # NCCL's own call fastest), and NCCL's other algorithms and two-level may beat it
    best = row.get("nccl_best_time_us")
    nccl = f"{_fmt(best / row['rr_time_us'] if best else None)} " \
           f"{row.get('nccl_best_algo') or '':<7}"
    ref = f"{_fmt(row.get('best_ref_ratio'))} {row.get('best_ref') or '':<19}"
    text += (f" {_fmt(row.get('ratio')):>8} {_fmt(row.get('two_level_ratio')):>8} "
             f"{nccl:>17} {ref:>24}")
    return text + (f" {_fmt(row.get('rr_link_eff')):>6} {_fmt(row.get('ref_link_eff')):>8}"
                   f" {wrong:>5}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot(runs: dict[str, dict[str, Any]], path: str) -> None:
    """One panel per run: ratio against both references by size, a line at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {k: r for k, r in runs.items()
            if any(row.get("rr_time_us") is not None for row in r["rows"])}
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
        if any(r.get("best_ref_ratio") for r in rows):
            ax.plot(sizes, [r["best_ref_ratio"] for r in rows], marker="o", color="black",
                    label="vs best reference")
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
    merge(runs)
    print(table(runs) if runs else "# no benchmark JSON to summarise")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    if args.plot and runs:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
