"""The 8- and 4-bit wires against the references: one all-reduce's time, busbw and error.

Per size and method, one AVG all-reduce of fp32 gradient-like data:
  nccl-fp32   the process group's own all-reduce (NCCL on GPUs), fp32
  hook-bf16   what torch's bf16_compress_hook does: cast to bf16, divide, all-reduce in
              bf16 (every hop, bf16 accumulation), cast back
  rr-fp32     ringreduce, no wire format (pipelined)
  rr-bf16     ringreduce, wire="bf16" (pipelined, fp32 accumulation)
  rr-int8, rr-fp8, rr-int4   ringreduce's compressed route (unpipelined; blocks of
              --block elements, one fp32 scale each; no error feedback: one call)
Time: median over rounds of the slowest rank's mean over --iters calls (CUDA events on
GPUs), methods interleaved per round; busbw = S/t * 2(n-1)/n as nccl-tests. Error: one
call on fresh data against an fp64 all-reduce: relative L2, and the largest absolute
error over the largest |exact|. Data: gaussian, scaled per 64K-element "layer" by a
log-normal factor (gradients of different layers differ in scale by orders of magnitude).

    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 --physical-gpus 2 \\
        --script benchmarks/compressed.py -- --sizes 16M,64M
    torchrun --nproc-per-node 4 benchmarks/compressed.py --machines 2
    python benchmarks/compressed.py          # CPU smoke: 4 gloo ranks as 2 x 2
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import ringreduce
from ringreduce.benchmark.launch import Launch, detect, run_ranks
from ringreduce.sizes import parse_size

Reduce = Callable[[torch.Tensor], None]
QUANTIZED = ("int8", "fp8", "int4")
LAYER = 1 << 16
"""Elements per "layer" of the synthetic gradient (one scale factor each)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--machines", type=int, help="virtual machines (emulate.py passes it)")
    p.add_argument("--sizes", help="bytes of fp32 per call, comma-separated "
                                   "(default 16M,64M on GPU, 256K,1M on CPU)")
    p.add_argument("--iters", type=int, help="timed calls per round (default 10 GPU, 2 CPU)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, help="default 5 GPU, 1 CPU")
    p.add_argument("--block", type=int, help="wire_block (default: the library's)")
    p.add_argument("--nprocs", type=int, help="processes without a launcher (CPU default 4)")
    p.add_argument("--json", help="write the rows here (rank 0)")
    return p


def gradient_like(count: int, rank: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(count, generator=g)
    layers = -(-count // LAYER)
    scale = torch.exp(torch.randn(layers, generator=torch.Generator().manual_seed(7)) * 1.5)
    return (x * scale.repeat_interleave(LAYER)[:count]).to(device)


def methods(args: argparse.Namespace, world: int) -> tuple[dict[str, Reduce],
                                                           list[ringreduce.Communicator]]:
    """Every method as an in-place AVG all-reduce, and the communicators to close."""
    plain = ringreduce.Communicator(machines=args.machines, min_bytes=0, wire_block=args.block)
    bf16 = ringreduce.Communicator(machines=args.machines, min_bytes=0, wire="bf16")

    def nccl_fp32(t: torch.Tensor) -> None:
        if dist.get_backend() == "nccl":
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
        else:  # gloo has no AVG
            dist.all_reduce(t)
            t.div_(world)

    def hook_bf16(t: torch.Tensor) -> None:
        b = t.to(torch.bfloat16).div_(world)
        dist.all_reduce(b)
        t.copy_(b)

    out: dict[str, Reduce] = {"nccl-fp32": nccl_fp32, "hook-bf16": hook_bf16,
                              "rr-fp32": ours(plain, None), "rr-bf16": ours(bf16, None)}
    for wire in QUANTIZED:
        out[f"rr-{wire}"] = ours(plain, wire)
    return out, [plain, bf16]


def ours(comm: ringreduce.Communicator, wire: str | None) -> Reduce:
    """ringreduce's AVG, with this call's wire format (None: the communicator's)."""
    def reduce(t: torch.Tensor) -> None:
        comm.all_reduce(t, op=dist.ReduceOp.AVG, wire=wire)
    return reduce


def timed(reduce: Reduce, t: torch.Tensor, iters: int) -> float:
    """Seconds per call, the slowest rank's."""
    dist.barrier()
    if t.is_cuda:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(iters):
            reduce(t)
        end.record()
        end.synchronize()
        sec = begin.elapsed_time(end) / 1e3 / iters
    else:
        start = time.perf_counter()
        for _ in range(iters):
            reduce(t)
        sec = (time.perf_counter() - start) / iters
    slowest = torch.tensor([sec], dtype=torch.float64, device=t.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item())


def errors(reduce: Reduce, x: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(relative L2, max abs error / max |exact|) of one call on a copy of ``x``."""
    t = x.clone()
    reduce(t)
    diff = t.double() - exact
    return ((diff.norm() / exact.norm()).item(),
            (diff.abs().max() / exact.abs().max()).item())


def worker(args: argparse.Namespace, launch: Launch,
           device: torch.device) -> list[dict[str, object]]:
    world = launch.world_size
    impls, comms = methods(args, world)
    rows = []
    try:
        for size in args.size_list:
            count = size // 4
            x = gradient_like(count, launch.rank, device)
            exact = x.double()
            dist.all_reduce(exact)
            exact /= world
            err = {name: errors(f, x, exact) for name, f in impls.items()}
            bufs = {name: x.clone() for name in impls}
            for name, f in impls.items():
                for _ in range(args.warmup):
                    f(bufs[name])
            times: dict[str, list[float]] = {name: [] for name in impls}
            for _ in range(args.rounds):
                for name, f in impls.items():
                    times[name].append(timed(f, bufs[name], args.iters))
            for name in impls:
                sec = statistics.median(times[name])
                rows.append({"size": size, "method": name, "time_us": sec * 1e6,
                             "busbw": size / sec / 1e9 * 2 * (world - 1) / world,
                             "rel_l2": err[name][0], "max_err": err[name][1]})
        topo = comms[0].topology
        for row in rows:
            row["topology"] = f"{topo.machines}x{topo.devices_per_machine}"
        return rows
    finally:
        for comm in comms:
            comm.close()


def table(rows: list[dict[str, object]], header: str) -> str:
    lines = [header, f"#{'size':>10} {'method':>10} {'time us':>10} {'busbw GB/s':>11} "
                     f"{'rel L2':>9} {'max err':>9}"]
    for r in rows:
        lines.append(f" {r['size']:>10} {r['method']:>10} {r['time_us']:>10.1f} "
                     f"{r['busbw']:>11.2f} {r['rel_l2']:>9.2e} {r['max_err']:>9.2e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    args = parser().parse_args(argv)
    cuda = torch.cuda.is_available()
    args.size_list = [parse_size(s) for s in (args.sizes or
                                               ("16M,64M" if cuda else "256K,1M")).split(",")]
    args.iters = args.iters or (10 if cuda else 2)
    args.rounds = args.rounds or (5 if cuda else 1)
    if args.machines is None and not cuda:
        args.machines = 2  # the CPU smoke: 4 gloo ranks as 2 machines x 2 devices
    rows = run_ranks(functools.partial(worker, args), args.nprocs)
    if rows and detect().rank == 0:  # standalone: rank 0's rows came back to this process
        device = torch.cuda.get_device_name() if cuda else "cpu (gloo): plumbing, not speed"
        print(table(rows, f"# one AVG all-reduce of fp32 gradient-like data, {rows[0]['topology']}"
                          f", {device}; median of {args.rounds} rounds x {args.iters} calls"))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
