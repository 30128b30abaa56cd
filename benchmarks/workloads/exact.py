"""Exactly representable inputs and their reference result, for tests and benchmarks.

Inputs are small integers, so every sum, max, min and average is exact in every
dtype; the expected result is computed locally from every rank's input (no
communication), in float64/int64, and compared bit for bit. The tests (tests/cases.py)
and the soak (benchmarks/soak.py) both check against it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringreduce.safety.checks import DTYPES
from ringreduce.safety.checks import OPS as _OP_NAMES

__all__ = ["DTYPES", "OPS", "expected", "rank_input"]

OPS = tuple(_OP_NAMES)
"""The supported ops, as ``dist.ReduceOp`` (the one table is safety.checks.OPS)."""


def rank_input(rank: int, n: int, dtype: torch.dtype, device: torch.device,
               salt: int = 0) -> torch.Tensor:
    """Integers in [-5, 5]: sums over 64 ranks stay exact even in bf16/fp16."""
    i = torch.arange(n, dtype=torch.int64)
    return (((i * 7 + rank * 3 + salt) % 11) - 5).to(dtype).to(device)


def expected(world: int, n: int, dtype: torch.dtype, op: object, device: torch.device,
             salt: int = 0) -> torch.Tensor:
    """Built on ``device`` (fast for the GPU soak's large tensors); the float AVG
    divides by a 0-dim tensor, which is IEEE division on CUDA too (a Python number
    would be a multiply by its rounded reciprocal there)."""
    wide = torch.int64 if not dtype.is_floating_point else torch.float64
    stack = torch.stack([rank_input(r, n, wide, device, salt) for r in range(world)])
    if op == dist.ReduceOp.MAX:
        out = stack.amax(0) if n else stack.sum(0)
    elif op == dist.ReduceOp.MIN:
        out = stack.amin(0) if n else stack.sum(0)
    elif op == dist.ReduceOp.AVG:
        s = stack.sum(0)
        out = (s / torch.full((), world, dtype=wide, device=device) if dtype.is_floating_point
               else torch.div(s, world, rounding_mode="trunc"))
    else:
        out = stack.sum(0)
    return out.to(dtype)
