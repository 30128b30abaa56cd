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


def check(state: Any, topo: Topology, config: Config) -> None:
    """ValueError unless ``state`` is a saved state of this rank, topology and wire."""
    if not isinstance(state, dict) or not {"feedback", "ddp", "format"} <= set(state):
        raise ValueError("load_state_dict takes what Communicator.state_dict() returned (a "
                         f"dict with 'format', 'feedback' and 'ddp'), not {type(state).__name__}"
                         f" {sorted(state) if isinstance(state, dict) else ''}")
    want = identity(topo, config)
    differ = [f"{name}: saved {state.get(name)!r}, here {value!r}"
              for name, value in want.items() if state.get(name) != value]
    if differ:
        raise ValueError("this ringreduce state was saved by another rank, world, topology "
                         f"or wire than this Communicator's ({'; '.join(differ)}); load each "
                         "rank's own state into a Communicator built with the same settings")
