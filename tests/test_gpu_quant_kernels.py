"""native/quant.cu against quant.py's torch ops on CUDA, bit for bit: quantize (with and
without error feedback), the add's dequantize + fp32 sum + requantize, and the final
dequantize (with AVG and the cast), for every format, float32/float16/bfloat16, blocks
of 256 and 24 (two lanes of 12 values), 64, 128 and 8 (every shared-memory layout of the
rotation), unaligned rows, and blocks of zeros, -0.0, inf (one, and two that meet in
the rotation's last pass), nan, ties, huge and subnormal values. The reference is
compressed.py's own torch path (``Codec`` without kernels), so the test holds what the
route relies on.

GPU only (marked ``gpu``). NaN compares by position (its payload is not specified by
either path); everything else, bytes and values, compares exactly.
"""

from __future__ import annotations

import importlib.util
import itertools
from types import SimpleNamespace

import pytest
import torch

from ringreduce.execution import compressed, quant
from ringreduce.execution.feedback import Errors

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="needs cupy"),
]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = ((256, 3, 7), (256, 2, 5003), (24, 3, 5), (64, 3, 9), (128, 2, 7), (8, 2, 33))
"""(block, rows, blocks a row): odd counts, and 10006 blocks for several grid steps; 64
(two groups of 16 lanes a warp), 128 (32 lanes of 4) and 8 (16 groups of 2 lanes) for
the rotation's butterflies across lanes and chunks."""


def _shapes(name: str) -> list[tuple[int, int, int]]:
    """SHAPES whose block the format takes (a rotated one: powers of two)."""
    return [s for s in SHAPES if not quant.FORMATS[name].rotated or s[0] & (s[0] - 1) == 0]


@pytest.fixture(scope="module")
def kernels():  # type: ignore[no-untyped-def]
    from ringreduce.execution.kernels import Kernels

    return Kernels(torch.device("cuda", torch.cuda.current_device()))


def _data(rows: int, k: int, block: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Gaussian rows at mixed scales, then special blocks in row 0 (and row 1's first)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-3, 3, k // block) \
        .repeat_interleave(block)
    flat = x[0]
    special = {
        1: torch.zeros(block),
        2: torch.full((block,), -0.0),
        3: torch.arange(block, dtype=torch.float32) % 16 - 7.5,  # ties at int4's steps
        4: torch.full((block,), 1e-44),  # the scale underflows to 0
    }
    for b, values in special.items():
        if b < k // block:
            flat[b * block:(b + 1) * block] = values
    if k // block > 6:
        flat[5 * block + 1] = float("inf")
        flat[6 * block + block - 1] = float("nan")
        flat[6 * block] = -float("inf")
    if k // block > 7:  # two infs that first meet in the rotation's last pass: inf - inf there
        flat[7 * block] = flat[7 * block + block // 2] = float("inf")
    if rows > 1:
        x[1, :block] = 3e38
    return x.to(dtype).cuda()


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal bits, NaN anywhere equal to NaN."""
    if got.dtype == torch.uint8:
        return torch.equal(got, want)
    nan = got.isnan()
    return torch.equal(nan, want.isnan()) and torch.equal(
        got.masked_fill(nan, 0).view(torch.int16 if got.element_size() == 2 else torch.int32),
        want.masked_fill(nan, 0).view(torch.int16 if got.element_size() == 2 else torch.int32))


def _same_packed(got: torch.Tensor, want: torch.Tensor, k: int, block: int) -> bool:
    """Scales as floats (NaN by position), payload bytes exactly."""
    nscales = k // block * quant.SCALE_BYTES
    got, want = got.clone(), want.clone()  # a fresh, aligned copy views as float32
    return _same(got[:, :nscales].view(torch.float32), want[:, :nscales].view(torch.float32)) \
        and torch.equal(got[:, nscales:], want[:, nscales:])


def _codecs(kernels, name: str, block: int):  # type: ignore[no-untyped-def]
    fmt, device = quant.FORMATS[name], torch.device("cuda")
    return (compressed.Codec(fmt, block, kernels, device),
            compressed.Codec(fmt, block, None, device))


@pytest.mark.parametrize("name", list(quant.FORMATS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_matches_torch(kernels, name: str, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    for (block, rows, nblocks), feedback in itertools.product(_shapes(name), (False, True)):
        fused, torch_ops = _codecs(kernels, name, block)
        k = nblocks * block
        x = _data(rows, k, block, seed=nblocks, dtype=dtype)
        residual = (torch.randn(rows, k, device="cuda") * 1e-2) if feedback else None
        want_res = None if residual is None else residual.clone()
        want, got = fused.packed(rows, k), fused.packed(rows, k)
        torch_ops.quantize(x.float().clone(), want, want_res)  # it adds in place
        fused.quantize(x, got, residual)
        torch.cuda.synchronize()
        what = (name, dtype, block, rows, nblocks, feedback)
        assert _same_packed(got, want, k, block), what
        assert residual is None or want_res is None or _same(residual, want_res), what


@pytest.mark.parametrize("name", list(quant.FORMATS))
def test_unaligned_rows_take_the_scalar_variant(kernels, name: str) -> None:  # type: ignore[no-untyped-def]
    fused, torch_ops = _codecs(kernels, name, 256)
    rows, k = 3, 7 * 256
    base = torch.empty(rows * k + 1, device="cuda")
    x = base[1:].view(rows, k)  # 4 bytes past 16-byte alignment: scalar loads
    x.copy_(_data(rows, k, 256, seed=1, dtype=torch.float32))
    raw = torch.empty(rows * fused.fmt.row_bytes(k, 256) + 1, dtype=torch.uint8, device="cuda")
    got = raw[1:].view(rows, -1)  # 1 byte past: byte-wise scales and payload
    want = fused.packed(rows, k)
    torch_ops.quantize(x.clone(), want, None)
    fused.quantize(x, got, None)
    torch.cuda.synchronize()
    assert _same_packed(got, want, k, 256), name


@pytest.mark.parametrize("name", list(quant.FORMATS))
def test_add_and_requantize_matches_torch(kernels, name: str) -> None:  # type: ignore[no-untyped-def]
    for (block, machines, nblocks), feedback in itertools.product(_shapes(name), (False, True)):
        fused, torch_ops = _codecs(kernels, name, block)
        k = nblocks * block
        parts = _data(machines, k, block, seed=nblocks + 7, dtype=torch.float32)
        got = fused.packed(machines, k)
        torch_ops.quantize(parts, got, None)  # each machine's row m as it crossed the rail
        for m in range(machines):
            mine = fused.packed(machines, k)
            mine[m] = got[m]
            others = got.clone()
            others[m] = 0  # never read: row m comes from mine
            diffuse = torch.randn(k, device="cuda") * 1e-2
            ours, theirs = (Errors(k, name, torch.empty(0), diffuse.clone())
                            if feedback else None for _ in range(2))
            sent = compressed._add(others, mine, fused, ours, m)
            want = compressed._add(got.clone(), mine, torch_ops, theirs, m)
            torch.cuda.synchronize()
            what = (name, block, machines, nblocks, feedback, m)
            assert _same_packed(sent, want, k, block), what
            if ours is not None and theirs is not None:
                assert _same(ours.diffuse, theirs.diffuse), what


@pytest.mark.parametrize("name", list(quant.FORMATS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dequantize_matches_torch(kernels, name: str, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    ctx = SimpleNamespace(topo=SimpleNamespace(world_size=6), divisors={})
    for (block, rows, nblocks), op in itertools.product(_shapes(name), ("sum", "avg")):
        fused, torch_ops = _codecs(kernels, name, block)
        k = nblocks * block
        x = _data(rows, k, block, seed=nblocks + 3, dtype=torch.float32)
        packed = fused.packed(rows, k)
        torch_ops.quantize(x.clone(), packed, None)
        got = compressed._unpack(packed, fused, op, dtype, ctx)  # type: ignore[arg-type]
        want = compressed._unpack(packed, torch_ops, op, dtype, ctx)  # type: ignore[arg-type]
        torch.cuda.synchronize()
        assert got.dtype == want.dtype == dtype
        assert _same(got, want), (name, dtype, block, rows, nblocks, op)
        if dtype == torch.float32 and nblocks > 6:
            assert torch.equal(got[0, block:3 * block], torch.zeros(2 * block, device="cuda"))
            bad = got[0, 5 * block:7 * block]
            assert not torch.isfinite(bad).any(), "a block with inf/nan must come back non-finite"


def _near_thresholds(nblocks: int, block: int, exponents: range, seed: int) -> torch.Tensor:
    """(1, nblocks * block) fp32: block b's max-abs s_b = 2^e (1 + u) for e over
    ``exponents``, its other values +-t s_b (1 + k 2^-23), t one of GAUSS4_THRESHOLDS / 2048
    and k in -3..3: v / s_b within a few ulps of a threshold on both sides, at scales from
    near-subnormal to huge (the 4-bit codes' compares, native/quant.cuh's gauss4_cuts)."""
    g = torch.Generator().manual_seed(seed)
    e = torch.tensor(list(exponents), dtype=torch.float64)[torch.randint(len(exponents),
                                                                         (nblocks, 1), generator=g)]
    s = torch.exp2(e) * (1 + torch.rand(nblocks, 1, generator=g, dtype=torch.float64))
    s = s.float().double()  # the block's max-abs, exactly a float
    t = torch.tensor(quant.GAUSS4_THRESHOLDS, dtype=torch.float64)[
        torch.randint(7, (nblocks, block), generator=g)] / (2 * quant.GAUSS4_DENOMINATOR)
    k = torch.randint(-3, 4, (nblocks, block), generator=g, dtype=torch.float64)
    sign = torch.randint(2, (nblocks, block), generator=g, dtype=torch.float64) * 2 - 1
    w = sign * t * s * (1 + k * 2.0 ** -23)
    w[:, 0] = s[:, 0]
    return w.float().reshape(1, -1).cuda()


@pytest.mark.parametrize("rotate", (False, True), ids=("rotated-domain", "rotated-here"))
@pytest.mark.parametrize("feedback", (False, True))
def test_int4_codes_next_to_every_threshold(kernels, rotate: bool, feedback: bool) -> None:  # type: ignore[no-untyped-def]
    """The 4-bit codes where a division's last bit decides them: values within a few ulps of
    every threshold times their block's scale, at scales 2^-126 .. 2^120, through each
    kernel that codes them (rr_quantize_rot256 and rr_quantize, rotated or not, with and
    without a residual), bit for bit against quant.py's torch ops (their division)."""
    fused, torch_ops = _codecs(kernels, "int4", 256)
    nblocks = 4096
    w = _near_thresholds(nblocks, 256, range(-126, 111, 3) if rotate else range(-126, 127, 2),
                         seed=5)
    if rotate:  # rotating it again lands within a few ulps of w (the rotation's rounding)
        quant.rotate_back(w, 256)
    k = nblocks * 256
    residual = torch.zeros(1, k, device="cuda") if feedback else None
    want_res = None if residual is None else residual.clone()
    want, got = fused.packed(1, k), fused.packed(1, k)
    torch_ops.quantize(w.clone(), want, want_res, rotate=rotate)
    fused.quantize(w, got, residual, rotate=rotate)
    torch.cuda.synchronize()
    assert _same_packed(got, want, k, 256)
    assert residual is None or want_res is None or _same(residual, want_res)
