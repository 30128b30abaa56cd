"""Everything a Communicator holds: topology, transport, streams, events, buffers.

Built once, collectively, at construction. Machines are found by exchanging host
identities through the process group's store; NCCL communicators are split from one
world communicator whose unique id travels through the same store (cuda_setup.py
makes and closes them; this module owns the Resources, the CPU's gloo groups, and
what a failure, wait_idle and close do with all of it).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ringreduce.config import Config
from ringreduce.errors import RingReduceError
from ringreduce.execution import cuda_setup, probe
from ringreduce.execution.call_check import HostCallCheck
from ringreduce.execution.pipeline import Buffers
from ringreduce.execution.streams import HostOrder
from ringreduce.execution.transport import GlooTransport
from ringreduce.plan import layout, slicing, topology
from ringreduce.plan.topology import Topology
from ringreduce.safety.flight import FlightRecorder, Record
from ringreduce.safety.guard import Guard
from ringreduce.safety.watchdog import Issue, Watchdog

log = logging.getLogger("ringreduce")
_ABORT_LOCK_WAIT_S = 2.0
"""How long a failure waits for the issuing thread to leave NCCL before aborting anyway:
a healthy issue (a few hundred microseconds) is long done by then."""
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@dataclass
class Resources:
    topo: Topology
    is_cuda: bool
    device: torch.device
    slice_bytes: int
    staging_slots: int
    transport: Any
    sync: Any
    buffers: Buffers
    nccl_version: int = 0
    guard: Any = None
    kernels: Any = None
    """native/ kernels (CUDA with cupy); None: the add stage uses torch ops."""
    rank_order: Any = None
    """int64 indices of the group's ranks in (device, machine) order, on ``device``."""
    release_steps: list[Any] = field(default_factory=list)
    comms: dict[str, Any] = field(default_factory=dict)
    """NCCL communicators by stage (CUDA), aborted together on a failure."""
    watchdog: Watchdog | None = None
    issue_lock: threading.RLock = field(default_factory=threading.RLock)
    """Held while a call makes NCCL calls: NCCL forbids aborting a communicator while
    another thread is inside an NCCL call on it."""
    aborted: bool = False
    user_captures: int = 0
    """Calls issued while the caller was capturing a CUDA graph of its own."""
    divisors: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    """World size as a 0-dim tensor per float dtype, made once: AVG divides by it."""
    smallest_slice_bytes: int = 0
    """Config.smallest_slice_bytes: a small call's slices (call_slice_bytes); 0: every
    call's are ``slice_bytes``."""
    native: Any = None
    """The native issuer (native.NativeIssuer: replays a pipelined call's NCCL calls
    from C++ on the caller's thread); None: every call is issued from Python."""
    call_check: Any = None
    """The end-of-call check (call_check.py, Config.check_call_end); None: off."""
    plan: slicing.Choice = slicing.CPU_DEFAULT
    """How hierarchical all-reduces are issued, and why (execution/probe.py)."""
    probe_calls: int = 0
    """Calls the construction probe made (numbered before the user's)."""
    issuing: tuple[Record, float] | None = None
    """The call being issued and since when (time.monotonic()); None between calls."""

    def call_slice_bytes(self, nbytes: int) -> int:
        """The slice size of a call of ``nbytes`` (plan/layout.call_slice_bytes)."""
        smallest = self.smallest_slice_bytes or self.slice_bytes  # 0: one size (the field)
        return layout.call_slice_bytes(nbytes, self.slice_bytes, smallest,
                                       self.topo.devices_per_machine, self.topo.machines)

    def stuck_issue(self) -> Issue | None:
        """For the watchdog: the call being issued (blocking NCCL calls wait inside it
        while they connect to a peer), or None."""
        issuing = self.issuing  # one read: the issuing thread clears it concurrently
        if issuing is None:
            return None
        record, since = issuing
        stage = getattr(self.transport, "stage", "-")
        return Issue(record.op_number, f"{record.kind} of {record.numel} x {record.dtype}",
                     stage, self.topo.peers(stage), since)

    def fail(self, exc: RingReduceError, record: Record | None) -> None:
        """A failed operation: poison the Guard (dumps the flight recorder), abort every
        NCCL communicator so that kernels waiting for a dead peer exit. Idempotent."""
        # The issuing thread may itself be stuck inside NCCL or a kernel launch (a full
        # launch queue behind kernels that wait for a dead peer): then the lock never
        # frees, and only the abort can unstick it. torch's watchdog aborts regardless.
        locked = self.issue_lock.acquire(timeout=_ABORT_LOCK_WAIT_S)
        try:
            self.guard.fail(exc, record)
            if self.comms and not self.aborted:
                self.aborted = True
                if self.native is not None and not self.native.stop():
                    log.warning("ringreduce: aborting while the native issuer is inside "
                                "NCCL or CUDA (stuck behind the failed operation)")
                if not locked:
                    log.warning("ringreduce: aborting while the issuing thread is inside "
                                "NCCL or CUDA (stuck behind the failed operation)")
                cuda_setup.abort_together(self.comms, self.device)
        finally:
            if locked:
                self.issue_lock.release()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """CUDA: until issued work finished (True) or ``timeout_s`` (False); raises the
        watchdog's RingReduceError after a failure."""
        self.guard.check_usable()
        return self.watchdog.wait_idle(timeout_s) if self.watchdog is not None else True

    def release(self) -> None:
        """Teardown (close): after a failure nothing is left to destroy (aborted);
        otherwise let issued work finish, then destroy."""
        if self.native is not None:
            self.native.close()  # refuses further jobs (every issued one is on the device)
        if self.watchdog is not None:
            if self.guard.failure is None:
                with contextlib.suppress(RingReduceError):  # on_failure aborted everything
                    self.watchdog.wait_idle()
            self.watchdog.stop()
        if self.aborted or self.guard.failure is not None:
            self.release_steps.clear()
            return
        self.sync.synchronize()
        if self.captured():
            gc.collect()  # graphs the caller dropped may still sit in reference cycles
            torch.cuda.synchronize(self.device)  # and their replays must have ended
        for step in self.release_steps:
            step()
        self.release_steps.clear()

    def captured(self) -> int:
        """How many calls were captured into the caller's CUDA graphs."""
        return self.user_captures


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
    recorder = FlightRecorder(config.flight_records, rank, config.flight_file)
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
