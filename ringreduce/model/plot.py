"""Predicted speedup of ringreduce over NCCL against machine count (a PNG)."""

from __future__ import annotations

from collections.abc import Sequence

from ..plan.slicing import ONE_SLICE
from .cluster import Cluster
from .nccl_cost import nccl_best_us, ring_time_us
from .probe import AUTO, engine_plan
from .simulate import Options, ringreduce_time_us

SWEEP = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def speedups(c: Cluster, size: int, buckets: int, o: Options, plan: str = AUTO
             ) -> tuple[list[float], list[float], list[str]]:
    """(vs NCCL best: the faster of ring and tree, vs ring, ringreduce's plan) at every
    machine count of SWEEP, each priced on ``plan`` (auto: the engine's probe's)."""
    best, ring, plans = [], [], []
    for m in SWEEP:
        cm = c.with_(machines=m)
        planned = engine_plan(cm, o, plan)
        rr = ringreduce_time_us(size, cm, planned.options(o), buckets)
        best.append(buckets * nccl_best_us(size, cm) / rr)
        ring.append(buckets * ring_time_us(size, cm) / rr)
        plans.append(planned.plan)
    return best, ring, plans


def plot_speedup(path: str, clusters: Sequence[Cluster], size: int, buckets: int,
                 o: Options, plan: str = AUTO, note: str = "") -> None:
    import matplotlib  # lazily: only --plot needs it

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for c in clusters:
        best, ring, plans = speedups(c, size, buckets, o, plan)
        line, = ax.plot(SWEEP, best, label=f"{c.name} vs NCCL best (ring or tree)")
        ax.plot(SWEEP, ring, ls="--", color=line.get_color(), label=f"{c.name} vs ring")
        for m, b, p in zip(SWEEP, best, plans, strict=True):  # the plan at each point
            ax.plot(m, b, marker="o" if p == ONE_SLICE else "^", color=line.get_color())
    d = clusters[0].gpus
    ceiling = [(2 * (m * d - 1) / (m * d)) / (2 * (m - 1) / m) for m in SWEEP]
    ax.plot(SWEEP, ceiling, ls=":", color="gray", label=f"bytes ceiling vs ring, D={d}")
    ax.axhline(1.0, color="black", lw=0.8)
    for marker, name in (("o", "one slice"), ("^", "pipelined")):
        ax.plot([], [], ls="", marker=marker, color="gray", label=f"plan: {name}")
    ax.set(xscale="log", yscale="log", xlabel="machines", ylabel="predicted speedup",
           title=f"MODEL, not measured: {size / 2**20:g} MiB x {buckets} bucket(s), "
                 f"plan {plan}" + (" (the engine's probe)" if plan == AUTO else "")
           + (f"\n{note}" if note else ""))
    ax.set_xticks(SWEEP, [str(m) for m in SWEEP])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
