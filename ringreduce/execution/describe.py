"""What a Communicator says about itself, once, on rank 0 at construction: its
effective configuration in one line (``Communicator.describe``), and a warning when a
group of several ranks can only take the flat route."""

from __future__ import annotations

from ringreduce.config import Config
from ringreduce.execution import quant
from ringreduce.execution.resources import Resources
from ringreduce.plan.topology import Topology


def describe(res: Resources, config: Config) -> str:
    """The effective configuration, one line (logged once on rank 0)."""
    t, r, c = res.topo, res, config
    return (f"{t.machines} machines x {t.devices_per_machine} devices, "
            f"{'cuda (nccl ' + str(r.nccl_version) + ')' if r.is_cuda else 'cpu (gloo)'}, "
            f"{r.plan.summary}, "
            f"slice_bytes={_slice_range(r)}, staging_bytes={c.staging_bytes} "
            f"({r.staging_slots} slots), min_bytes={c.min_bytes}, "
            f"wire={_wire_text(c)}, diffuse_gather={int(c.diffuse_gather)}, "
            f"check_call_end={int(r.call_check is not None)}, "
            f"issuer={r.native.mode if r.native is not None else 'python'}")


def flat_note(topo: Topology, config: Config, host: str) -> str:
    """What to tell the user when a group of several ranks takes only the flat route
    ("" when the hierarchy serves it)."""
    if topo.flat_reason:
        return f"every call takes the flat all-reduce: {topo.flat_reason}"
    if topo.machines > 1 or topo.world_size == 1 or config.machines is not None:
        return ""
    return (f"all {topo.world_size} ranks of this group are on one machine ({host!r}), so "
            "every call takes NCCL's (gloo's) own all-reduce, the fastest there; to emulate "
            "K machines on one host pass machines=K (RINGREDUCE_MACHINES) or give each "
            "machine's ranks their own NCCL_HOSTID")


def _wire_text(config: Config) -> str:
    """The wire format for describe()."""
    if config.wire is None:
        return "tensor dtype"
    return f"{config.wire} (blocks of {config.wire_block})" if config.wire in quant.FORMATS \
        else config.wire


def _slice_range(res: Resources) -> str:
    """``4194304``, or ``1048576..4194304`` when the slice size follows the call size."""
    low, high = res.smallest_slice_bytes, res.slice_bytes
    return f"{low}..{high}" if 0 < low < high else str(high)
