"""Everything a Communicator holds: topology, transport, streams, events, buffers,
and what a failure, wait_idle and close do with all of it.

Built once, collectively, at construction (build.py). A leaf of execution/: the
modules that build or use Resources import it, never the other way round.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ringreduce.errors import RingReduceError
from ringreduce.execution.buffers import Buffers
from ringreduce.plan import layout, slicing
from ringreduce.plan.topology import Topology
from ringreduce.safety.flight import Record
from ringreduce.safety.watchdog import Watchdog
from ringreduce.safety.watched import Issue

log = logging.getLogger("ringreduce")
_ABORT_LOCK_WAIT_S = 2.0
"""How long a failure waits for the issuing thread to leave NCCL before aborting anyway:
a healthy issue (a few hundred microseconds) is long done by then."""


@dataclass
class Resources:
    topo: Topology
    is_cuda: bool
    device: torch.device
    slice_bytes: int
    staging_slots: int
    transport: Any
    sync: Any
    buffers: Buffers
    nccl_version: int = 0
    guard: Any = None
    kernels: Any = None
    """native/ kernels (CUDA with cupy); None: the add stage uses torch ops."""
    rank_order: Any = None
    """int64 indices of the group's ranks in (device, machine) order, on ``device``."""
    release_steps: list[Any] = field(default_factory=list)
    comms: dict[str, Any] = field(default_factory=dict)
    """NCCL communicators by stage (CUDA), aborted together on a failure."""
    watchdog: Watchdog | None = None
    issue_lock: threading.RLock = field(default_factory=threading.RLock)
    """Held while a call makes NCCL calls: NCCL forbids aborting a communicator while
    another thread is inside an NCCL call on it."""
    aborted: bool = False
    user_captures: int = 0
    """Calls issued while the caller was capturing a CUDA graph of its own."""
    divisors: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    """World size as a 0-dim tensor per float dtype, made once: AVG divides by it."""
    smallest_slice_bytes: int = 0
    """Config.smallest_slice_bytes: a small call's slices (call_slice_bytes); 0: every
    call's are ``slice_bytes``."""
    native: Any = None
    """The native issuer (native.NativeIssuer: replays a hierarchical call's NCCL calls
    and kernels from C++ on the caller's thread, on either plan); None: every call is
    issued from Python."""
    call_check: Any = None
    """The end-of-call check (call_check.py, Config.check_call_end); None: off."""
    plan: slicing.Choice = slicing.CPU_DEFAULT
    """How hierarchical all-reduces are issued, and why (execution/probe.py)."""
    probe_calls: int = 0
    """Calls the construction probe made (numbered before the user's)."""
    abort: Callable[[], None] | None = None
    """Aborts every NCCL communicator at once (cuda_setup.abort_together), set with them."""
    issuing: tuple[Record, float] | None = None
    """The call being issued and since when (time.monotonic()); None between calls."""

    def call_slice_bytes(self, nbytes: int) -> int:
        """The slice size of a call of ``nbytes`` (plan/layout.call_slice_bytes)."""
        smallest = self.smallest_slice_bytes or self.slice_bytes  # 0: one size (the field)
        return layout.call_slice_bytes(nbytes, self.slice_bytes, smallest,
                                       self.topo.devices_per_machine, self.topo.machines)

    def stuck_issue(self) -> Issue | None:
        """For the watchdog: the call being issued (blocking NCCL calls wait inside it
        while they connect to a peer), or None."""
        issuing = self.issuing  # one read: the issuing thread clears it concurrently
        if issuing is None:
            return None
        record, since = issuing
        stage = getattr(self.transport, "stage", "-")
        return Issue(record.op_number, f"{record.kind} of {record.numel} x {record.dtype}",
                     stage, self.topo.peers(stage), since)

    def fail(self, exc: RingReduceError, record: Record | None) -> None:
        """A failed operation: poison the Guard (dumps the flight recorder), abort every
        NCCL communicator so that kernels waiting for a dead peer exit. Idempotent."""
        # The issuing thread may itself be stuck inside NCCL or a kernel launch (a full
        # launch queue behind kernels that wait for a dead peer): then the lock never
        # frees, and only the abort can unstick it. torch's watchdog aborts regardless.
        locked = self.issue_lock.acquire(timeout=_ABORT_LOCK_WAIT_S)
        try:
            self.guard.fail(exc, record)
            if self.comms and not self.aborted:
                self.aborted = True
                if self.native is not None and not self.native.stop():
                    log.warning("ringreduce: aborting while the native issuer is inside "
                                "NCCL or CUDA (stuck behind the failed operation)")
                if not locked:
                    log.warning("ringreduce: aborting while the issuing thread is inside "
                                "NCCL or CUDA (stuck behind the failed operation)")
                assert self.abort is not None, "NCCL communicators come with their abort"
                self.abort()
        finally:
            if locked:
                self.issue_lock.release()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """CUDA: until issued work finished (True) or ``timeout_s`` (False); raises the
        watchdog's RingReduceError after a failure."""
        self.guard.check_usable()
        return self.watchdog.wait_idle(timeout_s) if self.watchdog is not None else True

    def release(self) -> None:
        """Teardown (close): after a failure nothing is left to destroy (aborted);
        otherwise let issued work finish, then destroy."""
        if self.native is not None:
            self.native.close()  # refuses further jobs (every issued one is on the device)
        if self.watchdog is not None:
            if self.guard.failure is None:
                with contextlib.suppress(RingReduceError):  # on_failure aborted everything
                    self.watchdog.wait_idle()
            self.watchdog.stop()
        if self.aborted or self.guard.failure is not None:
            self.release_steps.clear()
            return
        self.sync.synchronize()
        if self.captured():
            gc.collect()  # graphs the caller dropped may still sit in reference cycles
            torch.cuda.synchronize(self.device)  # and their replays must have ended
        for step in self.release_steps:
            step()
        self.release_steps.clear()

    def captured(self) -> int:
        """How many calls were captured into the caller's CUDA graphs."""
        return self.user_captures
