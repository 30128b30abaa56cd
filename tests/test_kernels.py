"""native/add.cu against the torch reference (ringreduce.add), every dtype and op.

GPU only (marked ``gpu``); inputs are small integers, so results compare bit for bit.
"""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from ringreduce import add as reference
from ringreduce.errors import RingReduceError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="needs cupy"),
]
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64)


@pytest.fixture(scope="module")
def kernels():  # type: ignore[no-untyped-def]
    from ringreduce.kernels import Kernels

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


def test_compiler_errors_carry_the_log(kernels) -> None:  # type: ignore[no-untyped-def]
    from ringreduce.kernels import Kernels

    broken = Kernels(torch.device("cuda", torch.cuda.current_device()))
    broken._source = kernels._source + "\nthis is not C++;\n"
    t = torch.ones(16, device="cuda")
    with pytest.raises(RingReduceError, match=r"(?s)compiling native/add.cu.*log.*error"):
        broken.add(t, t.view(1, 16), "sum", 2, torch.cuda.current_stream().cuda_stream)
