"""Fit the model's costs to measured runs, and check it on runs it was not fitted to.

Costs are fitted per *setting* (one link, one intra-machine carrier, one way of placing
ranks on GPUs: :func:`results.setting_key`), because an emulated link or a loopback socket
is not a NIC. Within a setting, rows alternate between the fit set and the validation set
(sorted by file, buckets and size: every other row), so every size range is in both. The
fit minimises the squared log error of ringreduce's and NCCL's predicted times over the
fit rows, plus a weak pull of each cost towards its prior (the link's cap, NCCL's
latencies, the measured host cost), by Nelder-Mead in log space (stdlib only).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .cluster import MEASURED_HOST_CALL_US, MEASURED_HOST_SLICE_US, Cluster
from .nccl_cost import nccl_time_us, ring_time_us, tree_time_us
from .results import Sample, nccl_algo_of
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
                   wire_factor=sample.wire_factor)


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
