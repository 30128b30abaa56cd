"""Custom HSDP's replicate all-reduce: the all-reduce hook ``ringreduce.fsdp.apply``
installs on each FSDP module when given ``replicate=`` (ringreduce/fsdp.py's docstring
says when torch calls it, and why not on a 2-D mesh)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ringreduce.engine import Communicator
from ringreduce.execution import quant

if TYPE_CHECKING:
    from torch import nn


class ReplicaAllReduce:
    """HSDP's replicate all-reduce through ``comm`` (a Communicator over the replicate
    group), for ``FSDPModule.set_all_reduce_hook`` of ``module``, sharded on the shard
    dimension alone (fsdp.py's docstring says why not on a 2-D mesh). In place, as
    torch requires: FSDP views the tensor as the gradient shards afterwards. ``wire``:
    None for the exact all-reduce, or a quantized format, with error feedback kept here
    where ``comm`` has ``hook_feedback=True`` (Config.hook_feedback: off by default, one
    knob for every hook; one object per module, as ``apply`` makes them).

    Every call all-reduces: without native HSDP, FSDP calls the hook even under
    ``set_requires_all_reduce(False)`` and adds the result to the gradient, so a call
    skipped would leave a shard unreduced."""

    def __init__(self, comm: Communicator, module: nn.Module, *,
                 wire: str | None = None) -> None:
        if wire is not None and wire not in quant.FORMATS:
            raise ValueError(f"wire={wire!r} is not a quantized wire format; use one of "
                             f"{tuple(quant.FORMATS)}, or None for the exact route")
        _division_settings(module)  # fails here, not mid-backward, on a torch without them
        self.comm, self.wire, self._module = comm, wire, module
        self._key: str | None = None
        """This module's feedback key in ``comm``, named at its first quantized call: the
        n-th such hook there, the same in every process (execution/buckets.Names)."""

    def __call__(self, reduce_output: torch.Tensor) -> None:
        """Unpipelined meaning: reduce_output = op(reduce_output of every replica),
        op as native HSDP's all-reduce (fsdp.py's docstring)."""
        factor_set, sum_only = _division_settings(self._module)
        op: Any = dist.ReduceOp.AVG
        if factor_set:
            op = dist.ReduceOp.SUM  # the user's factor is the whole division, as natively
        elif sum_only or reduce_output.dtype not in (torch.float32, torch.bfloat16):
            # FSDP divides by the shard group's size only: the replicas' share here,
            # before the sum (fp16 would overflow where the average does not)
            reduce_output.div_(self.comm.topology.world_size)
            op = dist.ReduceOp.SUM
        if self.wire is None or self.comm.topology.machines == 1:
            self.comm.all_reduce(reduce_output, op)
        else:
            self.comm.all_reduce(reduce_output, op, wire=self.wire, feedback=self._feedback())

    def _feedback(self) -> str | None:
        """The feedback key, named at the first quantized call that keeps feedback; None
        (no error feedback) unless ``comm`` has ``hook_feedback=True``, as DDP's hook."""
        if not self.comm.config.hook_feedback:
            return None
        if self._key is None:
            self._key = self.comm._feedback_name("fsdp all_reduce")
        return self._key

    def reset_feedback(self) -> None:
        """Forget the error feedback (none kept without ``hook_feedback``)."""
        if self._key is not None:
            self.comm.reset_feedback(self._key)


def _division_settings(module: nn.Module) -> tuple[bool, bool]:
    """(a gradient divide factor is set, SUM-only collectives) for ``module``, as
    ``set_gradient_divide_factor`` and ``set_force_sum_reduction_for_comms`` left its
    FSDP parameter groups. torch keeps them on private objects; read per call, since
    both may be set after ``apply``."""
    state = module._get_fsdp_state()  # type: ignore[operator]  # FSDPModule's
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # torch before per-parameter meshes: at most one group
        group = getattr(state, "_fsdp_param_group", None)
        groups = [] if group is None else [group]
    try:
        return (any(g.gradient_divide_factor is not None for g in groups),
                any(g.force_sum_reduction_for_comms for g in groups))
    except AttributeError as exc:
        raise RuntimeError(f"torch {torch.__version__}'s FSDP keeps no {exc.name} where "
                           "ringreduce reads it, so the replicate all-reduce cannot follow "
                           "its division; use native HSDP (a 2-D mesh) instead") from exc
