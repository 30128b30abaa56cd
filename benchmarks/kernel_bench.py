"""Target T8: the add kernel's bytes moved per second against a device-to-device copy
measured in the same run. Run on a GPU machine: ``python benchmarks/kernel_bench.py``.

Bytes moved by the add: (rows + 1) * k * itemsize read, k * itemsize written; by a copy
of n bytes: n read + n written. Median of CUDA-event timings over 20 launches.
"""

from __future__ import annotations

import statistics

import torch

from ringreduce.execution import add as reference
from ringreduce.execution.kernels import Kernels


def timed(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    fn()
    samples = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def main() -> None:
    kernels = Kernels(torch.device("cuda", torch.cuda.current_device()))
    stream = torch.cuda.current_stream().cuda_stream
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() / timed(lambda: dst.copy_(src))
    print(f"# device-to-device copy: {copy_bw / 1e9:.0f} GB/s (1 GiB, read + write)")
    print(f"#{'dtype':>15} {'rows':>5} {'MiB/row':>8} {'kernel GB/s':>12} {'torch GB/s':>11} "
          f"{'kernel/copy':>12}")
    for dtype in (torch.float32, torch.bfloat16):
        for nrows in (1, 3, 7):
            k = (256 << 20) // dtype.itemsize  # 256 MiB a row
            rows = torch.randint(-9, 10, (nrows, k), device="cuda").to(dtype)
            own = torch.randint(-9, 10, (k,), device="cuda").to(dtype)
            moved = (nrows + 2) * k * own.element_size()
            t_kernel = timed(lambda: kernels.add(own, rows, "sum", 2, stream))  # noqa: B023
            t_torch = timed(lambda: reference.add(own, rows, "sum", 2))  # noqa: B023
            print(f" {dtype!s:>15} {nrows:>5} {k * own.element_size() >> 20:>8} "
                  f"{moved / t_kernel / 1e9:>12.0f} {moved / t_torch / 1e9:>11.0f} "
                  f"{moved / t_kernel / copy_bw:>12.2f}")

    wire_casts(kernels, stream, copy_bw)


def wire_casts(kernels: Kernels, stream: int, copy_bw: float) -> None:
    """The 16-bit wire kernels (native/wire.cu, the wire add) on float32 rows of 128 MiB:
    they run once per slice on the rail stages, so they must stay near copy speed."""
    print(f"#{'kernel':>15} {'rows':>5} {'MiB/row':>8} {'kernel GB/s':>12} {'kernel/copy':>12}")
    k = (128 << 20) // 4
    for nrows in (1, 3, 7):
        view = torch.randn(nrows + 1, k, device="cuda")
        packed = torch.empty(nrows, k, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(k, dtype=torch.bfloat16, device="cuda")
        cases = {
            "narrow_rows": (lambda: kernels.narrow_rows(view, packed, 0, stream),  # noqa: B023
                            nrows * k * 6),
            "widen_rows": (lambda: kernels.widen_rows(packed, view, 0, stream),  # noqa: B023
                           nrows * k * 6),
            "add_wire": (lambda: kernels.add_wire(view[0], packed, out, "sum", 2,  # noqa: B023
                                                  stream), k * 10 + nrows * k * 2),
        }
        for name, (launch, moved) in cases.items():
            t = timed(launch)
            print(f" {name:>15} {nrows:>5} {k * 4 >> 20:>8} {moved / t / 1e9:>12.0f} "
                  f"{moved / t / copy_bw:>12.2f}")


if __name__ == "__main__":
    main()
