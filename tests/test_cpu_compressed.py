"""The 8- and 4-bit wires (``wire="int8"|"fp8"|"int4"``) and error feedback, on CPU (gloo).

Quantization is real rounding, so results are compared with an fp64 all-reduce under a
stated bound per format, measured on gaussian data (2 x 2 and 3 x 2, block 256, SUM and
AVG, fp32/bf16/fp16 tensors, relative L2 per call; worst seen in parentheses):
int8 < 1.5e-2 (1.0e-2), fp8 < 6e-2 (3.7e-2), int4 < 2.5e-1 (1.9e-1). Each value is
quantized twice (its machine's partial in collect, the reduced sum in diffuse); torch's
bf16 hook measured 2.3e-3 on gradients. What must be exact: every rank ends
bit-identical, zeros stay zeros, nothing non-finite is lost. ``RR_TEST_ERROR_REPORT=path``
writes the measured table there.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from ringreduce.execution import quant

from .multiproc import run_test_ranks

BOUNDS = {"int8": 1.5e-2, "fp8": 6e-2, "int4": 2.5e-1}
"""Relative L2 error of one all-reduce against fp64, gaussian inputs (module docstring)."""
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


def _compressed_worker(rank: int, world: int, machines: int, report: str) -> None:
    with ringreduce.Communicator(machines=machines, min_bytes=0, wire="int8") as comm:
        assert comm.config.wire == "int8" and comm.config.wire_dtype is None
        table = accuracy(comm, rank, world)
        non_finite(comm, rank, world)
        # MAX/MIN and integer tensors keep their own (exact) route on an int8 communicator
        t = torch.full((999,), float(rank))
        comm.all_reduce(t, op=dist.ReduceOp.MAX)
        assert torch.equal(t, torch.full((999,), float(world - 1)))
        t = torch.full((999,), rank, dtype=torch.int64)
        comm.all_reduce(t)
        assert torch.equal(t, torch.full((999,), sum(range(world)), dtype=torch.int64))
        t = torch.full((999,), float(rank))
        comm.all_reduce(t, op=dist.ReduceOp.SUM)
        assert comm._res.guard.recorder.last().route == "compressed int8"
    if rank == 0 and report:
        with open(report, "a") as f:
            f.write("\n".join([f"# {machines} x {world // machines}", *table]) + "\n")


@pytest.mark.parametrize("machines,devices", [(2, 2), (3, 2)], ids=["2x2", "3x2"])
def test_compressed_bounds_identity_and_non_finite(machines: int, devices: int) -> None:
    report = os.environ.get("RR_TEST_ERROR_REPORT", "")  # where to write the error table
    run_test_ranks(_compressed_worker, machines * devices, machines, report)


def _feedback_worker(rank: int, world: int, report: str) -> None:
    comm = ringreduce.Communicator(machines=2, min_bytes=0)
    feedback(comm, rank, report)
    _bad_arguments(comm, rank, world)
    comm.close()


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
    assert comm._feedback.nbytes() == 3 * per_key, (comm._feedback.nbytes(), per_key)
    comm.reset_feedback("x int8")
    assert comm._feedback.nbytes() == 2 * per_key
    t = x[:777].clone()  # the same key, another size: it starts over
    comm.all_reduce(t, wire="int4", feedback="x int4")
    comm.reset_feedback()
    assert comm._feedback.nbytes() == 0


def _bad_arguments(comm: ringreduce.Communicator, rank: int, world: int) -> None:
    """Refused before any communication; the communicator stays usable."""
    t = torch.ones(100)
    cases = [
        ({"wire": "int9"}, ValueError, r"wire='int9' is not a per-call wire format"),
        ({"wire": "bf16"}, ValueError, r"16-bit wires are set per Communicator"),
        ({"feedback": "k"}, ValueError, r"feedback='k' needs an 8- or 4-bit wire"),
        ({"wire": "int8", "feedback": 3}, TypeError, r"must be a str key"),
        ({"wire": "int8", "op": dist.ReduceOp.MAX}, ValueError, r"carries SUM and AVG"),
    ]
    before = comm.op_number
    for kwargs, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            comm.all_reduce(t, **kwargs)  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(TypeError, match=r"not torch.int32"):
        comm.all_reduce(torch.ones(8, dtype=torch.int32), wire="int8")
    out, blocks = torch.zeros(25), torch.ones(100)
    for kwargs, exc, pattern in [*cases[:2], ({"feedback": "k"}, ValueError,
                                              r"feedback='k' needs wire='int8'")]:
        with pytest.raises(exc, match=pattern):
            comm.reduce_scatter(out, blocks, **kwargs)  # type: ignore[arg-type]  # on purpose
    assert comm.op_number == before and torch.equal(t, torch.ones(100))
    comm.reduce_scatter(out, blocks, wire="int8", feedback="rs")
    assert torch.equal(out, torch.full((25,), float(world)))  # small integers: exact in int8
    comm.all_reduce(t, wire="int8")
    assert torch.equal(t, torch.full((100,), float(world)))  # 4 ranks: exact in int8


def test_error_feedback_and_arguments() -> None:
    run_test_ranks(_feedback_worker, 4, os.environ.get("RR_TEST_ERROR_REPORT", ""))


def _hook_worker(rank: int, world: int) -> None:
    with ringreduce.Communicator(machines=2, min_bytes=0, wire="int8") as comm:
        hook_trains(comm, rank)


def hook_trains(comm: ringreduce.Communicator, rank: int) -> None:
    """DDP with the hook on an int8 communicator: the loss falls, the replicas stay
    bit-identical, and the buckets keep error feedback."""
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
    assert comm._feedback.nbytes() > 0, "the hook keeps error feedback for int8"


def test_ddp_hook_with_int8_trains_and_stays_identical() -> None:
    run_test_ranks(_hook_worker, 4)


# --- no processes --------------------------------------------------------------------

def test_config_wire_names_and_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ringreduce.Config(wire_dtype="bfloat16").wire == "bf16"
    assert ringreduce.Config(wire="fp16").wire_dtype == "float16"
    assert ringreduce.Config(wire="int4").wire_dtype is None
    with pytest.raises(ValueError, match="disagree; pass only wire="):
        ringreduce.Config(wire="int8", wire_dtype="bfloat16")
    with pytest.raises(ValueError, match="wire='int2' is not supported"):
        ringreduce.Config(wire="int2")
    with pytest.raises(ValueError, match="wire_block=12 must be a positive multiple of 8"):
        ringreduce.Config(wire_block=12)
    monkeypatch.setenv("RINGREDUCE_WIRE", "fp8")
    monkeypatch.setenv("RINGREDUCE_WIRE_BLOCK", "64")
    config = ringreduce.Config.from_env()
    assert (config.wire, config.wire_block) == ("fp8", 64)
    monkeypatch.delenv("RINGREDUCE_WIRE")
    monkeypatch.setenv("RINGREDUCE_WIRE_DTYPE", "float16")  # the older spelling
    assert ringreduce.Config.from_env().wire == "fp16"
    assert ringreduce.Config.from_env(wire="int8").wire == "int8"  # an argument wins


@pytest.mark.parametrize("name", list(quant.FORMATS))
def test_quantize_round_trip(name: str) -> None:
    fmt, block = quant.FORMATS[name], 64
    x = torch.randn(3, 8 * block, generator=torch.Generator().manual_seed(0))
    x[1, :block] = 0.0
    x[2, 3] = float("-inf")
    packed = torch.empty(3, fmt.row_bytes(8 * block, block), dtype=torch.uint8)
    quant.quantize(x, fmt, block, packed)
    y = torch.empty_like(x)
    quant.dequantize(packed, fmt, block, y)
    assert torch.equal(y[1, :block], torch.zeros(block))
    assert not torch.isfinite(y[2, :block]).any() and torch.isfinite(y[2, block:]).all()
    # a value is off by at most half a step (int) or half an e4m3 ulp of the block max
    step = x[0].view(8, block).abs().amax(-1, keepdim=True) / fmt.qmax
    half = step / 2 if name != "fp8" else step * 448 * 2.0**-4
    assert ((y[0] - x[0]).view(8, block).abs() <= half * 1.0001).all()
    again = torch.empty_like(packed[:1])
    quant.quantize(y[:1].clone(), fmt, block, again)
    assert torch.equal(again, packed[:1]), "dequantized values must quantize to themselves"
