"""What gloo and NCCL do, ringreduce does: tensors autograd tracks reduce in place, and a
failed operation raises from the call that asks for its result (issue 14's two defects,
found by PyTorch's own distributed tests). CPU, 4 ranks as 2 machines x 2, hierarchy forced.
The workers run on CUDA too (tests/test_gpu_conformance.py): ``RR_TEST_DEVICE`` is set.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

from .multiproc import run_test_ranks

HIERARCHY = {"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"}
N = 4099  # not a multiple of D * M: the tail goes through a padding slot too


def device() -> torch.device:
    """The rank's device: its GPU in GPU tests (multiproc sets RR_TEST_DEVICE)."""
    if "RR_TEST_DEVICE" in os.environ:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _values(rank: int, n: int = N) -> torch.Tensor:
    """Small integers: every sum is exact in float32."""
    return (torch.arange(n, dtype=torch.float32, device=device()) % 13) * (rank + 1)


def _expected(world: int, n: int = N) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float32, device=device()) % 13) * sum(
        range(1, world + 1))


def _check_tracked(reduce: object, rank: int, world: int) -> None:
    """``reduce(t)`` reduces in place: a leaf parameter, a view of one, views that
    autograd made (split outputs of a tensor in a graph), like gloo and NCCL do."""
    leaf = nn.Parameter(_values(rank))
    reduce(leaf)  # type: ignore[operator]
    assert torch.equal(leaf.detach(), _expected(world)), "leaf parameter"
    assert leaf.requires_grad and leaf.grad_fn is None, "the parameter is still a leaf"

    whole = nn.Parameter(_values(rank, 2 * N))
    reduce(whole[N:])  # type: ignore[operator]  # a view of a leaf that requires grad
    assert torch.equal(whole.detach()[N:], _expected(world, 2 * N)[N:]), "view of a leaf"
    assert torch.equal(whole.detach()[:N], _values(rank)), "the rest of the leaf untouched"

    in_graph = nn.Parameter(torch.ones(2 * N, device=device())) * _values(rank, 2 * N)
    first, second = in_graph.split(N)  # outputs of a multi-output view op
    reduce(second)  # type: ignore[operator]
    assert torch.equal(second.detach(), _expected(world, 2 * N)[N:]), "view made by autograd"
    assert torch.equal(first.detach(), _values(rank)), "the sibling view untouched"


def tracked_worker(rank: int, world: int) -> None:
    comm = ringreduce.Communicator(machines=2, min_bytes=0)
    _check_tracked(comm.all_reduce, rank, world)
    _check_tracked(lambda t: comm.all_reduce(t, async_op=True).wait(), rank, world)
    assert comm.op_number == 6, f"the engine ran {comm.op_number} of 6 calls"
    t = _values(rank)
    comm.all_reduce(t)  # the communicator is still healthy and in step
    assert torch.equal(t, _expected(world))
    comm.close()


def test_tensors_autograd_tracks_reduce_in_place() -> None:
    run_test_ranks(tracked_worker, 4)


def backend_tracked_worker(rank: int, world: int) -> None:
    engine = dist.group.WORLD.communicator(device())  # type: ignore[union-attr]
    _check_tracked(dist.all_reduce, rank, world)
    assert engine.op_number == 3, f"the engine ran {engine.op_number} of 3 calls"


def test_backend_reduces_tensors_autograd_tracks() -> None:
    run_test_ranks(backend_tracked_worker, 4, backend="ringreduce", env=HIERARCHY)


class _Squares(nn.Module):
    """PyTorch's test_ddp_create_graph model, as a vector: the loss is sum(c * p^2)
    with per-rank integer weights c, so every gradient (2 c p) and its average over
    ranks are exact."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(N, device=device()))
        # Not a buffer: DDP would broadcast rank 0's.
        self.c = 4.0 * (rank + 1) * (torch.arange(N, device=device()) % 5)

    def forward(self) -> torch.Tensor:
        return (self.c * self.p.pow(2)).sum()


def create_graph_worker(rank: int, world: int) -> None:
    engine = dist.group.WORLD.communicator(device())  # type: ignore[union-attr]
    ddp = DDP(_Squares(rank))
    for step in range(1, 4):
        ddp().backward(create_graph=True)  # gradients are tensors in an autograd graph
        grad = ddp.module.p.grad
        assert grad is not None and grad.requires_grad, "create_graph keeps the grad tracked"
        mean_c = 4.0 * sum(range(1, world + 1)) / world * (torch.arange(N, device=device()) % 5)
        assert torch.equal(grad.detach(), step * 2 * mean_c), f"step {step}"
    assert engine.op_number == 3, f"DDP's all-reduces ran {engine.op_number} of 3 times on us"


def test_ddp_create_graph_on_the_backend() -> None:
    run_test_ranks(create_graph_worker, 4, backend="ringreduce", env=HIERARCHY)


DEADLINE = 4.0
SLACK = 8.0  # 4 ranks on 2 cores
BIG = 8 << 20  # 32 MiB on gloo: the kill lands while the operation runs


def _failed_work_worker(rank: int, world: int, how: str) -> None:
    t = torch.ones(10)
    dist.all_reduce(t)  # healthy first
    if rank == 3:
        dist.all_reduce(torch.ones(BIG), async_op=True)
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(BIG)
    started = time.monotonic()
    with pytest.raises(ringreduce.RingReduceError, match=r"stage '\w+' failed .* peers"):
        if how == "sync":
            dist.all_reduce(t)
        elif how == "work":
            work = dist.all_reduce(t, async_op=True)
            assert work is not None
            try:
                work.wait()
            finally:
                assert work.is_completed() and not work.is_success(), "a failed work"
                assert isinstance(work.exception(), ringreduce.RingReduceError)
        else:
            work = dist.all_reduce(t, async_op=True)
            assert work is not None
            work.get_future().wait()
    assert time.monotonic() - started < DEADLINE + SLACK
    with pytest.raises(ringreduce.RingReduceError, match="refuses new work"):
        dist.all_reduce(torch.ones(10))


@pytest.mark.parametrize("how", ["sync", "work", "future"])
def test_a_failed_all_reduce_raises_from_the_call_that_asks(how: str) -> None:
    env = {**HIERARCHY, "RINGREDUCE_TIMEOUT": str(DEADLINE)}
    run_test_ranks(_failed_work_worker, 4, how, backend="ringreduce", env=env, timeout=120,
                   expect_exit={3: -signal.SIGKILL})
