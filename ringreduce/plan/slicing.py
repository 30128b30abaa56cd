"""Whether a hierarchical all-reduce is sliced: one slice or the pipeline. Pure: no torch.

One slice issues the whole tensor as three collectives, one after the other: a
reduce-scatter inside the machine, an all-reduce along the rail, an all-gather inside
the machine (the two-level composition). Its time is the sum of the three. The
pipeline cuts the tensor into slices and overlaps the stages of different slices, so
its time approaches the slowest stage's, but every slice costs host time (an NCCL
group per wave, events per stage) and a fill and drain.

So slicing pays only where the intra-machine stages take time comparable to the
rail's and the host issues slices faster than the device runs them: one GPU shared
by virtual machines, PCIe-only machines, slow networks. On NVLink machines joined by
a network the two intra-machine stages are a few percent of the rail's time; over a
fast link the pipeline's host time is the call's time. Both favour one slice.

``choose`` decides from what the construction probe measured (execution/probe.py):
the time of one call of the probe's size on each plan, as a call runs. One slice wins
ties within ``ONE_SLICE_MARGIN``: it costs a fraction of the pipeline's host time and
CPU, which the probe's device-side clock does not see when the device is the slower.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

ONE_SLICE = "one-slice"
PIPELINED = "pipelined"
PLANS = (ONE_SLICE, PIPELINED)
"""Config.plan's values (config.py names them too: it sits below this package)."""

ONE_SLICE_MARGIN = 0.05
"""One slice is chosen unless the pipeline was faster by more than this fraction."""

PROBE_BYTES = 16 << 20
"""One probe call: large enough that bandwidth, not latency, decides (a DDP bucket is
25 MiB), small enough that the probe takes well under a second at 10 Gbit/s. Its
shape is here, not in execution/probe.py, so the model (ringreduce/model/) can price
the probe without torch."""
LARGEST_PROBE_BYTES = 256 << 20
"""Above this ``min_bytes`` the probe is not run (the pipeline is taken)."""
PROBE_WARMUP = 2
"""Untimed calls per plan before any timed one (connections, the native issuer's trace)."""
PROBE_ROUNDS = 3
"""Timed calls per plan and pass."""
PROBE_PASSES = 2
"""The plans are timed in turn, this many passes each, and each plan's fastest pass
counts, so that neither pays alone for what warms up or disturbs the link while the
probe runs. (It did not change a decision where it was measured: results
2026-11-27-h100x2-replay-default, runs 4 and 5.)"""


@dataclass(frozen=True)
class Choice:
    """The plan every hierarchical call of a communicator takes, and why."""

    plan: str
    reason: str

    @property
    def one_slice(self) -> bool:
        return self.plan == ONE_SLICE

    @functools.cached_property
    def why(self) -> str:
        """One line for flight records and logs (made once: every call records it)."""
        return f"plan={self.plan}: {self.reason}"


def choose(one_slice_s: float, pipelined_s: float, nbytes: int) -> Choice:
    """The plan from the probe's seconds per call of ``nbytes`` on each plan (the
    slowest rank's: every rank must decide alike)."""
    if one_slice_s <= 0 or pipelined_s <= 0:
        raise ValueError(f"probe times must be positive, got one_slice_s={one_slice_s!r}, "
                         f"pipelined_s={pipelined_s!r}")
    measured = (f"a {nbytes >> 20} MiB call took {one_slice_s * 1e3:.2f} ms on one slice, "
                f"{pipelined_s * 1e3:.2f} ms pipelined in the construction probe")
    if pipelined_s * (1 + ONE_SLICE_MARGIN) < one_slice_s:
        return Choice(PIPELINED, f"{measured}: the pipeline is faster by more than "
                                 f"{ONE_SLICE_MARGIN:.0%}")
    return Choice(ONE_SLICE, f"{measured}: one slice is as fast (within "
                             f"{ONE_SLICE_MARGIN:.0%}) and costs less host time")


def probe_bytes(min_bytes: int) -> int:
    """The probe's call: ``PROBE_BYTES``, or ``min_bytes`` where larger (smaller calls take
    the flat route, which the probe would not time)."""
    return max(PROBE_BYTES, min_bytes)


def unprobed(min_bytes: int) -> Choice | None:
    """The pipeline where the probe's call would be above ``LARGEST_PROBE_BYTES``; else None."""
    if probe_bytes(min_bytes) <= LARGEST_PROBE_BYTES:
        return None
    return Choice(PIPELINED, f"min_bytes={min_bytes} is above the probe's largest call "
                             f"({LARGEST_PROBE_BYTES} bytes)")


def given(plan: str) -> Choice:
    """The plan set by the user (Config.plan)."""
    return Choice(plan, "set by plan= (RINGREDUCE_PLAN)")


UNDECIDED = Choice(PIPELINED, "not probed yet (the probe runs at the end of construction)")
ONE_MACHINE = Choice(ONE_SLICE, "one machine: every call takes the flat route")
ONE_DEVICE = Choice(ONE_SLICE, "one device per machine: the rail all-reduce is the whole call")
CPU_DEFAULT = Choice(PIPELINED, "gloo: inside a machine as slow as the network, so the "
                                "stages overlap usefully; plan='one-slice' takes one slice")
