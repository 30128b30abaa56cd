"""Error of a 16-bit wire on real gradients (issue: 16-bit wire on the network hop).

Four CPU ranks (gloo) as 2 machines x 2 devices train a small MLP for a few steps; at
each step every rank's flat gradient is all-reduced (AVG) four ways:
  exact     float64 all-reduce (the reference),
  fp32      ringreduce, float32 everywhere,
  rr-bf16 / rr-fp16   ringreduce with wire_dtype: only collect/diffuse are 16-bit,
  rr-int8 / rr-fp8 / rr-int4   ringreduce with a quantized rail (one fp32 scale per
            block of 256; int4 rotates each block: quant.py; benchmarks/wire_study.py
            compares it with the variants not kept), one call each, no error feedback
            (feedback carries a call's error into the next call of the same key; this
            measures one call),
  hook-bf16 what torch's bf16_compress_hook does: cast to bf16, divide, all-reduce in
            bf16 (every hop), cast back,
and the relative L2 error and the largest relative element error against the
reference are printed. The numerics do not depend on the device, so CPU is enough.

    python benchmarks/wire_error.py
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
from torch import nn

import ringreduce
from ringreduce.benchmark.launch import run_ranks

STEPS = 5


def grads(model: nn.Module, rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * rank + step)
    x, y = torch.randn(64, 256, generator=g), torch.randn(64, 10, generator=g)
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y.softmax(-1)).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def errors(got: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - exact
    big = exact.abs() > exact.abs().max() * 1e-3  # relative error where it is meaningful
    return ((diff.norm() / exact.norm()).item(),
            (diff[big].abs() / exact[big].abs()).max().item())


def worker(launch: object, device: torch.device) -> dict[str, list[tuple[float, float]]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                          nn.Linear(512, 10))
    comms = {name: ringreduce.Communicator(machines=2, min_bytes=0, wire=wire)
             for name, wire in (("fp32", None), ("rr-bf16", "bf16"), ("rr-fp16", "fp16"),
                                ("rr-int8", "int8"), ("rr-fp8", "fp8"), ("rr-int4", "int4"))}
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in (*comms, "hook-bf16")}
    for step in range(STEPS):
        g = grads(model, rank, step)
        exact = g.double()
        dist.all_reduce(exact)
        exact /= world
        for name, comm in comms.items():
            t = g.clone()
            comm.all_reduce(t, op=dist.ReduceOp.AVG)
            out[name].append(errors(t, exact))
        hooked = g.to(torch.bfloat16).div_(world)
        dist.all_reduce(hooked)
        out["hook-bf16"].append(errors(hooked.float(), exact))
    for comm in comms.values():
        comm.close()
    return out


def main() -> None:
    result = run_ranks(worker, 4)
    print(f"# {STEPS} steps of real MLP gradients (256-512-512-10, 399,370 values), 4 ranks "
          "as 2 machines x 2 devices, AVG; median over steps")
    print(f"#{'method':>13} {'rel L2 error':>14} {'max rel error':>14}")
    for name, rows in result.items():
        l2 = statistics.median(r[0] for r in rows)
        worst = statistics.median(r[1] for r in rows)
        print(f" {name:>13} {l2:>14.2e} {worst:>14.2e}")


if __name__ == "__main__":
    main()
