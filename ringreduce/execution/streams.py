"""The stage streams and the events between them (CUDA), and their CPU counterpart.

``CudaStreams`` owns one high-priority stream per stage (plus the flat route's and two
for replays) and one event per named edge of the schedule; ``HostOrder`` is the CPU
path's stand-in, where program order is the only order. ``external_wait`` and
``external_record`` put event nodes into ringreduce's own graph captures, so replays
order themselves against the calls around them as streams do.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ringreduce.errors import RingReduceError
from ringreduce.plan import schedule
from ringreduce.plan.schedule import DONE, ENTRY

FLAT = "flat"
"""Stream of the flat all-reduce fast path."""


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
