"""Hierarchical reduce-scatter and all-gather: two stages each, over the communicators
the all-reduce stages already own.

Blocks of ``n`` elements, block r belonging to group rank r, M machines x D devices:

  reduce_scatter  regroup the input's blocks into (D, M, n) order, so that the M
                  blocks of device d's rail lie together; reduce-scatter inside the
                  machine (device d gets the machine's partial of its rail's blocks);
                  reduce-scatter along the rail (each rank gets its own block).
  all_gather      the reverse: gather along the rail, then inside the machine, then
                  put the blocks back in rank order.

Why: per machine and direction the network carries D*(M-1)*n bytes, against (N-1)*n
for NCCL's flat ring over N = M*D ranks (N-1 ring steps, each crossing a machine
boundary once per machine): 1.5x fewer at 2x2, nearly 2x at 2x8. Unlike all-reduce
the two stages are not sliced: a reduce-scatter's result is a block of the caller's,
so there is no in-place view to pipeline through staging; the regrouping copy is
local and bandwidth-bound. Both run on the caller's stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ringreduce.execution.add import finish_average
from ringreduce.execution.pipeline import stage_errors

if TYPE_CHECKING:
    from ringreduce.execution.context import CallContext


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: str, ctx: CallContext,
                   stream: int | None) -> None:
    """Unpipelined meaning: output = reduce(op, [input_r.view(N, n)[rank] for every r])."""
    topo, n = ctx.topo, output.numel()
    assert ctx.rank_order is not None, "a hierarchical route has its rank order"
    staged = input.view(topo.world_size, n).index_select(0, ctx.rank_order)
    machine_part = torch.empty((topo.machines, n), dtype=output.dtype, device=output.device)
    with stage_errors(ctx, "reduce_scatter", input):
        ctx.transport.reduce_scatter_into("reduce_scatter", staged, machine_part, op, stream)
    with stage_errors(ctx, "collect", input):
        ctx.transport.reduce_scatter_into("collect", machine_part, output.view(-1), op, stream)
    if op == "avg":
        finish_average(output, topo.world_size, ctx.divisors.get(output.dtype))


def all_gather(output: torch.Tensor, input: torch.Tensor, ctx: CallContext,
               stream: int | None) -> None:
    """Unpipelined meaning: output.view(N, n)[r] = input_r for every rank r."""
    topo, n = ctx.topo, input.numel()
    rail = torch.empty((topo.machines, n), dtype=input.dtype, device=input.device)
    gathered = torch.empty((topo.world_size, n), dtype=input.dtype, device=input.device)
    with stage_errors(ctx, "diffuse", input):
        ctx.transport.all_gather_into("diffuse", input.view(-1), rail, stream)
    with stage_errors(ctx, "all_gather", input):
        ctx.transport.all_gather_into("all_gather", rail, gathered, stream)
    assert ctx.rank_order is not None, "a hierarchical route has its rank order"
    output.view(topo.world_size, n).index_copy_(0, ctx.rank_order, gathered)


def flat_reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: str, ctx: CallContext,
                        stream: int | None) -> None:
    """NCCL's (gloo's) own reduce-scatter over the whole group."""
    with stage_errors(ctx, "flat", input):
        ctx.transport.reduce_scatter_into("world", input.view(-1), output.view(-1), op, stream)
    if op == "avg":
        finish_average(output, ctx.topo.world_size, ctx.divisors.get(output.dtype))


def flat_all_gather(output: torch.Tensor, input: torch.Tensor, ctx: CallContext,
                    stream: int | None) -> None:
    with stage_errors(ctx, "flat", input):
        ctx.transport.all_gather_into("world", input.view(-1), output.view(-1), stream)
