"""The row-sharded EmbeddingBag check (benchmarks/workloads/sharded_embedding.py) that
test_cpu_embedding.py runs on CPU and test_gpu_embedding.py on CUDA: forward output and
weight gradient, bit for bit, against one unsharded nn.EmbeddingBag holding the whole
table and fed every rank's batch (the table, the output gradients and so every pooled
sum are small integers, exact in float32), then a refused bad input.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ringreduce
from benchmarks.workloads.sharded_embedding import RowShardedEmbeddingBag, shard_bounds

from .cases import check_equal

ROWS, DIM, BAGS = 103, 5, 6  # 103 = 4 * 25 + 3: shards of 26, 26, 26, 25 rows


def table(rows: int = ROWS, dim: int = DIM) -> torch.Tensor:
    """Integers in [-5, 5]: any bag of a few rows sums exactly in float32."""
    i, j = torch.arange(rows)[:, None], torch.arange(dim)[None, :]
    return ((i * 7 + j * 3) % 11 - 5).float()


def batch(rank: int, step: int, rows: int = ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank's (ids, offsets): BAGS bags of 0..4 ids, so ranks hold different id counts
    (the all-gather pads); at step 1 rank 0's bags are all empty."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(0, 5, (BAGS,), generator=g)
    if step == 1 and rank == 0:
        lengths.zero_()
    ids = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
    return ids, torch.cumsum(lengths, 0) - lengths


def grad_out(rank: int, step: int) -> torch.Tensor:
    """The loss's gradient with respect to rank's pooled rows: integers in [-3, 3]."""
    g = torch.Generator().manual_seed(7 + 1000 * step + rank)
    return torch.randint(-3, 4, (BAGS, DIM), generator=g).float()


def reference(world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled rows of every rank's bags and the weight gradient, from the whole table."""
    full = nn.EmbeddingBag(ROWS, DIM, mode="sum", _weight=table())
    parts = [batch(r, step) for r in range(world)]
    ids = torch.cat([p[0] for p in parts])
    starts = torch.tensor([0, *torch.cumsum(torch.tensor([p[0].numel() for p in parts]), 0)])
    offsets = torch.cat([p[1] + starts[r] for r, p in enumerate(parts)])
    out = full(ids, offsets)
    out.backward(torch.cat([grad_out(r, step) for r in range(world)]))
    assert full.weight.grad is not None
    return out.detach(), full.weight.grad


def check_sharded_embedding(comm: ringreduce.Communicator, rank: int, world: int,
                            device: torch.device) -> None:
    """Two forward/backward steps against the unsharded reference, then bad input."""
    sharded = RowShardedEmbeddingBag(ROWS, DIM, comm, device=device)
    assert (sharded.start, sharded.stop) == shard_bounds(ROWS, world, rank)
    sharded.load_full(table().to(device))
    for step in range(2):
        sharded.zero_grad()
        ids, offsets = batch(rank, step)
        out = sharded(ids.to(device), offsets.to(device))
        out.backward(grad_out(rank, step).to(device))
        want_out, want_grad = reference(world, step)
        check_equal(out.detach(), want_out[rank * BAGS:(rank + 1) * BAGS], f"step {step} output")
        assert sharded.weight.grad is not None
        check_equal(sharded.weight.grad, want_grad[sharded.start:sharded.stop],
                    f"step {step} weight grad of rows [{sharded.start}, {sharded.stop})")
    ids, offsets = batch(rank, 0)
    if rank == 1:
        offsets = offsets[:-1]  # one bag short: every rank must refuse, none may hang
    with pytest.raises(ValueError, match="same number of bags"):
        sharded(ids.to(device), offsets.to(device))
    # A step: two all-gathers of the batch, the reduce-scatter, its backward all-gather;
    # the refused call made one all-gather. All on the hierarchical route (min_bytes=0)
    # when there is one (several machines of several devices), else the flat one.
    assert comm.op_number == 2 * 4 + 1, comm.op_number
    topo = comm.topology
    route = "hierarchical" if topo.machines > 1 and topo.devices_per_machine > 1 else "flat"
    routes = {(r.kind, r.route) for r in comm._res.guard.recorder._records}
    assert routes == {("all_gather", route), ("reduce_scatter", route)}, routes
