"""Block-quantized wire formats of the network hop: int8, fp8 (e4m3) and int4.

A row of ``k`` fp32 values (``k`` a multiple of the block) travels as one uint8 row:
``k / block`` fp32 scales, then the payload (``k`` bytes for int8 and fp8, ``k / 2`` for
int4, two values a byte, the even element in the low nibble). Per block, symmetric:

    scale = max|x| / QMAX            (QMAX: 127 int8, 448 e4m3, 7 int4)
    q     = round(x / scale)         clamped to [-QMAX, QMAX] (fp8: rounded by the cast)
    x'    = q * scale                (fp32)

Rules the route relies on (compressed.py):
  * a block of zeros has scale 0 and comes back as zeros (the division is guarded);
  * a block holding inf or nan has a non-finite scale, so every element of it comes
    back non-finite (0 * inf and x * nan are nan): nothing non-finite is lost, and the
    rest of that block is lost with it (documented in Config.wire);
  * dequantization is a pure function of the bytes, so ranks that dequantize the same
    bytes hold bit-identical values.

Written with torch ops so that it runs on the CPU (gloo tests) and on CUDA alike; they
make several passes over the row. On CUDA with cupy, compressed.py runs the fused
kernels of native/quant.cu instead (one pass each), which mirror these ops on CUDA bit
for bit: note that there ``torch.div`` by a Python number multiplies by the fp32
reciprocal of QMAX (a true division on the CPU), so a scale may differ in its last bit
between the CPU and CUDA; ranks of one run all take the same path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_BYTES = 4
"""One fp32 scale per block."""


@dataclass(frozen=True)
class Format:
    """One quantized wire format."""

    name: str
    qmax: float
    """Largest magnitude of a quantized value: the block's max-abs maps to it."""
    bits: int
    """Payload bits per element."""

    @property
    def worst_error(self) -> float:
        """The largest |x' - x| of one quantization, as a fraction of its block's
        max-abs: half a step for the integers, half an e4m3 ulp at the top (3 mantissa
        bits: an ulp is at most 2^-3 of the value) for fp8."""
        return 2.0**-4 if self.name == "fp8" else 0.5 / self.qmax

    def row_bytes(self, k: int, block: int) -> int:
        """Bytes of one packed row of ``k`` values (scales, then payload)."""
        assert k % block == 0 and block % 8 == 0, (k, block)
        return k // block * SCALE_BYTES + k * self.bits // 8


FORMATS = {
    "int8": Format("int8", 127.0, 8),
    # e4m3's largest finite value: the cast rounds to nearest, so a block's max-abs
    # maps onto it exactly and nothing saturates into e4m3fn's nan.
    "fp8": Format("fp8", 448.0, 8),
    # Symmetric -7..7 (of -8..7): zero stays exact and the two signs have equal steps.
    "int4": Format("int4", 7.0, 4),
}


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
    if fmt.name == "fp8":
        payload.copy_(y.view(rows, k).to(torch.float8_e4m3fn).view(torch.uint8))
        return
    q = y.round_().to(torch.int8).view(rows, k)
    if fmt.name == "int8":
        payload.copy_(q.view(torch.uint8))
        return
    nibbles = q.view(torch.uint8) & 0xF  # two's complement: -7..7 -> 9..15, 0..7
    torch.bitwise_or(nibbles[:, 0::2], nibbles[:, 1::2] << 4, out=payload)


def dequantize(packed: torch.Tensor, fmt: Format, block: int, out: torch.Tensor) -> None:
    """Unpipelined meaning: out[r] = q(packed[r]) * scale, block by block, in fp32.

    ``packed``: (R, fmt.row_bytes(k, block)) uint8; ``out``: (R, k) fp32."""
    rows, k = out.shape
    scales, payload = _split(packed, fmt, k, block)
    if fmt.name == "fp8":
        values = payload.view(torch.float8_e4m3fn).float()
    elif fmt.name == "int8":
        values = payload.view(torch.int8).float()
    else:
        nibbles = torch.stack((payload & 0xF, payload >> 4), dim=-1).view(rows, k)
        values = ((nibbles.view(torch.int8) ^ 8) - 8).float()  # sign-extend 4 bits
    torch.mul(values.view(rows, k // block, block), scales.unsqueeze(-1),
              out=out.view(rows, k // block, block))


def _split(packed: torch.Tensor, fmt: Format, k: int,
           block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales (R, k/block) fp32, payload (R, k*bits/8) uint8): views of a packed buffer."""
    nscales = k // block * SCALE_BYTES
    assert packed.shape[1] == fmt.row_bytes(k, block), (packed.shape, k, block)
    return packed[:, :nscales].view(torch.float32), packed[:, nscales:]
