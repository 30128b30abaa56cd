"""GraphCache's bookkeeping (CPU): what gets captured, and when capturing stops.

Capture and replay themselves need a GPU: tests/test_gpu.py runs them exactly."""

from __future__ import annotations

import torch

from ringreduce.execution.graphs import GraphCache


def key(i: int) -> tuple[int, int, torch.dtype, str]:
    return (4096 * i, 1000, torch.float32, "sum")


def test_a_tensor_is_worth_capturing_from_its_second_call_only() -> None:
    cache = GraphCache(4, torch.device("cpu"))
    assert not cache.seen_before(key(1))
    assert not cache.seen_before(key(2))
    assert cache.seen_before(key(1))
    assert not cache.seen_before((4096, 1000, torch.float32, "avg"))  # the op is part of it
    assert cache.get(key(1)) is None and len(cache) == 0


def test_keys_seen_once_are_forgotten_beyond_four_times_capacity() -> None:
    cache = GraphCache(2, torch.device("cpu"))
    for i in range(9):  # 8 remembered: key 0 falls out
        assert not cache.seen_before(key(i))
    assert not cache.seen_before(key(0))
    assert cache.seen_before(key(8))


def test_no_new_captures_once_the_cache_has_thrashed() -> None:
    cache = GraphCache(2, torch.device("cpu"))
    cache.evicted = 2  # as many graphs dropped as it holds: more tensors repeat than fit
    cache.seen_before(key(1))
    assert not cache.seen_before(key(1))
