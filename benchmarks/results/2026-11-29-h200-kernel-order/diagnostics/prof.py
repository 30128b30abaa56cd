"""One int4 quantize (no feedback) of 64 MiB, three times, for ncu."""
import torch

from ringreduce.execution import compressed, quant
from ringreduce.execution.kernels import Kernels

kernels = Kernels(torch.device("cuda", 0))
codec = compressed.Codec(quant.FORMATS["int4"], 256, kernels, torch.device("cuda"))
x = torch.randn(4, 4 << 20, device="cuda")
out = codec.packed(4, 4 << 20)
for _ in range(3):
    codec.quantize(x, out, None)
torch.cuda.synchronize()
