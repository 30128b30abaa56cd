"""The faithful measurements the model is checked against with nominal costs (no fit).

The faithful setting (``benchmarks/emulate.py --physical-gpus 2``: a virtual machine's two
ranks on two H100s joined by NVLink, NCCL seeing one host per virtual machine, each machine's
link capped at 10 Gbit/s) is the project's performance truth (issue 35). Its runs are not
bench JSON the fit can read, and fitting them would hide what the model gets wrong, so here
the model prices them from the nominal cluster alone, as ``python -m ringreduce.model
--machines 2 4 --gpus-per-machine 2 --machine-net-gbps 10 --intra-gbps 1200`` does: the
cap, NCCL's own latencies, ringreduce's measured host cost.

Two kinds of measured rows:

* ratios (NCCL time / ringreduce time) from issue 35's table (``nvidia-h100-x2``, NCCL
  2.28.9, torch 2.11, ``-n 3 -w 1 -r 3``; also ../shared/FINDINGS.md). That table is not
  yet a results folder: the faithful ``gpu.sh perf`` run that will hold it is issue 35's
  item 4;
* times (ms) from the results folder :data:`COMPRESSED` names, under ``benchmarks/results/``
  (benchmarks/compressed.py, one AVG call, median of 5 rounds x 10 calls; NCCL's tree in a
  second process set, whose ringreduce time is the second one given).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import PRESETS, Cluster
from .nccl_cost import nccl_algo, nccl_time_us, ring_time_us, tree_time_us
from .simulate import Options, steady_time_us

MiB = 1 << 20
ISSUE_35 = "issue 35 table (faithful perf, -n 3)"
COMPRESSED = "2026-11-26-h100x2-compressed (10 calls)"


@dataclass(frozen=True)
class Measured:
    """One faithful row: ``nccl`` is "default" (NCCL's own pick), "tree" or "ring"
    (``NCCL_ALGO``); ``ratio`` = NCCL time / ringreduce time, or ``times`` = (ringreduce
    ms, NCCL ms) where the folder gives times."""

    source: str
    machines: int
    size: int
    nccl: str
    buckets: int = 1
    iters: int = 3
    ratio: float | None = None
    times: tuple[float, float] | None = None


def _issue_rows(machines: int, nccl: str, ratios: tuple[float, ...]) -> list[Measured]:
    sizes = ((4 * MiB, 1), (16 * MiB, 1), (64 * MiB, 1), (256 * MiB, 1), (25 * MiB, 16))
    return [Measured(ISSUE_35, machines, size, nccl, buckets, ratio=r)
            for (size, buckets), r in zip(sizes, ratios, strict=True)]


#: 4 MiB, 16 MiB, 64 MiB, 256 MiB, 16 x 25 MiB. At 4 x 2 NCCL's default is its ring.
MEASURED: tuple[Measured, ...] = (
    *_issue_rows(2, "default", (1.50, 1.52, 1.04, 1.02, 1.52)),
    *_issue_rows(2, "tree", (1.00, 1.00, 1.05, 1.00, 1.03)),
    *_issue_rows(4, "default", (1.16, 1.17, 1.19, 1.13, 1.16)),
    *_issue_rows(4, "tree", (1.35, 1.49, 1.44, 1.50, 1.53)),
    Measured(COMPRESSED, 2, 16 * MiB, "default", iters=10, times=(13.57, 20.74)),
    Measured(COMPRESSED, 2, 16 * MiB, "tree", iters=10, times=(13.57, 14.21)),
    Measured(COMPRESSED, 2, 64 * MiB, "default", iters=10, times=(57.40, 57.17)),
    Measured(COMPRESSED, 2, 64 * MiB, "tree", iters=10, times=(54.31, 59.33)),
)


def cluster(machines: int) -> Cluster:
    """The nominal faithful cluster: 2 GPUs a machine, 10 Gbit/s per machine."""
    return PRESETS["dgx-h100"].with_(name="faithful 10G", machines=machines, gpus=2,
                                     net_gbps=10.0, intra_gbps=1200.0)


@dataclass(frozen=True)
class Predicted:
    row: Measured
    rr_us: float
    nccl_us: float
    algo: str
    """The algorithm the model's NCCL ran: the tuner's pick for "default"."""

    @property
    def ratio(self) -> float:
        return self.nccl_us / self.rr_us

    def errors(self) -> list[float]:
        """predicted / measured - 1: of the ratio, or of both times."""
        if self.row.times is None:
            assert self.row.ratio is not None
            return [self.ratio / self.row.ratio - 1]
        rr_ms, nccl_ms = self.row.times
        return [self.rr_us / 1e3 / rr_ms - 1, self.nccl_us / 1e3 / nccl_ms - 1]


def predict(row: Measured) -> Predicted:
    c = cluster(row.machines)
    algo = nccl_algo(row.size, c) if row.nccl == "default" else row.nccl
    one = {"default": nccl_time_us, "tree": tree_time_us, "ring": ring_time_us}[row.nccl]
    rr = steady_time_us(row.size, c, Options(), row.buckets, row.iters)
    return Predicted(row, rr, row.buckets * one(row.size, c), algo)


def predictions() -> list[Predicted]:
    return [predict(row) for row in MEASURED]


def table(preds: list[Predicted]) -> str:
    """Markdown: measured beside predicted, signed error (predicted / measured - 1)."""
    out = ["| source | M x D | size | NCCL (model's algorithm) | measured | model | err |",
           "|---|---|---|---|---|---|---|"]
    for p in preds:
        r = p.row
        size = f"{r.buckets} x {r.size // MiB} MiB" if r.buckets > 1 else f"{r.size // MiB} MiB"
        what = f"{r.nccl} ({p.algo})"
        if r.times is None:
            measured, model = f"ratio {r.ratio:.2f}", f"{p.ratio:.2f}"
        else:
            measured = f"rr {r.times[0]:.2f} ms, NCCL {r.times[1]:.2f} ms"
            model = f"rr {p.rr_us / 1e3:.2f}, NCCL {p.nccl_us / 1e3:.2f}"
        errs = ", ".join(f"{e:+.0%}" for e in p.errors())
        out.append(f"| {r.source} | {r.machines}x2 | {size} | {what} | {measured} | {model} "
                   f"| {errs} |")
    return "\n".join(out)


def summary(preds: list[Predicted]) -> str:
    errs = sorted(abs(e) for p in preds for e in p.errors())
    worst = max(preds, key=lambda p: max(abs(e) for e in p.errors()))
    r = worst.row
    return (f"faithful rows (nominal costs, not fitted): median |error| "
            f"{errs[len(errs) // 2]:.1%}, largest {errs[-1]:.1%} ({r.machines}x2, "
            f"{r.buckets} x {r.size // MiB} MiB, NCCL {r.nccl}) over {len(errs)} predictions")
