"""Where the cut-coded int4 and quant.py's torch ops differ (GPU), and whether torch's
GPU division equals the CPU's (IEEE). Run from the repository root of the commit:
``python3 run4-diag.py`` (it ran as run 4's ``diag.py``; reformatted since, same code)."""
import sys

import torch

sys.path.insert(0, "tests")
sys.path.insert(0, ".")
import test_gpu_quant_kernels as t

from ringreduce.execution import compressed, quant
from ringreduce.execution.kernels import Kernels

kern = Kernels(torch.device("cuda", 0))
fmt = quant.FORMATS["int4"]


def codes(packed: torch.Tensor, k: int, block: int) -> torch.Tensor:
    n = k // block * 4
    p = packed[0, n:].cpu()
    nib = torch.stack((p & 0xF, p >> 4), -1).view(-1)
    return (nib.view(torch.int8) ^ 8) - 8


def check(name: str, w: torch.Tensor, block: int) -> None:
    k = w.shape[1]
    fused = compressed.Codec(fmt, block, kern, torch.device("cuda"))
    ops = compressed.Codec(fmt, block, None, torch.device("cuda"))
    a, b = fused.packed(1, k), fused.packed(1, k)
    ops.quantize(w.clone(), a, None, rotate=False)
    fused.quantize(w, b, None, rotate=False)
    torch.cuda.synchronize()
    ca, cb = codes(a, k, block), codes(b, k, block)
    bad = (ca != cb).nonzero().view(-1)
    v = w.view(-1).cpu()
    s = v.view(-1, block).abs().amax(1).repeat_interleave(block)
    ygpu = (w.view(-1, block) / w.view(-1, block).abs().amax(1, keepdim=True)).view(-1).cpu()
    ycpu = v / s
    nscales = k // block * 4
    same_scales = torch.equal(a[0, :nscales].cpu(), b[0, :nscales].cpu())
    print(f"{name}: {len(bad)} code mismatches of {k}; torch GPU vs CPU division differ at "
          f"{int((ygpu != ycpu).sum())}; scales equal {same_scales}")
    for i in bad[:6].tolist():
        print(f"  i={i} v={v[i].item()!r} s={s[i].item()!r} y_gpu={ygpu[i].item()!r} "
              f"y_cpu={ycpu[i].item()!r} torch={ca[i].item()} kernel={cb[i].item()}")


check("near thresholds", t._near_thresholds(4096, 256, range(-126, 127, 2), seed=5), 256)
x = t._data(3, 9 * 64, 64, seed=9, dtype=torch.float32)
check("block 64 _data (unrotated)", x.view(1, -1).contiguous(), 64)
