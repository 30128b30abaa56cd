"""What keeps a failure from becoming a hang or silent corruption.

* ``agree``: a cross-rank fingerprint of a call (kind, numel, dtype, op), compared
  through the store *before* anything is communicated; a mismatch raises on every rank
  naming both ranks and both calls. NCCL's send/recv do not compare sizes, so a rank
  whose peer sends a longer or shorter message can return wrong values as success.
  By default (``check_new_calls``) each rank checks the first call of every fingerprint
  it has not seen yet, one store round trip per new kind of call and none in a steady
  stream of DDP buckets; ``RINGREDUCE_DEBUG=1`` checks every call and names the rank.
  Ranks that swap two fingerprints each has seen before are caught after the fact, on
  the device, by the end-of-call check (``signature``, ``check_call_end``).
* ``fail``: the first failed operation poisons the communicator (like torch's NCCL
  process group after a watchdog abort): later calls raise at once instead of
  talking to peers in an unknown state; the flight recorder is dumped once.
"""

from __future__ import annotations

import collections
import datetime
import time

import torch
import torch.distributed as dist

from ringreduce.errors import CALL_CHECK, RingReduceError, stage_error
from ringreduce.safety.flight import FlightRecorder, Record

SEEN_LIMIT = 4096
"""Fingerprints a communicator remembers as checked. A workload with more distinct
calls than this pays a store round trip for each one it has forgotten."""


_DIVERGED = ("; a rank whose call at this point is one it has made before does not check "
             "it, so the ranks' calls may have diverged (RINGREDUCE_DEBUG=1 checks every "
             "call and names both)")


def fingerprint(t: torch.Tensor, op: str, kind: str) -> str:
    return f"{kind}(numel={t.numel()}, dtype={t.dtype}, op={op})"


class Guard:
    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout_s: float,
                 recorder: FlightRecorder) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.recorder = recorder
        self.failure: RingReduceError | None = None
        self.failed_op = 0
        """Number of the operation that failed first (0: none, or unknown)."""
        self.checks = 0
        """Calls checked so far: the store key of a check, so a retry after a mismatch
        never reads the previous attempt's fingerprints. Ranks that make the same calls
        check the same calls, so their counts agree in either mode."""
        self.seen: collections.OrderedDict[tuple[object, ...], None] = \
            collections.OrderedDict()
        """Fingerprints every rank agreed on, most recent last (at most SEEN_LIMIT), as
        (kind, numel, dtype, op): a tuple, since building the fingerprint's text on
        every call of a steady stream cost more than the lookup."""

    def check_usable(self) -> None:
        if self.failure is not None:
            raise RingReduceError(
                "this ringreduce.Communicator refuses new work because an earlier "
                f"operation failed ({self.failure}); its peers are in an unknown state: "
                "restart the job, or re-create the process group and the Communicator")

    def agree_if_new(self, op_number: int, t: torch.Tensor, op: str, kind: str) -> None:
        """``agree`` on the first call of a fingerprint this rank has not seen (or has
        forgotten: the last SEEN_LIMIT are kept, so memory stays bounded and every rank
        forgets the same ones)."""
        mine = (kind, t.numel(), t.dtype, op)
        if mine in self.seen:
            self.seen.move_to_end(mine)
            return
        self.agree(op_number, t, op, kind, "first call of its kind")
        self.seen[mine] = None
        if len(self.seen) > SEEN_LIMIT:
            self.seen.popitem(last=False)

    def agree(self, op_number: int, t: torch.Tensor, op: str, kind: str = "all_reduce",
              why: str = "RINGREDUCE_DEBUG") -> None:
        """Every rank must be about to run the same call; raise on every rank if not."""
        self.checks += 1
        n = self.checks
        mine = fingerprint(t, op, kind)
        keys = [f"fp/{n}/{r}" for r in range(self.world_size)]
        try:  # the store may be gone (its server exited): that too is an error, not a hang
            self.store.set(keys[self.rank], mine)
            self.store.wait(keys, self.timeout)
            calls = [self.store.get(key).decode() for key in keys]
        except Exception as exc:
            raise stage_error(
                CALL_CHECK, self.rank, f"operation #{op_number} ({why} check of {mine})",
                range(self.world_size),
                f"not every rank reached it within {self.timeout.total_seconds():.0f} s, or "
                f"the store failed: {exc}{_DIVERGED if why != 'RINGREDUCE_DEBUG' else ''}"
            ) from exc
        for r, theirs in enumerate(calls):
            if theirs != mine:
                raise RingReduceError(
                    f"collective mismatch at operation #{op_number}: rank {self.rank} calls "
                    f"{mine}, rank {r} calls {theirs}; every rank must issue the same "
                    "collective calls in the same order")
        if n > 2:  # every rank has read check n-2's keys before it wrote check n-1's
            self.store.delete_key(f"fp/{n - 2}/{self.rank}")

    def fail(self, exc: RingReduceError, record: Record | None) -> None:
        if self.failure is None:
            self.failure = exc
            self.failed_op = record.op_number if record else 0
            self.recorder.dump(f"operation #{record.op_number if record else '?'} failed: {exc}")

    def raise_if_failed(self, op_number: int) -> None:
        """Raise the failure if it hit operation ``op_number`` (work issued after a
        failed operation ran behind it on the same streams, or was refused)."""
        if self.failure is not None and self.failed_op <= op_number:
            raise RingReduceError(str(self.failure)) from self.failure

    @staticmethod
    def finish(record: Record) -> None:
        record.finished = time.time() - record.started
