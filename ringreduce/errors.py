"""The one exception type for failures that are not the caller's mistake."""

from __future__ import annotations


class RingReduceError(RuntimeError):
    """An NCCL, CUDA or transport failure inside ringreduce.

    The message names the stage, the operation number and the peer ranks, so the
    log line alone says where the pipeline broke. Caller mistakes raise
    ``ValueError``/``TypeError`` instead, before any communication.
    """
