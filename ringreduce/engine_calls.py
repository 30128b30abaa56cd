"""What every call of a Communicator (engine.py) shares, whatever the collective:
serialised, checked across ranks, numbered, recorded in the flight recorder and handed
to execution/issue.py (``_call``); and what a caller asks of the calls made:
``raise_if_failed``, ``wait_idle``, ``close``. engine.py's Communicator builds the
state below and adds the collectives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from ringreduce.config import Config
from ringreduce.errors import RingReduceError
from ringreduce.execution.issue import Issuer, as_torch_future
from ringreduce.execution.resources import Resources
from ringreduce.plan.topology import Topology
from ringreduce.safety.flight import Record


class Calls:
    """The calls of one Communicator, over the state its construction made."""

    _config: Config
    _res: Resources
    _issuer: Issuer
    _op_number: int
    _closed: bool
    _calls: threading.RLock

    @property
    def config(self) -> Config:
        """The effective settings. Replacing it (``dataclasses.replace``) changes what
        is read per call (``min_bytes``, ``debug``) from the next call on."""
        return self._config

    @config.setter
    def config(self, value: Config) -> None:
        self._config = value
        if "_issuer" in self.__dict__:
            self._issuer.config = value

    @property
    def topology(self) -> Topology:
        """machines, devices_per_machine, machine_index, device_index (and ranks)."""
        return self._res.topo

    @property
    def op_number(self) -> int:
        """The number of the latest call; the construction probe's calls
        (execution/probe.py, CUDA) are numbered first."""
        return self._op_number

    def _call(self, kind: str, t: torch.Tensor, op: str, async_op: bool, result: torch.Tensor,
              on_cuda: Callable[[Record], Any], on_cpu: Callable[[Record], Any],
              route: str = "") -> torch.futures.Future[torch.Tensor] | None:
        """What every collective shares: the call check, numbering, the flight record;
        then issue.py issues CUDA work here or queues CPU work in order (and poisons the
        communicator after a failure)."""
        with self._calls:
            guard = self._res.guard
            if self.config.debug:
                guard.agree(self._op_number + 1, t, op, kind)
            elif self.config.check_new_calls:
                guard.agree_if_new(self._op_number + 1, t, op, kind)
            self._op_number += 1
            record = guard.recorder.begin(self._op_number, t.numel(), str(t.dtype), op, route,
                                          kind)
            if self._res.is_cuda:
                return self._issuer.issue_cuda(record, on_cuda)
            job = self._issuer.queue_cpu(record, on_cpu)
            if async_op:
                return as_torch_future(job, result)
        job.result()  # outside the lock: other threads may queue behind this call meanwhile
        return None

    def _usable(self) -> None:
        """Closed or poisoned communicators refuse work before anything is checked."""
        if self._closed:
            raise RingReduceError("this ringreduce.Communicator is closed; create a new one")
        self._res.guard.check_usable()

    def raise_if_failed(self, op_number: int) -> None:
        """Raise RingReduceError if operation ``op_number`` (or one before it) failed;
        on CUDA as far as the watchdog knows now (it never waits for the device)."""
        self._res.guard.raise_if_failed(op_number)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block the host until every issued call finished on the device (True), or
        ``timeout_s`` passed (False). Raises RingReduceError when an operation failed
        (a dead or hung peer, after the deadline at most), or the communicator is
        closed. The CPU path: until the queued calls ran."""
        if self._closed:  # its worker and streams are gone: say so, not what broke inside
            raise RingReduceError("this ringreduce.Communicator is closed; create a new one")
        if not self._res.is_cuda:
            self._issuer.wait_cpu()
            self._res.guard.check_usable()
            return True
        return self._res.wait_idle(timeout_s)

    def close(self) -> None:
        """Finish outstanding work and release communicators. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._issuer.close()
        self._res.release()
