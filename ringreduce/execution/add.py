"""The add stage and the AVG finish, in torch ops.

``add`` folds the M-1 rows received in `collect` into this machine's own row.
16-bit floats accumulate in fp32 and round once, so the result does not depend on
the order in which machines' partials arrive. AVG divides the exact sum once, at the
end (dividing by N exactly keeps small-integer averages exact; multiplying by 1/N
would not for N = 3, 6, ...); integer AVG truncates toward zero, as NCCL's does.
"""

from __future__ import annotations

import torch

_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def add(own: torch.Tensor, rows: torch.Tensor, op: str, world_size: int) -> None:
    """Unpipelined meaning: ``own[:] = reduce(op, [own, *rows])``, AVG divided by N."""
    if op == "max":
        torch.maximum(own, rows.amax(dim=0), out=own)
    elif op == "min":
        torch.minimum(own, rows.amin(dim=0), out=own)
    elif own.dtype in _WIDE:
        acc = rows.sum(dim=0, dtype=_WIDE[own.dtype]).add_(own)
        if op == "avg":
            finish_average(acc, world_size)
        own.copy_(acc)
    else:
        own.add_(rows.sum(dim=0))
        if op == "avg":
            finish_average(own, world_size)


def add_wire(own: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, op: str,
             world_size: int) -> None:
    """``add`` for float32 ``own`` and rows that came in a 16-bit wire format: fp32
    accumulation, then the result rounded to the wire format once, into ``out`` (the
    row diffuse sends) and ``own``, so the owner keeps exactly the value every other
    machine receives."""
    if op in ("max", "min"):
        add(own, rows.float(), op, world_size)
    else:
        own.add_(rows.sum(dim=0, dtype=torch.float32))
        if op == "avg":
            finish_average(own, world_size)
    out.copy_(own)
    own.copy_(out)


def finish_average(t: torch.Tensor, world_size: int, divisor: torch.Tensor | None = None) -> None:
    """Turn an all-reduced sum into the average in place, by IEEE division.

    Not ``t.div_(world_size)``: for a Python-number divisor torch's CUDA kernel
    multiplies by the rounded reciprocal, which is not correctly rounded (it differed
    from native/add.cu's true division in the last bit in the GPU kernel tests).
    A 0-dim tensor on the same device takes the true-division path, with no copy
    from the host: ``divisor`` (the communicator's, made once), else a fill kernel."""
    if t.is_floating_point():
        if divisor is None:
            divisor = torch.full((), world_size, dtype=t.dtype, device=t.device)
        t.div_(divisor)
    else:
        torch.div(t, world_size, rounding_mode="trunc", out=t)
