"""native/ kernels against their torch references (ringreduce.execution.add, transport.py's
copies): the add for every dtype and op, the wire add and the wire casts for both
16-bit formats.

GPU only (marked ``gpu``); inputs are small integers, so results compare bit for bit.
"""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from ringreduce.errors import RingReduceError
from ringreduce.execution import add as reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="needs cupy"),
]
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64)


@pytest.fixture(scope="module")
def kernels():  # type: ignore[no-untyped-def]
    from ringreduce.execution.kernels import Kernels

    return Kernels(torch.device("cuda", torch.cuda.current_device()))


def _small_ints(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-9, 10, shape, generator=g).to(dtype).cuda()  # shape: a tuple


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_add_matches_torch(kernels, dtype: torch.dtype, op: str) -> None:  # type: ignore[no-untyped-def]
    stream = torch.cuda.current_stream().cuda_stream
    for k, nrows, offset in itertools.product([1, 7, 8, 4097, (1 << 20) + 3], [1, 3],
                                              [0, 1]):
        # offset 1 shifts every row off 16-byte alignment: the scalar variant runs.
        base = _small_ints(((nrows + 1) * k + offset,), dtype, seed=k + nrows)
        own, rows = base[offset:offset + k], base[offset + k:].view(nrows, k)
        want = own.clone()
        reference.add(want, rows.clone(), op, world_size=6)
        kernels.add(own, rows, op, 6, stream)
        torch.cuda.synchronize()
        assert torch.equal(own, want), (dtype, op, k, nrows, offset)


WIRES = (torch.bfloat16, torch.float16)
SHAPES = list(itertools.product([1, 7, 8, 4097, (1 << 18) + 3], [2, 3, 5], [0, 1]))
"""(k, machines, offset): offset 1 element puts rows off alignment (scalar variants)."""


def _fractions(n: int, seed: int) -> torch.Tensor:
    """float32 values that round in both 16-bit formats (not small integers): the
    casts must round exactly as torch does."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 300).cuda()


@pytest.mark.parametrize("wire", WIRES, ids=str)
@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_add_wire_matches_torch(kernels, wire: torch.dtype, op: str) -> None:  # type: ignore[no-untyped-def]
    stream = torch.cuda.current_stream().cuda_stream
    for k, machines, offset in SHAPES:
        rows_n = machines - 1
        own = _small_ints((k + offset,), torch.float32, seed=k)[offset:]
        rows = _small_ints((rows_n * k + offset,), wire, seed=k + 1)[offset:].view(rows_n, k)
        out = torch.full((k + offset,), 99, dtype=wire, device="cuda")[offset:]
        want_own, want_out = own.clone(), out.clone()
        reference.add_wire(want_own, rows.clone(), want_out, op, world_size=machines * 2)
        kernels.add_wire(own, rows, out, op, machines * 2, stream)
        torch.cuda.synchronize()
        assert torch.equal(own, want_own) and torch.equal(out, want_out), (wire, op, k, machines)


@pytest.mark.parametrize("wire", WIRES, ids=str)
def test_wire_casts_match_torch_copies(kernels, wire: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    stream = torch.cuda.current_stream().cuda_stream
    for (k, machines, offset), skip in itertools.product(SHAPES, range(5)):
        if skip >= machines:
            continue
        view = _fractions(machines * k + offset, seed=k + skip)[offset:].view(machines, k)
        packed = torch.empty(((machines - 1) * k + offset,), dtype=wire, device="cuda")
        packed = packed[offset:].view(machines - 1, k)
        kernels.narrow_rows(view, packed, skip, stream)
        others = [j for j in range(machines) if j != skip]
        torch.cuda.synchronize()
        assert torch.equal(packed, view[others].to(wire)), ("narrow", wire, k, machines, skip)
        back = torch.full_like(view, -1.0)
        kernels.widen_rows(packed, back, skip, stream)
        torch.cuda.synchronize()
        assert torch.equal(back[others], packed.float()), ("widen", wire, k, machines, skip)
        assert torch.equal(back[skip], torch.full_like(back[skip], -1.0)), "own row touched"


def test_compiler_errors_carry_the_log(kernels) -> None:  # type: ignore[no-untyped-def]
    from ringreduce.execution.kernels import Kernels

    broken = Kernels(torch.device("cuda", torch.cuda.current_device()))
    broken._sources = {**kernels._sources,
                       "add.cu": kernels._sources["add.cu"] + "\nthis is not C++;\n"}
    t = torch.ones(16, device="cuda")
    with pytest.raises(RingReduceError, match=r"(?s)compiling native/add.cu.*log.*error"):
        broken.add(t, t.view(1, 16), "sum", 2, torch.cuda.current_stream().cuda_stream)
