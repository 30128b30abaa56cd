"""What gloo and NCCL do, ringreduce does, for tensors autograd tracks: the workers that
test_cpu_conformance.py runs on CPU and test_gpu_conformance.py on CUDA (``RR_TEST_DEVICE``
set): a leaf parameter, a view of one and views autograd made reduce in place through a
Communicator and through the "ringreduce" backend, and DDP with create_graph=True on the
backend.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

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


def backend_tracked_worker(rank: int, world: int) -> None:
    engine = dist.group.WORLD.communicator(device())  # type: ignore[union-attr]
    _check_tracked(dist.all_reduce, rank, world)
    assert engine.op_number == 3, f"the engine ran {engine.op_number} of 3 calls"


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
