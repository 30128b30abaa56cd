"""DDP training shared by the CPU and GPU tests: a small model and its training steps
(plain DDP against the hook or the backend), and 16-bit gradients whose sum overflows
fp16 where their average does not (issue 34)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(37, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 5))


CPU = torch.device("cpu")


def train(net: nn.Module, rank: int, steps: int, device: torch.device = CPU) -> list[torch.Tensor]:
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x, y = torch.randn(16, 37, generator=g), torch.randn(16, 5, generator=g)
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


BIG_FP16 = 40000.0
"""Exact in fp16 (a multiple of its spacing 32 there), as is BIG_FP16 / 4 (spacing 8);
the sum of four of them (160000) is past fp16's largest finite value, 65504."""
ELEMENTS = 1000  # 2 KB of fp16: below the default min_bytes, one bucket per dtype


class Big(nn.Module):
    """Zero 16-bit weights whose gradients are the inputs, so every rank's gradient is
    exactly ``x`` (the loss itself is 0, far from overflowing)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.fp16 = nn.Parameter(torch.zeros(ELEMENTS, dtype=torch.float16, device=device))
        self.bf16 = nn.Parameter(torch.zeros(ELEMENTS, dtype=torch.bfloat16, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.fp16 * x.half()).sum().float() + (self.bf16 * x.bfloat16()).sum().float()


def big_gradients(net: nn.Module, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One backward of ``Big`` through ``net`` (DDP with or without the hook): the
    reduced fp16 and bf16 gradients."""
    net.zero_grad()
    net(torch.full((ELEMENTS,), BIG_FP16, device=device)).backward()
    module: Any = net.module if isinstance(net, DDP) else net
    half, bf16 = module.fp16.grad, module.bf16.grad
    assert half is not None and bf16 is not None
    return half.clone(), bf16.clone()


def check_big_gradients(comm: ringreduce.Communicator, device: torch.device, route: str) -> None:
    """The hook returns what plain DDP (on the default group) returns for 16-bit
    gradients whose 4-rank sum overflows fp16 but whose average does not: 40000, bit
    for bit, not inf; the hook's calls took ``route``."""
    plain = big_gradients(DDP(Big(device)), device)
    hooked_ddp = DDP(Big(device))
    hooked_ddp.register_comm_hook(comm, ringreduce.ddp_hook)
    hooked = big_gradients(hooked_ddp, device)
    record = comm._res.guard.recorder.last()
    calls = comm.op_number - comm._res.probe_calls  # the construction probe's come first
    assert calls == 2 and record is not None, "one hook call per 16-bit bucket"
    hierarchical = ("hierarchical", "one-slice")  # either plan (execution/probe.py)
    assert record.route.startswith(hierarchical if route == "hierarchical" else route), \
        f"the hook took the {record.route} route"
    assert torch.equal(plain[0], torch.full_like(plain[0], BIG_FP16)), \
        f"plain DDP's reference changed: {plain[0][:4]}"
    for name, got, want in zip(("float16", "bfloat16"), hooked, plain, strict=True):
        assert torch.isfinite(got).all(), f"{name} gradients overflowed in the hook: {got[:4]}"
        assert torch.equal(got, want), f"{name}: hook {got[:4]} != plain DDP {want[:4]}"
    # bf16 rounds 40000 to 39936 (156 x its spacing 256 there); a quarter is exact too
    assert torch.equal(plain[1], torch.full_like(plain[1], 39936.0)), \
        f"plain DDP's bf16 reference changed: {plain[1][:4]}"
