"""``ringreduce.all_reduce``: the standalone call, with one Communicator per group.

The cache below is the one piece of module state in ringreduce, on purpose: a
Communicator owns NCCL communicators, streams and staging memory, so building one
per call would be collective and slow. Call ``release_cached()`` before destroying
the process group (or let process exit reclaim it).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from ringreduce.engine import Communicator

_communicators: dict[str, Communicator] = {}


def all_reduce(t: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: dist.ProcessGroup | None = None,
               async_op: bool = False) -> torch.futures.Future[torch.Tensor] | None:
    """Like ``dist.all_reduce(t, op, group, async_op)``, through a cached Communicator.

    The first call for a group is collective (it builds the Communicator with the
    settings of ``Config.from_env()``). On a rank outside ``group`` it does nothing
    and returns None, with torch's warning, as ``dist.all_reduce`` does."""
    if group is not None and group == dist.GroupMember.NON_GROUP_MEMBER:  # new_group's answer
        warnings.warn(f"Running all_reduce on global rank {dist.get_rank()} which does not "
                      "belong to the given group.", stacklevel=2)
        return None
    group = group or dist.group.WORLD
    key = getattr(group, "group_name", "") or "world"
    comm = _communicators.get(key)
    if comm is None:
        comm = _communicators[key] = Communicator(group)
    return comm.all_reduce(t, op=op, async_op=async_op)


def release_cached() -> None:
    """Close every cached Communicator (collective, like their construction)."""
    while _communicators:
        _, comm = _communicators.popitem()
        comm.close()
