"""Caller mistakes, caught before any communication: each raises TypeError or
ValueError with the rule, the value and the fix, and changes nothing."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64)
OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg",
       dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min"}
_BY_IDENTITY = tuple(OPS.items())
"""The usual spelling (``dist.ReduceOp.SUM``) is one of these very objects: found by
identity in a third of the time that hashing a pybind enum for the dict takes."""


def op_name(op: Any) -> str:
    """"sum", "avg", "max" or "min" for a supported ``dist.ReduceOp``: an enum value
    (``dist.ReduceOp.SUM``) or a ``dist.ReduceOp`` object wrapping one."""
    for known, known_name in _BY_IDENTITY:
        if op is known:
            return known_name
    kind = getattr(op, "op", op)  # a ReduceOp object (PREMUL_SUM's, the options') wraps its enum
    name = OPS.get(kind)
    if name is None:
        # the enum has a name; a ReduceOp object's repr is only its address
        readable = getattr(kind, "name", None)
        shown = f"ReduceOp.{readable}" if isinstance(readable, str) else repr(op)
        raise TypeError(f"op {shown} is not supported; use dist.ReduceOp.SUM, AVG, MAX or MIN")
    return name


def tensor(t: Any, call: str, name: str, device: torch.device) -> None:
    """A dense, contiguous tensor of a supported dtype on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{call} expects a torch.Tensor, got {type(t).__name__} for {name}")
    if t.is_sparse or t.layout != torch.strided:
        raise ValueError(f"{call} needs a dense tensor, got layout {t.layout}; "
                         "call .to_dense() first")
    if not t.is_contiguous():
        raise ValueError(f"{call} needs a contiguous tensor, got shape {tuple(t.shape)} "
                         f"with strides {t.stride()}; call .contiguous() and copy back")
    if t.device != device:
        raise ValueError(f"tensor is on {t.device}, this communicator works on "
                         f"{device}; move it with .to('{device}')")
    if t.dtype not in DTYPES:
        raise TypeError(f"dtype {t.dtype} is not supported; use one of "
                        f"{', '.join(str(d) for d in DTYPES)}")


def pair(output: Any, input: Any, call: str, world: int, device: torch.device,
         input_blocks: bool) -> None:
    """Both tensors valid and of one dtype; ``input_blocks``: input holds ``world``
    blocks the size of output (else the other way round)."""
    tensor(output, call, "output", device)
    tensor(input, call, "input", device)
    whole, block = (input, output) if input_blocks else (output, input)
    if whole.numel() != world * block.numel():
        raise ValueError(
            f"{call}: {'input' if input_blocks else 'output'} has {whole.numel()} elements, "
            f"it must have world_size x {block.numel()} = {world * block.numel()} "
            f"({world} blocks the size of {'output' if input_blocks else 'input'})")
    if output.dtype != input.dtype:
        raise TypeError(f"{call}: output is {output.dtype} but input is {input.dtype}; "
                        "use one dtype for both")
