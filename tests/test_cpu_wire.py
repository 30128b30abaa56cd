"""16-bit wire format on the network hop (``wire_dtype``), over gloo on CPU."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce.execution import quant

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


# --- the rotated 4-bit wire (quant.py: int4 = gauss4 levels on rotated blocks) -------

def _hadamard(block: int) -> torch.Tensor:
    """Sylvester's Hadamard matrix in float64: H[i, j] = (-1)^popcount(i & j)."""
    i = torch.arange(block)
    bits = torch.bitwise_and(i[:, None], i[None, :])
    parity = torch.zeros_like(bits)
    for b in range(block.bit_length()):
        parity ^= (bits >> b) & 1
    return 1.0 - 2.0 * parity.double()


@pytest.mark.parametrize("block", [8, 64, 128, 256])
def test_rotation_is_a_randomized_hadamard_transform(block: int) -> None:
    g = torch.Generator().manual_seed(block)
    x = torch.randn(3, 5 * block, generator=g) * torch.logspace(-3, 3, 5 * block)
    forward, back = quant.signs(block, CPU)
    signs = torch.sign(forward).double()
    assert torch.equal(torch.sign(back), torch.sign(forward))
    a = (block.bit_length() - 1) // 2
    want = (x.double().view(3, 5, block) * signs) @ _hadamard(block).T * 2.0**-a
    got = quant.rotate(x, block)
    assert torch.allclose(got.double().view(3, 5, block), want, rtol=0, atol=1e-5 * x.abs().max())
    assert 0.3 < (signs < 0).double().mean() < 0.7, "the signs are not mixed"
    assert torch.equal(quant.rotate(x, block), got), "the rotation is not deterministic"
    again = got.clone()
    quant.rotate_back(again, block)
    assert torch.allclose(again, x, rtol=1e-5, atol=1e-6 * x.abs().max())


def test_rotation_signs_differ_by_block() -> None:
    s64, s128 = (torch.sign(quant.signs(b, CPU)[0]) for b in (64, 128))
    assert not torch.equal(s64, s128[:64])


def _one_call(parts: torch.Tensor, wire: str | quant.Format, block: int) -> torch.Tensor:
    """compressed.py's collect quantization, add, requantization and dequantization of
    M machines' partials (M, k), torch ops: what every rank ends with. ``wire``: a
    wire's name, or a study-only format."""
    from types import SimpleNamespace

    from ringreduce.execution import compressed

    fmt = quant.FORMATS[wire] if isinstance(wire, str) else wire
    codec = compressed.Codec(fmt, block, None, CPU)
    got = codec.packed(*parts.shape)
    codec.quantize(parts.clone(), got, None)
    sent = compressed._add(got, got, codec, None, 0)
    ctx = SimpleNamespace(topo=SimpleNamespace(world_size=4), divisors={})
    return compressed._unpack(sent, codec, "sum", torch.float32, ctx).view(-1)  # type: ignore[arg-type]


def test_rotated_int4_beats_the_plain_one_on_outlier_blocks() -> None:
    """Gradient-like blocks: a Gaussian bulk and one value 20 times out per block. The
    plain 4-bit steps (the study's unrotated uniform variant, no wire) are set by the
    outlier; the rotated wire spreads it."""
    g = torch.Generator().manual_seed(0)
    parts = torch.randn(2, 64 * 256, generator=g)
    parts.view(2, 64, 256)[:, :, 7] *= 20
    exact = parts.double().sum(0)
    uniform = quant.Format("uniform4", 7.0, 4, "int4")  # benchmarks/wire_study.py's
    err = {fmt: ((_one_call(parts, fmt, 256).double() - exact).norm() / exact.norm()).item()
           for fmt in ("int4", uniform)}
    assert err["int4"] < 0.6 * err[uniform], err
    assert err["int4"] < 0.13, err


def test_gauss4_levels_are_exact_and_ties_go_down() -> None:
    """quant.quantize's gauss4 codes, unrotated (the rotation is tested above): a block
    whose max-abs is 1 (scale 1) holding each level, each tie, and negatives."""
    fmt, block = quant.Format("gauss4", 1.0, 4, "gauss4"), 16
    levels = torch.tensor(quant.GAUSS4_LEVELS, dtype=torch.float32) / quant.GAUSS4_DENOMINATOR
    ties = torch.tensor(quant.GAUSS4_THRESHOLDS, dtype=torch.float32) / 2048
    for values, want in ((levels, levels), (ties, levels[:-1]), (-levels, -levels)):
        x = torch.zeros(1, block)
        x[0, :values.numel()] = values
        x[0, -1] = 1.0
        packed = torch.empty(1, fmt.row_bytes(block, block), dtype=torch.uint8)
        quant.quantize(x, fmt, block, packed)
        out = torch.empty(1, block)
        quant.dequantize(packed, fmt, block, out)
        assert torch.equal(out[0, :want.numel()], want), (values, out)
        assert out[0, -1] == levels[-1]  # the max itself: the top level


def test_gauss4_cuts_give_the_division_codes() -> None:
    """native/quant.cuh codes int4 without a division a value: RN(v / s) > t exactly when
    |v| > RD(m s), m the midpoint between the threshold t and the next float (t's last
    significand bit 0: a tie goes down to t), m s exact in fp64. That arithmetic in torch
    against quant.quantize's division, on values within 3 ulps of every threshold at scales
    2^-149 .. 2^127, and the kernel's midpoints read from quant.cuh against the thresholds."""
    from ringreduce.execution.kernels import source_dir

    t = torch.tensor(quant.GAUSS4_THRESHOLDS, dtype=torch.float32) / 2048
    assert not (t.view(torch.int32) & 1).any(), "a tie would round up: the cuts need >="
    mid = (t.double() + torch.nextafter(t, torch.tensor(2.0)).double()) / 2
    source = (source_dir() / "quant.cuh").read_text()
    written = [int(n) / 2048 + 2.0 ** -int(e)
               for n, e in re.findall(r"(\d+)\.0 / 2048 \+ 0x1p-(\d+)", source)]
    assert written == mid.tolist(), (written, mid.tolist())

    g = torch.Generator().manual_seed(3)
    nblocks, block = 4096, 64
    exponent = torch.randint(-149, 128, (nblocks, 1), generator=g).double()
    s = (torch.exp2(exponent) * (1 + torch.rand(nblocks, 1, generator=g, dtype=torch.float64)))
    s = s.float().clamp(min=2.0 ** -149, max=torch.finfo(torch.float32).max).double()
    pick = torch.randint(len(t), (nblocks, block), generator=g)
    ulps = torch.randint(-3, 4, (nblocks, block), generator=g).double()
    sign = torch.randint(2, (nblocks, block), generator=g).double() * 2 - 1
    x = (sign * t.double()[pick] * s * (1 + ulps * 2.0 ** -23)).float()
    x[:, 0] = s[:, 0].float()  # the block's max-abs: its scale
    fmt = quant.Format("gauss4", 1.0, 4, "gauss4")
    packed = torch.empty(1, fmt.row_bytes(nblocks * block, block), dtype=torch.uint8)
    quant.quantize(x.view(1, -1).clone(), fmt, block, packed)
    payload = packed[0, nblocks * quant.SCALE_BYTES:]
    want = torch.stack((payload & 0xF, payload >> 4), dim=-1).view(nblocks, block)

    product = mid * s  # exact: 25 x 24 significant bits
    cuts = product.float()
    cuts = torch.where(cuts.double() > product, torch.nextafter(cuts, torch.tensor(-1.0)), cuts)
    m = (x.abs().unsqueeze(-1) > cuts.unsqueeze(1)).sum(-1)
    got = torch.where(x.signbit(), -m, m).to(torch.int8).view(torch.uint8) & 0xF
    near = ((x / s.float()).abs().unsqueeze(-1) / t - 1).abs().amin(-1) < 4 * 2.0 ** -23
    assert near.float().mean() > 0.8  # the values are where the last bit decides
    assert torch.equal(got, want)


def test_gauss4_buckets_give_the_division_codes() -> None:
    """rr_quantize_rot256 codes int4 by a table (native/quant.cuh's Gauss4Bucket): entry n
    of 33 for the values whose v * 16 / s rounds to n - 16, holding a code, the next one and
    the cut of the one threshold inside the bucket (widened by the bucket's rounding error).
    That table built as quant.cuh builds it (its margin, fma constant and mask read from the
    source), against quant.quantize's division: on values next to every threshold and next
    to every bucket edge at scales 2^-100 .. 2^100 (the kernel's range for the table),
    with the bucket off by its whole rounding error either way, and through the kernel's
    own float32 arithmetic with its reciprocal off by 2^-22 either way (gauss4_r16's
    rcp.approx: 1 ulp or 2)."""
    from ringreduce.execution.kernels import source_dir

    source = (source_dir() / "quant.cuh").read_text()
    margin = int(re.search(r"128 \* b - 64 - (\d+)", source).group(1))  # type: ignore[union-attr]
    magic = re.search(r"fmaf\(v, r16, ([\d.]+)f\)", source).group(1)  # type: ignore[union-attr]
    mask = re.search(r"__float_as_uint\(f\) & (0x[0-9a-f]+)u\) \| table", source).group(1)  # type: ignore[union-attr]
    ulp = 2.0 ** (math.floor(math.log2(float(magic))) - 23)  # of the fma's sum
    assert float(magic) == 1.5 * 2.0 ** 20 + 16.5 and ulp == 1 / 8 and int(mask, 16) == 0x1f8
    assert margin == 2048 / 16 * ulp / 2  # the sum's rounding, in 1/2048 of the scale
    body = re.search(r"int gauss4_threshold\(int j\) \{(.*?)\}", source, re.S).group(1)  # type: ignore[union-attr]
    assert tuple(map(int, re.findall(r"\b(\d{2,})\b", body))) == quant.GAUSS4_THRESHOLDS

    t = torch.tensor(quant.GAUSS4_THRESHOLDS, dtype=torch.float64)
    entries = []  # (threshold inside or -1, code, code above it) by n
    for n in range(33):
        b = abs(n - 16)
        lo, hi = 128 * b - 64 - margin, 128 * b + 64 + margin
        held = [j for j, x in enumerate(quant.GAUSS4_THRESHOLDS) if lo <= x <= hi]
        assert len(held) <= 1, (n, held)
        below, sign = int((t < lo).sum()), -1 if n < 16 else 1
        entries.append((held[0] if held else -1, (sign * below) & 0xF,
                        (sign * (below + len(held))) & 0xF))
    inside, code0, code1 = (torch.tensor(c) for c in zip(*entries, strict=True))

    g = torch.Generator().manual_seed(4)
    nblocks, block = 4096, 64
    exponent = torch.randint(-100, 100, (nblocks, 1), generator=g).double()
    s = (torch.exp2(exponent) * (1 + torch.rand(nblocks, 1, generator=g, dtype=torch.float64)))
    s = s.float().double()
    edges = (torch.arange(33, dtype=torch.float64) - 16.5) / 16
    near = torch.cat((t / 2048, edges[1:]))  # every threshold and every inner bucket edge
    pick = torch.randint(len(near), (nblocks, block), generator=g)
    ulps = torch.randint(-3, 4, (nblocks, block), generator=g).double()
    sign = torch.randint(2, (nblocks, block), generator=g).double() * 2 - 1
    x = (sign * near[pick].abs() * s * (1 + ulps * 2.0 ** -23)).float().clamp(-s.float(), s.float())
    x[:, 1::4] = (torch.rand(nblocks, block // 4, generator=g) * 2 - 1) * s.float()
    x[:, 0] = s[:, 0].float()  # the block's max-abs: its scale
    fmt = quant.Format("gauss4", 1.0, 4, "gauss4")
    packed = torch.empty(1, fmt.row_bytes(nblocks * block, block), dtype=torch.uint8)
    quant.quantize(x.view(1, -1).clone(), fmt, block, packed)
    payload = packed[0, nblocks * quant.SCALE_BYTES:]
    want = torch.stack((payload & 0xF, payload >> 4), dim=-1).view(nblocks, block).long()

    mid = (t / 2048 + torch.nextafter((t / 2048).float(), torch.tensor(2.0)).double()) / 2
    product = mid * s  # exact, rounded down to a float: the cuts (quant.cuh's gauss4_cut)
    cuts = product.float()
    cuts = torch.where(cuts.double() > product, torch.nextafter(cuts, torch.tensor(-1.0)), cuts)
    cuts = cuts.view(torch.int32).long()
    bits = x.view(torch.int32).long() & 0xFFFFFFFF

    def codes(n: torch.Tensor) -> torch.Tensor:
        assert int(n.min()) >= 0 and int(n.max()) <= 32
        j = inside[n]
        cut = torch.gather(cuts, 1, j.clamp(min=0)) | torch.where(n < 16, 1 << 31, 0)
        cut = torch.where(j < 0, 0xFFFFFFFF, cut)
        return torch.where(bits > cut, code1[n], code0[n])

    y = x.double() / s
    for error in (-1 / 16, 0.0, 1 / 16):  # the bucket's whole rounding error either way
        assert torch.equal(codes(torch.floor(16 * y + 16.5 + error).long()), want), error
    for off in (-(2.0 ** -22), 0.0, 2.0 ** -22):
        r16 = (16 / s * (1 + off)).float().double()
        fma = (x.double() * r16 + float(magic)).float()  # within an ulp of the fused sum
        n = (fma.view(torch.int32) & int(mask, 16)) >> 3
        assert torch.equal(codes(n.long()), want), off


def test_rotated_wire_keeps_zeros_and_non_finite_blocks() -> None:
    block = 64
    g = torch.Generator().manual_seed(1)
    parts = torch.randn(2, 6 * block, generator=g)
    parts[:, block:2 * block] = 0.0
    parts[0, 3 * block + 5] = float("inf")
    parts[1, 4 * block + 9] = float("nan")
    out = _one_call(parts, "int4", block)
    zeros = out[block:2 * block]
    assert torch.equal(zeros, torch.zeros(block)) and not zeros.signbit().any()
    assert not torch.isfinite(out[3 * block:5 * block]).any()
    assert torch.isfinite(out[:block]).all() and torch.isfinite(out[5 * block:]).all()


def test_rotated_wire_needs_a_power_of_two_block() -> None:
    from ringreduce.execution import compressed

    with pytest.raises(ValueError, match="wire_block=24 must be a power of two; use 32"):
        ringreduce.Config(wire="int4", wire_block=24)
    assert ringreduce.Config(wire="int8", wire_block=24).wire_block == 24  # unrotated
    with pytest.raises(ValueError, match="wire_block=24 must be a power of two >= 8; use 32"):
        compressed.Codec(quant.FORMATS["int4"], 24, None, CPU)
