"""What a saved Communicator state belongs to, and the check a load makes first.

Error feedback is per element of a rank's share of each bucket: which elements a rank
holds follows from the world, the machines, this rank's place, the wire format and its
block. A state loaded under any other of these would add its errors to other elements,
so ``load_state_dict`` refuses it before changing anything, naming each difference."""

from __future__ import annotations

from typing import Any

from ringreduce.config import Config
from ringreduce.plan.topology import Topology

FORMAT = 1
"""The layout of a saved state; a later change of it bumps this."""


def identity(topo: Topology, config: Config) -> dict[str, Any]:
    """The plain values that say whose a state is."""
    return {"format": FORMAT, "rank": topo.rank, "world_size": topo.world_size,
            "machines": topo.machines, "devices_per_machine": topo.devices_per_machine,
            "wire": config.wire, "wire_block": config.wire_block}


def rank_key(rank: int) -> str:
    """The one key of a saved state: its rank's. torch.distributed.checkpoint takes
    equal keys on every rank for one replicated value and keeps rank 0's alone, so a
    state under the same key on every rank would lose the others' feedback."""
    return f"rank {rank}"


def check(saved: Any, topo: Topology, config: Config) -> dict[str, Any]:
    """This rank's part of ``saved`` (``Communicator.state_dict()``'s result); ValueError
    unless it is a saved state of this rank, topology and wire."""
    if not isinstance(saved, dict) or len(saved) != 1 or \
            not str(next(iter(saved))).startswith("rank ") or \
            not isinstance(next(iter(saved.values())), dict):
        raise ValueError("load_state_dict takes what Communicator.state_dict() returned (one "
                         f"key, 'rank N', holding a dict), not {type(saved).__name__} "
                         f"{sorted(saved) if isinstance(saved, dict) else ''}")
    state = saved.get(rank_key(topo.rank))
    if state is None:
        raise ValueError(f"this ringreduce state is {sorted(saved)}'s, but this Communicator "
                         f"is rank {topo.rank}; load each rank's own state")
    if "format" not in state:
        raise ValueError(f"a saved ringreduce state has a 'format'; this one has {sorted(state)}")
    # torch.distributed.checkpoint keeps no empty container: none means empty
    state.setdefault("feedback", {})
    state.setdefault("ddp", {})
    want = identity(topo, config)
    differ = [f"{name}: saved {state.get(name)!r}, here {value!r}"
              for name, value in want.items() if state.get(name) != value]
    if differ:
        raise ValueError("this ringreduce state was saved by another rank, world, topology "
                         f"or wire than this Communicator's ({'; '.join(differ)}); load each "
                         "rank's own state into a Communicator built with the same settings")
    return state
