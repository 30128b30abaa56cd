"""Which of torch's distributed cases the driver runs, and the one list of cases that the
reference backend passes and ringreduce, knowingly, does not. Pure: no torch import."""

from __future__ import annotations

import re

PATTERNS: dict[str, str] = {
    "all-reduce": r"all_reduce|allreduce",
    "DDP": r"ddp|DistributedDataParallel",
    "comm hooks": r"hook",
    "futures": r"future",
    "no_sync": r"no_sync",
    "model averaging, post-local SGD (all-reduce of parameters)": r"averag|localSGD",
    "SyncBatchNorm (all-reduce of statistics)": r"SyncBatchNorm|sync_bn",
    "DDP-style gradient cases not named ddp": r"static_graph|unused|grads_same|grad_div",
    "coalesced all-reduce": r"coalescing_manager",
}
"""Name patterns (``re.search`` on the test method's name), each with what it covers."""

EXCLUDE: dict[str, str] = {}
"""Cases the patterns match that are cut, with the rule that cuts them."""

_MONITORED_BARRIER = (
    "cannot apply: torch's dist.monitored_barrier serves only groups whose backend is "
    "named gloo (ValueError 'monitored_barrier is only implemented for GLOO backend.')")

_BACKEND_NAME = (
    "cannot apply: asserts dist.get_backend() == BACKEND, and the suite is told the "
    "backend ringreduce stands on (cases.py says why); the group is rightly named "
    "'ringreduce'")

NOT_PASSED: dict[str, dict[str, str]] = {
    # Outside the default selection, seen with -k . (the whole suite): test_get_backend,
    # test_monitored_barrier_gloo*.
    "cpu": {
        "test_get_backend": _BACKEND_NAME,
        "test_monitored_barrier_gloo": _MONITORED_BARRIER,
        "test_monitored_barrier_gloo_subgroup": _MONITORED_BARRIER,
    },
    "cuda": {
        "test_get_backend": _BACKEND_NAME,  # expected as on CPU; not run on a GPU yet
    },
}
"""device -> case -> why the reference backend passes it and ringreduce does not. The
driver fails on any such case missing here; README.md shows this list."""


def select(names: list[str], pattern: str | None = None) -> list[str]:
    """Of torch's case names (``worker.py --list``, parametrized cases expanded), those
    matching ``PATTERNS`` (or ``pattern`` alone), less ``EXCLUDE``."""
    chosen = pattern if pattern is not None else "|".join(PATTERNS.values())
    return [n for n in names if re.search(chosen, n) and n not in EXCLUDE]
