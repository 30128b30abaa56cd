"""Issue #37's kernel target: the fused quantized-wire kernels (native/quant.cu) at >= 0.85
of the GPU's memory bandwidth, against quant.py's torch ops. One GPU, no communication:
``python benchmarks/quant_bench.py [--mib N] [WIRE ...]`` (default: 64 MiB, every wire of
quant.FORMATS).

Shapes of the compressed route with M = 4 machines, 64 MiB of fp32 (16 Mi values; --mib
sets it: a training call's slices are 1-4 MiB, where every warp quantizes a block or two
and a kernel's start weighs more) in blocks of 256: quantize (M, k) rows, the add (M
received rows -> one requantized row of k), dequantize (M rows -> fp32), each with error
feedback off and on (quantize, add). Bytes moved are what the fused kernel must read and
write (the same count for the torch ops, which move more: the fraction says how far each
is from one pass). The reference is a device-to-device copy of the same bytes (half read,
half written) in the same run.

Timing: CUDA events around 20 back-to-back launches queued behind a sleep kernel, so
the host's launch time (cupy from Python, torch's many ops) stays out of the GPU time.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import SimpleNamespace

import torch

from ringreduce.defaults import DEFAULT_WIRE_BLOCK
from ringreduce.execution import compressed, quant
from ringreduce.execution.feedback import Errors
from ringreduce.execution.kernels import Kernels

MACHINES = 4
MIB = 64
"""MiB of fp32 (default): the input of quantize, what the add's M rows and dequantize's
output stand for."""
REPS = 20
SLEEP_CYCLES = 200_000_000
"""About 0.1 s at 2 GHz: long enough for the host to queue REPS launches of the torch
path (tens of ops each) before the GPU reaches them."""


def timed(fn: Callable[[], object]) -> float:
    """Seconds per call of ``fn``, GPU time, calls back to back."""
    fn()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    begin.record()
    for _ in range(REPS):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / REPS


class Copies:
    """Device-to-device copy bandwidth (bytes read + written per second) by size."""

    def __init__(self) -> None:
        self._bw: dict[int, float] = {}

    def bandwidth(self, moved: int) -> float:
        if moved not in self._bw:
            src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            self._bw[moved] = moved / timed(lambda: dst.copy_(src))
        return self._bw[moved]


Case = tuple[Callable[[], object], Callable[[], object], int]


def cases(kernels: Kernels, name: str, feedback: bool, values: int) -> dict[str, Case]:
    """kernel -> (fused launch, torch ops, bytes the fused kernel moves)."""
    fmt, block, device = quant.FORMATS[name], DEFAULT_WIRE_BLOCK, torch.device("cuda")
    fused = compressed.Codec(fmt, block, kernels, device)
    ops = compressed.Codec(fmt, block, None, device)
    k = values // MACHINES
    row = fmt.row_bytes(k, block)
    x = torch.randn(MACHINES, k, device="cuda")
    packed = fused.packed(MACHINES, k)
    ops.quantize(x.clone(), packed, None)
    residual = torch.zeros_like(x) if feedback else None
    errors = Errors(values, name, x, torch.zeros(k, device="cuda")) \
        if feedback else None
    ctx = SimpleNamespace(topo=SimpleNamespace(world_size=8), divisors={})
    extra = 8 if feedback else 0  # a residual value read and written
    found = {
        "quantize": (lambda: fused.quantize(x, packed, residual),
                     lambda: ops.quantize(x, packed, residual),
                     values * (4 + extra) + MACHINES * row),
        "add": (lambda: compressed._add(packed, packed, fused, errors, 0),
                lambda: compressed._add(packed, packed, ops, errors, 0),
                MACHINES * row + row + k * extra),
    }
    if not feedback:
        found["dequantize"] = (
            lambda: compressed._unpack(packed, fused, "sum", torch.float32, ctx),  # type: ignore[arg-type]
            lambda: compressed._unpack(packed, ops, "sum", torch.float32, ctx),  # type: ignore[arg-type]
            MACHINES * row + values * 4)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description="the fused quantized-wire kernels against a copy")
    p.add_argument("wires", nargs="*", metavar="WIRE",
                   help=f"wires to measure, of {list(quant.FORMATS)} (default: all)")
    p.add_argument("--mib", type=int, default=MIB, help="MiB of fp32 a call (default: 64)")
    args = p.parse_args()
    unknown = sorted(set(args.wires) - set(quant.FORMATS))
    if unknown:  # not argparse's choices: with nargs="*" it refuses the empty default
        p.error(f"unknown wire(s) {unknown}: choose from {list(quant.FORMATS)}")
    mib, wires = args.mib, args.wires or list(quant.FORMATS)
    values = (mib << 20) // 4
    kernels = Kernels(torch.device("cuda", torch.cuda.current_device()))
    copies = Copies()
    print(f"# {torch.cuda.get_device_name()}: device-to-device copy of 64 MiB "
          f"{copies.bandwidth(128 << 20) / 1e9:.0f} GB/s (read + write); "
          f"{mib} MiB, M={MACHINES}, block {DEFAULT_WIRE_BLOCK}, {REPS} launches each")
    rows = []
    for name in wires:
        for feedback in (False, True):
            for kernel, (fused, ops, moved) in cases(kernels, name, feedback, values).items():
                copy_bw = copies.bandwidth(moved)
                t_fused, t_ops = timed(fused), timed(ops)
                rows.append((kernel, name, "on" if feedback else "off", moved >> 20,
                             moved / t_fused / 1e9, moved / t_fused / copy_bw,
                             moved / t_ops / 1e9, moved / t_ops / copy_bw, t_ops / t_fused))
    print(f"{'kernel':>10} {'wire':>5} {'feedback':>8} {'MiB':>5} {'fused GB/s':>10} "
          f"{'/copy':>6} {'torch GB/s':>10} {'/copy':>6} {'speedup':>7}")
    for kernel, name, fb, mib, fused_bw, fused_frac, ops_bw, ops_frac, speedup in rows:
        print(f"{kernel:>10} {name:>5} {fb:>8} {mib:>5} {fused_bw:>10.0f} {fused_frac:>6.2f} "
              f"{ops_bw:>10.0f} {ops_frac:>6.2f} {speedup:>6.1f}x")


if __name__ == "__main__":
    main()
