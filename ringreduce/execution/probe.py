"""The construction probe: how fast the stages are here, for plan/slicing.choose.

Collective: every rank of a CUDA communicator runs it once, at construction, after the
stage communicators exist. It times, on the flat stream, one reduce-scatter plus one
all-gather inside the machine of ``PROBE_BYTES`` and the rail all-reduce of this
rank's chunk of them (what one slice of a call that size does), after a warm-up round
that also opens the connections. Every rank then takes the largest intra-machine share
over the world (an all-reduce MAX), so all decide alike. The host waits for the
device here, at construction, never on a call.
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
    """(intra-machine seconds, rail seconds) per round on this rank."""
    devices, transport = topo.devices_per_machine, res.transport
    k = PROBE_BYTES // 4 // devices
    body = torch.zeros(devices * k, dtype=torch.float32, device=res.device)
    chunk = body.view(devices, k)[topo.device_index]
    stream = res.sync.streams["flat"]
    handle = stream.cuda_stream

    def intra() -> None:
        transport.reduce_scatter_into("reduce_scatter", body, chunk, "sum", handle)
        transport.all_gather_into("all_gather", chunk, body, handle)

    def rail() -> None:
        transport.all_reduce_on("collect", chunk, "sum", handle)

    marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    stream.wait_stream(torch.cuda.current_stream(res.device))  # the zeros are written
    with torch.cuda.stream(stream):
        intra()
        rail()  # warm-up: first calls connect to their peers
        marks[0].record(stream)
        for _ in range(ROUNDS):
            intra()
        marks[1].record(stream)
        for _ in range(ROUNDS):
            rail()
        marks[2].record(stream)
    _wait(marks[2], timeout_s, "the construction probe's stage timings")
    return (marks[0].elapsed_time(marks[1]) / 1e3 / ROUNDS,
            marks[1].elapsed_time(marks[2]) / 1e3 / ROUNDS)


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
