"""The torch.distributed backend "ringreduce": ``dist.init_process_group("ringreduce")``.

Fairring's users changed one string; so can ours. ``all_reduce``,
``reduce_scatter_tensor`` and ``all_gather_into_tensor`` on the group run through a
ringreduce Communicator (hierarchical across machines, NCCL's own below ``min_bytes``
or on one machine, exactly as a Communicator routes each). Every other collective goes
to NCCL for CUDA tensors and gloo for CPU tensors: the group registers both as its
per-device backends, so torch dispatches them natively. DDP needs no hook, because its
reducer calls the group's ``allreduce``; FSDP2 (``fully_shard``) needs none either: its
default reduce-scatter and all-gather call ``dist.reduce_scatter_single`` and
``dist.all_gather_single`` (torch 2.13; ``reduce_scatter_tensor`` and
``all_gather_into_tensor`` before), which reach the group's ``reduce_scatter_single``
and ``all_gather_single`` (``_reduce_scatter_base`` and ``_allgather_base`` before),
and HSDP's replicate all-reduce is a ``dist.all_reduce`` on a group of this backend.

Registered on ``import ringreduce`` (once per process). Needs torch >= 2.4 for
Python process groups with per-device backends (``ProcessGroup._register_backend``)
and ``_create_work_from_future``; tested on 2.11 (GPU) and 2.13 (CPU). The device
forms ``"cuda:ringreduce"`` and ``"cpu:gloo,cuda:ringreduce"`` work too, but give the
same group: torch lets a Python process group serve every device.

Exact, always: the backend's all-reduces (and reduce-scatters) keep the tensor's format
whatever RINGREDUCE_WIRE says (logged once when it is set), because every all-reduce
of the group goes through here, a user's metric ``[loss, correct, total]`` or a
SyncBatchNorm statistic as much as DDP's gradients, and a lossy format must touch only
what the user asked to compress. Compression is per model: ``ringreduce.ddp.apply(
model, wire="int8")`` (a hook), ``ringreduce.fsdp.apply``, or a
Communicator's call with ``wire=``.

A call the engine does not take (several tensors, another dtype or op such as
PREMUL_SUM or BAND, a sparse tensor) runs on the device's own backend; logged once
per collective and reason, never silent (FSDP2 all-gathers bytes, uint8, when a
module's parameters differ in dtype). A non-contiguous tensor is refused (ValueError)
before any communication, as NCCL's process group refuses it: gloo would write
outside the view. torch's functional collectives (DTensor's redistribute,
torch.compile) call the C++ group, whose Python trampoline offers neither
``reduce_scatter_single`` nor ``all_gather_single`` (torch 2.13): those stay the
device backend's.

The engine of a device is built at the group's first engine call on it, under a lock
(threads), collectively: every rank first publishes its settings and waits for every
other rank within the group's timeout (safety/agreement.py), so an absent rank is
named in a RingReduceError, ranks configured differently fail naming the field, and a
failed build can be retried at once. A group whose ranks are spread unevenly over
machines, or whose size RINGREDUCE_MACHINES does not divide, takes the flat route
(logged once). The engine's deadline is the group's timeout
(``init_process_group(timeout=...)``) unless RINGREDUCE_TIMEOUT is set.

The collectives torch's trampoline for Python process groups (``PyProcessGroup``)
routes through ``WORK_OVERRIDE`` are defined here and hand the call to the device's
backend directly. torch's fallback path calls the backend *holding the GIL*, and gloo
then deadlocks: its worker thread, holding the work queue's lock, drops the last
reference to a Python-owned tensor and waits for the GIL, while the caller waits for
that lock (a hang of ``barrier`` after ``all_gather`` in about one test run in ten;
gdb showed both stacks; ``test_other_collectives_are_the_backends_and_do_not_deadlock``
hangs within a few hundred rounds without this). The backend's own bindings release
the GIL before they take the lock. Left on torch's path: the coalesced all-gather and
reduce-scatter (``all_gather_single_coalesced``, ``reduce_scatter_single_coalesced``),
which gloo's Python binding does not offer to hand them to.
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from ringreduce.config import Config
from ringreduce.engine import Communicator
from ringreduce.errors import RingReduceError, stage_error
from ringreduce.integrations.dispatch import first_tensor, not_ours, refuse_views
from ringreduce.integrations.work import EngineWork, listed
from ringreduce.safety.agreement import STAGE

NAME = "ringreduce"
log = logging.getLogger("ringreduce")
_BackendType = dist.ProcessGroup.BackendType


class RingReduceGroup(dist.ProcessGroup):
    """A process group whose all-reduce is ringreduce's; built by torch's
    ``init_process_group`` / ``new_group`` through ``create``."""

    def __init__(self, store: dist.Store, rank: int, size: int,
                 timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the stub lists only (store, rank, size)
        self._store = store
        self._timeout = timeout
        self._engines: dict[str, Communicator] = {}
        self._builds: dict[str, int] = {}
        """Engine builds tried per device type: each attempt meets under a store prefix
        of its own, so a build that failed (a rank absent past the deadline) leaves
        nothing that a later attempt could trip over."""
        self._building = threading.Lock()
        """Two threads' first calls must not build two engines on one prefix."""
        self._delegated: set[tuple[str, str]] = set()
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        self._register_backend(torch.device("cpu"), _BackendType.GLOO, gloo)
        default = _BackendType.GLOO
        if torch.cuda.is_available() and dist.is_nccl_available():
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, size, options)
            self._register_backend(torch.device("cuda"), _BackendType.NCCL, nccl)
            default = _BackendType.NCCL
        self._set_default_backend(default)
        self._default_device = torch.device("cuda" if default == _BackendType.NCCL else "cpu")

    def getBackendName(self) -> str:
        return NAME

    def allreduce(  # type: ignore[override]  # torch's C++ calls it with (tensors, opts)
            self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else c10d.AllreduceOptions()
        refuse_views(tensors, "all_reduce")
        reason = f"{len(tensors)} tensors in one call" if len(tensors) != 1 else \
            not_ours(tensors, opts.reduceOp)
        if reason:
            device = tensors[0].device if tensors else self._default_device
            return self._delegate("all_reduce", "allreduce", (tensors, opts), device, reason)
        t = tensors[0]
        engine = self._engine(t.device)
        fut = engine.all_reduce(t, op=opts.reduceOp.op, async_op=True)
        assert fut is not None
        return EngineWork(listed(fut, t.device), engine)

    def _reduce_scatter(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> Any:
        """``dist.reduce_scatter_single`` (``reduce_scatter_tensor``) through
        Communicator.reduce_scatter: hierarchical at M > 1 and D > 1 from
        ``min_bytes``, the engine's flat route otherwise; ``input`` is left as it was,
        as NCCL leaves it."""
        opts = opts if opts is not None else c10d.ReduceScatterOptions()
        refuse_views((output, input), "reduce_scatter")
        reason = not_ours([output, input], opts.reduceOp)
        if reason:
            return self._delegate("reduce_scatter", "_reduce_scatter_base",
                                  (output, input, opts), input.device, reason)
        engine = self._engine(input.device)
        fut = engine.reduce_scatter(output, input, opts.reduceOp.op, async_op=True)
        assert fut is not None
        return EngineWork(listed(fut, input.device), engine)

    def _all_gather(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """``dist.all_gather_single`` (``all_gather_into_tensor``) through
        Communicator.all_gather, routed as the reduce-scatter; ``input`` may be this
        rank's block of ``output`` (FSDP2 gathers in place)."""
        opts = opts if opts is not None else c10d.AllgatherOptions()
        refuse_views((output, input), "all_gather")
        reason = not_ours([output, input], None)
        if reason:
            return self._delegate("all_gather", "_allgather_base", (output, input, opts),
                                  input.device, reason)
        engine = self._engine(input.device)
        fut = engine.all_gather(output, input, async_op=True)
        assert fut is not None
        return EngineWork(listed(fut, input.device), engine)

    def communicator(self, device: torch.device) -> Communicator:
        """The engine serving ``device``'s tensors (built on first use, collectively)."""
        return self._engine(device)

    def _engine(self, device: torch.device) -> Communicator:
        engine = self._engines.get(device.type)
        if engine is None:
            with self._building:
                engine = self._engines.get(device.type)
                if engine is None:
                    engine = self._build(device)
        return engine

    def _build(self, device: torch.device) -> Communicator:
        """The engine for ``device``'s tensors: built collectively at the group's first
        engine call on that device (CUDA: on the current device, which the user sets
        after creating the group as often as before). Its deadline is the group's
        timeout unless RINGREDUCE_TIMEOUT says otherwise."""
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        attempt = self._builds.get(device.type, 0)
        self._builds[device.type] = attempt + 1
        store = dist.PrefixStore(f"engine/{device.type}/{attempt}/", self._store)
        defaults: dict[str, object] = {"timeout_s": self._timeout.total_seconds()}
        config = Config.from_env(defaults)
        settings = self._machines_or_flat(config)
        if config.wire is not None and self.rank() == 0:
            log.warning("ringreduce backend: RINGREDUCE_WIRE=%s does not apply to the "
                        "'ringreduce' backend, whose all-reduces stay exact (a user's metric "
                        "or statistic must not be rounded); compress DDP's gradients with "
                        "ringreduce.ddp.apply(model, wire=%r) or register_comm_hook("
                        "ringreduce.Communicator(wire=%r), ringreduce.ddp_hook)",
                        config.wire, config.wire, config.wire)
        try:
            engine = Communicator._on_store(store, self.rank(), self.size(), device,
                                            defaults=defaults, exact=True, **settings)
        except (ValueError, TypeError, RingReduceError):
            raise
        except RuntimeError as exc:  # gloo's or NCCL's own: a peer left mid-build
            raise stage_error(STAGE, self.rank(), "the construction of the ringreduce "
                              f"backend's engine (attempt {attempt})", range(self.size()),
                              f"{exc}; call again on every rank to retry") from exc
        self._engines[device.type] = engine
        return engine

    def _machines_or_flat(self, config: Config) -> dict[str, object]:
        """RINGREDUCE_MACHINES applies to every group of the backend; a group whose size
        it does not divide (a pipeline stage of 3 ranks) is one flat machine: its calls
        take the flat route, as gloo and NCCL would run them."""
        machines = config.machines
        if machines is None or self.size() % machines == 0:
            return {}
        if self.rank() == 0:
            log.warning("ringreduce backend: RINGREDUCE_MACHINES=%d does not divide this "
                        "group's %d ranks; its engine calls take the flat route", machines,
                        self.size())
        return {"machines": 1}

    def _delegate(self, call: str, backend_method: str, args: tuple[Any, ...],
                  device: torch.device, reason: str) -> Any:
        """``call`` on ``device``'s own backend; logged once per call and reason."""
        if (call, reason) not in self._delegated:
            self._delegated.add((call, reason))
            log.warning("ringreduce backend: %s of %s runs on %s's own backend "
                        "(logged once per reason)", call, reason, device.type)
        backend: Any = self._get_backend(device)  # ProcessGroupGloo or -NCCL; not in the stub
        return getattr(backend, backend_method)(*args)

    def _backend_for(self, args: tuple[Any, ...]) -> Any:
        """The backend of the device of the first tensor in ``args`` (the default
        backend's device when there is none, as for ``barrier``)."""
        tensor = first_tensor(args)
        device = tensor.device if tensor is not None else self._default_device
        return self._get_backend(device)

    def shutdown(self) -> None:
        """Close the engines (``destroy_process_group`` calls this)."""
        while self._engines:
            _, engine = self._engines.popitem()
            engine.close()


# Process-group method -> the backend method that does the same work. These are the
# collectives torch's trampoline would run with the GIL held (see the module's
# docstring); names this torch does not have are skipped.
_TO_BACKEND = {
    "allgather": "allgather",
    "allreduce_coalesced": "allreduce_coalesced",
    "all_to_all_single": "alltoall_base",
    "alltoall_base": "alltoall_base",
    "barrier": "barrier",
    "broadcast": "broadcast",
    "reduce_scatter": "reduce_scatter",
    "send": "send",
    "recv": "recv",
}


def _to_backend(backend_method: str) -> Any:
    def method(self: RingReduceGroup, *args: Any, **kwargs: Any) -> Any:
        backend = self._backend_for((args, tuple(kwargs.values())))
        return getattr(backend, backend_method)(*args, **kwargs)
    return method


for _name, _backend_method in _TO_BACKEND.items():
    if hasattr(dist.ProcessGroup, _name):
        setattr(RingReduceGroup, _name, _to_backend(_backend_method))

# Process-group method -> the engine's. torch 2.13's dist.reduce_scatter_single and
# all_gather_single (reduce_scatter_tensor and all_gather_into_tensor call them) use the
# first two names; older torch's reduce_scatter_tensor and all_gather_into_tensor the
# last two. The list forms (dist.reduce_scatter, dist.all_gather) stay gloo's and
# NCCL's: FSDP2 does not call them.
_TO_ENGINE = {
    "reduce_scatter_single": RingReduceGroup._reduce_scatter,
    "all_gather_single": RingReduceGroup._all_gather,
    "_reduce_scatter_base": RingReduceGroup._reduce_scatter,
    "_allgather_base": RingReduceGroup._all_gather,
}
for _name, _method in _TO_ENGINE.items():
    if hasattr(dist.ProcessGroup, _name):
        setattr(RingReduceGroup, _name, _method)


def create(store: dist.Store, rank: int, size: int,
           timeout: datetime.timedelta) -> RingReduceGroup:
    return RingReduceGroup(store, rank, size, timeout)


def register() -> None:
    """Make "ringreduce" a torch.distributed backend; a second call does nothing."""
    if NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(NAME, create, devices=["cpu", "cuda"])
