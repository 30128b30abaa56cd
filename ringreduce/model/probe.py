"""The plan the engine would take on a cluster: its construction probe, priced.

On CUDA the engine times a call on each plan at construction (execution/probe.py) and
takes the fastest route (``slicing.choose``). Here the same rule decides on the model's
times of the 16 MiB call on the two hierarchical plans, with ``MODEL_MARGIN`` (the
model prices neither NCCL's flat route nor the 4 MiB probe here)::

    one, piped = probe_us(c, plan) for plan in (one slice, pipelined)
    choice = slicing.choose([Timing(probe_bytes(min_bytes), {ONE_SLICE: (one,),
                                                              PIPELINED: (piped,)})],
                            MODEL_MARGIN)

``probe_us`` is what the probe's clock sees: from the device end of its
``PROBE_WARMUP`` calls to the end of its ``PROBE_ROUNDS`` timed ones, per timed call,
queued back to back (asynchronous, each on its own tensor: the host never waits between
them). Without a probe, as the engine:
one machine (the flat route), a plan given (``--plan``), one GPU a machine (the rail's
all-reduce is the call); and a 16-bit wire, which sends float32 through the pipeline
whatever the probe chose (execution/issue.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..plan import slicing
from ..plan.slicing import ONE_SLICE, PIPELINED, PLANS, Choice
from .cluster import Cluster
from .simulate import Options, steady_time_us

AUTO = "auto"
"""``--plan``'s default: the plan the engine's probe would take."""
CHOICES = (AUTO, *PLANS)

MODEL_MARGIN = slicing.MAX_MARGIN
"""The model's times have no spread, and a prediction is no surer than the noisiest
probe: where the plans are within the largest margin, the one with fewer collectives."""

WIRE = Choice(PIPELINED, "float32 calls cross the 16-bit wire on the pipeline, whatever "
                         "the probe chose (execution/issue.py)")


@dataclass(frozen=True)
class Planned:
    """The plan a cluster's hierarchical calls take, why, and a few characters of why
    for a table row (``brief``: the probe's two times where ``probed``)."""

    choice: Choice
    brief: str
    probed: bool = False

    @property
    def plan(self) -> str:
        return self.choice.plan

    def options(self, o: Options) -> Options:
        """``o`` priced on this plan (a 16-bit wire only ever on the pipeline)."""
        plan = PIPELINED if o.wire_factor != 1.0 else self.choice.plan
        return dataclasses.replace(o, plan=plan)


def probe_us(c: Cluster, o: Options, nbytes: int) -> float:
    """Microseconds per timed call of the probe on ``o.plan``: its timed calls' window,
    after the warm-up calls, over the calls in it."""
    warm, rounds = slicing.PROBE_WARMUP, slicing.PROBE_ROUNDS
    first, last = (n * steady_time_us(nbytes, c, o, 1, n) for n in (warm, warm + rounds))
    return (last - first) / rounds


def engine_plan(c: Cluster, o: Options, plan: str = AUTO) -> Planned:
    """The plan of ``c``'s hierarchical calls: ``plan`` where given, else the probe's."""
    if plan not in CHOICES:
        raise ValueError(f"plan={plan!r} is not one of {CHOICES}")
    if c.machines == 1:
        return Planned(slicing.ONE_MACHINE, "1 machine")
    if o.wire_factor != 1.0:
        return Planned(WIRE, "16-bit wire")
    if plan != AUTO:
        return Planned(Choice(plan, "set by --plan (the engine's plan=, RINGREDUCE_PLAN)"),
                       "--plan")
    if c.gpus == 1:
        return Planned(slicing.ONE_DEVICE, "1 GPU/machine")
    unprobed = slicing.unprobed(o.min_bytes)
    if unprobed is not None:
        return Planned(unprobed, "min_bytes")
    nbytes = slicing.probe_bytes(o.min_bytes)
    one, piped = (probe_us(c, dataclasses.replace(o, plan=p), nbytes)
                  for p in (ONE_SLICE, PIPELINED))
    choice = slicing.choose([slicing.Timing(nbytes, {ONE_SLICE: (one / 1e6,),
                                                     PIPELINED: (piped / 1e6,)})],
                            MODEL_MARGIN)
    return Planned(Choice(choice.plan, f"predicted: {choice.reason}"),
                   f"{one / 1e3:.2f}/{piped / 1e3:.2f}", probed=True)
