"""The compressed reduce-scatter: the hierarchical reduce-scatter of collectives.py with
the rail hop carrying block-quantized rows (quant.py), for FSDP2's gradients.

Unpipelined, on the caller's stream; input of N blocks of ``n`` elements, block r
belonging to group rank r; M machines x D devices, rank (m, d); k = n padded up to the
wire block:

    x       = input's blocks in (D, M) order, as fp32, each zero-padded to k
    part    = sum over this machine's devices of x[d]              (M, k)  reduce_scatter
    part   += collect error of this call's owner                           (error feedback)
    sent    = quantize(part)                                        (M, row bytes)
    got[j]  = machine j's sent[m]                                   collect: rail all-to-all
    got[m]  = part[m], exact (this machine's own partial never crosses the network)
    out     = got[0] + ... + got[M-1] in fp32, machines in order, / N for AVG
    output  = out[:n] in output's dtype

Unlike the compressed all-reduce (compressed.py) there is no diffuse: a shard has one
owner, so nothing must come out bit-identical on several ranks, and the owner keeps its
own partial exact. Accumulation is fp32 throughout; 16-bit inputs are widened before the
intra-machine reduce-scatter. The network carries M-1 quantized rows per rank, against
M-1 rows of the gradient's dtype for the exact route: 4x fewer bytes for fp32 at int8
(plus one fp32 scale a block), 8x at int4.

Compute uses quant.py's torch ops, or native/quant.cu's quantize kernel on CUDA with
cupy (compressed.Codec); the dequantize-and-sum is torch ops on both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ringreduce.execution.add import finish_average
from ringreduce.execution.compressed import Codec
from ringreduce.execution.pipeline import stage_errors
from ringreduce.execution.quant import Format, dequantize, rotate_back

if TYPE_CHECKING:
    from ringreduce.execution.context import CallContext


def padded_block(n: int, block: int) -> int:
    """Elements of one rail row: a shard's ``n`` padded up to the wire block."""
    return -(-n // block) * block


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: str, fmt: Format, block: int,
                   error: torch.Tensor | None, ctx: CallContext, stream: int | None) -> None:
    """The route of the module docstring: ``output`` = op over ranks of block ``rank`` of
    ``input``. ``error``: (M, k) fp32 collect error, updated in place (None: no feedback)."""
    n, topo = output.numel(), ctx.topo
    if n == 0:
        return
    k = padded_block(n, block)
    codec = Codec(fmt, block, ctx.kernels if output.is_cuda else None, output.device)
    part = _machine_part(input, n, k, ctx, stream)
    got = _collect(part, codec, error, ctx, stream)
    reduced = got[0].clone()
    for j in range(1, topo.machines):  # one fixed order, whatever order rows arrived in
        reduced.add_(got[j])
    if op == "avg":
        finish_average(reduced, topo.world_size, ctx.divisors.get(torch.float32))
    output.view(-1).copy_(reduced[:n])


def _machine_part(input: torch.Tensor, n: int, k: int, ctx: CallContext,
                  stream: int | None) -> torch.Tensor:
    """(M, k) fp32: this machine's sum of the blocks of its rail (device d's), each
    zero-padded to k; the blocks regrouped so that row d*M + m is rank (m, d)'s."""
    topo = ctx.topo
    assert ctx.rank_order is not None, "every communicator has its rank order"
    rows = topo.devices_per_machine * topo.machines
    x = torch.zeros((rows, k), dtype=torch.float32, device=input.device)
    x[:, :n].copy_(input.view(rows, n).index_select(0, ctx.rank_order))
    if topo.devices_per_machine == 1:
        return x
    part = torch.empty((topo.machines, k), dtype=torch.float32, device=input.device)
    with stage_errors(ctx, "reduce_scatter", input):
        ctx.transport.reduce_scatter_into("reduce_scatter", x.view(-1), part, "sum", stream)
    return part


def _collect(part: torch.Tensor, codec: Codec, error: torch.Tensor | None, ctx: CallContext,
             stream: int | None) -> torch.Tensor:
    """(M, k) fp32: every machine's partial of this machine's row, as it crossed the
    rail (quantized, then dequantized), this machine's own exact."""
    m, (machines, k) = ctx.topo.machine_index, part.shape
    own = part[m].clone()  # before quantize: the torch ops add the error into part
    sent = codec.packed(machines, k)
    codec.quantize(part, sent, error)
    if error is not None:
        error[m].zero_()  # the own row was never rounded: nothing to carry
    packed = torch.empty_like(sent)
    others = [j for j in range(machines) if j != m]
    with stage_errors(ctx, "collect", part):
        ctx.transport.rail_exchange("collect", [sent[j] for j in others],
                                    [packed[j] for j in others], stream)
    packed[m].copy_(sent[m])  # dequantized below with the rest, then replaced
    got = torch.empty((machines, k), dtype=torch.float32, device=part.device)
    dequantize(packed, codec.fmt, codec.block, got)
    if codec.fmt.rotated:  # each row back from the rotated domain (quant.py)
        rotate_back(got, codec.block)
    got[m].copy_(own)
    return got
