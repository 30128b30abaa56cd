"""Whether a hierarchical all-reduce is sliced: one slice or the pipeline. Pure: no torch.

One slice issues the whole tensor as three collectives, one after the other: a
reduce-scatter inside the machine, an all-reduce along the rail, an all-gather inside
the machine (the two-level composition). Its time is the sum of the three. The
pipeline cuts the tensor into slices and overlaps the stages of different slices, so
its time approaches the slowest stage's, but every slice costs host time (an NCCL
group per wave, events per stage) and a fill and drain.

So slicing pays only where the intra-machine stages take time comparable to the
rail's: one GPU shared by virtual machines, PCIe-only machines. On NVLink machines
joined by a network the two intra-machine stages are a few percent of the rail's
time, the composition reaches the pipeline's wire time (the references issue
measured both at the link bound), and the pipeline's host time buys nothing.

``choose`` decides from what a probe measured when the communicator was built:
``intra_s``, one reduce-scatter plus one all-gather inside the machine, and
``rail_s``, the rail all-reduce of the same call's chunk. If the intra-machine share
of an unpipelined call is at most ``ONE_SLICE_SHARE``, perfect overlap could save at
most that share, about what the pipeline's fill, drain and per-slice overheads cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringreduce.config import PLANS

ONE_SLICE, PIPELINED = PLANS

ONE_SLICE_SHARE = 0.10
"""The largest intra-machine share of an unpipelined call for which one slice is chosen."""


@dataclass(frozen=True)
class Choice:
    """The plan every hierarchical call of a communicator takes, and why."""

    plan: str
    reason: str

    @property
    def one_slice(self) -> bool:
        return self.plan == ONE_SLICE

    @property
    def why(self) -> str:
        """One line for flight records and logs."""
        return f"plan={self.plan}: {self.reason}"


def choose(intra_s: float, rail_s: float) -> Choice:
    """The plan from the probe's times (seconds, the slowest rank's share: every rank
    must decide alike, so the caller agrees on the share before calling this)."""
    if intra_s < 0 or rail_s <= 0:
        raise ValueError(f"probe times must be positive, got intra_s={intra_s!r}, "
                         f"rail_s={rail_s!r}")
    return choose_share(intra_s / (intra_s + rail_s))


def choose_share(share: float) -> Choice:
    """The plan from the intra-machine share of one unpipelined call (0..1)."""
    measured = (f"the intra-machine stages took {share:.1%} of an unpipelined call "
                f"in the construction probe")
    if share <= ONE_SLICE_SHARE:
        return Choice(ONE_SLICE, f"{measured} (<= {ONE_SLICE_SHARE:.0%}: pipelining could "
                                 "save at most that)")
    return Choice(PIPELINED, f"{measured} (> {ONE_SLICE_SHARE:.0%}: overlapping the stages "
                             "pays)")


def given(plan: str) -> Choice:
    """The plan set by the user (Config.plan)."""
    return Choice(plan, "set by plan= (RINGREDUCE_PLAN)")


ONE_MACHINE = Choice(ONE_SLICE, "one machine: every call takes the flat route")
ONE_DEVICE = Choice(ONE_SLICE, "one device per machine: the rail all-reduce is the whole call")
CPU_DEFAULT = Choice(PIPELINED, "gloo: inside a machine as slow as the network, so the "
                                "stages overlap usefully; plan='one-slice' takes one slice")
