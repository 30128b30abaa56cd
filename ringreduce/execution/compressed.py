"""The compressed route: an all-reduce whose network hop carries block-quantized rows.

Unpipelined, on one stream (CUDA: the last stage's, after the caller's), for a
float32/bfloat16/float16 tensor of a SUM or AVG call; M machines x D devices, rank
(m, d), P = numel padded up to D*M*block:

    x        = t as fp32, zero-padded to P, viewed (D, M, k)
    part     = sum over this machine's devices of x[d]         (M, k)  reduce-scatter
    part    += collect error of ``key``                                (error feedback)
    mine     = quantize(part)                                  (M, row bytes)
    got[j]   = machine j's mine[m]; got[m] = mine[m]           collect: rail all-to-all
    reduced  = dequant(got[0]) + ... + dequant(got[M-1])       fp32, machines in order
    reduced += diffuse error of ``key``
    sent     = quantize(reduced)
    rows[j]  = machine j's sent (this machine's own included)  diffuse: rail all-gather
    out      = dequant(rows), / N for AVG (fp32), in t's dtype (M, k)
    (rotated formats, quant.py: quantize(part) rotates each block first, so collect, the
    sum, the diffuse error and diffuse are in the rotated domain; out rotates back)
    t        = (every device's out)[:numel]                    all-gather

Every rank dequantizes the same bytes for every row (the owner of a row its own
``sent`` too), so all ranks end with bit-identical values: DDP's replicas cannot drift
apart. Accumulation is fp32 throughout (16-bit tensors are widened before the
intra-machine reduce-scatter). Why unpipelined: on NVLink machines the unpipelined
two-level composition reached the same wire time as the 5-stage pipeline (issue
tracker), and it keeps the route exact to reason about. Not done yet: pipelining it,
and the end-of-call check (Config.check_call_end).

Issued two ways (issue.Issuer.compressed): replayed by the native issuer
(recording.walk_compressed traces this walk once per kind of call, its work buffers
made once and kept with the program: ``Scratch``), for float32 tensors on CUDA with
the kernels; else from Python, buffers fresh per call. Both on the same stream, so
calls sharing a key's error-feedback memory run in issue order.

Compute, on CUDA with cupy: three fused kernels of native/quant.cu, one pass each,
bit for bit the torch ops' results (``Codec``): quantize (with the collect error),
add (the M dequantizations, their sum, the diffuse error and the requantization of
``reduced``, which is never stored) and the final dequantize (with AVG's division and
the cast to t's dtype). Without padding they read and write ``t`` itself (no fp32
copy in, the last all-gather or, with one device a machine, the dequantization
straight into it). Elsewhere quant.py's torch ops, several passes each.

Error feedback, the per-call checks of what the caller asked for and the memory
kept between calls: feedback.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ringreduce.execution.add import finish_average
from ringreduce.execution.feedback import Errors, keep_error
from ringreduce.execution.pipeline import stage_errors
from ringreduce.execution.quant import (
    SCALE_BYTES,
    Format,
    dequantize,
    quantize,
    rotate_back,
)
from ringreduce.execution.quant import rotate as rotate_blocks

if TYPE_CHECKING:
    from ringreduce.execution.context import CallContext


class Scratch:
    """A call's work buffers: fresh per call (``keep`` None: issued from Python), or
    made once for a kind of call and kept with its program (``keep``: the list the
    native issuer's trace holds, recording.walk_compressed). Kept buffers are zeroed
    once: the padding nobody writes stays zero for every replay."""

    def __init__(self, device: torch.device, keep: list[torch.Tensor] | None = None) -> None:
        self.device, self.keep = device, keep

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.keep is None:
            return torch.empty(shape, dtype=dtype, device=self.device)
        return self.zeros(shape, dtype)

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        t = torch.zeros(shape, dtype=dtype, device=self.device)
        if self.keep is not None:
            self.keep.append(t)
        return t


@dataclass
class On:
    """Where a call's work goes: ``stream`` (its raw handle; None on the CPU), named
    ``stage`` for ctx.sync's copies (a recorded copy lands on that stage's stream),
    its buffers from ``scratch``."""

    stream: int | None
    stage: str
    scratch: Scratch


def all_reduce(t: torch.Tensor, op: str, fmt: Format, block: int, errors: Errors | None,
               ctx: CallContext, on: On) -> None:
    """The route of the module docstring, in place on ``t`` (flat, contiguous), every
    kernel and collective on ``on.stream`` (current on CUDA: the torch ops' stream)."""
    n, topo = t.numel(), ctx.topo
    if n == 0:
        return
    devices, machines = topo.devices_per_machine, topo.machines
    k = padded_row(n, devices, machines, block)
    if errors is not None and t.is_cuda:  # kept across calls, maybe on other streams
        for kept in (errors.collect, errors.diffuse):
            kept.record_stream(torch.cuda.current_stream(t.device))
    codec = Codec(fmt, block, ctx.kernels, t.device, on)  # None on the CPU
    part = _machine_part(t, k, codec, ctx, on)
    got, mine = _collect(part, codec, errors, ctx, on.stream)
    sent = _add(got, mine, codec, errors, ctx.topo.machine_index)
    rows = _diffuse(sent, ctx, on)
    _unpack_into(t, rows, codec, op, ctx, on)


def padded_row(n: int, devices: int, machines: int, block: int) -> int:
    """Elements per rail row: numel padded up to D*M*block, over D*M."""
    group = devices * machines * block
    return -(-n // group) * block


class Codec:
    """quantize/dequantize of one call: the fused kernels of native/quant.cu on CUDA
    when cupy is there (``kernels``), else quant.py's torch ops (the CPU; CUDA without
    cupy, logged at setup). The kernels produce the torch ops' bytes and values on CUDA
    bit for bit (tests/test_gpu_quant_kernels.py), so either serves every rank alike.
    Kernels launch on ``on.stream`` (default: the current stream), buffers come from
    ``on.scratch`` (default: fresh)."""

    def __init__(self, fmt: Format, block: int, kernels: Any, device: torch.device,
                 on: On | None = None) -> None:
        fmt.check_block(block)
        self.fmt, self.block, self.kernels = fmt, block, kernels
        self.scratch = on.scratch if on is not None else Scratch(device)
        self.handle = 0 if kernels is None else on.stream if on is not None and \
            on.stream is not None else torch.cuda.current_stream(device).cuda_stream

    def packed(self, rows: int, k: int) -> torch.Tensor:
        """(rows, row bytes) uint8 for ``rows`` packed rows of ``k`` values."""
        return self.scratch.empty((rows, self.fmt.row_bytes(k, self.block)), torch.uint8)

    def quantize(self, x: torch.Tensor, out: torch.Tensor, residual: torch.Tensor | None,
                 rotate: bool = True) -> None:
        """out = quantize(R(x) + residual); residual = what that dropped (finite, or 0).
        R: a rotated format's rotation (quant.rotate) when ``rotate``, else nothing (x
        is in the rotated domain already: the add's requantization); the residual is
        in the rotated domain. Unrotated, the torch ops add the residual into ``x`` in
        place; the kernels leave it as is."""
        rotated = rotate and self.fmt.rotated
        if self.kernels is not None:
            self.kernels.quantize(x, self.fmt, self.block, out, residual, self.handle,
                                  rotated)
            return
        if rotated:
            x = rotate_blocks(x, self.block)
        if residual is not None:
            x = x.add_(residual)
        quantize(x, self.fmt, self.block, out)
        if residual is not None:  # what the rows became, minus what they were
            dequantize(out, self.fmt, self.block, residual)
            keep_error(torch.sub(x, residual, out=residual))


def _exact(t: torch.Tensor, k: int, ctx: CallContext) -> bool:
    """Whether ``t`` needs no padding: D*M rows of k, read and written in place."""
    return t.numel() == ctx.topo.devices_per_machine * ctx.topo.machines * k


def _machine_part(t: torch.Tensor, k: int, codec: Codec, ctx: CallContext,
                  on: On) -> torch.Tensor:
    """(M, k): this machine's sum of view[d], widened (fp32) before summing; with one
    device and no padding, ``t`` itself for the kernels (they read any float dtype and
    leave it unchanged)."""
    topo, n = ctx.topo, t.numel()
    devices, machines = topo.devices_per_machine, topo.machines
    flat = t.view(-1)
    if devices == 1 and n == machines * k and codec.kernels is not None:
        return flat.view(machines, k)
    if t.dtype == torch.float32 and _exact(t, k, ctx):
        x = flat if devices > 1 else flat.clone()  # read-only below; D == 1 adds into it
    else:
        x = on.scratch.zeros((devices * machines * k,), torch.float32)
        ctx.sync.copy(on.stage, x[:n], flat)  # widens a 16-bit tensor (from Python only)
    if devices == 1:
        return x.view(machines, k)
    part = on.scratch.empty((machines, k), torch.float32)
    with stage_errors(ctx, "reduce_scatter", t):
        ctx.transport.reduce_scatter_into("reduce_scatter", x, part, "sum", on.stream)
    return part


def _collect(part: torch.Tensor, codec: Codec, errors: Errors | None, ctx: CallContext,
             stream: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(got, mine): every machine's partial of row m as it crossed the rail (got[m]
    not filled: it is mine[m]), and this machine's partials, each quantized once."""
    m, (machines, k) = ctx.topo.machine_index, part.shape
    mine = codec.packed(machines, k)
    codec.quantize(part, mine, None if errors is None else errors.collect)
    got = codec.packed(machines, k)
    others = [j for j in range(machines) if j != m]
    with stage_errors(ctx, "collect", part):
        ctx.transport.rail_exchange("collect", [mine[j] for j in others],
                                    [got[j] for j in others], stream)
    return got, mine


def _add(got: torch.Tensor, mine: torch.Tensor, codec: Codec, errors: Errors | None,
         m: int) -> torch.Tensor:
    """(1, row bytes): the sum over machines of row m, in fp32, machines 0..M-1 on every
    rank (one fixed order), plus the diffuse error, quantized once for diffuse."""
    machines, k = got.shape[0], _row_elements(got, codec)
    sent = codec.packed(1, k)
    residual = None if errors is None else errors.diffuse
    if codec.kernels is not None:
        codec.kernels.reduce_requantize(got, mine[m], m, codec.fmt, codec.block, sent,
                                        residual, codec.handle)
        return sent
    got[m].copy_(mine[m])  # this machine's own partial counts as quantized too
    values = torch.empty((machines, k), dtype=torch.float32, device=got.device)
    dequantize(got, codec.fmt, codec.block, values)
    reduced = values[0].clone()
    for j in range(1, machines):
        reduced.add_(values[j])
    codec.quantize(reduced.view(1, k), sent, None if residual is None else residual.view(1, k),
                   rotate=False)  # the sum of rotated rows is rotated already
    return sent


def _row_elements(packed: torch.Tensor, codec: Codec) -> int:
    """Elements of one packed row (quant.Format.row_bytes inverted)."""
    fmt, block = codec.fmt, codec.block
    k = packed.shape[1] * 8 * block // (8 * SCALE_BYTES + fmt.bits * block)
    assert fmt.row_bytes(k, block) == packed.shape[1], (k, packed.shape)
    return k


def _diffuse(sent: torch.Tensor, ctx: CallContext, on: On) -> torch.Tensor:
    """(M, row bytes): every machine's reduced row as its owner sent it (ours included,
    so every rank dequantizes the same bytes)."""
    rows = on.scratch.empty((ctx.topo.machines, sent.shape[1]), torch.uint8)
    with stage_errors(ctx, "diffuse", sent):
        ctx.transport.all_gather_into("diffuse", sent.view(-1), rows, on.stream)
    return rows


def _unpack_into(t: torch.Tensor, rows: torch.Tensor, codec: Codec, op: str,
                 ctx: CallContext, on: On) -> None:
    """t = every device's rows dequantized (``_unpack``), in device order, cut to
    numel. Without padding the last step writes ``t`` itself: the dequantization (one
    device a machine) or the all-gather."""
    devices, n, k = ctx.topo.devices_per_machine, t.numel(), _row_elements(rows, codec)
    exact = _exact(t, k, ctx) and codec.kernels is not None
    if devices == 1:
        out = t.view(rows.shape[0], k) if exact else None
        out = _unpack(rows, codec, op, t.dtype, ctx, out)
        if not exact:
            ctx.sync.copy(on.stage, t.view(-1), out.view(-1)[:n])
        return
    out = _unpack(rows, codec, op, t.dtype, ctx)
    whole = t.view(devices, -1) if exact else \
        on.scratch.empty((devices, out.numel()), out.dtype)
    with stage_errors(ctx, "all_gather", t):
        ctx.transport.all_gather_into("all_gather", out.view(-1), whole, on.stream)
    if not exact:
        ctx.sync.copy(on.stage, t.view(-1), whole.view(-1)[:n])


def _unpack(rows: torch.Tensor, codec: Codec, op: str, dtype: torch.dtype,
            ctx: CallContext, out: torch.Tensor | None = None) -> torch.Tensor:
    """(M, k) in ``dtype`` (into ``out`` when given: kernels only): the rows
    dequantized (fp32), / N for AVG, rounded once."""
    k, world = _row_elements(rows, codec), ctx.topo.world_size
    if codec.kernels is not None:
        if out is None:
            out = codec.scratch.empty((rows.shape[0], k), dtype)
        codec.kernels.dequantize(rows, codec.fmt, codec.block, out,
                                 world if op == "avg" else 0, codec.handle)
        return out
    values = torch.empty((rows.shape[0], k), dtype=torch.float32, device=rows.device)
    dequantize(rows, codec.fmt, codec.block, values)
    if codec.fmt.rotated:
        rotate_back(values, codec.block)
    if op == "avg":
        finish_average(values, world, ctx.divisors.get(torch.float32))
    return values.to(dtype)
