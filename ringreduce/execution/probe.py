"""The construction probe: which route is fastest here, for plan/slicing.choose.

Collective: every rank of a CUDA communicator runs it once, at the end of its
construction, when the plan is not given and a call can take the hierarchy (M > 1,
D > 1). At each of ``slicing.probe_sizes`` it makes all-reduces through the
communicator itself on every route of ``slicing.ROUTES`` (NCCL's flat all-reduce on the
whole group, one slice, two-level, the pipeline) on int32 tensors, and with an 8- or 4-bit wire
also on float32 ones that take the wire, in ``PROBE_PASSES`` passes that time each route
in turn. A route's pass is timed as training runs its calls: ``PROBE_ROUNDS``
asynchronous calls queued back to back, each on a tensor of its own (DDP's buckets;
calls on one tensor would wait for each other), then waited for together, between two
events on the caller's stream; its time per call is that window over the calls. So a
route whose calls slow each other when queued (the pipeline's) is not taken for winning
a call alone, and the window holds the device's work, or the host's where issuing
takes longer than the device needs. Right before its pass a route makes untimed calls
(``PROBE_WARMUP`` before its first: connections, the native issuer's trace;
``PROBE_REWARM`` before each later one: its links idled while the others were timed),
so that none pays alone for what is still warming up. Every rank then takes the
slowest rank's time of each pass (an all-reduce MAX), so all decide alike, on the
route's fastest pass and the passes' spread (the margin). The host waits for the
device here, at construction, never on a call, and only at a pass's end. The probe's
calls are numbered and recorded like the user's, before them.

Its cost: sizes x routes x ``slicing.probe_calls_per_route()`` calls, 88 (110 with a
wire) of 4 and 16 MiB: about 1 s at 10 Gbit/s between two machines; its memory:
``PROBE_ROUNDS`` tensors of the larger size (64 MiB), given back to the caching
allocator when it returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
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


def compare(res: Resources, all_reduce: Callable[..., torch.futures.Future[torch.Tensor] | None],
            config: Config, sizes: Sequence[int] | None = None) -> slicing.Choice:
    """Time every route through ``all_reduce`` (the communicator's) at each probe size
    (``slicing.probe_sizes``; ``sizes`` where given, a CPU test's) and return the choice,
    agreed over every rank. Leaves ``res.plan`` set to it. Calls of ``min_bytes`` at
    least (smaller ones take the flat route anyway)."""
    unprobed = slicing.unprobed(config.min_bytes)
    if unprobed is not None:
        res.plan = unprobed
        return res.plan
    routes = slicing.probe_routes(config.wire in quant.FORMATS)
    sizes = tuple(sizes) if sizes is not None else slicing.probe_sizes(config.min_bytes)
    cases = [(size, route) for size in sizes for route in routes]
    seconds = _passes(res, all_reduce, cases, config.timeout_s)
    agreed = torch.tensor(seconds, dtype=torch.float64, device=res.device)
    all_reduce_max(res, agreed, config.timeout_s)
    slowest = agreed.tolist()
    timings = [slicing.Timing(size, {route: tuple(slowest[i])
                                     for i, (at, route) in enumerate(cases) if at == size})
               for size in sizes]
    res.plan = slicing.choose(timings)
    return res.plan


def _passes(res: Resources, all_reduce: Callable[..., torch.futures.Future[torch.Tensor] | None],
            cases: Sequence[tuple[int, str]], timeout_s: float) -> list[list[float]]:
    """Seconds per call of each case (size, route) in each pass, this rank's. The
    tensors live only here: the caching allocator has them back when it returns."""
    buffers = [torch.zeros(-(-max(size for size, _ in cases) // 4), dtype=torch.float32,
                           device=res.device) for _ in range(slicing.PROBE_ROUNDS)]
    seconds = [[0.0] * slicing.PROBE_PASSES for _ in cases]
    for p in range(slicing.PROBE_PASSES):
        for i, (size, route) in enumerate(cases):
            res.plan = _forced(route)
            tensors = [_tensor(b, size, route) for b in buffers]
            for _ in range(slicing.PROBE_WARMUP if p == 0 else slicing.PROBE_REWARM):
                all_reduce(tensors[0])  # right before the pass: warm, not yet timed
            seconds[i][p] = _timed(all_reduce, tensors, res, timeout_s)
    return seconds


def _forced(route: str) -> slicing.Choice:
    """The choice that sends the probe's calls down ``route`` (WIRE: the wire's, whose
    exact plan the float32 call does not take)."""
    return slicing.Choice(slicing.ONE_SLICE if route == slicing.WIRE else route,
                          "the construction probe", wire=route == slicing.WIRE)


def _tensor(buffer: torch.Tensor, nbytes: int, route: str) -> torch.Tensor:
    """The probe's tensor of ``nbytes``, the start of ``buffer`` (zeros, float32): float32
    for the wire (the dtype it carries), int32 for an exact route. Not float32 there: a
    communicator's wire (bf16's pipeline, int8's compressed route) takes float32 calls
    whatever the route, so they would time the wire's route; every other dtype takes the
    route, and int32 moves float32's bytes (zeros both ways)."""
    t = buffer[:-(-nbytes // 4)]
    return t if route == slicing.WIRE else t.view(torch.int32)


def _timed(all_reduce: Callable[..., torch.futures.Future[torch.Tensor] | None],
           tensors: Sequence[torch.Tensor], res: Resources, timeout_s: float) -> float:
    """Seconds per call of one asynchronous call on each of ``tensors``, queued back to
    back, then waited for together: from the device end of what came before (the
    route's warm-up) to the end of the last, over the calls."""
    clock = _Clock(res)
    futures = [all_reduce(t, async_op=True) for t in tensors]
    for f in futures:
        if f is None:
            raise RingReduceError("construction: an asynchronous call of the probe "
                                  "returned no Future")
        f.wait()  # CUDA-aware: the caller's stream waits, not the host
    return clock.seconds(timeout_s) / len(tensors)


class _Clock:
    """Seconds on the caller's stream from its making (CUDA events; the host's clock on
    gloo, whose calls the host runs) to ``seconds``, which waits for the end."""

    def __init__(self, res: Resources) -> None:
        self._stream = torch.cuda.current_stream(res.device) if res.is_cuda else None
        self._host = time.perf_counter()
        if self._stream is not None:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(self._stream)

    def seconds(self, timeout_s: float) -> float:
        if self._stream is None:
            return time.perf_counter() - self._host
        end = torch.cuda.Event(enable_timing=True)
        end.record(self._stream)
        _wait(end, timeout_s, "the construction probe's calls")
        return float(self._start.elapsed_time(end)) / 1e3


def all_reduce_max(res: Resources, t: torch.Tensor, timeout_s: float) -> None:
    """``t`` = its elementwise maximum over every rank (the world communicator)."""
    if not res.is_cuda:
        res.transport.all_reduce_on("world", t, "max")
        return
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
