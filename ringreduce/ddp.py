"""DDP's gradient all-reduce through ringreduce, in one call.

    model = DDP(net)                                   # any process group
    comm = ringreduce.ddp.apply(model, wire="int8")    # the hook registered
    ...
    torch.save({"ringreduce": comm.state_dict(), ...}, f"ckpt{rank}.pt")

The twin of ``ringreduce.fsdp.apply``. A hook reduces over its Communicator's group,
whatever DDP's is: a Communicator over other ranks than the model's (DDP over the
world, the Communicator over pairs, or the reverse) lets the replicas drift apart or
averages over the wrong ranks without any error, as torch's own hooks would. ``apply``
builds the Communicator over ``model.process_group`` itself, or refuses a given one
over another group before registering anything.

Several models may share one Communicator (``apply(g, comm)``, ``apply(d, comm)``):
each keeps its own error feedback (execution/buckets.py), bit for bit what one
Communicator per model gives.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ringreduce.engine import Communicator
from ringreduce.integrations.hook import ddp_hook, state_error


def apply(model: DistributedDataParallel, comm: Communicator | None = None, *,
          wire: str | None = None, **settings: Any) -> Communicator:
    """Register ``ringreduce.ddp_hook`` on ``model`` (a DistributedDataParallel) and
    return its Communicator: ``comm``, checked to span ``model.process_group`` with this
    rank at the same place, or when None one built now over that group (collective over
    it) with ``wire`` and ``settings`` (Communicator's keyword arguments: ``machines``,
    ``min_bytes``, ...). The caller closes it (``comm.close()``) when done."""
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(f"ringreduce.ddp.apply takes a DistributedDataParallel, not "
                        f"{type(model).__name__}; wrap it first: DDP(model), then apply")
    group = model.process_group
    if comm is None:
        comm = Communicator(group, wire=wire, **settings)
    elif wire is not None or settings:
        given = sorted([*settings, *(["wire"] if wire is not None else [])])
        raise ValueError(f"settings {given} apply to a Communicator built here; with comm= "
                         "given, pass them to its constructor instead")
    elif not isinstance(comm, Communicator):
        raise TypeError(state_error(comm))
    else:
        _check_group(comm, group)
    model.register_comm_hook(comm, ddp_hook)
    return comm


def _check_group(comm: Communicator, group: dist.ProcessGroup) -> None:
    """``comm`` must reduce over DDP's group: the same ranks (global numbers), in order."""
    ours = comm._global_ranks
    theirs = tuple(dist.get_process_group_ranks(group))
    if ours is None:
        raise ValueError("this Communicator is the 'ringreduce' backend's engine, which has no "
                         "process group to check against DDP's; pass comm=None")
    if ours != theirs:
        raise ValueError(f"the Communicator reduces over global ranks {list(ours)}, but the "
                         f"model's DDP process group is ranks {list(theirs)}: its replicas "
                         "would not be averaged with each other; pass comm=None to have one "
                         "built over model.process_group, or build it with "
                         "ringreduce.Communicator(model.process_group)")
