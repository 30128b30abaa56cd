"""Pure schedule: which stream runs what, which events it waits on and records.

No torch, no CUDA. The engine walks the steps in order on the host; each step runs
on the stream named after its stage. Events are named after the edge they guard
(``rs_to_collect``) or the slot they free (``staging_free[3]``).

One event per edge is enough: the host issues slices in order, so every wait on
``rs_to_collect`` is enqueued right after the record it must see, before the next
slice records it again. Slots are different: slice i+S reuses the staging slot of
slice i, so each slot has its own "free" event.

Every call starts at staging slot 0 and padding slot 0, so its steps depend only on
its own plan, never on the calls before it: one kind of call (size, dtype, op) has one
program for the native issuer to trace and replay. While slots rotated across calls,
a kind of call needed a program per rotation position (up to 64 x 16 of them, each
traced by a ~3 ms Python walk), so DDP's buckets were traced anew for the first ~8
steps and a model with a few hundred bucket sizes could outgrow the program cache
and trace every call. Starting at slot 0 costs little overlap: the next call's slice i
waits for the ``add`` that last read slot i, which ends long before the rail stream
reaches the next call (no loss measured).

Steps are issued in *waves* (``waves``): wave w holds the stages that can go together,
e.g. all_gather of slice w-3 ... reduce_scatter of slice w, and their NCCL operations
go out as one NCCL group (one ncclGroupEnd for up to four communicators instead of
one per stage: the group calls were three quarters of a native call's host time). A
wave enqueues its grouped steps' waits, then the group, then their records, and then
its ``add`` steps (a kernel of ours, nothing of NCCL), each wait, kernel and records
in turn. So a grouped step may only wait on events recorded in an *earlier* wave,
while an add may follow its slice's collect in the same wave: one wave, so one NCCL
group, fewer per call (slices + 3 instead of slices + 4; ~30 us of host time each).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from ringreduce.plan import layout

#: The stages, in pipeline order. Streams, communicators and events take their names.
STAGES = ("reduce_scatter", "collect", "add", "diffuse", "all_gather")

#: Short names used in edge events, e.g. "rs_to_collect".
SHORT = {"reduce_scatter": "rs", "collect": "collect", "add": "add",
         "diffuse": "diffuse", "all_gather": "ag"}

ENTRY = "entry"
"""Recorded on the caller's stream when a call starts."""

DONE = "done"
"""Recorded after the last stage of the last slice; the caller's stream waits on it."""


AFTER_GROUP = "add"
"""The stage a wave issues after its NCCL group (see above)."""


def active_stages(devices: int) -> tuple[str, ...]:
    """With one device per machine there is nothing to reduce-scatter or gather."""
    return STAGES if devices > 1 else ("collect", "add", "diffuse")


def edge(src: str, dst: str) -> str:
    return f"{SHORT[src]}_to_{SHORT[dst]}"


def staging_free(slot: int) -> str:
    return f"staging_free[{slot}]"


def padding_free(slot: int) -> str:
    return f"padding_free[{slot}]"


def tail(stage: str) -> str:
    """Recorded after a call's last work on ``stage``; the next call's first work there
    waits on it. Streams order eager calls by themselves; a replayed graph runs on a
    stream of its own and needs the edge (CudaStreams keeps these to captures)."""
    return f"tail[{SHORT[stage]}]"


def crosses_calls(name: str) -> bool:
    """Events one call records for a later call: slot releases and stage tails (a
    captured graph records and waits on them as external event nodes)."""
    return name.startswith(("staging_free", "padding_free", "tail"))


@dataclass(frozen=True)
class Step:
    """Issue ``stage`` of slice ``slice_index`` on the stage's stream."""

    slice_index: int
    stage: str
    waits: tuple[str, ...]
    records: tuple[str, ...]
    staging_slot: int
    padding_slot: int | None
    """Set on the slice that has a tail: copy in before the first stage, copy back
    after the last."""


def plan_steps(n_slices: int, tail_on_last: bool, devices: int, staging_slots: int,
               slot_reader: str = "add") -> tuple[Step, ...]:
    """Steps of one call, slice-major: slice i in staging slot i mod ``staging_slots``,
    a tail in padding slot 0 (module docstring: every call starts there).

    ``slot_reader`` is the last stage that uses a slice's staging slot: ``add``, or
    ``diffuse`` when a 16-bit wire format also stages the diffused rows there."""
    stages = active_stages(devices)
    steps: list[Step] = []
    for i in range(n_slices):
        last = i == n_slices - 1
        pad = 0 if (tail_on_last and last) else None
        for position, stage in enumerate(stages):
            steps.append(_step(i, stage, stages, position, i % staging_slots, pad, last,
                               slot_reader))
    return tuple(steps)


def _step(i: int, stage: str, stages: tuple[str, ...], position: int, staging: int,
          pad: int | None, last_slice: bool, slot_reader: str) -> Step:
    waits: list[str] = []
    records: list[str] = []
    if position == 0:
        if i == 0:
            waits.append(ENTRY)
        if pad is not None:
            waits.append(padding_free(pad))
    else:
        waits.append(edge(stages[position - 1], stage))
    if stage == "collect":
        waits.append(staging_free(staging))  # collect is the first writer of the slot
    if i == 0:
        # After the previous call's last work on this stage. Last: in a capture, a
        # stream joins it through an earlier wait, and only then takes external ones.
        waits.append(tail(stage))
    if stage == slot_reader:
        records.append(staging_free(staging))  # the last reader of the slot
    if last_slice:
        records.append(tail(stage))
    if position + 1 < len(stages):
        records.append(edge(stage, stages[position + 1]))
    else:
        if pad is not None:
            records.append(padding_free(pad))
        if last_slice:
            records.append(DONE)
    return Step(i, stage, tuple(waits), tuple(records), staging, pad)


def event_names(devices: int, staging_slots: int, padding_slots: int) -> tuple[str, ...]:
    """Every event a communicator needs, created once."""
    stages = active_stages(devices)
    names = [ENTRY, DONE]
    names += [edge(a, b) for a, b in itertools.pairwise(stages)]
    names += [staging_free(s) for s in range(staging_slots)]
    names += [padding_free(p) for p in range(padding_slots)]
    names += [tail(stage) for stage in stages]
    return tuple(names)


Wave = tuple[Step, ...]


def waves(steps: tuple[Step, ...]) -> tuple[Wave, ...]:
    """The steps (slice-major, as plan_steps makes them) as waves.

    Slice-major order is a valid issue order, so it defines what each wait must see:
    the latest record of that event before it. A wave issues in two phases (module
    docstring): 0, the grouped steps' waits, their group and their records; 1, the
    add steps one after another. A step goes into the earliest wave where (1) it
    follows the records it waits on and (2) its stream's previous step (a grouped step:
    in a later wave; an add: the same wave will do, phase 1 comes after both phases),
    and (3) its records come after every wait that must still see the record they
    replace. Within a wave steps keep slice-major order, so a stream's work and the
    host's NCCL calls keep one order on every rank."""
    wave_of: list[int] = []
    recorded: dict[str, int] = {}                 # event -> wave of its latest record
    waiters: dict[str, tuple[int, int]] = {}      # event -> latest (wave, phase) waiting on it
    on_stream: dict[str, int] = {}                # stage -> wave of its latest step
    for step in steps:
        late = step.stage == AFTER_GROUP  # phase 1: sees its own wave's earlier records
        gap = 0 if late else 1
        # A grouped step records in phase 0, so after a phase-1 wait of its wave only in
        # the next wave; an add records after every wait of its wave.
        w = max([recorded[e] + gap for e in step.waits if e in recorded]
                + [on_stream[step.stage] + gap if step.stage in on_stream else 0]
                + [wave + (1 if phase == 1 and not late else 0) for wave, phase in
                   (waiters[e] for e in step.records if e in waiters)])
        for e in step.waits:
            waiters[e] = max(waiters.get(e, (0, 0)), (w, int(late)))
        for e in step.records:
            recorded[e] = w
            waiters.pop(e, None)
        on_stream[step.stage] = w
        wave_of.append(w)
    out: list[list[Step]] = [[] for _ in range(max(wave_of, default=-1) + 1)]
    for step, w in zip(steps, wave_of, strict=True):
        out[w].append(step)
    return tuple(tuple(wave) for wave in out if wave)


@functools.lru_cache(maxsize=1024)
def plan_waves(numel: int, itemsize: int, devices: int, machines: int, slice_bytes: int,
               staging_slots: int, slot_reader: str,
               ) -> tuple[tuple[layout.SlicePlan, ...], tuple[Wave, ...]]:
    """plan_call with its steps as waves (memoised the same way)."""
    plans, steps = plan_call(numel, itemsize, devices, machines, slice_bytes, staging_slots,
                             slot_reader)
    return plans, waves(steps)


@functools.lru_cache(maxsize=1024)
def plan_call(numel: int, itemsize: int, devices: int, machines: int, slice_bytes: int,
              staging_slots: int, slot_reader: str,
              ) -> tuple[tuple[layout.SlicePlan, ...], tuple[Step, ...]]:
    """A call's slices and steps. Pure and immutable, so memoised: planning a 25 MiB
    call costs 60-90 us of Python (2 x 1 and 2 x 2, on a 2-core CI-class CPU), a cache
    hit 0.4 us, and training repeats the same sizes."""
    plans = layout.plan_slices(numel, itemsize, devices, machines, slice_bytes)
    steps = plan_steps(len(plans), plans[-1].tail > 0, devices, staging_slots, slot_reader)
    return plans, steps
