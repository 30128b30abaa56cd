"""Registers, local memory and shared memory of the rot256 kernels as NVRTC builds them here."""
import torch

from ringreduce.execution.kernels import Kernels

k = Kernels(torch.device("cuda", 0))
for t in ("float", "half_t"):
    for name in (f"rr_quantize_rot256<{t}, 3, true>", f"rr_dequantize_rot256<{t}, 3, true>"):
        fn = k._function("quant.cu", name)
        a = getattr(fn, "attributes", None) or {}
        print(name, {key: a.get(key) for key in ("num_regs", "local_size_bytes", "shared_size_bytes")}
              if a else (fn.num_regs, fn.local_size_bytes, fn.shared_size_bytes))
