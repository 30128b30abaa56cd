"""The construction probe: which plan is faster here, for plan/slicing.choose.

Collective: every rank of a CUDA communicator runs it once, at the end of its
construction, when the plan is not given and a call can take either plan (M > 1, D > 1).
It makes int32 all-reduces of ``slicing.PROBE_BYTES`` through the communicator itself:
``PROBE_WARMUP`` on each plan (connections, the native issuer's trace), then
``PROBE_PASSES`` passes that time each plan in turn, ``PROBE_ROUNDS`` synchronous calls
between two events on the caller's stream, each plan's fastest pass counting (the
probe's shape is plan/slicing.py's, which the model prices). So each plan is timed as a
call runs: the device's work, or the host's where issuing takes longer than the device
needs; and neither pays alone for what is still warming up when the probe starts.
Every rank then takes the slowest rank's time of each plan (an all-reduce MAX), so all
decide alike. The host waits for the device here, at
construction, never on a call. The probe's calls are numbered and recorded like the
user's, before them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ringreduce.config import Config
from ringreduce.errors import RingReduceError
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
    """Time both plans through ``all_reduce`` (the communicator's, synchronous) and
    return the faster, agreed over every rank. Leaves ``res.plan`` set to it. A call
    of ``min_bytes`` at least (smaller ones take the flat route)."""
    unprobed = slicing.unprobed(config.min_bytes)
    if unprobed is not None:
        res.plan = unprobed
        return res.plan
    nbytes = slicing.probe_bytes(config.min_bytes)
    timeout_s = config.timeout_s
    # int32, not float32: a communicator's wire (bf16's pipeline, int8's compressed
    # route) takes float32 calls whatever the plan, so they would time the wire's route
    # on both plans; every other dtype takes the plan, and int32 moves float32's bytes.
    t = torch.zeros(-(-nbytes // 4), dtype=torch.int32, device=res.device)
    plans = [slicing.Choice(plan, "the construction probe") for plan in slicing.PLANS]
    for choice in plans:
        res.plan = choice
        for _ in range(slicing.PROBE_WARMUP):
            all_reduce(t)
    seconds = [float("inf")] * len(plans)
    for _ in range(slicing.PROBE_PASSES):
        for i, choice in enumerate(plans):
            res.plan = choice
            seconds[i] = min(seconds[i], _timed(lambda: all_reduce(t), res, timeout_s))
    agreed = torch.tensor(seconds, dtype=torch.float64, device=res.device)
    all_reduce_max(res, agreed, timeout_s)
    one, piped = agreed.tolist()
    res.plan = slicing.choose(one, piped, t.numel() * 4)
    return res.plan


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
