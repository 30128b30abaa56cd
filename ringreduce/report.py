"""How the benchmark reports: the nccl-tests style table, JSON and a PNG plot."""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
from typing import TYPE_CHECKING, Any

import torch

from ringreduce.launch import nccl_variables

if TYPE_CHECKING:
    from ringreduce.bench import Bench

#: Per implementation: (heading, row key suffix, width, format).
_COLUMNS = (("time(us)", "time_us", 10, ".1f"), ("host(us)", "host_us", 8, ".1f"),
            ("algbw", "algbw", 7, ".2f"),
            ("busbw", "busbw", 7, ".2f"), ("#wrong", "wrong", 7, ""))


def header(b: Bench) -> str:
    a, topo = b.args, b.comm.topology
    ref = b.backend + ("(sum+div)" if a.op == "avg" and b.backend != "nccl" else "")
    sub = "".join(f" {h:>{w}}" for h, _, w, _ in _COLUMNS)
    nccl = " ".join(f"{k}={v}" for k, v in nccl_variables().items()) or "(none)"
    return "\n".join([
        f"# ringreduce.bench  world {b.launch.world_size} = {topo.machines} machines x "
        + f"{topo.devices_per_machine} devices  launcher {b.launch.launcher}",
        f"# {a.collective}  {a.datatype} {a.op}  buckets {a.buckets}  iters {a.iters}"
        + f"  warmup {a.warmup_iters}  rounds {a.rounds}  check {a.check}"
        + f"  link {a.link_gbit} Gbit/s",
        f"# ringreduce: {b.comm.describe()}",
        f"# NCCL env: {nccl}",
        f"#{'':>40} {'ringreduce':<{len(sub)}} {ref}",
        f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6} {sub} {sub}  {'ratio':>6}"
        + (f"  {'eff rr':>6} {'eff ref':>7}" if a.link_gbit else ""),
    ])


def format_row(row: dict[str, Any]) -> str:
    text = f"{row['size']:>12} {row['count']:>12} {row['type']:>8} {row['redop']:>6}"
    for name in ("rr", "ref"):
        text += " " + "".join(f" {row[f'{name}_{key}']:>{w}{f}}" for _, key, w, f in _COLUMNS)
    text += f"  {row['ratio']:>6.2f}"
    for name in ("rr", "ref") if "rr_link_eff" in row else ():
        eff = row[f"{name}_link_eff"]
        text += f"  {'n/a' if eff is None else f'{eff:.2f}':>6}"
    return text


def write_outputs(b: Bench, rows: list[dict[str, Any]]) -> None:
    topo, a = b.comm.topology, b.args
    meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "torch": torch.__version__, "backend": b.backend,
            "device": torch.cuda.get_device_name() if b.device.type == "cuda" else "cpu",
            "launcher": b.launch.launcher, "world_size": b.launch.world_size,
            "machines": topo.machines, "devices_per_machine": topo.devices_per_machine,
            "options": vars(a), "config": dataclasses.asdict(b.comm.config),
            "nccl_env": nccl_variables()}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if a.plot:
        plot(rows, a.plot, f"{meta['machines']}x{meta['devices_per_machine']} {a.collective} "
             f"{a.datatype}"
             f" {a.op}, buckets {a.buckets}", b.backend)


def plot(rows: list[dict[str, Any]], path: str, title: str, reference: str) -> None:
    import matplotlib  # lazily: only --plot needs it

    matplotlib.use("Agg")  # files only; no display on cluster nodes
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    sizes = [r["size"] for r in rows]
    ax.plot(sizes, [r["rr_busbw"] for r in rows], marker="o", label="ringreduce")
    ax.plot(sizes, [r["ref_busbw"] for r in rows], marker="s", label=reference)
    ax.set(xscale="log", xlabel="bytes per call", ylabel="busbw (GB/s)", title=title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
