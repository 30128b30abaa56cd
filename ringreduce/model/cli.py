"""Predicted time of ringreduce against NCCL's ring and tree and the link bound.

    python -m ringreduce.model                              # dgx-h100, 2..1024 machines
    python -m ringreduce.model --preset eth-100g --machines 4 16 --sizes 25M 1G
    python -m ringreduce.model --machines 8 --gpus-per-machine 4 --net-gbps 200 \\
        --intra-gbps 2400 --buckets 16 --sizes 25M --plot speedup.png
    python -m ringreduce.model --calibrate run.json         # fit costs to your benchmark JSON
    python -m ringreduce.model --plan pipelined             # price one plan, not the probe's

Each row is priced on the plan the engine would take there (--plan auto): its
construction probe's rule (plan/slicing.py) on the model's times of the probe's 16 MiB
call on each plan; the "why" column gives those two times (one slice/pipelined, ms).

A MODEL, not a measurement: times are predictions from alpha-beta link costs, NCCL's own
cost model and ringreduce's measured host cost per call and per slice. Its check against
the repository's measurements runs from a checkout: python -m benchmarks.model_validation.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..plan import slicing
from ..sizes import parse_size
from . import calibrate, results
from .cluster import DEFAULT_PRESET, PRESETS, Cluster, measured_note
from .nccl_cost import link_bound_us, nccl_algo, ring_time_us, tree_time_us
from .plot import SWEEP
from .probe import AUTO, CHOICES, MODEL_MARGIN, Planned, engine_plan
from .simulate import Options, ringreduce_time_us


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ringreduce.model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET,
        help="cluster to start from; the flags below override its fields")
    add("--machines", type=int, nargs="+", help=f"machine counts (default: {SWEEP})")
    add("--gpus-per-machine", type=int)
    add("--intra-gbps", type=float, help="intra-machine Gbit/s per GPU and direction")
    add("--intra-latency-us", type=float)
    net = p.add_mutually_exclusive_group()
    net.add_argument("--net-gbps", type=float,
                     help="network Gbit/s per GPU (one NIC per GPU) and direction")
    net.add_argument("--machine-net-gbps", type=float,
                     help="network Gbit/s per machine (all NICs) and direction")
    add("--net-latency-us", type=float)
    add("--host-call-us", type=float, help="ringreduce host cost per call")
    add("--host-slice-us", type=float, help="ringreduce host cost per slice")
    add("--sizes", type=parse_size, nargs="+", default=[25 << 20, 256 << 20])
    add("--slice-bytes", type=parse_size, help="default: the engine's rule")
    add("--buckets", type=int, default=1, help="back-to-back calls per step")
    add("--wire", choices=("bfloat16", "float16"),
        help="fp32 tensors cross the network in 16 bits (the engine's wire_dtype)")
    add("--plan", choices=CHOICES, default=AUTO,
        help="the plan of hierarchical calls; auto: the one the engine's construction "
             "probe would take on each row's cluster (default)")
    add("--plot", help="write predicted speedup against machine count (PNG)")
    add("--all-presets", action="store_true",
        help="every preset, a table each (and with --plot one plot), with this run's "
             "host costs")
    add("--calibrate", type=Path, metavar="RESULTS_JSON",
        help="fit the costs to a benchmark JSON (python -m ringreduce.bench --json); its "
             "host costs then price the cluster")
    add("--validate", nargs="?", const=True, help=argparse.SUPPRESS)  # moved: main says where
    return p


def cluster_from(args: argparse.Namespace) -> Cluster:
    """The preset with the flags' overrides."""
    c = PRESETS[args.preset]
    gpus = args.gpus_per_machine or c.gpus
    changes = {"gpus": gpus, "intra_gbps": args.intra_gbps, "intra_lat_us": args.intra_latency_us,
               "net_lat_us": args.net_latency_us, "host_call_us": args.host_call_us,
               "host_slice_us": args.host_slice_us,
               "net_gbps": (args.net_gbps * gpus if args.net_gbps else args.machine_net_gbps)}
    return c.with_(**{k: v for k, v in changes.items() if v is not None})


def predict_row(c: Cluster, size: int, o: Options, buckets: int, planned: Planned
                ) -> dict[str, Any]:
    rr = ringreduce_time_us(size, c, planned.options(o), buckets)
    ring, tree = buckets * ring_time_us(size, c), buckets * tree_time_us(size, c)
    n = c.ranks
    busbw = size * buckets / rr / 1e3 * 2 * (n - 1) / n if rr else 0.0
    bound = buckets * link_bound_us(size, c)
    return {"cluster": c.name, "machines": c.machines, "size": size, "rr": rr,
            "busbw": busbw, "ring": ring, "tree": tree, "vs_ring": ring / rr,
            "vs_tree": tree / rr, "vs_best": min(ring, tree) / rr,
            "default": nccl_algo(size, c), "bound": bound, "eff": bound / rr if rr else 0.0,
            "plan": planned.plan, "why": planned.brief, "reason": planned.choice.reason,
            "probed": planned.probed}


def print_table(c: Cluster, rows: list[dict[str, Any]], buckets: int) -> None:
    print(f"# MODEL (predicted, not measured): {c.name}: {c.gpus} GPUs/machine, intra "
          f"{c.intra_gbps:g} Gbit/s/GPU {c.intra_lat_us:g} us, network {c.net_gbps:g} "
          f"Gbit/s/machine {c.net_lat_us:g} us, host {c.host_call_us:.0f} us/call + "
          f"{c.host_slice_us:.0f} us/slice, buckets {buckets}")
    if c.source:
        print(f"# source: {c.source}")
    print(f"# measured: {measured_note(c)}")
    print("# time per step in us; busbw GB/s (nccl-tests); speedup = NCCL time / ringreduce"
          " time; vs best: the faster of ring and tree; default: NCCL's tuner's pick; "
          "bound = 2S(M-1)/(M*B); eff = bound / ringreduce time")
    print(f"# plan: ringreduce's plan for hierarchical calls; why: {_why_legend(rows)}")
    print(f"#{'machines':>8} {'size':>11} {'ringreduce':>11} {'busbw':>7} {'ring':>11} "
          f"{'tree':>11} {'vs ring':>7} {'vs tree':>7} {'vs best':>7} {'default':>7} "
          f"{'bound':>10} {'eff':>5} {'plan':>9} {'why':>13}")
    for r in rows:
        print(f"{r['machines']:>9} {_size(int(r['size'])):>11} {r['rr']:>11.1f} {r['busbw']:>7.1f} "
              f"{r['ring']:>11.1f} {r['tree']:>11.1f} {r['vs_ring']:>7.2f} "
              f"{r['vs_tree']:>7.2f} {r['vs_best']:>7.2f} {r['default']:>7} "
              f"{r['bound']:>10.1f} {r['eff']:>5.2f} {r['plan']:>9} {r['why']:>13}")


def _why_legend(rows: list[dict[str, Any]]) -> str:
    """The "why" column's meaning: the probe's rule where it decided, else each reason."""
    probe = (f"the engine's construction probe, predicted: a {slicing.PROBE_BYTES >> 20} MiB "
             f"call on one slice/pipelined (ms); the faster, one slice within "
             f"{MODEL_MARGIN:.0%} (plan/slicing.py)")
    others = {r["why"]: r["reason"] for r in rows if not r["probed"]}
    return "; ".join([probe] * any(r["probed"] for r in rows) +
                     [f"{brief}: {reason}" for brief, reason in others.items()])


def _size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def calibrated(c: Cluster, path: Path) -> Cluster:
    """Fit every setting of one benchmark JSON; print the costs and the fit; carry the
    host costs (a software property) over to the cluster, not the emulated links."""
    report = calibrate.run(results.load_file(path))
    print(calibrate.table(report))
    print(calibrate.summary(report))
    if not report.costs:
        raise SystemExit(f"--calibrate {path}: no benchmark rows the model can use")
    costs = list(report.costs.values())
    return c.with_(host_call_us=calibrate.median([k.host_call_us for k in costs]),
                   host_slice_us=calibrate.median([k.host_slice_us for k in costs]))


def main(argv: list[str] | None = None, note: str = "") -> list[dict[str, Any]]:
    """Print the prediction table (and plot); ``note``: a line more in the plot's title."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.validate:
        parser.error("--validate moved out of the package (the wheel holds the "
                     "library, not the repository's measurements); from a checkout run "
                     "python -m benchmarks.model_validation")
    if args.buckets < 1 or any(m < 1 for m in args.machines or ()):
        parser.error("--buckets and --machines must be at least 1")
    for flag in ("gpus_per_machine", "intra_gbps", "net_gbps", "machine_net_gbps"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be > 0")
    for flag in ("intra_latency_us", "net_latency_us", "host_call_us", "host_slice_us"):
        if getattr(args, flag) is not None and getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be >= 0")
    try:
        base = cluster_from(args)
    except ValueError as e:
        parser.error(str(e))
    if args.calibrate:
        base = calibrated(base, args.calibrate)
    o = Options(slice_bytes=args.slice_bytes, wire_factor=0.5 if args.wire else 1.0)
    clusters = [base]
    if args.all_presets:
        clusters = [p.with_(host_call_us=base.host_call_us, host_slice_us=base.host_slice_us)
                    for p in PRESETS.values()]
    rows = []
    for c in clusters:
        mine = [predict_row(cm, s, o, args.buckets, engine_plan(cm, o, args.plan))
                for cm in (c.with_(machines=m) for m in args.machines or SWEEP)
                for s in args.sizes]
        print_table(c, mine, args.buckets)
        rows += mine
    if args.plot:
        _plot(args, clusters, o, note)
    return rows


def _plot(args: argparse.Namespace, clusters: list[Cluster], o: Options, note: str) -> None:
    from .plot import plot_speedup  # lazily: only --plot needs matplotlib

    if args.all_presets:
        c = clusters[0]
        note = "; ".join(filter(None, (f"host {c.host_call_us:g} us/call + "
                                       f"{c.host_slice_us:g} us/slice", note)))
    plot_speedup(args.plot, clusters, args.sizes[-1], args.buckets, o, args.plan, note)
