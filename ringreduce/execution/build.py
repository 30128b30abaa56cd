"""Building a Communicator's Resources: collective, once, at construction.

Machines are found by exchanging host identities through the process group's store;
NCCL communicators are split from one world communicator whose unique id travels
through the same store (cuda_setup.py makes and closes them); the CPU path's gloo
groups are made here. The plan comes last but one (probe.py), then the native issuer.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from ringreduce.config import Config, host_identity
from ringreduce.execution import cuda_setup, probe
from ringreduce.execution.buffers import Buffers
from ringreduce.execution.call_check import HostCallCheck
from ringreduce.execution.gloo_transport import GlooTransport
from ringreduce.execution.resources import Resources
from ringreduce.execution.streams import HostOrder
from ringreduce.plan import layout, slicing, topology
from ringreduce.plan.topology import Topology
from ringreduce.safety.flight import RECORDS, FlightRecorder
from ringreduce.safety.guard import Guard

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def build_resources(store: dist.Store, rank: int, world: int, device: torch.device,
                    config: Config, hosts: list[str]) -> Resources:
    """Everything for one communicator of ``world`` ranks meeting in ``store`` (a
    namespace of its own), on machines told apart by ``hosts`` (every rank's identity,
    agreed in safety/agreement.meet): collective, every rank calls it with its
    ``rank``."""
    topo = topology.from_host_ids(hosts, rank)
    is_cuda = device.type == "cuda"
    slice_bytes = config.resolved_slice_bytes(topo.devices_per_machine, topo.machines)
    slot_bytes, slots = layout.staging_geometry(topo.devices_per_machine, topo.machines,
                                                slice_bytes, config.staging_bytes)
    buffers = Buffers(topo, slot_bytes, slots if topo.machines > 1 else 0,
                      layout.PADDING_SLOTS, device)
    res = Resources(topo, is_cuda, device, slice_bytes, slots, None, None, buffers,
                    smallest_slice_bytes=config.smallest_slice_bytes(topo.devices_per_machine,
                                                                     topo.machines))
    recorder = FlightRecorder(RECORDS, rank, config.flight_file)
    res.guard = Guard(store, rank, world, config.timeout_s, recorder)
    res.rank_order = _rank_order(topo, device)
    if is_cuda:
        cuda_setup.build_cuda(res, store, config)
    else:
        _build_cpu(res, store, datetime.timedelta(seconds=config.timeout_s), config.diffuse_gather)
        res.call_check = HostCallCheck() if config.check_call_end else None
    res.divisors = _divisors(world, device)
    res.plan = probe.plan_without_probe(res, config) or slicing.UNDECIDED
    if is_cuda:  # last, as ever: what the native issuer traces reads them
        cuda_setup.build_native(res, config)
    return res


def group_store(group: dist.ProcessGroup) -> dist.Store:
    """A store namespace unique to this communicator: the n-th construction on a group
    gets instance n on every rank. Each rank counts its own constructions (a key per
    rank), so ranks that fail fast and try again cannot shift a slower rank onto
    another instance, as one shared counter did."""
    base = dist.distributed_c10d._get_default_store()
    name = getattr(group, "group_name", "") or "world"
    instance = base.add(f"ringreduce/{name}/instances/{dist.get_rank()}", 1) - 1
    return dist.PrefixStore(f"ringreduce/{name}/{instance}/", base)


def device_of(group: dist.ProcessGroup) -> torch.device:
    """CUDA when the group can run NCCL (its backend is nccl, or ringreduce's own with
    GPUs present), on the current device, as torch's NCCL group does; else the CPU."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend or ("ringreduce" in backend and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def host_of(config: Config, rank: int, world: int) -> str:
    """This rank's host identity: its virtual machine with ``machines=K`` (the group's
    ranks in K machines of contiguous ranks), else the real host's (NCCL_HOSTID, or
    host name and boot id)."""
    if config.machines is not None:
        return topology.virtual_host(rank, world, config.machines)
    return host_identity()


def _rank_order(topo: Topology, device: torch.device) -> torch.Tensor:
    """Group ranks in (device, machine) order: row d*M + m of a (D, M, n) view belongs
    to rank ``ranks[m][d]`` (hierarchical reduce-scatter and all-gather regroup their
    blocks with it). Built once, so no call copies indices from the host."""
    order = [topo.ranks[m][d] for d in range(topo.devices_per_machine)
             for m in range(topo.machines)]
    return torch.tensor(order, dtype=torch.int64).to(device)


def _divisors(world: int, device: torch.device) -> dict[torch.dtype, torch.Tensor]:
    """Made once and waited for here, at construction, so that calls on any stream
    may read them without a fill kernel (or a host copy) per AVG call."""
    made = {dtype: torch.full((), world, dtype=dtype, device=device) for dtype in _FLOATS}
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    return made


def _build_cpu(res: Resources, store: dist.Store, timeout: datetime.timedelta,
               gathers: bool) -> None:
    """gloo groups made directly on the store (no torch.distributed registration, so
    the same code serves the "ringreduce" backend, which is built before the default
    group exists), each with ringreduce's own deadline: a dead or absent peer turns
    into an error after ``timeout`` instead of the user group's (30 min default).
    A rank makes only the groups it belongs to; ranks inside are group-local."""
    topo = res.topo

    def gloo(name: str, ranks: tuple[int, ...]) -> dist.ProcessGroupGloo:
        sub = dist.PrefixStore(f"gloo/{name}/", store)
        return dist.ProcessGroupGloo(sub, ranks.index(topo.rank), len(ranks), timeout)

    groups = {"world": gloo("world", tuple(range(topo.world_size)))}
    if topo.devices_per_machine > 1:
        groups["intra"] = gloo(f"intra{topo.machine_index}", topo.intra_ranks())
    if topo.machines > 1:
        groups["rail"] = gloo(f"rail{topo.device_index}", topo.rail_ranks())
    res.transport = GlooTransport(topo, groups, gathers)
    res.sync = HostOrder()
