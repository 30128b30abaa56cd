"""16-bit wire format on the network hop (``wire_dtype``), over gloo on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringreduce

from .cases import DTYPES, OPS, sweep
from .multiproc import run_test_ranks

CPU = torch.device("cpu")


def _exact_worker(rank: int, world: int, machines: int, wire: torch.dtype) -> None:
    """Small integers are exact in bf16/fp16 too: the wire must not change them."""
    with ringreduce.Communicator(machines=machines, min_bytes=0, slice_bytes=256,
                                 wire_dtype=wire) as comm:
        sizes = [1, 5, 2 * world + 1, 97, 300]
        # float32 takes the wire; other dtypes do not. AVG over 6 ranks (k/6) is not a
        # 16-bit value, so it is rounded on the wire: exact only for a power-of-two world.
        ops = OPS if world & (world - 1) == 0 else tuple(o for o in OPS if o != dist.ReduceOp.AVG)
        sweep(comm, sizes, CPU, dtypes=DTYPES, ops=ops)
        # The sweep's results are the same with the wire off; this proves it is on:
        # 1 + 2^-12 is not a 16-bit value, so the sum crosses the wire rounded.
        t = torch.full((97,), 1 + 2**-12)
        comm.all_reduce(t)
        fp32 = torch.full((97,), world * (1 + 2**-12))
        assert not torch.equal(t, fp32), "float32 did not take the 16-bit wire"
        assert torch.equal(t, t.to(wire).float()), "results are not wire-format values"


@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("machines,devices", [
    pytest.param(2, 2, id="2x2"), pytest.param(3, 2, id="3x2", marks=pytest.mark.slow)])
def test_wire_keeps_small_integers_exact(machines: int, devices: int, wire: torch.dtype) -> None:
    run_test_ranks(_exact_worker, machines * devices, machines, wire)


def _rounding_worker(rank: int, world: int) -> None:
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(10_007, generator=g)
    exact = x.double()
    dist.all_reduce(exact)
    with ringreduce.Communicator(machines=2, min_bytes=0, slice_bytes=4096,
                                 wire_dtype=torch.bfloat16) as comm:
        t = x.clone()
        comm.all_reduce(t)
    # Every element was reduced on one machine and crossed the wire in bf16 once:
    assert torch.equal(t, t.to(torch.bfloat16).float()), "results are not bf16 values"
    hi, lo = t.clone(), t.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    assert torch.equal(hi, lo), "ranks disagree: replicas would drift apart"
    rel = ((t.double() - exact).norm() / exact.norm()).item()
    assert 0 < rel < 2 ** -8, rel  # one bf16 rounding of fp32-accumulated sums


def test_wire_rounds_once_and_identically_on_every_rank() -> None:
    run_test_ranks(_rounding_worker, 4)


def test_wire_dtype_is_checked() -> None:
    with pytest.raises(ValueError, match="wire_dtype='int8' is not supported"):
        ringreduce.Config(wire_dtype="int8")
