"""The construction probe: how fast the stages are here, for plan/slicing.choose.

Collective: every rank of a CUDA communicator runs it once, at construction, after the
stage communicators exist. It times, on the flat stream, one reduce-scatter plus one
all-gather inside the machine of ``PROBE_BYTES`` and the rail all-reduce of this
rank's chunk of them (what one slice of a call that size does), after a warm-up round
that also opens the connections; each stage starts right after a tiny all-reduce over
every rank, so no rank counts a peer's lateness as its stage's time. Every rank then
takes the largest intra-machine share over the world (an all-reduce MAX), so all
decide alike. The host waits for the device here, at construction, never on a call.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from ringreduce.config import Config
from ringreduce.errors import RingReduceError
from ringreduce.plan import slicing
from ringreduce.plan.topology import Topology

if TYPE_CHECKING:
    from ringreduce.execution.resources import Resources

PROBE_BYTES = 16 << 20
"""What the probe moves through the machine: large enough that the stages' bandwidth,
not their latency, decides (a DDP bucket is 25 MiB), small enough to take a few
milliseconds on NVLink and ~10 ms on a 10 Gbit/s rail at two machines."""
ROUNDS = 3
"""Timed rounds; the fastest counts (the least disturbed)."""


def choose_plan(res: Resources, config: Config) -> slicing.Choice:
    """The plan of ``res``'s hierarchical calls: the user's, else the probe's (CUDA),
    else the pipeline (gloo)."""
    topo = res.topo
    if topo.machines == 1:
        return slicing.ONE_MACHINE
    if config.plan is not None:
        return slicing.given(config.plan)
    if not res.is_cuda:
        return slicing.CPU_DEFAULT
    if topo.devices_per_machine == 1:
        return slicing.ONE_DEVICE
    intra_s, rail_s = _timed(res, topo, config.timeout_s)
    return slicing.choose_share(_agreed_share(res, intra_s, rail_s, config.timeout_s))


def _timed(res: Resources, topo: Topology, timeout_s: float) -> tuple[float, float]:
    """(intra-machine seconds, rail seconds) of one round on this rank, the fastest of
    ROUNDS. Each stage is timed right after a one-element all-reduce over every rank,
    which ends on all of them at about the same moment: otherwise a rank would count
    as its own stage's time the wait for a peer still busy on its rail (rails finish
    at different times, and first calls connect)."""
    devices, transport = topo.devices_per_machine, res.transport
    k = PROBE_BYTES // 4 // devices
    body = torch.zeros(devices * k, dtype=torch.float32, device=res.device)
    chunk = body.view(devices, k)[topo.device_index]
    one = torch.zeros(1, dtype=torch.float32, device=res.device)
    stream = res.sync.streams["flat"]
    handle = stream.cuda_stream

    def intra() -> None:
        transport.reduce_scatter_into("reduce_scatter", body, chunk, "sum", handle)
        transport.all_gather_into("all_gather", chunk, body, handle)

    def rail() -> None:
        transport.all_reduce_on("collect", chunk, "sum", handle)

    def line_up() -> None:
        transport.all_reduce_on("world", one, "sum", handle)

    stream.wait_stream(torch.cuda.current_stream(res.device))  # the zeros are written
    rounds = []
    with torch.cuda.stream(stream):
        intra()
        rail()  # warm-up: first calls connect to their peers
        for _ in range(ROUNDS):
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            for stage, (start, end) in ((intra, marks[:2]), (rail, marks[2:])):
                line_up()
                start.record(stream)
                stage()
                end.record(stream)
            rounds.append(marks)
    _wait(rounds[-1][3], timeout_s, "the construction probe's stage timings")
    return (min(m[0].elapsed_time(m[1]) for m in rounds) / 1e3,
            min(m[2].elapsed_time(m[3]) for m in rounds) / 1e3)


def _agreed_share(res: Resources, intra_s: float, rail_s: float, timeout_s: float) -> float:
    """The largest intra-machine share over every rank."""
    share = torch.tensor([intra_s / max(intra_s + rail_s, 1e-12)], dtype=torch.float32,
                         device=res.device)
    stream = res.sync.streams["flat"]
    stream.wait_stream(torch.cuda.current_stream(res.device))
    with torch.cuda.stream(stream):
        res.transport.all_reduce_on("world", share, "max", stream.cuda_stream)
    done = torch.cuda.Event()
    done.record(stream)
    _wait(done, timeout_s, "the construction probe's agreement")
    return float(share.item())


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
