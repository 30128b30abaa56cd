"""The call checks of safety/guard.py on one process: which calls reach the store.

The cross-rank behaviour (a mismatch raises on every rank, a divergence ends at the
deadline) is tested with real ranks in test_cpu_faults.py and test_gpu_faults.py; here,
what one rank decides: the new-call check asks the store exactly once per kind of call
it has not seen, remembers a bounded number of kinds, and forgets the oldest first.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ringreduce.safety import guard
from ringreduce.safety.flight import FlightRecorder
from ringreduce.safety.guard import Guard


class CountingStore(dist.HashStore):
    """A one-rank store that counts the checks' writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def set(self, key: str, value: str | bytes) -> None:  # type: ignore[override]
        self.writes += 1
        super().set(key, value)


def _guard() -> tuple[Guard, CountingStore]:
    store = CountingStore()
    return Guard(store, 0, 1, 5.0, FlightRecorder(4, 0, None)), store


def test_a_kind_of_call_is_checked_once() -> None:
    g, store = _guard()
    a, b = torch.ones(10), torch.ones(11)
    for op_number, (t, op) in enumerate([(a, "sum"), (a, "sum"), (b, "sum"), (a, "avg"),
                                         (b, "sum"), (a.double(), "sum")], start=1):
        g.agree_if_new(op_number, t, op, "all_reduce")
    assert store.writes == 4 == g.checks  # a/sum, b/sum, a/avg, a as float64
    g.agree_if_new(7, a, "sum", "reduce_scatter")  # another collective is another kind
    assert store.writes == 5


def test_the_oldest_kinds_are_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "SEEN_LIMIT", 2)
    g, store = _guard()
    x, y, z = torch.ones(1), torch.ones(2), torch.ones(3)
    for t in (x, y, x, z):  # x used again after y: y is the oldest when z comes
        g.agree_if_new(1, t, "sum", "all_reduce")
    assert store.writes == 3 and len(g.seen) == 2
    g.agree_if_new(1, x, "sum", "all_reduce")
    assert store.writes == 3  # x was kept
    g.agree_if_new(1, y, "sum", "all_reduce")
    assert store.writes == 4  # y was forgotten, so it is checked again


def test_every_call_is_checked_with_debug() -> None:
    g, store = _guard()
    for op_number in range(1, 4):
        g.agree(op_number, torch.ones(10), "sum")
    assert store.writes == 3
