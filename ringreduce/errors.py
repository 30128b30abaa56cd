"""The one exception type for failures that are not the caller's mistake."""

from __future__ import annotations

from collections.abc import Iterable


class RingReduceError(RuntimeError):
    """An NCCL, CUDA or transport failure inside ringreduce.

    The message names the stage, the operation number and the peer ranks, so the
    log line alone says where the pipeline broke. Caller mistakes raise
    ``ValueError``/``TypeError`` instead, before any communication.
    """

    stage: str | None = None
    """The stage it names, once stage_error built it (an outer handler keeps it)."""


CALL_CHECK = "call check"
"""The stage named by failures of the checks that ranks make the same calls (the store
checks of safety/guard.py, the end-of-call check of execution/call_check.py)."""


def stage_error(stage: str, rank: int | None, where: str, peers: Iterable[int],
                cause: object) -> RingReduceError:
    """The one shape of a stage failure: "ringreduce stage '<stage>' failed on rank <r>
    in <where>, peers (group ranks) [...]: <cause>". ``where`` says which operation
    (e.g. "operation #7 (all_reduce of 1024 x torch.float32)"); ``rank`` None when the
    reporter does not know it."""
    on = "" if rank is None else f" on rank {rank}"
    error = RingReduceError(f"ringreduce stage '{stage}' failed{on} in {where}, "
                            f"peers (group ranks) {list(peers)}: {cause}")
    error.stage = stage
    return error
