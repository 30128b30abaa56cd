"""How the benchmark reports: the nccl-tests style table, JSON and a PNG plot.

Works on plain data (:class:`RunInfo` and row dicts), so it imports nothing else of
the benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

#: Per implementation: (heading, row key suffix, width, format).
_COLUMNS = (("time(us)", "time_us", 10, ".1f"), ("host(us)", "host_us", 8, ".1f"),
            ("cpu(us)", "cpu_us", 8, ".0f"), ("busbw", "busbw", 6, ".2f"),
            ("#wrong", "wrong", 6, ""))
_IMPLS = (("rr", "ringreduce"), ("ref", "flat"), ("two_level", "two-level"))
_WIRE_REF = ("wire_ref", "flat in the wire dtype")
#: --wire values whose rows carry the wire-dtype reference (options.WIRES; this module
#: imports nothing of the benchmark).
WIRE_REF_WIRES = ("bfloat16", "float16")
FLAT_NOTE = "same library (flat route)"


def route_label(route: str) -> str:
    """The table's route cell: hier, flat, the quantized wire ("compressed int8" ->
    "int8"), or "-" (no ringreduce in the run)."""
    return {"hierarchical": "hier", "flat": "flat"}.get(route, route.removeprefix("compressed "))


def headline(row: dict[str, Any]) -> dict[str, Any]:
    """``best_ref``: the fastest reference of the row: NCCL best (``nccl_best_algo``), the
    two-level composition, NCCL in the wire dtype (torch's bf16_compress_hook); on gloo
    (``flat_backend``) the flat references are gloo's, named so;
    ``best_ref_ratio``: its time / ringreduce's time (> 1: ringreduce faster; None
    without a ringreduce time)."""
    flat = row.get("flat_backend") or "nccl"
    if flat == "nccl":
        names = (f"NCCL {row.get('nccl_best_algo')}",
                 f"NCCL {row.get('wire')} ({row.get('wire_ref_best_algo')})")
    else:  # NCCL_ALGO means nothing to gloo
        names = (flat, f"{flat} {row.get('wire')}")
    times = {names[0]: row.get("nccl_best_time_us"), "two-level": row.get("two_level_time_us"),
             names[1]: row.get("wire_ref_best_time_us")}
    known = {name: t for name, t in times.items() if t}
    if not known:
        return {"best_ref": None, "best_ref_ratio": None}
    name = min(known, key=known.__getitem__)
    rr = row.get("rr_time_us")
    return {"best_ref": name, "best_ref_ratio": known[name] / rr if rr else None}


@dataclass(frozen=True)
class RunInfo:
    """Who ran, where, and how faithfully: everything the header and JSON meta say."""

    world: int
    machines: int
    devices: int
    launcher: str
    backend: str
    device: str
    engine: str
    """The Communicator's describe() line."""
    fidelity: str
    nccl_env: dict[str, str]
    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _impls(wire: str | None) -> tuple[tuple[str, str], ...]:
    return (*_IMPLS, _WIRE_REF) if wire in WIRE_REF_WIRES else _IMPLS


def header(info: RunInfo, a: argparse.Namespace) -> str:
    ref = info.backend + ("(sum+div)" if a.op == "avg" and info.backend != "nccl" else "")
    link = f"{a.link_gbit:g} Gbit/s per machine" if a.link_gbit else "not given (--link-gbit)"
    sub = "".join(f" {h:>{w}}" for h, _, w, _ in _COLUMNS)
    impls = _impls(a.wire)
    wire_ref = (f"; flat in the wire dtype = the tensor cast to {a.wire}, {ref}'s all_reduce, "
                "cast back (torch's bf16_compress_hook); wire = its time / ringreduce time"
                if a.wire in WIRE_REF_WIRES
                else "")
    nccl = " ".join(f"{k}={v}" for k, v in info.nccl_env.items()) or "(none)"
    lines = [
        f"# ringreduce.bench  world {info.world} = {info.machines} "
        f"machine{'s' * (info.machines != 1)} x {info.devices} "
        f"device{'s' * (info.devices != 1)}  launcher {info.launcher}  device {info.device}",
        f"# {a.collective}  {a.datatype} {a.op}  wire {a.wire or 'tensor dtype'}  buckets "
        f"{a.buckets}  iters {a.iters}  warmup {a.warmup_iters}  rounds {a.rounds}  "
        f"check {a.check}  link {link}",
        f"# fidelity: {info.fidelity}",
        f"# ringreduce: {info.engine}",
        f"# references in the same run, interleaved per round: flat = {ref}'s {a.collective} "
        "on the whole group; two-level = torch.distributed reduce_scatter_tensor in the "
        "machine, all_reduce on the rail, all_gather_into_tensor in the machine "
        f"(unpipelined, padded to a multiple of the devices; all_reduce only){wire_ref}",
        "# ratio = flat time / ringreduce time, 2lvl = two-level time / ringreduce time "
        f"(> 1: ringreduce faster); best = the fastest reference's time / ringreduce time, "
        f"naming it (this process's NCCL runs under NCCL_ALGO "
        f"{info.nccl_env.get('NCCL_ALGO', 'unset: its default')}; benchmark.summary merges "
        f"the other algorithms' runs); \"{FLAT_NOTE}\": ringreduce routed the call to the "
        "flat reference's own collective, so no ratio is claimed",
        "# time: device time per iteration, median over rounds of the slowest rank; "
        "host: caller time per call; cpu: process CPU time per call (all threads), mean "
        "over ranks; busbw in GB/s; route: ringreduce's, from its flight record",
        *(f"# NOTE: {n}" for n in info.notes),
        f"# NCCL env: {nccl}",
        f"#{'':>32}" + "".join(f" {label:<{len(sub)}}" for _, label in impls),
        f"#{'size':>11} {'type':>8} {'redop':>5} {'route':>5}" + f" {sub}" * len(impls)
        + f"  {'ratio':>6} {'2lvl':>6}" + (f" {'wire':>6}" if len(impls) > 3 else "")
        + f" {'best':>6} {'(which)':<10}"
        + (f"  link efficiency {' / '.join(k for k, _ in impls)}" if a.link_gbit else ""),
    ]
    return "\n".join(lines)


def format_row(row: dict[str, Any]) -> str:
    impls = _impls(row.get("wire"))
    text = f"{row['size']:>12} {row['type']:>8} {row['redop']:>5} {route_label(row['route']):>5}"
    for name, _ in impls:
        text += " " + "".join(f" {_cell(row.get(f'{name}_{key}'), f):>{w}}"
                              for _, key, w, f in _COLUMNS)
    if row["route"] == "flat":
        text += f"  {FLAT_NOTE}"
    else:
        text += f"  {_cell(row['ratio'], '.2f'):>6} {_cell(row['two_level_ratio'], '.2f'):>6}"
        if len(impls) > 3:
            text += f" {_cell(row.get('wire_ref_ratio'), '.2f'):>6}"
        text += (f" {_cell(row.get('best_ref_ratio'), '.2f'):>6} "
                 f"{row.get('best_ref') or '-':<10}")
    if "rr_link_eff" in row and any(row.get(f"{n}_link_eff") is not None for n, _ in impls):
        text += "  " + " ".join(f"{_cell(row.get(f'{n}_link_eff'), '.2f'):>5}"
                                for n, _ in impls)
    if row["buckets"] > 1:
        text += f"  ({row['buckets']} buckets)"
    return text


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def meta(info: RunInfo, a: argparse.Namespace) -> dict[str, Any]:
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "argv": sys.argv[1:], **{k: v for k, v in asdict(info).items()},
            "devices_per_machine": info.devices, "options": vars(a),
            "ratio": "flat time / ringreduce time",
            "two_level_ratio": "two-level time / ringreduce time",
            "wire_ref_ratio": "flat time in the wire dtype (bf16_compress_hook) / ringreduce time",
            "best_ref_ratio": "the fastest reference's time (best_ref) / ringreduce time"}


def write_outputs(info: RunInfo, a: argparse.Namespace, rows: list[dict[str, Any]],
                  torch_version: str) -> None:
    data = meta(info, a) | {"torch": torch_version}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": data, "rows": rows}, f, indent=1)
    if a.plot:
        link = f"link {a.link_gbit:g} Gbit/s" if a.link_gbit else "link not capped"
        title = (f"{info.machines}x{info.devices} {a.collective} {a.datatype} {a.op}, "
                 f"{info.device}, {link}")
        plot(rows, a.plot, title, info.backend)


def plot(rows: list[dict[str, Any]], path: str, title: str, reference: str) -> None:
    """busbw against size (log2 axis, power-of-two ticks), ringreduce's route as its
    marker (filled: hierarchical, x: flat), and a ratio panel against both references
    with a line at 1 (flat-route rows have no ratio to show). Rows of several buckets
    are left out (their size is per call)."""
    import matplotlib  # lazily: only --plot needs it

    matplotlib.use("Agg")  # files only; no display on cluster nodes
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["buckets"] == rows[0]["buckets"]] if rows else []
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    sizes = [r["size"] for r in rows]
    hier = [r["route"] == "hierarchical" for r in rows]
    top.plot(sizes, [r["rr_busbw"] for r in rows], color="C0", label="ringreduce")
    for flag, marker, label in ((True, "o", "route hierarchical"), (False, "x", "route flat")):
        pts = [(s, r["rr_busbw"]) for s, r, h in zip(sizes, rows, hier, strict=True)
               if h == flag]
        if pts:
            top.scatter(*zip(*pts, strict=True), color="C0", marker=marker, label=label,
                        zorder=3)
    top.plot(sizes, [r["ref_busbw"] for r in rows], marker="s", color="C1",
             label=f"flat ({reference})")
    two = [(s, r["two_level_busbw"]) for s, r in zip(sizes, rows, strict=True)
           if r["two_level_busbw"] is not None]
    if two:
        top.plot(*zip(*two, strict=True), marker="^", color="C2", label="two-level")
    top.set(ylabel="busbw (GB/s)", title=title)
    top.legend(fontsize=8)
    claimed = [r for r in rows if r["route"] != "flat"]  # flat route: no ratio claimed
    for key, marker, color, label in (("ratio", "s", "C1", "flat time / ringreduce time"),
                                      ("two_level_ratio", "^", "C2",
                                       "two-level time / ringreduce time")):
        pts = [(r["size"], r[key]) for r in claimed if r[key] is not None]
        if pts:
            bottom.plot(*zip(*pts, strict=True), marker=marker, color=color, label=label)
    bottom.axhline(1.0, color="grey", linewidth=1)
    bottom.set(ylabel="ratio (> 1: ringreduce faster)", xlabel="bytes per call")
    bottom.legend(fontsize=8)
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [size_label(s) for s in sizes])
        ax.grid(True, alpha=0.3)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def size_label(size: int) -> str:
    """1048576 -> "1M", 65536 -> "64K" (powers of 1024, as -b/-e take them)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)
