"""Registers, local memory and shared memory of the rot256 kernels as NVRTC builds them
here (cupy's function attributes)."""
import torch

from ringreduce.execution.kernels import Kernels

KEYS = ("num_regs", "local_size_bytes", "shared_size_bytes")

k = Kernels(torch.device("cuda", 0))
for t in ("float", "half_t"):
    for name in (f"rr_quantize_rot256<{t}, 3, true>", f"rr_dequantize_rot256<{t}, 3, true>"):
        fn = k._function("quant.cu", name)
        print(name, {key: fn.attributes.get(key) for key in KEYS})
