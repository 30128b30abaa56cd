"""The checks of the 8- and 4-bit wires that the CPU tests (test_cpu_compressed.py, whose
docstring says how the bounds were measured) and the GPU tests (test_gpu_compressed.py)
both run: error bounds per format against an fp64 all-reduce, bit-identical results on
every rank, inf/nan and zero blocks, error feedback over repeated calls, and DDP with
the hook."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from ringreduce.execution import quant

BOUNDS = {"int8": 1.5e-2, "fp8": 6e-2, "int4": 2.5e-1}
"""Relative L2 error of one all-reduce against fp64, gaussian inputs (test_cpu_compressed.py)."""
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
SIZES = (1, 7, 2000, 10_007)
"""Odd sizes: every one is padded to D*M*block inside."""


def same_on_every_rank(t: torch.Tensor, what: str) -> None:
    """Bit for bit, nan included (compared as integers; gloo gathers no int16)."""
    bits = t.view({4: torch.int32, 2: torch.int16}[t.element_size()]).to(torch.int32)
    everyone = [torch.empty_like(bits) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, bits)
    for r, other in enumerate(everyone):
        assert torch.equal(other, everyone[0]), f"{what}: rank {r} differs from rank 0"


def rel_l2(got: torch.Tensor, exact: torch.Tensor) -> float:
    return ((got.double() - exact).norm() / exact.norm()).item()


def here() -> torch.device:
    """The device of this rank's tensors: its GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def accuracy(comm: ringreduce.Communicator, rank: int, world: int,
             sizes: tuple[int, ...] = SIZES) -> list[str]:
    """Every format, dtype, op and size: bound and bit-identity. Returns the error table."""
    table = []
    for wire in quant.FORMATS:
        for dtype in FLOATS:
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                worst = 0.0
                for n in sizes:
                    g = torch.Generator().manual_seed(1000 * rank + n)
                    x = torch.randn(n, generator=g).to(dtype).to(here())
                    exact = x.double()
                    dist.all_reduce(exact)
                    if op == dist.ReduceOp.AVG:
                        exact /= world
                    t = x.clone()
                    comm.all_reduce(t, op=op, wire=wire)
                    what = f"{wire} {dtype} {op} n={n}"
                    same_on_every_rank(t, what)
                    err = rel_l2(t, exact)
                    assert err < BOUNDS[wire], f"{what}: relative L2 {err:.3g}"
                    worst = max(worst, err)
                table.append(f"{wire} {dtype!s:>14} {op!s:>12} worst rel L2 {worst:.2e}")
    return table


def non_finite(comm: ringreduce.Communicator, rank: int, world: int) -> None:
    """inf/nan survive, only their block may go with them; blocks of zeros stay zeros."""
    block = comm.config.wire_block
    n = 20 * block + 3
    for wire in quant.FORMATS:
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(n, generator=g)
        x[2 * block:3 * block] = 0.0  # zero on every rank: the sum's block is zeros
        if rank == 1:
            x[5] = float("inf")
        if rank == 2 % world:
            x[7 * block + 3] = float("nan")
        if rank in (0, world - 1):
            x[12 * block + 9] = 3e38  # finite on each rank, inf once summed in fp32
        x = x.to(here())
        fp32 = x.clone()
        dist.all_reduce(fp32)
        t = x.clone()
        comm.all_reduce(t, wire=wire)
        same_on_every_rank(t, f"{wire} non-finite")
        t, fp32 = t.cpu(), fp32.cpu()
        lost = torch.isfinite(t) & ~torch.isfinite(fp32)
        assert not lost.any(), f"{wire}: non-finite lost at {lost.nonzero().flatten().tolist()}"
        # the route's blocks are aligned to `block` in the flat tensor (k is a multiple)
        bad_blocks = (~torch.isfinite(fp32)).nonzero().flatten() // block
        outside = torch.ones(n, dtype=torch.bool)
        for b in bad_blocks.tolist():
            outside[b * block:(b + 1) * block] = False
        assert torch.isfinite(t[outside]).all(), f"{wire}: non-finite outside the bad blocks"
        zeros = t[2 * block:3 * block]
        assert torch.equal(zeros, torch.zeros_like(zeros)), f"{wire}: a zero block changed"
        t = torch.zeros(n, device=here())
        comm.all_reduce(t, op=dist.ReduceOp.AVG, wire=wire)
        assert not t.any() and not t.signbit().any(), f"{wire}: zeros did not stay zeros"



def feedback(comm: ringreduce.Communicator, rank: int, report: str = "") -> None:
    """The mean of N calls on the same tensor: without feedback the same error every
    call; with it, the errors cancel and the mean approaches the exact sum. Then the
    memory it holds, reset, and a key whose size changes."""
    calls = 24
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(5000, generator=g).to(here())
    exact = x.double()
    dist.all_reduce(exact)
    for wire in quant.FORMATS:
        means = {}
        for key in (None, f"x {wire}"):
            total = torch.zeros(5000, dtype=torch.float64, device=here())
            for _ in range(calls):
                t = x.clone()
                comm.all_reduce(t, wire=wire, feedback=key)
                same_on_every_rank(t, f"{wire} feedback={key}")
                total += t.double()
            means[key] = rel_l2(total / calls, exact)
        plain, fed = means[None], means[f"x {wire}"]
        assert fed < plain / 8, f"{wire}: mean error {fed:.3g} with feedback, {plain:.3g} without"
        if rank == 0 and report:
            with open(report, "a") as f:
                f.write(f"{wire}: mean of {calls} calls, rel L2 {plain:.2e} without feedback, "
                        f"{fed:.2e} with\n")
    # per key: P/D + P/(D*M) fp32 values, P = 5000 padded to a multiple of D*M*256
    topo = comm.topology
    group = topo.devices_per_machine * topo.machines * 256
    padded = -(-5000 // group) * group
    per_key = (padded // topo.devices_per_machine + padded // group * 256) * 4
    keys = len(quant.FORMATS)  # one key per format above
    assert comm._feedback.nbytes() == keys * per_key, (comm._feedback.nbytes(), per_key)
    comm.reset_feedback("x int8")
    assert comm._feedback.nbytes() == (keys - 1) * per_key
    t = x[:777].clone()  # the same key, another size: it starts over
    comm.all_reduce(t, wire="int4", feedback="x int4")
    comm.reset_feedback()
    assert comm._feedback.nbytes() == 0


def hook_trains(comm: ringreduce.Communicator, rank: int) -> None:
    """DDP with the hook on an int8 communicator: the loss falls, the replicas stay
    bit-identical, and the buckets keep error feedback if and only if the Communicator
    was asked to (``hook_feedback``, off by default)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(37, 64), nn.ReLU(), nn.Linear(64, 5)).to(here())
    model = DDP(net, bucket_cap_mb=0.005)  # several buckets, rebuilt after the first step
    model.register_comm_hook(comm, ringreduce.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, 37, generator=g).to(here()), torch.randn(32, 5, generator=g).to(here())
    losses = []
    for _ in range(12):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    for p in model.parameters():
        same_on_every_rank(p.detach(), "DDP parameters")
    kept = comm._feedback.nbytes()
    assert (kept > 0) == comm.config.hook_feedback, (kept, comm.config.hook_feedback)


class _TwoLayers(nn.Module):
    """Two layers registered a, b and run b(a(x)): DDP's one bucket holds a's
    parameters first, and after its rebuild b's, at the same index and size."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def hook_feedback_follows_the_rebuilt_bucket(comm: ringreduce.Communicator,
                                             plain: ringreduce.Communicator, rank: int) -> None:
    """The feedback DDP's hook kept for a bucket before DDP rebuilt it is not added to
    the rebuilt one, which holds its parameters in another order at the same index and
    size: the rebuilt bucket's first reduction is bit for bit a reduction of the same
    gradients without feedback (on ``plain``), and the old key is let go."""
    torch.manual_seed(0)
    net = _TwoLayers().to(here())
    names = {id(p): n for n, p in net.named_parameters()}
    model = DDP(net, bucket_cap_mb=1)  # one bucket, before and after the rebuild
    calls: list[tuple[int, list[str], torch.Tensor, torch.futures.Future[torch.Tensor]]] = []

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations
        before = bucket.buffer().clone()
        fut = ringreduce.ddp_hook(state, bucket)
        calls.append((bucket.index(), [names[id(p)] for p in bucket.parameters()], before, fut))
        return fut

    model.register_comm_hook(comm, hook)
    g = torch.Generator().manual_seed(rank)
    results = []
    for _ in range(3):
        model(torch.randn(16, 64, generator=g).to(here())).square().mean().backward()
        results.append(calls[-1][3].wait().clone())  # the next step reuses the buffer
    (i0, layout0, _, _), (i1, layout1, before, _), _ = calls
    assert i0 == i1 == 0 and layout0 != layout1, (layout0, layout1)  # the case it guards
    want = before.clone()
    plain.all_reduce(want, op=dist.ReduceOp.AVG, wire="int8")
    assert torch.equal(results[1], want), "the rebuilt bucket got the old layout's feedback"
    assert len(comm._feedback._errors) == 1, list(comm._feedback._errors)
