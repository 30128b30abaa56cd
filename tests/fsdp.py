"""FSDP2 (fully_shard) with its gradient reduce-scatter through ringreduce, against plain
FSDP2 from the same init and data: the model, its training and the checks, and the
``worker`` that runs the cases on one mesh, for test_cpu_fsdp.py (gloo) and
test_gpu_fsdp.py (NCCL). test_cpu_fsdp.py's docstring says why the comparison is bit
for bit. Importing this module skips the importing test module on a torch without
FSDP2's ``set_custom_reduce_scatter``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ringreduce
from ringreduce.execution import quant

fully_shard_api = pytest.importorskip("torch.distributed.fsdp")
if not hasattr(getattr(fully_shard_api, "FSDPModule", None), "set_custom_reduce_scatter"):
    pytest.skip("FSDP2's set_custom_reduce_scatter needs torch >= 2.9", allow_module_level=True)

STEPS = 3
LAYERS = 3
"""FSDP modules with parameters (the root holds none): reduce-scatters per backward."""


class _Round(torch.autograd.Function):
    """Rounds values in forward and gradients in backward: integers throughout."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.round()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.round()


class Rounding(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Round.apply(x)


def model() -> nn.Sequential:
    """Weights on a 1/8 grid, so that the first steps' values are exact too."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 11), Rounding(), nn.ReLU(), nn.Linear(11, 7), Rounding(),
                        nn.ReLU(), nn.Linear(7, 3), Rounding())
    with torch.no_grad():
        for p in net.parameters():
            p.copy_((p * 16).round() / 8)
    return net


def sharded(mesh: Any, reshard: bool, mixed: bool) -> nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if mixed else MixedPrecisionPolicy()
    net = model()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(net, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return net


def train(net: nn.Module, rank: int, steps: int = STEPS) -> list[tuple[torch.Tensor, ...]]:
    """(parameter shard, gradient shard) of every parameter after ``steps`` of SGD;
    integer data, a different batch per rank and step, on the parameters' device."""
    opt = torch.optim.SGD(net.parameters(), lr=1 / 32)
    device = next(net.parameters()).device
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * rank + step)
        x = torch.randint(-2, 3, (8, 5), generator=g).float().to(device)
        y = torch.randint(-2, 3, (8, 3), generator=g).float().to(device)
        opt.zero_grad()
        (0.5 * (net(x) - y).square().sum()).backward()
        opt.step()
    return [(p.to_local().detach().clone(), p.grad.to_local().clone())  # type: ignore[union-attr]
            for p in net.parameters()]


def check_identical(got: list[tuple[torch.Tensor, ...]], want: list[tuple[torch.Tensor, ...]],
                    case: str) -> None:
    total = torch.stack([g.abs().sum() for _, g in want]).sum()
    dist.all_reduce(total)  # a rank's shards may be empty or all zero; not every rank's
    assert total > 0, f"{case}: the reference's gradients are 0 on every rank"
    for i, (pair, ref) in enumerate(zip(got, want, strict=True)):
        for what, a, b in zip(("parameter", "gradient"), pair, ref, strict=True):
            assert a.dtype == torch.float32, (case, what, a.dtype)
            assert torch.equal(a, b), f"{case}: {what} {i} differs by {(a - b).abs().max()}"


def routes(hooks: list[ringreduce.fsdp.RingReduceScatter]) -> list[tuple[str, str]]:
    """(kind, route) of every call of the communicator the hooks built."""
    comms = [c for name, c in hooks[0].comms.communicators().items() if name != "replicate"]
    assert len(comms) == 1 and all(h.comms is hooks[0].comms for h in hooks)
    return flight(comms[0])


def flight(comm: ringreduce.Communicator, after: int = 0,
           fields: tuple[str, ...] = ("kind", "route")) -> list[tuple[str, ...]]:
    """``fields`` of every flight record of ``comm`` numbered after ``after``; checked to
    be every call made since (none dropped by the recorder's capacity; a CUDA
    construction probe's calls leave no records)."""
    after = max(after, comm._res.probe_calls)
    records = [r for r in comm._res.guard.recorder._records if r.op_number > after]
    assert [r.op_number for r in records] == list(range(after + 1, comm.op_number + 1))
    return [tuple(getattr(r, f) for f in fields) for r in records]


def route(world: int, machines: int) -> str:
    """The exact reduce-scatter's route: with one device a machine, NCCL's (gloo's) own
    (Communicator.reduce_scatter: nothing to reduce inside a machine)."""
    return "hierarchical" if world // machines > 1 else "flat"


def _exact_cases(rank: int, mesh: Any, machines: int) -> None:
    """reshard_after_forward True and False, and bf16 parameters reducing in fp32: equal
    to plain FSDP2; every reduce-scatter on ringreduce's hierarchical route."""
    for reshard, mixed in ((True, False), (False, False), (True, True)):
        case = f"reshard_after_forward={reshard} mixed={mixed}"
        want = train(sharded(mesh, reshard, mixed), rank)
        net = sharded(mesh, reshard, mixed)
        hooks = ringreduce.fsdp.apply(net, machines=machines, min_bytes=0)
        assert len(hooks) == LAYERS + 1  # the root is an FSDP module too
        check_identical(train(net, rank), want, case)
        want_route = route(mesh.size(), machines)
        assert routes(hooks) == [("reduce_scatter", want_route)] * (STEPS * LAYERS), case
        hooks[0].comms.close()


def _given_comm(rank: int, mesh: Any, machines: int) -> None:
    """One Communicator of the user's for every module, built on the shard group."""
    comm = ringreduce.Communicator(mesh.get_group(), machines=machines, min_bytes=0)
    want = train(sharded(mesh, True, False), rank, steps=1)
    net = sharded(mesh, True, False)
    ringreduce.fsdp.apply(net, comm)
    check_identical(train(net, rank, steps=1), want, "given comm")
    assert [r.route for r in comm._res.guard.recorder._records] == \
        [route(mesh.size(), machines)] * LAYERS
    comm.close()


def _compressed_call(rank: int, world: int, mesh: Any, machines: int, wire: str) -> None:
    """One quantized reduce-scatter against the exact sum of known inputs: each other
    machine's partial is off by at most its block's max-abs times the format's worst
    error (quant.Format.worst_error_in: a rotated format's bound is its block times
    looser); the machine's own partial is exact."""
    n, devices = 40, world // machines  # 40: not a multiple of the 32-element wire block
    hook = ringreduce.fsdp.RingReduceScatter(wire=wire, machines=machines, min_bytes=0,
                                             wire_block=32)
    device = mesh.device_type
    inputs = [(torch.linspace(-3, 3, world * n) * (r + 1) + r).to(device) for r in range(world)]
    out = torch.empty(n, device=device)
    hook(out, inputs[rank].clone(), mesh.get_group(), dist.ReduceOp.SUM)
    blocks = torch.stack(inputs).view(world, world, n)[:, rank]  # every rank's block `rank`
    exact = blocks.sum(0)
    mine = rank // devices
    partials = blocks.view(machines, devices, n).sum(1)
    bound = sum(_block_max(partials[j], 32) for j in range(machines) if j != mine) \
        * quant.FORMATS[wire].worst_error_in(32)
    assert ((out - exact).abs() <= bound * (1 + 1e-5)).all(), (wire, (out - exact).abs().max())
    assert not torch.equal(out, exact), f"{wire}: nothing was rounded, so nothing was tested"
    routes_seen = [r.route for r in hook.comms.communicators()[mesh.get_group().group_name]
                   ._res.guard.recorder._records]
    assert routes_seen == [f"compressed {wire}"]
    hook.comms.close()


def _block_max(row: torch.Tensor, block: int) -> torch.Tensor:
    """Each element's block max-abs, the row zero-padded to whole blocks."""
    padded = torch.zeros(-(-row.numel() // block) * block, device=row.device)
    padded[: row.numel()] = row.abs()
    return padded.view(-1, block).amax(1).repeat_interleave(block)[: row.numel()]


def tanh_net(mesh: Any) -> nn.Module:
    """A model whose gradients are not integers (a quantized wire rounds them)."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 33), nn.Tanh(), nn.Linear(33, 3))
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def _compressed_training(rank: int, mesh: Any, machines: int) -> None:
    """FSDP2 with an int8 rail: after one step (same parameters, so the same local
    gradients) the reduced gradients stay within 1% of the exact ones in norm."""
    nets = [tanh_net(mesh), tanh_net(mesh)]
    hooks = ringreduce.fsdp.apply(nets[1], wire="int8", machines=machines, min_bytes=0,
                                  wire_block=32)
    got, want = (train(net, rank, steps=1) for net in (nets[1], nets[0]))
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert (g - w).norm() <= 0.01 * w.norm() + 1e-6, ((g - w).norm(), w.norm())
    assert set(routes(hooks)) == {("reduce_scatter", "compressed int8")}
    hooks[0].comms.close()


def worker(rank: int, world: int, machines: int, cases: tuple[str, ...],
           device_type: str = "cpu") -> None:
    """The ``cases`` on one mesh over every rank, on ``device_type`` (the current CUDA
    device of each rank on "cuda")."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device_type, (world,))
    run: dict[str, Callable[[], None]] = {
        "exact": lambda: _exact_cases(rank, mesh, machines),
        "given": lambda: _given_comm(rank, mesh, machines),
        "compressed": lambda: [_compressed_call(rank, world, mesh, machines, wire)
                               for wire in quant.FORMATS] and None,
        "training": lambda: _compressed_training(rank, mesh, machines),
    }
    for case in cases:
        run[case]()
