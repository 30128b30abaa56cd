"""One order for calls on the same memory (CUDA): a call waits for the last
asynchronous call still recorded on its tensors' memory (issue.py's Issuer asks before
it enqueues anything, and records each asynchronous call it issues)."""

from __future__ import annotations

import torch

from ringreduce.execution.resources import Resources

_PENDING = 4096
"""Asynchronous calls remembered by the memory they used (after_pending): DDP's buckets
and the tensors of a training step, with room; the oldest go first (a wait on one that
finished long ago costs the device nothing, forgetting it only matters while it runs)."""


class MemoryOrder:
    """The end of the last asynchronous call on each piece of memory, for one
    Communicator's calls over ``res``."""

    def __init__(self, res: Resources) -> None:
        self.res = res
        self._pending: dict[int, torch.cuda.Event | int] = {}
        """CUDA: memory (storage address) -> the end of the last asynchronous call on it
        off the caller's stream: an event recorded right after it, or a native job's
        number (see after_pending)."""

    def after_pending(self, *tensors: torch.Tensor, native_jobs: bool = False) -> int:
        """The caller's stream waits for the last asynchronous call still recorded on the
        memory of ``tensors``, before this call enqueues anything: calls on one tensor
        then run in issue order, as they do on a process group's one NCCL stream. Ours
        run on stage streams, and a call's reduce_scatter, which follows only the
        previous call's reduce_scatter on its stream, would otherwise read the tensor
        before that call's all_gather wrote it. Only overlapping calls wait: calls on
        different tensors (DDP's buckets) still overlap. This call's own end is ordered
        from here on (a synchronous call makes the caller's stream wait for it; an
        asynchronous one records itself with pend), so the entry goes.

        ``native_jobs``: the call is a native issuer's job, so an earlier native job on
        the memory is returned (the last one, else 0) for the program to follow on the
        device (native.issue's ``after``) instead of the caller's stream waiting for it."""
        after = 0
        for t in tensors:
            end = self._pending.pop(_storage(t), None)
            if native_jobs and isinstance(end, int):
                after = end
            elif end is not None:
                self._join(end)
        return after

    def _join(self, end: torch.cuda.Event | int) -> None:
        """The caller's stream waits for that call's end, and for nothing issued after
        it (a later call on other tensors, e.g. the next DDP bucket, must not hold the
        caller's compute back)."""
        caller = self.res.sync.caller()
        if isinstance(end, torch.cuda.Event):
            caller.wait_event(end)
            return
        native = self.res.native  # a native job: its done event, unless it finished
        assert native is not None
        if native.worker.state(end) == 0:  # the host-visible flag: no device sync
            native.worker.stream_wait(caller.cuda_stream, end)

    def pend(self, t: torch.Tensor, end: str | int) -> None:
        """Remember the asynchronous call just issued on ``t``: a native job's number,
        or the stream it ends on (an event is recorded there now, marking this call's
        end only)."""
        if isinstance(end, str):
            event = torch.cuda.Event()
            event.record(self.res.sync.streams[end])
            marker: torch.cuda.Event | int = event
        else:
            marker = end
        key = _storage(t)
        if len(self._pending) >= _PENDING and key not in self._pending:
            del self._pending[next(iter(self._pending))]  # the oldest: long finished
        self._pending[key] = marker


def _storage(t: torch.Tensor) -> int:
    """The address of ``t``'s memory allocation: views of one tensor share it."""
    return t.untyped_storage().data_ptr()
