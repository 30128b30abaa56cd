"""The NCCL binding: the one package that calls NCCL, through nccl4py (NVIDIA's binding).

Why nccl4py: it is NVIDIA's own binding, tracks NCCL releases (config structs,
split, abort, async errors), loads the same ``libnccl`` wheel torch's CUDA build
depends on, and needs no compiler. PyPI's pynccl (2020) has no config, no
non-blocking init and no split (FINDINGS.md). cupy.cuda.nccl lacks split and config.

Three modules, one reason each: ``library`` imports nccl4py and holds what every call
shares (the type and operator codes, result names); ``calls`` the per-call operations
a stage issues (the hot path); ``lifecycle`` a communicator's life: init, split,
polling out of ncclInProgress, async errors, abort, finalize. Everything is re-exported
here, so callers write ``nccl.send(...)`` and NcclTransport can take this package as its
``calls`` (transport.py), and no other module in ringreduce imports nccl4py
(tests/test_watchdog.py checks it).
"""

from __future__ import annotations

from ringreduce.execution.nccl.calls import (
    all_gather,
    all_reduce,
    all_reduce_into,
    group,
    recv,
    reduce_scatter,
    send,
)
from ringreduce.execution.nccl.library import (
    Comm,
    describe_result,
    dtype_code,
    new_unique_id,
    op_code,
    version,
)
from ringreduce.execution.nccl.lifecycle import (
    abort,
    async_error,
    comm_config,
    finalize_and_destroy,
    init_nonblocking,
    launch_order,
    split,
    wait_ready,
)

__all__ = [
    "Comm", "abort", "all_gather", "all_reduce", "all_reduce_into", "async_error", "comm_config",
    "describe_result", "dtype_code", "finalize_and_destroy", "group",
    "init_nonblocking", "launch_order", "new_unique_id", "op_code", "recv", "reduce_scatter",
    "send", "split", "version", "wait_ready",
]
