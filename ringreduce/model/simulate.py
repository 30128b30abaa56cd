"""ringreduce's time by replaying the engine's own plan against stage costs.

The plan comes from the pure planning modules the engine runs: ``layout.plan_slices``
(slices), ``layout.staging_geometry`` (slots, sized as the engine sizes them),
``Config`` and ``layout.call_slice_bytes`` (the slice-size rule) and
``schedule.plan_call`` (the steps, slice-major, with the events each waits on and
records). Each step is then timed as the CUDA streams would run it::

    start(stage s of slice i) = max(host has issued slice i,
                                    the events it waits on (stage s-1 of slice i, the
                                    staging slot's release, ...),
                                    stage s of slice i-1 on the same stream)
    end = max(start + alpha, link free) + occupancy

``alpha`` is the stage's latency; ``occupancy`` holds its link (NVLink for
reduce_scatter/all_gather, the rail NIC share for collect/diffuse, device memory for add),
so stages that share a link queue on it, in the order they become ready. Several calls
(buckets) continue the same streams, events and host clock, each starting at staging slot
0 as the engine's calls do, so they overlap as the engine's do.

The one-slice plan (plan/slicing.py, execution/one_slice.py: three collectives, one after
the other, on one stream) has no pipeline to replay: :func:`one_slice_call_us` prices its
call as the sum of the three, and the calls of an iteration follow one another on the
device while the host issues them (:func:`one_slice_time_us`). ``Options.plan`` says which
plan a call takes; the engine's construction probe chooses it on CUDA, so the model is told
(:mod:`.probe` predicts the probe's choice with these prices).
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

from ..config import Config
from ..defaults import DEFAULT_MIN_BYTES, DEFAULT_STAGING_BYTES
from ..plan import layout, schedule
from ..plan.slicing import PIPELINED, PLANS, UNSLICED
from .cluster import Cluster, gbps_to_bytes_per_us
from .nccl_cost import nccl_time_us

#: The link each stage holds while it moves data.
LINK = {"reduce_scatter": "intra", "all_gather": "intra", "collect": "net",
        "diffuse": "net", "add": "mem"}


@dataclass(frozen=True)
class Options:
    """What a call looks like: element size, slicing, staging, wire format."""

    itemsize: int = 4
    slice_bytes: int | None = None
    staging_bytes: int = DEFAULT_STAGING_BYTES
    min_bytes: int = DEFAULT_MIN_BYTES
    wire_factor: float = 1.0
    """Bytes on the network hop per byte of data: 0.5 with a 16-bit wire for fp32."""
    plan: str = PIPELINED
    """The engine's plan for hierarchical calls: "pipelined", "one-slice" or "two-level"
    (priced alike: the same three collectives; the engine takes them only where the
    wire is the tensor's dtype: execution/issue.py)."""

    def __post_init__(self) -> None:
        if self.plan not in PLANS:
            raise ValueError(f"plan={self.plan!r} is not one of {PLANS}")
        if self.plan in UNSLICED and self.wire_factor != 1.0:
            raise ValueError(f"plan={self.plan!r} with wire_factor={self.wire_factor}: the "
                             "engine sends a 16-bit wire through the pipeline, never one "
                             "slice; use plan='pipelined'")


def stage_cost(stage: str, numel: int, c: Cluster, o: Options) -> tuple[float, float]:
    """(alpha, occupancy) in microseconds of one stage on a slice of ``numel`` elements."""
    d, m = c.gpus, c.machines
    size = numel * o.itemsize
    if stage in ("reduce_scatter", "all_gather"):  # ring over D GPUs
        return ((d - 1) * c.intra_lat_us,
                size * (d - 1) / d / gbps_to_bytes_per_us(c.intra_gbps))
    if stage == "add":  # read the own row and M-1 received rows, write one
        return 0.0, size * (m + 1) / (d * m) / gbps_to_bytes_per_us(c.mem_gbps)
    # collect / diffuse: (M-1) rows of size/(D*M) to and from every peer on the rail,
    # which gets 1/D of the machine's network. Diffuse is one NCCL all-gather now; its
    # latency is modelled as collect's direct exchange (NCCL's ring would pay M-1 hops,
    # its PAT algorithm log M): an assumption that matters only at large M.
    moved = size * (m - 1) / m * o.wire_factor
    return (c.net_lat_us,
            (m - 1) * c.peer_us + moved / gbps_to_bytes_per_us(c.net_gbps))


@dataclass(frozen=True)
class _Plan:
    """Every step of every call in host issue order, as parallel tuples (cached: it
    does not depend on costs, so a fit replays it many times)."""

    call: tuple[int, ...]
    slice_index: tuple[int, ...]
    stage: tuple[str, ...]
    numel: tuple[int, ...]
    after: tuple[tuple[int, ...], ...]
    """Tasks that wait on this one: the next task on its stream, and every task whose
    wait sees this task's record (CUDA: a wait sees the last record issued before it)."""
    waiting: tuple[int, ...]
    slices: tuple[int, ...]
    """Slices of each call."""


@functools.lru_cache(maxsize=256)
def _plan(numel: int, itemsize: int, d: int, m: int, slice_bytes: int, slots: int,
          calls: int, slot_reader: str = "add") -> _Plan:
    call: list[int] = []
    index: list[int] = []
    stage: list[str] = []
    size: list[int] = []
    deps: list[set[int]] = []
    last_on: dict[str, int] = {}
    recorder: dict[str, int] = {}
    slices = []
    for c in range(calls):
        plans, steps = schedule.plan_call(numel, itemsize, d, m, slice_bytes, slots,
                                          slot_reader)
        slices.append(len(plans))
        for step in steps:
            mine = {recorder[w] for w in step.waits if w in recorder}
            if step.stage in last_on:
                mine.add(last_on[step.stage])
            last_on[step.stage] = len(call)
            for name in step.records:
                recorder[name] = len(call)
            call.append(c)
            index.append(step.slice_index)
            stage.append(step.stage)
            size.append(plans[step.slice_index].numel)
            deps.append(mine)
    after: list[list[int]] = [[] for _ in call]
    for i, mine in enumerate(deps):
        for j in mine:
            after[j].append(i)
    return _Plan(tuple(call), tuple(index), tuple(stage), tuple(size),
                 tuple(tuple(a) for a in after), tuple(len(x) for x in deps), tuple(slices))


def _run(p: _Plan, c: Cluster, o: Options) -> list[float]:
    """End time of every task. Tasks take their link in the order they become ready
    (non-preemptive), so stages of different slices that share a link share it in
    time, whatever order the host issued them in."""
    per_slice = c.host_slice_us + (c.machines - 1) * c.host_peer_us
    starts, host = [], 0.0
    for n in p.slices:  # the host issues calls one after another
        starts.append(host)
        host += c.host_call_us + n * per_slice
    cost = {(n, st): stage_cost(st, n, c, o) for n, st in set(zip(p.numel, p.stage, strict=True))}
    ready_at = [starts[k] + c.host_call_us + (i + 1) * per_slice
                for k, i in zip(p.call, p.slice_index, strict=True)]
    waiting = list(p.waiting)
    heap = [(ready_at[i], i) for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(heap)
    ends = [0.0] * len(ready_at)
    link_free = dict.fromkeys(LINK.values(), 0.0)
    while heap:
        ready, i = heapq.heappop(heap)
        alpha, busy = cost[p.numel[i], p.stage[i]]
        link = LINK[p.stage[i]]
        ends[i] = end = max(ready + alpha, link_free[link]) + busy
        link_free[link] = end
        for j in p.after[i]:
            if end > ready_at[j]:
                ready_at[j] = end
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (ready_at[j], j))
    return ends


def hierarchical(c: Cluster, o: Options, size: int) -> bool:
    """The engine's routing: one machine or a small tensor take NCCL's all-reduce."""
    return c.machines > 1 and size >= o.min_bytes and size >= o.itemsize


def iteration_ends(size: int, c: Cluster, o: Options, buckets: int = 1,
                   iterations: int = 1) -> list[float]:
    """Device end of each iteration of ``buckets`` back-to-back calls of ``size`` bytes,
    issued from an idle pipeline at t = 0 (the host never waits, as the benchmark's
    CUDA-aware futures do not)."""
    config = Config(slice_bytes=o.slice_bytes)
    largest = config.resolved_slice_bytes(c.gpus, c.machines)
    _, slots = layout.staging_geometry(c.gpus, c.machines, largest, o.staging_bytes)
    slice_bytes = layout.call_slice_bytes(size, largest,
                                          config.smallest_slice_bytes(c.gpus, c.machines),
                                          c.gpus, c.machines)
    # a 16-bit wire also stages the diffused rows, so diffuse frees the slot (engine)
    reader = "diffuse" if o.wire_factor < 1 else "add"
    p = _plan(size // o.itemsize, o.itemsize, c.gpus, c.machines, slice_bytes, slots,
              buckets * iterations, reader)
    ends = [0.0] * iterations
    for k, end in zip(p.call, _run(p, c, o), strict=True):
        it = k // buckets
        ends[it] = max(ends[it], end)
    return ends


def ringreduce_time_us(size: int, c: Cluster, o: Options, buckets: int = 1) -> float:
    """One iteration of ``buckets`` calls from an idle pipeline, host cost included."""
    if not hierarchical(c, o, size):
        return buckets * nccl_time_us(size, c)
    if o.plan in UNSLICED:
        return one_slice_time_us(size, c, o, buckets, 1)
    return iteration_ends(size, c, o, buckets)[0]


def rail_cluster(c: Cluster) -> Cluster:
    """A rail as NCCL sees it: M ranks, one a machine, each on 1/D of its machine's
    network, because the machine's D rails all-reduce at the same time."""
    return c.with_(name=f"{c.name} rail", gpus=1, net_gbps=c.net_gbps / c.gpus,
                   nccl_hosts=None)


def one_slice_call_us(size: int, c: Cluster, o: Options) -> float:
    """Device time of one one-slice call of ``size`` bytes: three collectives in turn::

        reduce_scatter(inside) ; all_reduce(rail, size / D) ; all_gather(inside)

    The intra-machine two as the pipeline's stages cost (:func:`stage_cost`) on the whole
    tensor; the rail's as NCCL's all-reduce (its tuner's pick) on :func:`rail_cluster`.
    The tail of ``size mod D`` elements, all-reduced over the world in the rail's group,
    is left out: fewer than D elements."""
    n = size // o.itemsize
    inside = sum(sum(stage_cost(st, n, c, o)) for st in ("reduce_scatter", "all_gather")) \
        if c.gpus > 1 else 0.0
    return inside + nccl_time_us(-(-size // c.gpus), rail_cluster(c))


def one_slice_time_us(size: int, c: Cluster, o: Options, buckets: int, iters: int,
                      host_call_us: float | None = None) -> float:
    """Per-iteration time of ``iters`` iterations of ``buckets`` one-slice calls issued
    back to back: the host issues a call in ``host_call_us`` (default: the engine's call
    and one slice's cost, ``c.host_call_us + c.host_slice_us``) and never waits; the
    device runs each call once issued and once the previous one is done (one stream)::

        end(k) = max(host has issued call k, end(k - 1)) + one_slice_call_us"""
    host = c.host_call_us + c.host_slice_us if host_call_us is None else host_call_us
    call, end = one_slice_call_us(size, c, o), 0.0
    for k in range(buckets * iters):
        end = max((k + 1) * host, end) + call
    return end / iters


#: Iterations simulated for a benchmark row; more are extrapolated at the rate between
#: the first and the second-to-last (each of those is followed by another iteration, which
#: takes links first where its stages are ready first, as the real run's do).
SIMULATED_ITERATIONS = 4


def steady_time_us(size: int, c: Cluster, o: Options, buckets: int, iters: int) -> float:
    """Per-iteration time as the benchmark measures it: ``iters`` iterations issued back
    to back from an idle pipeline, total time divided by ``iters``."""
    if not hierarchical(c, o, size):
        return buckets * nccl_time_us(size, c)
    if o.plan in UNSLICED:
        return one_slice_time_us(size, c, o, buckets, iters)
    k = max(1, min(iters, SIMULATED_ITERATIONS))
    ends = iteration_ends(size, c, o, buckets, k)
    if k == iters:
        return ends[-1] / iters
    rate = (ends[-2] - ends[0]) / (k - 2) if k > 2 else ends[-1] / k
    return (ends[-1] + (iters - k) * rate) / iters
