"""Executes a call's steps: stage operations on their streams, linked by events.

The same walk runs on CUDA and on the CPU. On CUDA each stage has its own stream and
the steps only *enqueue* work: the host never waits for the device. On the CPU the
host thread is the order, so waits and records are no-ops and each stage runs to
completion before the next.

Timeline of the five streams for a tensor of three slices, D > 1 (time ->):

  reduce_scatter  [rs 0][rs 1][rs 2]
  collect               [coll 0][coll 1][coll 2]
  add                           [a0]    [a1]    [a2]
  diffuse                           [diff 0][diff 1][diff 2]
  all_gather                                [ag 0]  [ag 1]  [ag 2] -> done
                 ^ entry (caller's stream)                          caller waits

Edges ``rs_to_collect`` ... ``diffuse_to_ag`` order one slice's stages. Slot
events protect memory reused by later slices: ``collect`` of slice i+S waits on
``staging_free[i % S]``, recorded after ``add`` of slice i read the slot; the tail's
padding slot is reused only after ``all_gather`` copied it back (``padding_free``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ringreduce.errors import RingReduceError
from ringreduce.execution.add import add, add_wire, finish_average
from ringreduce.execution.transport import Part
from ringreduce.plan import schedule
from ringreduce.plan.layout import SlicePlan
from ringreduce.plan.schedule import DONE, ENTRY, Step
from ringreduce.plan.topology import Topology
from ringreduce.safety.flight import FlightRecorder

stamp = FlightRecorder.stamp

FLAT = "flat"
"""Stream of the flat all-reduce fast path."""
_NO_STREAM = contextlib.nullcontext()


REPLAY_STREAMS = ("replay0", "replay1")
"""Replays alternate between these, so a replay can start while the previous one
finishes (consecutive launches on one stream would run one after the other)."""


class CudaStreams:
    """One stream per stage (and for the flat path and replays), and every named event.

    While a call is captured into a CUDA graph it records fresh events instead of the
    named ones and waits on those: CUDA refuses a captured wait on work recorded
    outside the capture (cudaErrorStreamCaptureIsolation), and an event recorded inside
    a capture cannot be waited on outside it (cudaErrorInvalidValue).

    What crosses calls (slot releases, stage tails: ``schedule.crosses_calls``) is
    handled two ways. In ringreduce's own captures (graphs.py) those waits and records
    become *external* event nodes on the named events, which a replay honours exactly
    as a stream honours an event: a wait sees the last record launched before it
    (benchmarks/graph_events.py checks this). So replays overlap one another the way
    eager calls do, slice by slice. In a caller's capture they are skipped, and the
    caller's stream orders the replay where the calls were issued, as before.

    Eager calls leave the stage tails alone (each stage's stream orders them). So a
    replay after an eager call first waits for its ``done``, and an eager call after
    a replay waits for the replay's ``done``."""

    def __init__(self, device: torch.device, event_names: Sequence[str]) -> None:
        # High priority: communication kernels should not queue behind compute.
        self.streams = {s: torch.cuda.Stream(device, priority=-1)
                        for s in (*schedule.STAGES, FLAT, *REPLAY_STREAMS)}
        self.events = {name: torch.cuda.Event() for name in event_names}
        self._crossing = frozenset(n for n in event_names if schedule.crosses_calls(n))
        self._tails = frozenset(n for n in self._crossing if n.startswith("tail"))
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        for event in self.events.values():  # create them: external nodes need handles
            event.record(self.streams[FLAT])
        self._after_replay = False
        self._replays = 0
        self._captured: dict[str, torch.cuda.Event] | None = None
        """Events of the capture under way, by name; None when not capturing."""
        self._external = False
        """The capture under way is ours: crossing events become external nodes."""

    def handle(self, stage: str) -> int:
        return self.streams[stage].cuda_stream

    def caller(self) -> torch.cuda.Stream:
        """The caller's current stream on our device. Naming the device skips torch's
        lookup of the current one (an availability check that reads os.environ), about
        a quarter of a replayed call's Python time."""
        return torch.cuda.current_stream(self._index)

    def wait(self, stage: str, names: Sequence[str]) -> None:
        stream = self.streams[stage]
        for name in names:
            if self._captured is None:
                if name not in self._tails:
                    stream.wait_event(self.events[name])
                continue
            event = self._captured.get(name)
            if event is not None:
                stream.wait_event(event)
            elif self._external and name in self._crossing:
                external_wait(stream, self.events[name])

    def record(self, stage: str, names: Sequence[str]) -> None:
        stream = self.streams[stage]
        for name in names:
            if self._captured is None:
                if name not in self._tails:
                    self.events[name].record(stream)
                continue
            event = self._captured.get(name)  # re-recorded per slice: one event per name
            if event is None:
                event = self._captured[name] = torch.cuda.Event()
            event.record(stream)
            if self._external and name in self._crossing:
                external_record(self.events[name], stream)

    def _recorded(self, name: str) -> torch.cuda.Event | None:
        return self.events[name] if self._captured is None else self._captured.get(name)

    def _to_record(self, name: str) -> torch.cuda.Event:
        if self._captured is None:
            return self.events[name]
        event = self._captured.get(name)
        if event is None:
            event = self._captured[name] = torch.cuda.Event()
        return event

    @contextlib.contextmanager
    def capturing(self, external: bool = False) -> Iterator[None]:
        """Around issuing one call into a CUDA graph capture; ``external`` for
        ringreduce's own captures (graphs.py), whose replays this class launches."""
        self._captured, self._external = {}, external
        try:
            yield
        finally:
            self._captured, self._external = None, False

    def on(self, stage: str) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self.streams[stage])

    def join_replay(self, stream: torch.cuda.Stream) -> None:
        """Before eager work that uses the stage communicators: wait for the last
        replay's end (eager calls do not wait on the stage tails)."""
        if self._after_replay and self._captured is None:
            stream.wait_event(self.events[DONE])
            self._after_replay = False

    def enter(self) -> None:
        caller = self.caller()
        self.join_replay(caller)
        self._to_record(ENTRY).record(caller)

    def replay(self, graph: torch.cuda.CUDAGraph) -> str:
        """Launch a captured call after the caller's stream's work so far, on the
        replay stream not used last. Its external waits order it after the previous
        replay slice by slice; after an eager call it waits for that call's ``done``.
        Its end becomes the new ``done``. Returns the replay stream's name."""
        name = REPLAY_STREAMS[self._replays % len(REPLAY_STREAMS)]
        self._replays += 1
        stream = self.streams[name]
        stream.wait_stream(self.caller())
        if not self._after_replay:
            stream.wait_event(self.events[DONE])
        with torch.cuda.stream(stream):
            graph.replay()
        self.events[DONE].record(stream)
        self._after_replay = True
        return name

    def leave(self) -> None:
        event = self._recorded(DONE)
        assert event is not None, "leave() before the call's last stage recorded done"
        self.caller().wait_event(event)

    @staticmethod
    def copy(stage: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        """A tail copy on ``stage``'s stream, which the caller made current."""
        dst.copy_(src)

    def adopt(self, t: torch.Tensor, stages: Sequence[str]) -> None:
        """Tell the caching allocator that our streams use ``t`` (async calls)."""
        for s in stages:
            t.record_stream(self.streams[s])

    def synchronize(self) -> None:
        for s in self.streams.values():
            s.synchronize()


class HostOrder:
    """The CPU counterpart of CudaStreams: program order is the only order."""

    def handle(self, stage: str) -> None:
        return None

    def wait(self, stage: str, names: Sequence[str]) -> None:
        pass

    def record(self, stage: str, names: Sequence[str]) -> None:
        pass

    def on(self, stage: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def enter(self) -> None:
        pass

    def leave(self) -> None:
        pass

    @staticmethod
    def copy(stage: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def adopt(self, t: torch.Tensor, stages: Sequence[str]) -> None:
        pass

    def synchronize(self) -> None:
        pass


class Buffers:
    """Staging and padding memory, allocated once as bytes and viewed per dtype."""

    def __init__(self, topo: Topology, slot_bytes: int, staging_slots: int,
                 padding_slots: int, device: torch.device) -> None:
        self.topo = topo
        self.slot_bytes = slot_bytes
        self.staging_bytes = torch.empty(staging_slots * slot_bytes, dtype=torch.uint8,
                                         device=device)
        # A padding slot holds the (D, M, 1) view plus its M-1 collect rows; 8 bytes
        # an element fits every dtype, and 16-byte strides keep views aligned.
        group, rows = topo.devices_per_machine * topo.machines, topo.machines - 1
        self.pad_stride = -(-(group + rows) * 8 // 16) * 16
        self.padding_bytes = torch.empty(padding_slots * self.pad_stride, dtype=torch.uint8,
                                         device=device)

    def staging(self, slot: int, dtype: torch.dtype, k: int,
                wire: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(received rows, rows to send). With a 16-bit wire format for float32, both
        are 16-bit and together take exactly the bytes of the float32 rows."""
        rows = self.topo.machines - 1
        start = slot * self.slot_bytes
        nbytes = rows * k * dtype.itemsize
        assert nbytes <= self.slot_bytes, (nbytes, self.slot_bytes)
        area = self.staging_bytes[start:start + nbytes]
        if wire is None:
            return area.view(dtype).view(rows, k), None
        both = area.view(wire).view(2, rows, k)
        return both[0], both[1]

    def padding(self, slot: int, dtype: torch.dtype, wire: torch.dtype | None = None) -> Part:
        t = self.topo
        group, rows = t.devices_per_machine * t.machines, t.machines - 1
        start = slot * self.pad_stride
        flat = self.padding_bytes[start:start + (group + rows) * dtype.itemsize].view(dtype)
        view = flat[:group].view(t.devices_per_machine, t.machines, 1)
        if wire is None:
            return Part(view, flat[group:].view(rows, 1))
        # The rows' float32 bytes hold both 16-bit row sets (received, to send).
        both = flat[group:].view(wire).view(2, rows, 1)
        return Part(view, both[0], both[1])


class SliceIO:
    """The parts of one slice and, when it has a tail, where the tail lives."""

    def __init__(self, flat: torch.Tensor, plan: SlicePlan, step: Step, buffers: Buffers,
                 wire: torch.dtype | None) -> None:
        topo = buffers.topo
        self.parts: list[Part] = []
        if plan.k:
            body = flat[plan.offset:plan.offset + plan.body]
            view = body.view(topo.devices_per_machine, topo.machines, plan.k)
            rows, out = buffers.staging(step.staging_slot, flat.dtype, plan.k, wire)
            self.parts.append(Part(view, rows, out))
        self.tail: torch.Tensor | None = None
        self.pad: Part | None = None
        if step.padding_slot is not None:
            self.tail = flat[plan.offset + plan.body:plan.offset + plan.numel]
            self.pad = buffers.padding(step.padding_slot, flat.dtype, wire)
            self.parts.append(self.pad)

    def copy_in(self, sync: Any, stage: str) -> None:
        """Tail into the padding slot. The slot's other elements are left as they
        are: their results are never read back."""
        if self.pad is not None and self.tail is not None:
            sync.copy(stage, self.pad.view.view(-1)[:self.tail.numel()], self.tail)

    def copy_out(self, sync: Any, stage: str) -> None:
        if self.pad is not None and self.tail is not None:
            sync.copy(stage, self.tail, self.pad.view.view(-1)[:self.tail.numel()])


_EXTERNAL = 0x01
"""cudaEventWaitExternal and cudaEventRecordExternal (driver_types.h)."""


def external_wait(stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
    """Captured: an event wait node on ``event`` (cudaEventWaitExternal)."""
    _check(_cudart().cudaStreamWaitEvent(stream.cuda_stream, event.cuda_event, _EXTERNAL),
           "cudaStreamWaitEvent")


def external_record(event: torch.cuda.Event, stream: torch.cuda.Stream) -> None:
    """Captured: an event record node on ``event`` (cudaEventRecordExternal)."""
    _check(_cudart().cudaEventRecordWithFlags(event.cuda_event, stream.cuda_stream, _EXTERNAL),
           "cudaEventRecordWithFlags")


@functools.cache
def _cudart() -> Any:
    # cuda-bindings comes with nccl4py (its CUDA dependency); torch and cupy expose
    # no flags on event records.
    from cuda.bindings import runtime
    return runtime


def _check(result: Any, what: str) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RingReduceError(f"{what} (external event node) failed: {err}")


def run_steps(steps: Sequence[Step], flat: torch.Tensor, plans: Sequence[SlicePlan],
              op: str, ctx: Any) -> None:
    """Unpipelined meaning, per slice s:
        view = s.as(D, M, k); rs(view); collect(view); add(view); diffuse(view); ag(view)
    ``ctx`` carries topology, transport, sync (streams) and buffers."""
    stages = schedule.active_stages(ctx.topo.devices_per_machine)
    # NCCL calls and native kernels take their stream explicitly; only torch ops (tail
    # copies; without cupy the add and the wire casts) need it current, and entering a
    # torch stream context costs host time on every step.
    torch_ops = ctx.kernels is None
    ios: dict[int, SliceIO] = {}
    for step in steps:
        io = ios.get(step.slice_index)
        if io is None:
            io = ios[step.slice_index] = SliceIO(flat, plans[step.slice_index], step,
                                                 ctx.buffers, ctx.wire)
        ctx.sync.wait(step.stage, step.waits)
        stamp(ctx.record, step.stage, step.slice_index, "start")
        on_stream = ctx.sync.on(step.stage) if torch_ops or io.pad is not None else _NO_STREAM
        with on_stream, stage_errors(ctx, step.stage, flat, str(step.slice_index)):
            if step.stage == stages[0]:
                io.copy_in(ctx.sync, step.stage)
            _run_stage(step.stage, io.parts, op, ctx)
            if step.stage == stages[-1]:
                io.copy_out(ctx.sync, step.stage)
                del ios[step.slice_index]
        ctx.sync.record(step.stage, step.records)
        stamp(ctx.record, step.stage, step.slice_index, "end")


def _run_stage(stage: str, parts: Sequence[Part], op: str, ctx: Any) -> None:
    handle = ctx.sync.handle(stage)
    if stage == "add":
        d, m = ctx.topo.device_index, ctx.topo.machine_index
        for p in parts:
            if p.wire_out is not None and ctx.kernels is not None:
                ctx.kernels.add_wire(p.view[d][m], p.staging, p.wire_out[0], op,
                                     ctx.topo.world_size, handle)
            elif p.wire_out is not None:
                add_wire(p.view[d][m], p.staging, p.wire_out[0], op, ctx.topo.world_size)
            elif ctx.kernels is not None:
                ctx.kernels.add(p.view[d][m], p.staging, op, ctx.topo.world_size, handle)
            else:
                add(p.view[d][m], p.staging, op, ctx.topo.world_size)
    elif stage == "reduce_scatter":
        ctx.transport.reduce_scatter(parts, op, handle)
    else:
        getattr(ctx.transport, stage)(parts, handle)


def run_flat(t: torch.Tensor, op: str, ctx: Any) -> None:
    """Unpipelined meaning: all_reduce(t, op) over every rank of the group, on the
    flat stream after the entry event (asynchronous calls; their Future records its
    own event there). It leaves ``done`` alone: that marks hierarchical calls only."""
    ctx.sync.wait(FLAT, [ENTRY])
    with ctx.sync.on(FLAT):
        flat_here(t, op, ctx, ctx.sync.handle(FLAT))


def flat_here(t: torch.Tensor, op: str, ctx: Any, stream: int | None) -> None:
    """all_reduce(t, op) on ``stream``, which must be current. Synchronous calls use
    the caller's stream, like ``dist.all_reduce``: at sizes where the flat route is
    taken, host time is the cost, and events plus a stream switch are a third of it."""
    with stage_errors(ctx, FLAT, t):
        ctx.transport.flat_all_reduce(t, op, stream)
        if op == "avg":
            finish_average(t, ctx.topo.world_size, ctx.divisors.get(t.dtype))


def stage_errors(ctx: Any, stage: str, t: torch.Tensor,
                 slice_index: str = "-") -> contextlib.AbstractContextManager[None]:
    """Failures inside ``stage`` become RingReduceError naming the stage's peers."""
    return _errors(ctx, stage, slice_index, ctx.topo.peers(stage), t)


@contextlib.contextmanager
def _errors(ctx: Any, stage: str, slice_index: str, peers: Sequence[int],
            t: torch.Tensor) -> Iterator[None]:
    try:
        yield
    except (ValueError, TypeError, AssertionError):
        raise
    except Exception as exc:
        raise RingReduceError(
            f"ringreduce stage '{stage}' failed on rank {ctx.topo.rank} in operation "
            f"#{ctx.op_number} (slice {slice_index}, tensor of {t.numel()} x {t.dtype}), "
            f"peers (group ranks) {list(peers)}: {exc}") from exc
