"""Row-sharded EmbeddingBag over ringreduce's CUDA reduce_scatter and all_gather: the
CPU test's checks (bit-exact against an unsharded table) on 2 virtual machines x 2
GPUs, NCCL between them. Run with ``pytest -m gpu``; skipped without CUDA or nccl4py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import ringreduce

from .embedding import check_sharded_embedding
from .gpu import GPUS, SMALL, gpu_env
from .multiproc import run_test_ranks

pytestmark = [
    pytest.mark.gpu,
    # With one GPU the test runs 2 x 1; virtual machines share GPUs (see tests/gpu.py).
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("nccl") is None, reason="needs nccl4py"),
]


def _embedding_worker(rank: int, world: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(min_bytes=0) as comm:  # host ids -> 2 machines x 2
        assert (comm.topology.machines, comm.topology.devices_per_machine) == SMALL
        check_sharded_embedding(comm, rank, world, dev)


def test_gpu_sharded_embedding_matches_unsharded() -> None:
    run_test_ranks(_embedding_worker, SMALL[0] * SMALL[1], backend="nccl", env=gpu_env(*SMALL))
