"""Fit the model's costs to measured runs, and check it on runs it was not fitted to.

Costs are fitted per *setting* (one link, one intra-machine carrier, one way of placing
ranks on GPUs: :func:`results.setting_key`), because an emulated link or a loopback socket
is not a NIC. Within a setting, rows alternate between the fit set and the validation set
(sorted by file, buckets and size: every other row), so every size range is in both. The
fit minimises the squared log error of ringreduce's and NCCL's predicted times over the
fit rows, plus a weak pull of each cost towards its prior (the link's cap, NCCL's
latencies, the measured host cost), by Nelder-Mead in log space (stdlib only).

``python -m ringreduce.model --calibrate run.json`` fits a user's own benchmark JSON
(:func:`run`, :func:`table`, :func:`summary`); the repository's validation against its
committed results (benchmarks/model_validation/) runs the same fit over every folder.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .cluster import MEASURED_HOST_CALL_US, MEASURED_HOST_SLICE_US, Cluster
from .nccl_cost import nccl_time_us, ring_time_us, tree_time_us
from .results import Sample, exclusion, nccl_algo_of
from .simulate import Options, steady_time_us

#: Weight of the pull towards the prior, per cost, in squared log units: a cost moves
#: freely by a factor of ~2 when the data ask for it, not by 100 when they do not.
PRIOR_WEIGHT = 0.02
NCCL_HOST_US = 100.0
"""NCCL's own host time per call (80-140 us measured)."""


@dataclass(frozen=True)
class Costs:
    """The fitted stage costs of one setting."""

    net_gbps: float
    net_lat_us: float
    intra_gbps: float
    intra_lat_us: float
    host_call_us: float
    host_slice_us: float
    nccl_eff: float

    def vector(self) -> list[float]:
        return [math.log(v) for v in dataclasses.astuple(self)]

    @staticmethod
    def from_vector(v: Sequence[float]) -> Costs:
        return Costs(*(math.exp(x) for x in v))


def prior(sample: Sample) -> Costs:
    """Starting costs: the cap (or ~40 Gbit/s for loopback sockets), NCCL's latencies for
    NVLink, ~50 us for sockets, the measured host cost, NCCL at the link."""
    net = sample.link_gbit or 40.0
    sockets = sample.setting.intra != "nvlink"
    return Costs(net_gbps=net, net_lat_us=50.0, intra_gbps=40.0 if sockets else 3600.0,
                 intra_lat_us=50.0 if sockets else 3.4, host_call_us=MEASURED_HOST_CALL_US,
                 host_slice_us=MEASURED_HOST_SLICE_US, nccl_eff=1.0)


def cluster_for(sample: Sample, costs: Costs) -> Cluster:
    hosts = sample.machines * sample.gpus if sample.setting.nccl_hosts == "ranks" else None
    return Cluster(sample.setting_key, sample.machines, sample.gpus,
                   intra_gbps=costs.intra_gbps, intra_lat_us=costs.intra_lat_us,
                   net_gbps=costs.net_gbps, net_lat_us=costs.net_lat_us,
                   host_call_us=costs.host_call_us, host_slice_us=costs.host_slice_us,
                   nccl_hosts=hosts, nccl_eff=min(costs.nccl_eff, 1.5))


def options_for(sample: Sample) -> Options:
    return Options(itemsize=sample.itemsize, slice_bytes=sample.slice_bytes,
                   staging_bytes=sample.staging_bytes, min_bytes=sample.min_bytes,
                   wire_factor=sample.wire_factor, plan=sample.plan)


def predict(sample: Sample, costs: Costs) -> tuple[float, float]:
    """(ringreduce, NCCL) per-iteration time of the sample's run, microseconds; NCCL under
    the algorithm the run's NCCL_ALGO forced, else the one its tuner picks."""
    c, o = cluster_for(sample, costs), options_for(sample)
    rr = steady_time_us(sample.size, c, o, sample.buckets, sample.iters)
    nccl = {"tree": tree_time_us, "ring": ring_time_us}.get(nccl_algo_of(sample.meta),
                                                            nccl_time_us)
    ref = sample.buckets * max(nccl(sample.size, c), NCCL_HOST_US)
    return rr, ref


def _loss(samples: Sequence[Sample], start: Costs) -> Callable[[Sequence[float]], float]:
    origin = start.vector()

    def loss(v: Sequence[float]) -> float:
        costs = Costs.from_vector(v)
        total = PRIOR_WEIGHT * sum((a - b) ** 2 for a, b in zip(v, origin, strict=True))
        for s in samples:
            rr, ref = predict(s, costs)
            total += math.log(rr / s.rr_us) ** 2 + math.log(ref / s.ref_us) ** 2
        return total
    return loss


def fit(samples: Sequence[Sample], evaluations: int = 150) -> Costs:
    """Costs minimising the fit loss over ``samples`` (all of one setting)."""
    start = prior(samples[0])
    best = nelder_mead(_loss(samples, start), start.vector(), evaluations)
    return Costs.from_vector(best)


def nelder_mead(f: Callable[[Sequence[float]], float], x0: Sequence[float],
                evaluations: int, step: float = 0.5) -> list[float]:
    """Minimise ``f`` from ``x0`` (standard reflection/expansion/contraction/shrink)."""
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)]
                            for i in range(len(x0))]
    values = [f(x) for x in simplex]
    used = len(simplex)
    while used < evaluations:
        order = sorted(range(len(simplex)), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centre = [sum(col) / (len(simplex) - 1) for col in zip(*simplex[:-1], strict=True)]
        worst = simplex[-1]
        trial = [c + (c - w) for c, w in zip(centre, worst, strict=True)]
        value, used = f(trial), used + 1
        if value < values[0]:
            wider = [c + 2 * (c - w) for c, w in zip(centre, worst, strict=True)]
            wide_value, used = f(wider), used + 1
            simplex[-1], values[-1] = (wider, wide_value) if wide_value < value else (trial, value)
        elif value < values[-2]:
            simplex[-1], values[-1] = trial, value
        else:
            used = _contract_or_shrink(f, simplex, values, centre, used)
    return simplex[min(range(len(simplex)), key=values.__getitem__)]


def _contract_or_shrink(f: Callable[[Sequence[float]], float], simplex: list[list[float]],
                        values: list[float], centre: list[float], used: int) -> int:
    inner = [c + 0.5 * (w - c) for c, w in zip(centre, simplex[-1], strict=True)]
    value = f(inner)
    if value < values[-1]:
        simplex[-1], values[-1] = inner, value
        return used + 1
    best = simplex[0]
    for i in range(1, len(simplex)):
        simplex[i] = [b + 0.5 * (x - b) for b, x in zip(best, simplex[i], strict=True)]
        values[i] = f(simplex[i])
    return used + 1 + len(simplex) - 1


def split(samples: Sequence[Sample]) -> tuple[list[Sample], list[Sample]]:
    """(fit, validate): every other row of a setting, in (file, buckets, size) order. A
    setting with fewer than 4 rows is fitted on all of them and validates nothing."""
    ordered = sorted(samples, key=lambda s: (s.source, s.buckets, s.size))
    if len(ordered) < 4:
        return ordered, []
    return ordered[0::2], ordered[1::2]


def relative_errors(samples: Sequence[Sample], costs: Costs) -> list[float]:
    """|predicted / measured - 1| for ringreduce and NCCL of every sample."""
    errors = []
    for s in samples:
        rr, ref = predict(s, costs)
        errors += [abs(rr / s.rr_us - 1), abs(ref / s.ref_us - 1)]
    return errors


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass(frozen=True)
class Line:
    sample: Sample
    role: str
    """"F": in the fit set; "V": validation only."""
    rr_us: float
    ref_us: float

    def errors(self) -> tuple[float, float]:
        return self.rr_us / self.sample.rr_us - 1, self.ref_us / self.sample.ref_us - 1


@dataclass(frozen=True)
class Report:
    lines: list[Line]
    costs: dict[str, Costs]
    excluded: list[tuple[Sample, str]]

    def median_error(self, role: str) -> float:
        return median([abs(e) for ln in self.lines if ln.role == role for e in ln.errors()])


def run(samples: Sequence[Sample]) -> Report:
    """Exclude by rule, fit each setting on its fit rows, predict every kept row."""
    kept: dict[str, list[Sample]] = defaultdict(list)
    excluded = []
    for s in samples:
        reason = exclusion(s)
        if reason is None:
            kept[s.setting_key].append(s)
        else:
            excluded.append((s, reason))
    lines: list[Line] = []
    costs: dict[str, Costs] = {}
    for key, group in sorted(kept.items()):
        fit_rows, check_rows = split(group)
        costs[key] = fit(fit_rows)
        for role, rows in (("F", fit_rows), ("V", check_rows)):
            lines.extend(Line(s, role, *predict(s, costs[key])) for s in rows)
    return Report(lines, costs, excluded)


def table(report: Report) -> str:
    """Markdown: one row per measured row, errors signed (predicted / measured - 1)."""
    out = ["| setting | file | M x D | size | buckets | role | ringreduce ms (model) | err "
           "| NCCL ms (model) | err |", "|---|---|---|---|---|---|---|---|---|---|"]
    for ln in sorted(report.lines, key=lambda x: (x.sample.setting_key, x.sample.source,
                                                 x.sample.buckets, x.sample.size)):
        s, (e_rr, e_ref) = ln.sample, ln.errors()
        out.append(f"| {s.setting_key} | {s.source} | {s.machines}x{s.gpus} | "
                   f"{s.size / 2**20:g} MiB | {s.buckets} | {ln.role} | {s.rr_us / 1e3:.2f} "
                   f"({ln.rr_us / 1e3:.2f}) | {e_rr:+.0%} | {s.ref_us / 1e3:.2f} "
                   f"({ln.ref_us / 1e3:.2f}) | {e_ref:+.0%} |")
    return "\n".join(out)


def summary(report: Report) -> str:
    v = [ln for ln in report.lines if ln.role == "V"]
    reasons: dict[str, int] = defaultdict(int)
    for _, why in report.excluded:
        reasons[why] += 1
    lines = [f"median |error| on validation rows (V, not fitted): "
             f"{report.median_error('V'):.1%} over {2 * len(v)} predictions "
             f"(ringreduce and NCCL); on fit rows (F): {report.median_error('F'):.1%}",
             "excluded rows: " + (", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
                                  or "none")]
    for key, c in report.costs.items():
        multi = any(ln.sample.gpus > 1 for ln in report.lines if ln.sample.setting_key == key)
        intra = (f"{c.intra_gbps:.0f} Gbit/s, {c.intra_lat_us:.0f} us" if multi
                 else "unused (one GPU per machine)")
        lines.append(f"costs [{key}]: net {c.net_gbps:.1f} Gbit/s/machine, "
                     f"{c.net_lat_us:.0f} us; intra {intra}; host {c.host_call_us:.0f} us/call"
                     f" + {c.host_slice_us:.0f} us/slice; NCCL at {c.nccl_eff:.2f} of the link")
    return "\n".join(lines)
