"""Row-sharded ``nn.EmbeddingBag`` (mode sum) over a communicator's reduce-scatter and
all-gather: each rank stores one contiguous block of a table's rows.

One table of N rows is split over the W ranks like ``torch.tensor_split``: rank r holds
``N // W`` rows, plus one for the first ``N % W`` ranks, so N need not divide by W and
no shard is empty while N >= W. A forward over a local batch of B bags (the same B on
every rank) means, unsharded:

    out[b] = sum(table[i] for i in bag b)                      # this rank's B bags
and runs as
    ids, offsets = all_gather(every rank's ids and bag lengths)  # the global W*B bags
    partial      = EmbeddingBag(shard)(ids in this shard only)   # (W*B, dim), 0 elsewhere
    out          = reduce_scatter(partial, SUM)                  # rank r: its own B bags

Backward: the gradient of a reduce-scatter is the all-gather of the output gradients;
the shard's EmbeddingBag then accumulates into its own rows only (ids of other shards
were dropped before the lookup). Any ``comm`` with ``dist``-style ``reduce_scatter``
and ``all_gather`` works (``ringreduce.Communicator``, or a process-group wrapper).
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
from torch import nn


class ShardComm(Protocol):
    """``reduce_scatter``/``all_gather`` with the meaning of ``dist.reduce_scatter_tensor``
    and ``dist.all_gather_into_tensor`` (rank order of the communicator's group)."""

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor,
                       op: Any = ..., async_op: bool = ...) -> Any: ...

    def all_gather(self, output: torch.Tensor, input: torch.Tensor,
                   async_op: bool = ...) -> Any: ...


def shard_bounds(num_embeddings: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's rows: the first ``N % W`` ranks take one extra row."""
    base, extra = divmod(num_embeddings, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def all_gather_rows(comm: ShardComm, row: torch.Tensor, world_size: int) -> torch.Tensor:
    """Every rank's 1-D ``row`` (same length everywhere), stacked in rank order: (W, n)."""
    out = row.new_empty((world_size, row.numel()))
    comm.all_gather(out.view(-1), row.contiguous())
    return out


def bag_lengths(num_ids: int, offsets: torch.Tensor) -> torch.Tensor:
    """Ids per bag from EmbeddingBag's start offsets (without the closing offset)."""
    end = offsets.new_full((1,), num_ids)
    return torch.diff(offsets, append=end)


def gather_batch(comm: ShardComm, ids: torch.Tensor, offsets: torch.Tensor,
                 world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's bags in rank order, as (ids, offsets) of W*B bags.

    Ranks hold different numbers of ids, and an all-gather needs one length: the first
    (tiny) all-gather shares (bags, ids) per rank, the second moves each rank's bag
    lengths and ids padded to the longest. Reading that longest back to size the
    buffer is a host sync on CUDA, as is the boolean indexing that drops the padding.
    """
    ids, offsets = ids.long(), offsets.long()  # one dtype for the packed all-gather
    batch, count = offsets.numel(), ids.numel()
    sizes = all_gather_rows(comm, torch.tensor([batch, count], device=ids.device), world_size)
    if bool((sizes[:, 0] != batch).any()):
        raise ValueError(f"every rank must pass the same number of bags (the reduce-scatter "
                         f"splits the pooled rows evenly), got {sizes[:, 0].tolist()} by rank; "
                         "pad the smaller batches with empty bags (repeat the last offset)")
    longest = int(sizes[:, 1].max())
    packed = ids.new_zeros(batch + longest)
    packed[:batch] = bag_lengths(count, offsets)
    packed[batch:batch + count] = ids
    rows = all_gather_rows(comm, packed, world_size)
    real = torch.arange(longest, device=ids.device) < sizes[:, 1:2]  # (W, longest)
    lengths = rows[:, :batch].reshape(-1)
    return rows[:, batch:][real], torch.cumsum(lengths, 0) - lengths


class _ReduceScatter(torch.autograd.Function):
    """out = reduce_scatter(partial, SUM); its gradient: all_gather(grad_out)."""

    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor, comm: ShardComm,
                world_size: int) -> torch.Tensor:
        ctx.comm, ctx.world_size = comm, world_size
        out = partial.new_empty((partial.shape[0] // world_size, *partial.shape[1:]))
        comm.reduce_scatter(out, partial.contiguous(), op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        full = grad.new_empty((grad.shape[0] * ctx.world_size, *grad.shape[1:]))
        ctx.comm.all_gather(full, grad.contiguous())
        return full, None, None


def reduce_scatter(partial: torch.Tensor, comm: ShardComm, world_size: int) -> torch.Tensor:
    """Differentiable SUM reduce-scatter along dim 0 (``partial.shape[0]`` = W * B)."""
    return _ReduceScatter.apply(partial, comm, world_size)


class RowShardedEmbeddingBag(nn.Module):
    """One EmbeddingBag table (mode sum) whose rows are split over ``comm``'s ranks.

    ``rank``/``world_size`` are this rank's place in the communicator's group (default:
    the default process group's). ``forward(ids, offsets)`` takes this rank's bags like
    ``nn.EmbeddingBag`` (1-D ids, start offsets; the same number of bags on every rank)
    and returns their pooled rows, shape (bags, embedding_dim). Collective: every rank
    calls forward (and backward) in the same order.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, comm: ShardComm, *,
                 rank: int | None = None, world_size: int | None = None,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.world_size = dist.get_world_size() if world_size is None else world_size
        self.rank = dist.get_rank() if rank is None else rank
        if num_embeddings < self.world_size:
            raise ValueError(f"num_embeddings={num_embeddings} < world size "
                             f"{self.world_size}: some ranks would hold no rows; use a "
                             "replicated nn.EmbeddingBag for tables this small")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.comm = comm
        self.start, self.stop = shard_bounds(num_embeddings, self.world_size, self.rank)
        self.shard = nn.EmbeddingBag(self.stop - self.start, embedding_dim, mode="sum",
                                     device=device, dtype=dtype)

    @property
    def weight(self) -> nn.Parameter:
        """This rank's rows ``[start, stop)`` of the table."""
        return cast(nn.Parameter, self.shard.weight)  # torch types it as a Tensor

    @torch.no_grad()
    def load_full(self, table: torch.Tensor) -> None:
        """Copy this rank's rows out of the whole (num_embeddings, dim) table."""
        if tuple(table.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"table of shape {tuple(table.shape)}, expected "
                             f"({self.num_embeddings}, {self.embedding_dim})")
        self.shard.weight.copy_(table[self.start:self.stop])

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        all_ids, all_offsets = gather_batch(self.comm, ids, offsets, self.world_size)
        local_ids, local_offsets = self._in_shard(all_ids, all_offsets)
        partial = self.shard(local_ids, local_offsets)  # (W*B, dim): global batch, our rows
        return reduce_scatter(partial, self.comm, self.world_size)

    def _in_shard(self, ids: torch.Tensor,
                  offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop ids of other shards (rather than weigh them 0: no wasted lookups, and no
        0 * inf); a bag's new offset is the number of kept ids before its old one."""
        mine = (ids >= self.start) & (ids < self.stop)
        kept_before = torch.cat([mine.new_zeros(1, dtype=torch.int64), mine.cumsum(0)])
        return ids[mine] - self.start, kept_before[offsets]

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, mode='sum', rows "
                f"[{self.start}, {self.stop}) on rank {self.rank} of {self.world_size}")
