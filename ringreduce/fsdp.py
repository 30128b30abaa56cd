"""FSDP2's gradient reduce-scatter (and HSDP's replicate all-reduce) through ringreduce.

    fully_shard(layer) for each layer; fully_shard(model)
    ringreduce.fsdp.apply(model, machines=None, wire=None)   # every FSDP module
    ringreduce.fsdp.apply(model, replicate=mesh["replicate"].get_group())  # custom HSDP

FSDP2 (``torch.distributed.fsdp.fully_shard``, torch >= 2.9) calls its ``ReduceScatter``
once per FSDP module and backward, on its reduce-scatter stream, as

    comm(output_tensor=out, input_tensor=inp, group=shard_group, op=op)

``inp``: one flat buffer of the module's gradients in FSDP's padded layout, N equal
blocks in shard-group rank order (block r: every parameter's dim-0 chunk r, each padded
to an equal size); ``out``: block ``rank``'s reduction, which FSDP then views as this
rank's gradient shards (written in place: FSDP ignores the return value). ``op``: AVG
for fp32/bf16 reductions, SUM when FSDP divides itself (fp16: before and after, against
overflow; ``force_sum_reduction_for_comms``), ``PREMUL_SUM(1/f)`` for
``set_gradient_divide_factor(f)``. That is exactly ``Communicator.reduce_scatter``'s
contract, so the exact route hands the call to it: reduce-scatter inside the machine,
then along the rail (execution/collectives.py). With ``wire="int8" | "fp8" | "int4"``
the rail hop is quantized (execution/compressed_scatter.py), with error feedback per
FSDP module where the Communicator it reduces through has ``hook_feedback=True`` (off by
default, as for the DDP hook: Config.hook_feedback says why).

HSDP's replicate all-reduce. On a 2-D mesh ("native" HSDP: ``fully_shard(mesh=mesh)``
with mesh dimensions (replicate, shard)) FSDP issues it itself, ``dist.all_reduce`` on
the replicate group, and ``set_all_reduce_hook`` cannot replace it: torch runs the hook
*after* that all-reduce, on its output (``foreach_reduce`` in torch 2.13; so since the
hook came, pytorch#147114). That all-reduce is ringreduce's only where the replicate
group is the "ringreduce" backend's; ``apply`` says so once. The hook's own use is
torch's "custom HSDP": shard on the shard dimension alone, ``fully_shard(mesh=
mesh["shard"])``, and pass ``replicate=mesh["replicate"].get_group()`` (or a
Communicator over it). FSDP then runs no all-reduce and calls the hook with the
reduce-scatter's output, on its all-reduce stream after the reduce-scatter's; the
hook all-reduces it in place there (a Communicator call orders itself after the
caller's stream, and the caller's stream after it) with native HSDP's operation: AVG
in fp32 and bf16, native HSDP's result bit for bit where the sums are exact; SUM
after ``set_gradient_divide_factor``; a division by the replica count, then SUM, for
fp16 or ``set_force_sum_reduction_for_comms`` (FSDP's own division then covers the
shard group only: the same average, rounded differently from native HSDP's). The
hook is ReplicaAllReduce, in integrations/hsdp.py.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ringreduce.engine import Communicator
from ringreduce.execution import quant
from ringreduce.integrations.hsdp import ReplicaAllReduce

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger("ringreduce")


def _reduce_scatter_base() -> Any:
    """FSDP2's ``ReduceScatter`` ABC (torch >= 2.9); ``object`` before it, so that
    importing ringreduce works on any torch (``apply`` says what is missing)."""
    try:
        api = importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_api")
    except ImportError:
        return object
    return getattr(api, "ReduceScatter", object)


_ReduceScatterBase: Any = _reduce_scatter_base()


class ShardGroupComms:
    """One Communicator per FSDP shard group, shared by the modules of a model: built
    on the group's first reduce-scatter (collective: every rank of the group reaches it
    at the same call) with ``settings`` (Communicator's keyword arguments), or the
    user's ``comm`` for every group, checked to match. ``replicate``: the one over
    HSDP's replicate group, when ``apply`` routes that all-reduce."""

    def __init__(self, comm: Communicator | None = None, **settings: Any) -> None:
        if comm is not None and settings:
            raise ValueError(f"settings {sorted(settings)} apply to communicators built here; "
                             "with comm= given, pass them to its constructor instead")
        self._given = comm
        self._settings = settings
        self._built: dict[str, Communicator] = {}
        self.replicate: Communicator | None = None
        self._owns_replicate = False

    def set_replicate(self, replicate: dist.ProcessGroup | Communicator) -> Communicator:
        """The communicator over the replicate group: ``replicate`` itself, or one built
        on that group now with this object's settings (collective over the group)."""
        if isinstance(replicate, Communicator):
            self.replicate = replicate
        else:
            self.replicate = Communicator(replicate, **self._settings)
            self._owns_replicate = True
        return self.replicate

    def get(self, group: dist.ProcessGroup) -> Communicator:
        """The communicator over ``group``."""
        if self._given is not None:
            _check_matches(self._given, group)
            return self._given
        name = group.group_name
        comm = self._built.get(name)
        if comm is None:
            comm = self._built[name] = Communicator(group, **self._settings)
        return comm

    def communicators(self) -> dict[str, Communicator]:
        """The communicators in use: those built here by shard group name, the given one
        under ``"given"``, the replicate group's under ``"replicate"``: for counting
        their calls (``op_number``) or ``describe()``."""
        comms = dict(self._built)
        if self._given is not None:
            comms["given"] = self._given
        if self.replicate is not None:
            comms["replicate"] = self.replicate
        return comms

    def close(self) -> None:
        """Close the communicators built here (given ones stay their owner's)."""
        for comm in self._built.values():
            comm.close()
        self._built.clear()
        if self.replicate is not None and self._owns_replicate:
            self.replicate.close()
        self.replicate = None


def _check_matches(comm: Communicator, group: dist.ProcessGroup) -> None:
    """A given communicator must span FSDP's shard group: the same size and this rank's
    place in it (a communicator over another group would scatter into wrong shards)."""
    topo = comm.topology
    size, rank = group.size(), dist.get_rank(group)
    if (topo.world_size, topo.rank) != (size, rank):
        raise ValueError(f"the communicator spans {topo.world_size} ranks with this one at "
                         f"{topo.rank}, but FSDP's shard group has {size} with it at {rank}; "
                         "build it on the shard group (mesh.get_group() of the shard "
                         "dimension), or pass comm=None to have one built per group")


class RingReduceScatter(_ReduceScatterBase):
    """FSDP2's reduce-scatter through a ringreduce Communicator, for
    ``FSDPModule.set_custom_reduce_scatter``. ``comms``: a Communicator over the shard
    group, the ShardGroupComms shared by a model's modules, or None (one built per
    group from ``settings``). ``wire``: None for the exact route (the gradient's own
    dtype on every hop), or ``"int8"``, ``"fp8"``, ``"int4"`` for a quantized rail hop;
    where the Communicator has ``hook_feedback=True`` (Config.hook_feedback, one knob for
    every hook) error feedback is kept per object, so use one object per FSDP module
    (``apply`` does)."""

    def __init__(self, comms: Communicator | ShardGroupComms | None = None, *,
                 wire: str | None = None, **settings: Any) -> None:
        if wire is not None and wire not in quant.FORMATS:
            raise ValueError(f"wire={wire!r} is not a quantized wire format; use one of "
                             f"{tuple(quant.FORMATS)}, or None for the exact route")
        if isinstance(comms, ShardGroupComms):
            if settings:
                raise ValueError(f"settings {sorted(settings)} go to ShardGroupComms(...)")
            self.comms = comms
        else:
            self.comms = ShardGroupComms(comms, **settings)
        self.wire = wire
        self._keys: list[tuple[Communicator, str]] = []
        """This module's error-feedback key in each Communicator it reduces through,
        named at its first quantized call there that keeps feedback: the n-th such hook of that
        Communicator, the same in every process, so a saved state finds it again
        (``Communicator.state_dict``; execution/buckets.Names)."""
        self.replicate: ReplicaAllReduce | None = None
        """This module's replicate all-reduce, when ``apply`` routes it (custom HSDP)."""

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP's buffers: plain tensors (the engine needs no special memory)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any,
                 async_op: bool = False) -> dist.Work | None:
        comm = self.comms.get(group)
        op = _premultiplied(input_tensor, op)
        if self.wire is None or comm.topology.machines == 1:
            # one machine has no rail to compress: the exact route, NCCL's own there
            fut = comm.reduce_scatter(output_tensor, input_tensor, op, async_op=async_op)
        else:
            fut = comm.reduce_scatter(output_tensor, input_tensor, op, async_op=async_op,
                                      wire=self.wire, feedback=self._feedback_in(comm))
        if fut is None:
            return None
        # FSDP's interface returns a Work (FSDP itself passes no async_op); torch's own
        # Future-backed Work, as the DDP comm hook machinery makes them
        as_work = torch._C._distributed_c10d._create_work_from_future  # type: ignore[attr-defined]
        return as_work(fut)

    def _feedback_in(self, comm: Communicator) -> str | None:
        """This module's feedback key in ``comm``, or None (no error feedback) unless
        ``comm`` was built with ``hook_feedback=True``: the knob the DDP hook follows."""
        if not comm.config.hook_feedback:
            return None
        for used, key in self._keys:
            if used is comm:
                return key
        key = comm._feedback_name("fsdp reduce_scatter")
        self._keys.append((comm, key))
        return key

    def reset_feedback(self) -> None:
        """Forget the error feedback, the replicate all-reduce's too (none kept without
        ``hook_feedback``: then nothing to forget)."""
        for comm, key in self._keys:
            comm.reset_feedback(key)
        if self.replicate is not None:
            self.replicate.reset_feedback()


def _premultiplied(input: torch.Tensor, op: Any) -> Any:
    """FSDP's ``PREMUL_SUM(f)`` (``set_gradient_divide_factor``) as NCCL runs it: every
    rank's input times f, then SUM; other ops unchanged."""
    if getattr(op, "op", None) != dist.ReduceOp.PREMUL_SUM:
        return op
    input.mul_(op.factor)  # FSDP's own buffer, read by nothing after the call
    return dist.ReduceOp.SUM


def apply(model: nn.Module, comm: Communicator | None = None, *, wire: str | None = None,
          replicate: dist.ProcessGroup | Communicator | None = None,
          **settings: Any) -> list[RingReduceScatter]:
    """Route the gradient reduce-scatter of every FSDP module of ``model`` (after
    ``fully_shard``) through ringreduce; returns the hooks, one per module. ``comm``: a
    Communicator over the shard group, or None to build one per shard group from
    ``settings`` (Communicator's keyword arguments: ``machines``, ``min_bytes``, ...).

    ``replicate``: HSDP's replicate group (``mesh["replicate"].get_group()``), or a
    Communicator over it, for a model sharded on ``mesh["shard"]`` alone: each module's
    all-reduce hook then all-reduces its gradient shards across the replicas, with
    ``wire`` too (``hook.replicate``). A group gets a Communicator built now from
    ``settings`` (collective over it); pass a Communicator for other settings there.
    Error feedback on the quantized wire follows the ``hook_feedback`` of each
    Communicator a hook reduces through (off by default), as the DDP hook's does:
    ``hook_feedback=True`` in ``settings`` turns it on in those built here.
    The shard group's Communicators get the same ``settings``: in custom HSDP that group
    is usually one machine, which detection finds; where ``machines=`` (or
    ``RINGREDUCE_MACHINES``) splits ranks into virtual machines, pass both Communicators
    built as you mean them. ``hooks[0].comms.communicators()`` lists them all.
    Refused for a model on a 2-D mesh, whose replicate all-reduce FSDP runs itself."""
    fsdp_module = _fsdp_module_class()
    modules = [m for m in model.modules() if isinstance(m, fsdp_module)]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no FSDP module: call fully_shard on its "
                         "layers and on it first, then ringreduce.fsdp.apply(model)")
    native = _native_replicate_group(model)
    if replicate is not None and native is not None:
        raise ValueError("the model is sharded on a 2-D mesh (native HSDP): FSDP all-reduces "
                         "across replicas itself and runs an all-reduce hook after that, so "
                         "replicate= would all-reduce twice; shard on mesh['shard'] alone to "
                         "pass replicate=, or leave it out")
    if native is not None:
        _note_native(native)
    comms = ShardGroupComms(comm, **settings)
    replica_comm = None if replicate is None else comms.set_replicate(replicate)
    hooks = []
    for module in modules:
        hook = RingReduceScatter(comms, wire=wire)
        module.set_custom_reduce_scatter(hook)
        if replica_comm is not None:
            hook.replicate = ReplicaAllReduce(replica_comm, module, wire=wire)
            module.set_all_reduce_hook(hook.replicate)
        hooks.append(hook)
    return hooks


def _native_replicate_group(model: nn.Module) -> dist.ProcessGroup | None:
    """The replicate group of a model that FSDP shards as native HSDP (its parameters'
    first mesh dimension replicates: FSDP's (Replicate(), Shard(0))), else None."""
    from torch.distributed.tensor import DTensor
    for p in model.parameters():
        if isinstance(p, DTensor) and p.device_mesh.ndim > 1 and p.placements[0].is_replicate():
            return p.device_mesh.get_group(0)
    return None


def _note_native(group: dist.ProcessGroup) -> None:
    """Say, once per ``apply``, whose the native HSDP all-reduce is: a documented
    decision, not a silent one."""
    backend = str(dist.get_backend(group))
    if backend == "ringreduce" or dist.get_rank() != 0:
        return
    log.warning("ringreduce.fsdp: HSDP's replicate all-reduce stays FSDP's own "
                "dist.all_reduce on its %s group (torch runs an all-reduce hook after it, "
                "not instead); to route it through ringreduce, shard on mesh['shard'] and "
                "pass replicate=mesh['replicate'].get_group(), or build the mesh on the "
                "'ringreduce' backend", backend)


def _fsdp_module_class() -> Any:
    """FSDP2's FSDPModule, refusing a torch without the custom reduce-scatter hook."""
    fsdp = importlib.import_module("torch.distributed.fsdp")
    module = getattr(fsdp, "FSDPModule", None)
    if module is None or not hasattr(module, "set_custom_reduce_scatter") or \
            _ReduceScatterBase is object:
        raise RuntimeError(f"torch {torch.__version__} has no FSDPModule."
                           "set_custom_reduce_scatter (added in torch 2.9); upgrade torch")
    return module
