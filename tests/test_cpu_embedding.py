"""Row-sharded EmbeddingBag (benchmarks/workloads/sharded_embedding.py) over ringreduce's
reduce_scatter and all_gather, on CPU (gloo), 2 virtual machines x 2 devices.

Forward output and weight gradient are compared (tests/embedding.py), bit for bit, with
one unsharded nn.EmbeddingBag holding the whole table and fed every rank's batch: the
table, the output gradients and so every pooled sum are small integers, exact in float32.
"""

from __future__ import annotations

import itertools

import torch

import ringreduce
from benchmarks.workloads.sharded_embedding import shard_bounds

from .embedding import check_sharded_embedding
from .multiproc import run_test_ranks


def _embedding_worker(rank: int, world: int) -> None:
    with ringreduce.Communicator(machines=2, min_bytes=0) as comm:
        assert (comm.topology.machines, comm.topology.devices_per_machine) == (2, 2)
        check_sharded_embedding(comm, rank, world, torch.device("cpu"))


def test_sharded_embedding_matches_unsharded() -> None:
    run_test_ranks(_embedding_worker, 4)


def test_shards_cover_the_table_in_order() -> None:
    for rows, world in [(103, 4), (8, 4), (5, 4), (4, 4), (1000, 7)]:
        bounds = [shard_bounds(rows, world, r) for r in range(world)]
        assert bounds[0][0] == 0 and bounds[-1][1] == rows
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        sizes = [stop - start for start, stop in bounds]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1, (rows, world, sizes)
