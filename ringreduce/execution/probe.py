"""The construction probe: which route is fastest here, for plan/slicing.choose.

Collective: every rank of a CUDA communicator runs it once, at the end of its
construction, when the plan is not given and a call can take the hierarchy (M > 1,
D > 1). At each of ``slicing.probe_sizes`` it makes all-reduces through the
communicator itself on every route of ``slicing.ROUTES`` (NCCL's flat all-reduce on the
whole group, one slice, two-level, the pipeline) on int32 tensors, and with an 8- or 4-bit wire
also on float32 ones that take the wire: ``PROBE_WARMUP`` calls on each (connections,
the native issuer's trace), then ``PROBE_PASSES`` passes that time each in turn,
``PROBE_ROUNDS`` synchronous calls between two events on the caller's stream. So each
route is timed as a call runs: the device's work, or the host's where issuing takes
longer than the device needs; and none pays alone for what is still warming up.
Every rank then takes the slowest rank's time of each pass (an all-reduce MAX), so all
decide alike, on the route's fastest pass and the passes' spread (the margin). The
host waits for the device here, at construction, never on a call. The probe's calls
are numbered and recorded like the user's, before them.

Its cost: sizes x routes x (PROBE_WARMUP + PROBE_PASSES x PROBE_ROUNDS) calls, 64 (80
with a wire) of 4 and 16 MiB: about 0.7 s at 10 Gbit/s between two machines.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ringreduce.config import Config
from ringreduce.errors import RingReduceError
from ringreduce.execution import quant
from ringreduce.plan import slicing

if TYPE_CHECKING:
    from ringreduce.execution.resources import Resources


def plan_without_probe(res: Resources, config: Config) -> slicing.Choice | None:
    """The plan when nothing needs measuring: the user's, one machine, gloo (the
    pipeline), one device per machine (the rail all-reduce is the call); else None
    (build.py then leaves slicing.UNDECIDED, and the Communicator runs ``compare``)."""
    topo = res.topo
    if topo.machines == 1:
        return slicing.ONE_MACHINE
    if config.plan is not None:
        return slicing.given(config.plan)
    if not res.is_cuda:
        return slicing.CPU_DEFAULT
    if topo.devices_per_machine == 1:
        return slicing.ONE_DEVICE
    return None


def compare(res: Resources, all_reduce: Callable[[torch.Tensor], object],
            config: Config) -> slicing.Choice:
    """Time every route through ``all_reduce`` (the communicator's, synchronous) at each
    probe size and return the choice, agreed over every rank. Leaves ``res.plan`` set
    to it. Calls of ``min_bytes`` at least (smaller ones take the flat route anyway)."""
    unprobed = slicing.unprobed(config.min_bytes)
    if unprobed is not None:
        res.plan = unprobed
        return res.plan
    routes = slicing.probe_routes(config.wire in quant.FORMATS)
    sizes = slicing.probe_sizes(config.min_bytes)
    cases = [(size, route, _tensor(res, size, route)) for size in sizes for route in routes]
    for _, route, t in cases:
        res.plan = _forced(route)
        for _ in range(slicing.PROBE_WARMUP):
            all_reduce(t)
    seconds = [[0.0] * slicing.PROBE_PASSES for _ in cases]
    for p in range(slicing.PROBE_PASSES):
        for i, (_, route, t) in enumerate(cases):
            res.plan = _forced(route)
            seconds[i][p] = _timed(functools.partial(all_reduce, t), res, config.timeout_s)
    agreed = torch.tensor(seconds, dtype=torch.float64, device=res.device)
    all_reduce_max(res, agreed, config.timeout_s)
    slowest = agreed.tolist()
    timings = [slicing.Timing(size, {route: tuple(slowest[i])
                                     for i, (at, route, _) in enumerate(cases) if at == size})
               for size in sizes]
    res.plan = slicing.choose(timings)
    return res.plan


def _forced(route: str) -> slicing.Choice:
    """The choice that sends the probe's calls down ``route`` (WIRE: the wire's, whose
    exact plan the float32 call does not take)."""
    return slicing.Choice(slicing.ONE_SLICE if route == slicing.WIRE else route,
                          "the construction probe", wire=route == slicing.WIRE)


def _tensor(res: Resources, nbytes: int, route: str) -> torch.Tensor:
    """The probe's tensor of ``nbytes``: float32 for the wire (the dtype it carries),
    int32 for an exact route. Not float32 there: a communicator's wire (bf16's pipeline,
    int8's compressed route) takes float32 calls whatever the route, so they would time
    the wire's route; every other dtype takes the route, and int32 moves float32's bytes."""
    dtype = torch.float32 if route == slicing.WIRE else torch.int32
    return torch.zeros(-(-nbytes // 4), dtype=dtype, device=res.device)


def _timed(call: Callable[[], object], res: Resources, timeout_s: float) -> float:
    """Seconds per call on the caller's stream, over PROBE_ROUNDS calls."""
    stream = torch.cuda.current_stream(res.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(slicing.PROBE_ROUNDS):
        call()
    end.record(stream)
    _wait(end, timeout_s, "the construction probe's calls")
    return start.elapsed_time(end) / 1e3 / slicing.PROBE_ROUNDS


def all_reduce_max(res: Resources, t: torch.Tensor, timeout_s: float) -> None:
    """``t`` = its elementwise maximum over every rank (the world communicator)."""
    stream = torch.cuda.current_stream(res.device)
    res.transport.all_reduce_on("world", t, "max", stream.cuda_stream)
    done = torch.cuda.Event()
    done.record(stream)
    _wait(done, timeout_s, "the construction probe's agreement")


def _wait(event: torch.cuda.Event, timeout_s: float, what: str) -> None:
    """Until ``event`` completed, or a RingReduceError after ``timeout_s``: a peer that
    dies during construction must not hang it."""
    deadline = time.monotonic() + timeout_s
    while not event.query():
        if time.monotonic() > deadline:
            raise RingReduceError(f"construction: {what} did not finish within "
                                  f"{timeout_s:g} s (RINGREDUCE_TIMEOUT); a peer is gone "
                                  "or stuck")
        time.sleep(1e-4)
