"""FSDP2's gradient reduce-scatter through ringreduce's hierarchical engine.

    fully_shard(layer) for each layer; fully_shard(model)
    ringreduce.fsdp.apply(model, machines=None, wire=None)   # every FSDP module

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
FSDP module. HSDP's replicate all-reduce is not routed here (FSDP issues it itself).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ringreduce.engine import Communicator
from ringreduce.execution import quant

if TYPE_CHECKING:
    from torch import nn



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
    user's ``comm`` for every group, checked to match."""

    def __init__(self, comm: Communicator | None = None, **settings: Any) -> None:
        if comm is not None and settings:
            raise ValueError(f"settings {sorted(settings)} apply to communicators built here; "
                             "with comm= given, pass them to its constructor instead")
        self._given = comm
        self._settings = settings
        self._built: dict[str, Communicator] = {}

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

    def close(self) -> None:
        """Close the communicators built here (a given one stays its owner's)."""
        for comm in self._built.values():
            comm.close()
        self._built.clear()


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
    dtype on every hop), or ``"int8"``, ``"fp8"``, ``"int4"`` for a quantized rail hop
    with error feedback kept here, so use one object per FSDP module (``apply`` does)."""

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
        self._key = f"fsdp reduce_scatter {id(self)}"
        """This module's error-feedback key in its Communicator (one hook per module)."""
        self._used: list[Communicator] = []
        """The Communicators that keep feedback under the key."""

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
            if comm not in self._used:
                self._used.append(comm)
            fut = comm.reduce_scatter(output_tensor, input_tensor, op, async_op=async_op,
                                      wire=self.wire, feedback=self._key)
        if fut is None:
            return None
        # FSDP's interface returns a Work (FSDP itself passes no async_op); torch's own
        # Future-backed Work, as the DDP comm hook machinery makes them
        as_work = torch._C._distributed_c10d._create_work_from_future  # type: ignore[attr-defined]
        return as_work(fut)

    def reset_feedback(self) -> None:
        """Forget the error feedback (e.g. after loading a checkpoint)."""
        for comm in self._used:
            comm.reset_feedback(self._key)


def _premultiplied(input: torch.Tensor, op: Any) -> Any:
    """FSDP's ``PREMUL_SUM(f)`` (``set_gradient_divide_factor``) as NCCL runs it: every
    rank's input times f, then SUM; other ops unchanged."""
    if getattr(op, "op", None) != dist.ReduceOp.PREMUL_SUM:
        return op
    input.mul_(op.factor)  # FSDP's own buffer, read by nothing after the call
    return dist.ReduceOp.SUM


def apply(model: nn.Module, comm: Communicator | None = None, *, wire: str | None = None,
          **settings: Any) -> list[RingReduceScatter]:
    """Route the gradient reduce-scatter of every FSDP module of ``model`` (after
    ``fully_shard``) through ringreduce; returns the hooks, one per module. ``comm``: a
    Communicator over the shard group, or None to build one per shard group from
    ``settings`` (Communicator's keyword arguments: ``machines``, ``min_bytes``, ...)."""
    fsdp_module = _fsdp_module_class()
    comms = ShardGroupComms(comm, **settings)
    hooks = []
    for _, module in model.named_modules():
        if isinstance(module, fsdp_module):
            hook = RingReduceScatter(comms, wire=wire)
            module.set_custom_reduce_scatter(hook)
            hooks.append(hook)
    if not hooks:
        raise ValueError(f"{type(model).__name__} has no FSDP module: call fully_shard on its "
                         "layers and on it first, then ringreduce.fsdp.apply(model)")
    return hooks


def _fsdp_module_class() -> Any:
    """FSDP2's FSDPModule, refusing a torch without the custom reduce-scatter hook."""
    fsdp = importlib.import_module("torch.distributed.fsdp")
    module = getattr(fsdp, "FSDPModule", None)
    if module is None or not hasattr(module, "set_custom_reduce_scatter") or \
            _ReduceScatterBase is object:
        raise RuntimeError(f"torch {torch.__version__} has no FSDPModule."
                           "set_custom_reduce_scatter (added in torch 2.9); upgrade torch")
    return module
