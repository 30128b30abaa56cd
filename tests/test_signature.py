"""The end-of-call check's signature (ringreduce.safety.signature): pure, no ranks."""

from __future__ import annotations

import pytest

from ringreduce.safety import signature


def _all_reduce_max(*signatures: int) -> tuple[int, int]:
    """What the check's all-reduce (MAX of [s, ~s]) gives: (largest, smallest)."""
    return max(signatures), ~max(~s for s in signatures)


def test_every_field_round_trips() -> None:
    for numel in (0, 1, 100_000, (1 << 40) - 1):
        for dtype in signature.DTYPES:
            for op in signature.OPS:
                s = signature.encode(numel, dtype, op)
                assert -(1 << 63) <= s < 1 << 63
                assert signature.describe(s) == \
                    f"all_reduce(numel={numel}, dtype=torch.{dtype}, op={op})"


def test_agreeing_ranks_pass_and_any_difference_is_named() -> None:
    own = signature.encode(100_000, "float32", "sum")
    assert signature.disagreement(*_all_reduce_max(own, own, own), own) is None
    for other in (signature.encode(100_000, "int32", "sum"),
                  signature.encode(100_001, "float32", "sum"),
                  signature.encode(100_000, "float32", "avg"),
                  signature.encode(100_000, "float8_e4m3fn", "sum")):
        for ranks in ((own, other), (other, own, own), (own, own, other)):
            why = signature.disagreement(*_all_reduce_max(*ranks), own)
            assert why is not None and signature.describe(other) in why, why
            assert f"this rank {signature.describe(own)}" in why
        assert signature.disagreement(*_all_reduce_max(own, other), other) is not None


def test_bits_that_are_no_signature_are_said_to_be_so() -> None:
    own = signature.encode(8, "float32", "sum")
    why = signature.disagreement(0x1234, own, own)
    assert why is not None and "no call signature (0x0000000000001234)" in why


def test_a_size_the_signature_cannot_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit the call signature's 40 bits"):
        signature.encode(1 << 40, "float32", "sum")


def test_the_hops_cover_every_rank_of_each_topology() -> None:
    """Inside the machine, then along the rail: a rail's ranks hold every machine's
    maximum after the second hop (one hop where the topology has one level)."""
    from ringreduce.execution.call_check import hops

    assert hops(2, 2) == ("all_gather", "diffuse")
    assert hops(8, 1) == ("all_gather",)
    assert hops(1, 4) == ("diffuse",)
