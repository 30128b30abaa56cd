"""ringreduce's time by replaying the engine's own plan against stage costs.

The plan comes from the pure planning modules the engine runs: ``layout.plan_slices``
(slices), ``layout.staging_slots`` (slots), ``Config.resolved_slice_bytes`` (the slice-size
rule) and ``schedule.plan_call`` (the steps, slice-major, with the events each waits on
and records). Each step is then timed, in issue order, as the CUDA streams would run it::

    start(stage s of slice i) = max(host has issued slice i,
                                    the events it waits on (stage s-1 of slice i, the
                                    staging slot's release, ...),
                                    stage s of slice i-1 on the same stream)
    end = max(start + alpha, link free) + occupancy

``alpha`` is the stage's latency; ``occupancy`` holds its link (NVLink for
reduce_scatter/all_gather, the rail NIC share for collect/diffuse, device memory for add),
so stages that share a link queue on it. Several calls (buckets) continue the same streams,
events, slot rotation and host clock, so they overlap as the engine's do.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import layout, schedule
from ..config import DEFAULT_MIN_BYTES, DEFAULT_STAGING_BYTES, Config
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
    # which gets 1/D of the machine's network
    moved = size * (m - 1) / m * o.wire_factor
    return (c.net_lat_us,
            (m - 1) * c.peer_us + moved / gbps_to_bytes_per_us(c.net_gbps))


class _Streams:
    """Clocks of one GPU's stage streams, links, events and host, across calls."""

    def __init__(self) -> None:
        self.stream: dict[str, float] = {}
        self.link: dict[str, float] = {}
        self.event: dict[str, float] = {}
        self.host = 0.0
        self.cursor = schedule.Cursor()


def _run_call(s: _Streams, numel: int, c: Cluster, o: Options, slice_bytes: int,
              slots: int) -> float:
    """Issue one hierarchical call; returns the time its ``done`` event fires."""
    plans, steps, s.cursor = schedule.plan_call(
        numel, o.itemsize, c.gpus, c.machines, slice_bytes, slots, s.cursor, "add")
    per_slice = c.host_slice_us + 4 * (c.machines - 1) * c.host_peer_us
    start = s.host
    s.event[schedule.ENTRY] = start
    costs = {(p.index, st): stage_cost(st, p.numel, c, o) for p in plans
             for st in schedule.active_stages(c.gpus)}
    for step in steps:
        issued = start + c.host_call_us + (step.slice_index + 1) * per_slice
        ready = max([issued, s.stream.get(step.stage, 0.0)]
                    + [s.event[w] for w in step.waits if w in s.event])
        alpha, busy = costs[step.slice_index, step.stage]
        link = LINK[step.stage]
        end = max(ready + alpha, s.link.get(link, 0.0)) + busy
        s.stream[step.stage] = s.link[link] = end
        for name in step.records:
            s.event[name] = end
    s.host = start + c.host_call_us + len(plans) * per_slice
    return s.event[schedule.DONE]


def hierarchical(c: Cluster, o: Options, size: int) -> bool:
    """The engine's routing: one machine or a small tensor take NCCL's all-reduce."""
    return c.machines > 1 and size >= o.min_bytes and size >= o.itemsize


def iteration_ends(size: int, c: Cluster, o: Options, buckets: int = 1,
                   iterations: int = 1) -> list[float]:
    """Device end of each iteration of ``buckets`` back-to-back calls of ``size`` bytes,
    issued from an idle pipeline at t = 0 (the host never waits, as the benchmark's
    CUDA-aware futures do not)."""
    numel = size // o.itemsize
    slice_bytes = Config(slice_bytes=o.slice_bytes).resolved_slice_bytes(c.gpus, c.machines)
    slots = layout.staging_slots(o.itemsize, c.gpus, c.machines, slice_bytes,
                                 o.staging_bytes)
    s = _Streams()
    ends = []
    for _ in range(iterations):
        ends.append(max(_run_call(s, numel, c, o, slice_bytes, slots)
                        for _ in range(buckets)))
    return ends


def ringreduce_time_us(size: int, c: Cluster, o: Options, buckets: int = 1) -> float:
    """One iteration of ``buckets`` calls from an idle pipeline, host cost included."""
    if not hierarchical(c, o, size):
        return buckets * nccl_time_us(size, c)
    return iteration_ends(size, c, o, buckets)[0]


def steady_time_us(size: int, c: Cluster, o: Options, buckets: int, iters: int) -> float:
    """Per-iteration time as the benchmark measures it: ``iters`` iterations back to
    back, the first one filling the pipeline, the rest at the steady-state rate."""
    if not hierarchical(c, o, size):
        return buckets * nccl_time_us(size, c)
    first, second = iteration_ends(size, c, o, buckets, 2)
    return (first + (iters - 1) * (second - first)) / iters
