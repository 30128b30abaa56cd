"""Block-quantized wire formats of the network hop: int8, fp8 (e4m3) and int4 (rotated,
at Gaussian levels).

A row of ``k`` fp32 values (``k`` a multiple of the block) travels as one uint8 row:
``k / block`` fp32 scales, then the payload (``k`` bytes for int8 and fp8, ``k / 2`` for
the 4-bit ones, two values a byte, the even element in the low nibble). Per block,
symmetric:

    scale = max|x| / QMAX            (QMAX: 127 int8, 448 e4m3, 1 gauss4; 7 uniform int4)
    q     = round(x / scale)         clamped to [-QMAX, QMAX] (fp8: rounded by the cast;
                                     gauss4: the nearest of 15 levels, GAUSS4_LEVELS)
    x'    = value(q) * scale         (fp32)

The int4 wire is gauss4 on rotated blocks (below). ``Format`` also takes the uniform
-7..7 int4 encoding, and rotation with any encoding: benchmarks/wire_study.py measures
such variants (unrotated uniform int4, rotated int8, ...) against the wires; FORMATS
holds only the wires, the variants the study and training kept.

Rules the route relies on (compressed.py):
  * a block of zeros has scale 0 and comes back as zeros (the division is guarded);
  * a block holding inf or nan has a non-finite scale, so every element of it comes
    back non-finite (0 * inf and x * nan are nan): nothing non-finite is lost, and the
    rest of that block is lost with it (documented in Config.wire);
  * dequantization is a pure function of the bytes, so ranks that dequantize the same
    bytes hold bit-identical values.

Rotated formats (``Format.rotated``): before quantizing, each block of B = ``block``
values (a power of two) is multiplied by a randomized Hadamard matrix, the same on every
rank and call (``rotate``); quantization, the machines' fp32 sum and error feedback all
happen in that rotated domain (the map is linear: the sum of the rotations is the
rotation of the sum), and the reduced rows are rotated back once where they land
(``rotate_back``). Why: a block's max-abs sets its step, and a gradient block's max is
often an outlier several times the bulk; rotated, every value is a +-1 mix of all B of
them, close to Gaussian, so the max sits ~3 standard deviations out, and gauss4 places
its 15 levels where such a block's values are (THC, DRIVE/EDEN, SDP4Bit; QLoRA's NF4).
Rules: an inf or nan spreads to its whole block on the way in, so that block comes back
non-finite, as unrotated; a rotated value may overflow where its block's values are
within 2^(log2(B)/2) of fp32's max (gradients are nowhere near): that block then comes
back non-finite too.

Written with torch ops so that it runs on the CPU (gloo tests) and on CUDA alike; they
make several passes over the row. On CUDA with cupy, compressed.py runs the fused
kernels of native/quant.cu instead (one pass each), which mirror these ops on CUDA bit
for bit: note that there ``torch.div`` by a Python number multiplies by the fp32
reciprocal of QMAX (a true division on the CPU), so a scale may differ in its last bit
between the CPU and CUDA; ranks of one run all take the same path.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch

SCALE_BYTES = 4
"""One fp32 scale per block."""
GAUSS4_DENOMINATOR = 1024
GAUSS4_LEVELS = (0, 98, 198, 305, 420, 553, 715, 938)
"""gauss4's magnitudes, times 1/1024 (exact in fp32): codes -7..7 stand for
-L[7]..L[7] of the block's max-abs. Lloyd-Max levels for y = x / max|x| over blocks of
128 Gaussian values (what a rotated block looks like), rounded to 1/1024: 0.096 of the
max-abs RMS error against 0.114 for int4's uniform steps (-16 %; 0.100 against 0.123 on
blocks of 256). The top level sits below the max: the max is one value of the block,
the bulk is near 0.3 of it."""
GAUSS4_THRESHOLDS = (98, 296, 503, 725, 973, 1268, 1653)
"""Midpoints of consecutive GAUSS4_LEVELS, times 1/2048 (exact): |y| above the j-th
takes level j+1 or higher (a tie takes the lower)."""
SIGN_SEED = 0x52494E47
"""The rotation's signs: a fixed constant (every rank and call agree without talking),
mixed with the block size (``signs``)."""


@dataclass(frozen=True)
class Format:
    """One quantized wire format."""

    name: str
    qmax: float
    """Largest magnitude of a quantized value: the block's max-abs maps to it."""
    bits: int
    """Payload bits per element."""
    encoding: str = ""
    """How a value is coded: "int8", "fp8", "gauss4" or "int4" (uniform -7..7 of the
    step: study variants only, benchmarks/wire_study.py) (default: ``name``)."""
    rotated: bool = False
    """Blocks cross randomized-Hadamard rotated (module docstring): ``block`` must be a
    power of two."""

    def __post_init__(self) -> None:
        if not self.encoding:
            object.__setattr__(self, "encoding", self.name)

    def check_block(self, block: int) -> None:
        """ValueError unless ``block`` suits this format (before any communication)."""
        if self.rotated and (block < 8 or block & (block - 1)):
            raise ValueError(f"wire={self.name!r} rotates blocks with a Hadamard transform, "
                             f"so wire_block={block!r} must be a power of two >= 8; use "
                             f"{1 << max(3, (block - 1).bit_length())} (or 256, the default)")

    @property
    def worst_error(self) -> float:
        """The largest |x' - x| of one quantization, as a fraction of its block's
        max-abs: half a step for the integers, half an e4m3 ulp at the top (3 mantissa
        bits: an ulp is at most 2^-3 of the value) for fp8; gauss4's widest half-gap
        or what its top level leaves of the max."""
        if self.encoding == "gauss4":
            levels = [n / GAUSS4_DENOMINATOR for n in GAUSS4_LEVELS]
            gaps = [(b - a) / 2 for a, b in itertools.pairwise(levels)]
            return max(*gaps, 1.0 - levels[-1])
        return 2.0**-4 if self.encoding == "fp8" else 0.5 / self.qmax

    def worst_error_in(self, block: int) -> float:
        """The largest |x' - x| of one quantization as a fraction of the max-abs of its
        block of ``block`` values in the tensor: ``worst_error``, times ``block`` for a
        rotated format (a rotated value is at most 2^-a B max|x|, its error at most
        worst_error of that, and rotating back sums B errors times 2^-(log2 B - a)):
        a bound for any input, far above what Gaussian-like blocks see."""
        return self.worst_error * (block if self.rotated else 1)

    def row_bytes(self, k: int, block: int) -> int:
        """Bytes of one packed row of ``k`` values (scales, then payload)."""
        assert k % block == 0 and block % 8 == 0, (k, block)
        return k // block * SCALE_BYTES + k * self.bits // 8


FORMATS = {
    "int8": Format("int8", 127.0, 8),
    # e4m3's largest finite value: the cast rounds to nearest, so a block's max-abs
    # maps onto it exactly and nothing saturates into e4m3fn's nan.
    "fp8": Format("fp8", 448.0, 8),
    # Rotated, at Gaussian levels: benchmarks/wire_study.py measured one call on real
    # gradients (DLRM, two decoders, 2 x 2, blocks of 256) at 0.120-0.128 relative L2
    # where uniform unrotated int4 (-7..7) gave 0.149-0.204, rotation alone 0.142-0.154
    # and Gaussian levels alone 0.121-0.163, for the same bytes.
    "int4": Format("int4", 1.0, 4, "gauss4", rotated=True),
}
"""The quantized wires (config.WIRES' 8- and 4-bit ones). int8 stays unrotated: rotated
int8's lower one-call error (8.2e-3-9.1e-3 against 9.2e-3-1.3e-2, the same study) did
not show in training, where int8 was as fast or faster at fp32's loss."""


def quantize(x: torch.Tensor, fmt: Format, block: int, out: torch.Tensor) -> None:
    """Unpipelined meaning: out[r] = pack(scales(x[r]), q(x[r])) for every row r.

    ``x``: (R, k) fp32, contiguous; ``out``: (R, fmt.row_bytes(k, block)) uint8."""
    rows, k = x.shape
    blocks = x.view(rows, k // block, block)
    scales, payload = _split(out, fmt, k, block)
    torch.div(blocks.abs().amax(dim=-1), fmt.qmax, out=scales)  # nan and inf propagate
    # Divide by 1 where the scale is 0 (a block of zeros: 0, not 0/0) or not finite
    # (that block's scale already makes every element non-finite on the way back).
    usable = torch.isfinite(scales) & (scales > 0)
    y = blocks / torch.where(usable, scales, torch.ones_like(scales)).unsqueeze(-1)
    y = y.clamp_(-fmt.qmax, fmt.qmax).nan_to_num_(0.0)  # no nan into an integer cast
    if fmt.encoding == "fp8":
        payload.copy_(y.view(rows, k).to(torch.float8_e4m3fn).view(torch.uint8))
        return
    q = y.round_().to(torch.int8).view(rows, k) if fmt.encoding != "gauss4" else \
        _gauss4_codes(y).view(rows, k)
    if fmt.encoding == "int8":
        payload.copy_(q.view(torch.uint8))
        return
    nibbles = q.view(torch.uint8) & 0xF  # two's complement: -7..7 -> 9..15, 0..7
    torch.bitwise_or(nibbles[:, 0::2], nibbles[:, 1::2] << 4, out=payload)


def dequantize(packed: torch.Tensor, fmt: Format, block: int, out: torch.Tensor) -> None:
    """Unpipelined meaning: out[r] = q(packed[r]) * scale, block by block, in fp32.

    ``packed``: (R, fmt.row_bytes(k, block)) uint8; ``out``: (R, k) fp32."""
    rows, k = out.shape
    scales, payload = _split(packed, fmt, k, block)
    if fmt.encoding == "fp8":
        values = payload.view(torch.float8_e4m3fn).float()
    elif fmt.encoding == "int8":
        values = payload.view(torch.int8).float()
    else:
        nibbles = torch.stack((payload & 0xF, payload >> 4), dim=-1).view(rows, k)
        codes = (nibbles.view(torch.int8) ^ 8) - 8  # sign-extend 4 bits
        values = codes.float() if fmt.encoding == "int4" else _gauss4_values(codes)
    torch.mul(values.view(rows, k // block, block), scales.unsqueeze(-1),
              out=out.view(rows, k // block, block))


def _gauss4_codes(y: torch.Tensor) -> torch.Tensor:
    """int8 codes -7..7 of y (|y| <= 1, no nan): the sign of y times the number of
    GAUSS4_THRESHOLDS below |y|."""
    thresholds, _ = _gauss4_tables(y.device)
    m = torch.bucketize(y.abs(), thresholds).to(torch.int8)  # count of thresholds < |y|
    return torch.where(y < 0, -m, m)


def _gauss4_values(codes: torch.Tensor) -> torch.Tensor:
    """fp32 level of each code -7..7 (int8), as a fraction of the block's max-abs."""
    _, table = _gauss4_tables(codes.device)
    return table[codes.long() + 7]


@functools.cache
def _gauss4_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(thresholds (7,), levels of codes -7..7 (15,)) fp32 on ``device``, made once."""
    thresholds = torch.tensor(GAUSS4_THRESHOLDS, dtype=torch.float32) / (2 * GAUSS4_DENOMINATOR)
    half = torch.tensor(GAUSS4_LEVELS, dtype=torch.float32) / GAUSS4_DENOMINATOR
    return thresholds.to(device), torch.cat((-half.flip(0)[:-1], half)).to(device)


def rotate(x: torch.Tensor, block: int) -> torch.Tensor:
    """Each block of ``x`` (R, k) fp32 rotated: y = 2^-a H diag(s) x per block, a new
    tensor (``signs`` gives s and a; H the Walsh-Hadamard matrix of order ``block``, by
    ``_walsh_hadamard`` in ``forward_passes``' order). The arithmetic native/quant.cu's
    kernels do bit for bit: one multiply by a power of two (exact), then log2(block)
    passes of adds."""
    rows, k = x.shape
    forward, _ = signs(block, x.device)
    y = torch.mul(x.view(rows, k // block, block), forward)
    return _walsh_hadamard(y.view(-1, block), forward_passes(block)).view(rows, k)


def forward_passes(block: int) -> tuple[int, ...]:
    """The butterfly strides of ``rotate``, in order: h = 1, 2, .., block/2, except for
    blocks of 256 (int4's): 16 .. 128 first, then 1 .. 8. Why: native/quant.cu's
    rr_quantize_rot256 loads a block with index bits 0-3 across 16 lanes and ends with
    them in each lane's registers, where 16 consecutive codes pack without another trip
    through shared memory (rotate_back's order stays 1 .. 128: its kernel starts from the
    packed codes)."""
    strides = _strides(block)
    return strides[4:] + strides[:4] if block == 256 else strides


def _strides(block: int) -> tuple[int, ...]:
    """h = 1, 2, .., block/2: every butterfly stride of a block, smallest first."""
    return tuple(1 << b for b in range(block.bit_length() - 1))


def rotate_back(y: torch.Tensor, block: int) -> None:
    """``rotate`` undone in place on ``y`` (R, k) fp32: x = diag(s) H y 2^-(log2(block)-a)
    per block (H is its own inverse up to 1/block, split over the two directions as
    powers of two: no rounding but the adds'), then + 0.0, which changes nothing but
    -0 into +0."""
    rows, k = y.shape
    _, back = signs(block, y.device)
    x = _walsh_hadamard(y.reshape(-1, block), _strides(block)).view(rows, k // block, block)
    out = y.view(rows, k // block, block)
    torch.mul(x, back, out=out)
    out.add_(0.0)  # -0 (a zero times a negative sign) -> +0: zeros come back as zeros


def _walsh_hadamard(x: torch.Tensor, passes: tuple[int, ...]) -> torch.Tensor:
    """(N, B) -> H x per row, unnormalized, in log2(B) butterfly passes of strides
    ``passes``: (x[i], x[i+h]) -> (x[i] + x[i+h], x[i] - x[i+h]) for i with bit h clear.
    Any order gives H x; each is one fixed order of fp32 adds, which the kernels repeat."""
    n, block = x.shape
    src, dst = x.contiguous(), torch.empty_like(x)
    for h in passes:
        a = src.view(n, block // (2 * h), 2, h)
        out = dst.view(n, block // (2 * h), 2, h)
        torch.add(a[:, :, 0], a[:, :, 1], out=out[:, :, 0])
        torch.sub(a[:, :, 0], a[:, :, 1], out=out[:, :, 1])
        src, dst = dst, src
    return src


def signs(block: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward, back): the rotation's per-position multipliers for ``block``, fp32
    (block,): s_i 2^-a and s_i 2^-(log2(block) - a), a = log2(block) // 2, so that the
    two directions together divide by block exactly. s_i = -1 where the top bit of
    ``sign_hash(block, i)`` is set."""
    return _signs(block, torch.device(device))


@functools.cache
def _signs(block: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Made once per block and device (a copy to the device each call would wait on
    the host)."""
    if block < 2 or block & (block - 1):
        raise ValueError(f"block={block} must be a power of two to be rotated")
    log = block.bit_length() - 1
    a = log // 2
    s = torch.tensor([-1.0 if sign_hash(block, i) >> 31 else 1.0 for i in range(block)])
    return (s * 2.0**-a).to(device), (s * 2.0**-(log - a)).to(device)


def sign_hash(block: int, i: int) -> int:
    """A 32-bit hash of position ``i`` in a block of ``block`` (lowbias32 of the seed
    mixed with the block, plus i): the rotation's random signs without a random number
    generator, so that the kernels compute the same ones (native/quant.cuh)."""
    return _lowbias32((_lowbias32(SIGN_SEED ^ block) + i) & 0xFFFFFFFF)


def _lowbias32(x: int) -> int:
    """Chris Wellons' lowbias32 integer hash, on 32-bit unsigned values."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _split(packed: torch.Tensor, fmt: Format, k: int,
           block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales (R, k/block) fp32, payload (R, k*bits/8) uint8): views of a packed buffer."""
    nscales = k // block * SCALE_BYTES
    assert packed.shape[1] == fmt.row_bytes(k, block), (packed.shape, k, block)
    return packed[:, :nscales].view(torch.float32), packed[:, nscales:]
