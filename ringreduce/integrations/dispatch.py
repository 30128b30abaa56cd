"""Where the "ringreduce" backend (backend.py) sends a call: the engine, unless
``not_ours`` gives a reason to hand it to the device's own backend (NCCL or gloo); a
non-contiguous tensor is refused first (``refuse_views``); ``first_tensor`` finds the
device whose backend runs the collectives the engine never takes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ringreduce.safety import checks
from ringreduce.safety.checks import DTYPES, OPS


def not_ours(tensors: list[torch.Tensor], op: Any) -> str:
    """Why the engine cannot take a call on ``tensors`` with ``op`` (None for an
    all-gather); "" when it can."""
    for t in tensors:
        if t.dtype not in DTYPES:
            return f"dtype {t.dtype}"
    if op is not None and op.op not in OPS:
        return f"op {op.op}"
    for t in tensors:
        if t.layout != torch.strided:
            return f"layout {t.layout}"
    return ""


def refuse_views(tensors: Sequence[torch.Tensor], call: str) -> None:
    """A strided tensor that is not contiguous is refused before any communication:
    gloo would write outside the view (NCCL refuses such tensors too)."""
    for t in tensors:
        if t.layout == torch.strided and not t.is_contiguous():
            checks.tensor(t, call, "tensor", t.device)


def first_tensor(args: Any) -> torch.Tensor | None:
    if isinstance(args, torch.Tensor):
        return args
    if isinstance(args, (list, tuple)):
        for arg in args:
            found = first_tensor(arg)
            if found is not None:
                return found
    return None
