"""Resuming from torch.distributed.checkpoint: the template a new process loads a saved
Communicator state into (execution/saved_state.py says what a state is and checks it)."""

from __future__ import annotations

import os
from typing import Any

import torch

from ringreduce.execution.saved_state import rank_key


def dcp_template(checkpoint_id: str | os.PathLike[str], rank: int,
                 prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """What ``torch.distributed.checkpoint.load`` fills with rank ``rank``'s saved
    Communicator state, from the checkpoint's own metadata: a new process has no
    feedback yet to offer as the template DCP loads into (its sizes come from the
    model's buckets). ``prefix``: the keys the state was saved under. Use::

        state = {"ringreduce": dcp_template(path, rank, ("ringreduce",))}
        dcp.load(state, checkpoint_id=path)
        comm.load_state_dict(state["ringreduce"])
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    metadata = FileSystemReader(checkpoint_id).read_metadata()
    paths = metadata.planner_data or {}
    want = (*prefix, rank_key(rank))
    out: dict[str, Any] = {}
    for fqn, meta in metadata.state_dict_metadata.items():
        path = tuple(paths.get(fqn, ()))
        if path[:len(want)] != want:
            continue
        value = torch.empty(meta.size, dtype=meta.properties.dtype) \
            if isinstance(meta, TensorStorageMetadata) else None
        node = out
        for part in path[len(prefix):-1]:
            node = node.setdefault(str(part), {})
        node[str(path[-1])] = value
    if not out:
        raise ValueError(f"the checkpoint {checkpoint_id} holds no ringreduce state of rank "
                         f"{rank} under {list(prefix)}; pass the keys it was saved under")
    return out
