"""How native/add.cu's launch shape and bf16 rounding change its bandwidth (T8).

Sweeps blocks per SM x threads per block, and for bf16 the bit-operation rounding
against PTX ``cvt.rn.bf16.f32``, with rows of 256 MiB, each checked exact once, against
a device copy in the same run. ringreduce.execution.kernels picks its launch shape from this.
One GPU: ``python3 benchmarks/kernel_occupancy.py``."""
from __future__ import annotations

import sys
from pathlib import Path

import cupy
import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # ringreduce, and kernel_bench beside this file
from kernel_bench import timed  # noqa: E402

from ringreduce.execution.kernels import source_dir  # noqa: E402

SRC = (source_dir() / "numeric.cuh").read_text() + (source_dir() / "add.cu").read_text()
OLD = """    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
        out->bits = static_cast<unsigned short>((u >> 16) | 0x40u);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    out->bits = static_cast<unsigned short>(u >> 16);"""
NEW = """    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    out->bits = h;"""
assert OLD in SRC


def main() -> None:
    major, minor = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    arch = f"sm_{major}{minor}"
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / timed(lambda: dst.copy_(src))
    print(f"# {torch.cuda.get_device_name()} copy {copy/1e9:.0f} GB/s", flush=True)
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    for dtype, elem, acc in ((torch.bfloat16, "bf16_t", np.float32),
                             (torch.float32, "float", np.float32)):
        for cvt in ((False, True) if dtype == torch.bfloat16 else (False,)):
            code = SRC.replace(OLD, NEW) if cvt else SRC
            vec = 16 // dtype.itemsize
            name = f"rr_add<{elem}, float, 0, {vec}>"
            fn = cupy.RawModule(code=code, name_expressions=[name],
                                options=("-std=c++17", f"--gpu-architecture={arch}")
                                ).get_function(name)
            for bps in (4, 8, 16):
                for threads in (256, 512):
                    if bps * threads > 2048:
                        continue
                    for nrows in (1, 3, 7):
                        k = (256 << 20) // dtype.itemsize
                        rows = torch.randint(-9, 10, (nrows, k), device="cuda").to(dtype)
                        own = torch.randint(-9, 10, (k,), device="cuda").to(dtype)
                        want = own.float() + rows.float().sum(0)
                        blocks = min(-(-k // (threads * vec)), bps * sms)
                        args = (np.uint64(own.data_ptr()), np.uint64(rows.data_ptr()),
                                np.int64(k), np.int32(nrows), acc(2))
                        launch = lambda: fn((blocks,), (threads,), args, stream=stream)  # noqa
                        own0 = own.clone()
                        launch()
                        torch.cuda.synchronize()
                        ok = torch.equal(own.float(), want.to(dtype).float())
                        own.copy_(own0)
                        t = timed(launch)
                        moved = (nrows + 2) * k * dtype.itemsize
                        print(f"{dtype!s:>15} cvt={int(cvt)} bps={bps:>2} thr={threads} "
                              f"rows={nrows} {moved/t/1e9:6.0f} GB/s  {moved/t/copy:.2f} "
                              f"exact={ok}", flush=True)


if __name__ == "__main__":
    main()
