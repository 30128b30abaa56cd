"""Where the cut-coded int4 and quant.py's torch ops differ (GPU), and whether torch's
GPU division equals the CPU's (IEEE)."""
import sys, torch
sys.path.insert(0, "tests"); sys.path.insert(0, ".")
from ringreduce.execution import compressed, quant
from ringreduce.execution.kernels import Kernels
import test_gpu_quant_kernels as t

kern = Kernels(torch.device("cuda", 0))
fmt = quant.FORMATS["int4"]

def codes(packed, k, block):
    n = k // block * 4
    p = packed[0, n:].cpu()
    nib = torch.stack((p & 0xF, p >> 4), -1).view(-1)
    return ((nib.view(torch.int8) ^ 8) - 8)

def check(name, w, block):
    k = w.shape[1]
    fused = compressed.Codec(fmt, block, kern, torch.device("cuda"))
    ops = compressed.Codec(fmt, block, None, torch.device("cuda"))
    a, b = fused.packed(1, k), fused.packed(1, k)
    ops.quantize(w.clone(), a, None, rotate=False)
    fused.quantize(w, b, None, rotate=False)
    torch.cuda.synchronize()
    ca, cb = codes(a, k, block), codes(b, k, block)
    bad = (ca != cb).nonzero().view(-1)
    v = w.view(-1).cpu(); s = v.view(-1, block).abs().amax(1).repeat_interleave(block)
    ygpu = (w.view(-1, block) / w.view(-1, block).abs().amax(1, keepdim=True)).view(-1).cpu()
    ycpu = v / s
    print(f"{name}: {len(bad)} code mismatches of {k}; torch GPU vs CPU division differ at "
          f"{int((ygpu != ycpu).sum())}; scales equal {torch.equal(a[0,:k//block*4].cpu(), b[0,:k//block*4].cpu())}")
    for i in bad[:6].tolist():
        print(f"  i={i} v={v[i].item()!r} s={s[i].item()!r} y_gpu={ygpu[i].item()!r} y_cpu={ycpu[i].item()!r} torch={ca[i].item()} kernel={cb[i].item()}")

check("near thresholds", t._near_thresholds(4096, 256, range(-126, 127, 2), seed=5), 256)
x = t._data(3, 9 * 64, 64, seed=9, dtype=torch.float32)
check("block 64 _data (unrotated)", x.view(1, -1).contiguous(), 64)
