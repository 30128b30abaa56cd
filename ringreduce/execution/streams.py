"""The stage streams and the events between them (CUDA), and their CPU counterpart.

``CudaStreams`` owns one high-priority stream per stage (plus the flat route's) and one
event per named edge of the schedule; ``HostOrder`` is the CPU path's stand-in, where
program order is the only order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ringreduce.plan import schedule
from ringreduce.plan.schedule import DONE, ENTRY

FLAT = "flat"
"""Stream of the flat all-reduce fast path."""


class CudaStreams:
    """One stream per stage (and for the flat path), and every named event.

    While a call is captured into the caller's CUDA graph it records fresh events
    instead of the named ones and waits on those: CUDA refuses a captured wait on work
    recorded outside the capture (cudaErrorStreamCaptureIsolation), and an event
    recorded inside a capture cannot be waited on outside it (cudaErrorInvalidValue).
    What crosses calls (slot releases, stage tails: ``schedule.crosses_calls``) is
    skipped in a capture: the caller's stream orders the replay where the call was
    issued. Eager calls leave the stage tails alone (each stage's stream orders them)."""

    def __init__(self, device: torch.device, event_names: Sequence[str]) -> None:
        # High priority: communication kernels should not queue behind compute.
        self.streams = {s: torch.cuda.Stream(device, priority=-1)
                        for s in (*schedule.STAGES, FLAT)}
        self.events = {name: torch.cuda.Event() for name in event_names}
        self._tails = frozenset(n for n in event_names
                                if schedule.crosses_calls(n) and n.startswith("tail"))
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._captured: dict[str, torch.cuda.Event] | None = None
        """Events of the capture under way, by name; None when not capturing."""

    def handle(self, stage: str) -> int:
        return self.streams[stage].cuda_stream

    def caller(self) -> torch.cuda.Stream:
        """The caller's current stream on our device. Naming the device skips torch's
        lookup of the current one (an availability check that reads os.environ)."""
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
    def capturing(self) -> Iterator[None]:
        """Around issuing one call into the caller's CUDA graph capture."""
        self._captured = {}
        try:
            yield
        finally:
            self._captured = None

    def on(self, stage: str) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self.streams[stage])

    def complete(self, stage: str, fut: torch.futures.Future[torch.Tensor],
                 value: torch.Tensor) -> None:
        """``fut.set_result(value)`` with ``stage``'s stream current (complete_on)."""
        complete_on(self.streams[stage], fut, value)

    def enter(self) -> None:
        self._to_record(ENTRY).record(self.caller())

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


def complete_on(stream: torch.cuda.Stream, fut: torch.futures.Future[torch.Tensor],
                value: torch.Tensor) -> None:
    """``fut.set_result(value)`` with ``stream`` current, so a CUDA-aware Future records
    its event there, then the caller's stream and device current again. torch's raw
    setters, not ``torch.cuda.stream()``: that context looks the current device up
    twice per use (availability checks that read os.environ), a sizeable share of an
    asynchronous call's host time (results 2026-11-27-h100x2-native-one-slice, run 3)."""
    index = stream.device_index
    device = torch._C._cuda_getDevice()
    caller = torch._C._cuda_getCurrentStream(index)  # (stream id, device index, type)
    torch._C._cuda_setStream(stream_id=stream.stream_id, device_index=index,
                             device_type=stream.device_type)
    try:
        fut.set_result(value)
    finally:
        torch._C._cuda_setStream(stream_id=caller[0], device_index=caller[1],
                                 device_type=caller[2])
        if device != index:  # setStream made the stream's device current
            torch._C._cuda_setDevice(device)


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
