"""The benchmark's flags, and every check of them that can run before a process starts."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from ..sizes import parse_size
from .launch import Launch

OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG,
       "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
DTYPES = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16,
          "double": torch.float64, "int32": torch.int32, "int64": torch.int64}
#: The 16-bit wires: float32 cast to this dtype on the network hop. NCCL can all-reduce
#: the same tensor in it (torch's bf16/fp16_compress_hook), the ``wire_ref`` reference.
WIRES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: The quantized wires (execution/quant.py FORMATS): blocks of 8 or 4 bits and a scale,
#: on ringreduce's compressed route; NCCL has no such all-reduce to compare with.
QUANTIZED_WIRES = ("int8", "fp8", "int4")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")

#: CPU defaults. 4 gloo ranks on 2 cores take ~10-40 ms per MiB-sized call, so the
#: default sweep is 2M..8M: every row at or above the default min_bytes (2 MiB), so
#: every row runs the hierarchy, in well under a minute.
CPU_SIZES = (2 << 20, 8 << 20)
GPU_SIZES = (1 << 20, 256 << 20)
CPU_LOOPS = {"iters": 5, "warmup_iters": 2, "rounds": 3}
GPU_LOOPS = {"iters": 20, "warmup_iters": 5, "rounds": 5}


def build_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ringreduce.bench", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("-b", "--minbytes", type=parse_size, help="smallest size (default 1M on GPU, 2M on CPU)")
    add("-e", "--maxbytes", type=parse_size, help="largest size (default 256M on GPU, 8M on CPU)")
    add("-f", "--stepfactor", type=int, default=2, help="size multiplier between rows")
    add("-n", "--iters", type=int, help="timed iterations per round (default 20 GPU, 5 CPU)")
    add("-w", "--warmup_iters", type=int, help="default 5 on GPU, 2 on CPU")
    add("-r", "--rounds", type=int,
        help="interleaved rounds; the median is shown (default 5 GPU, 3 CPU)")
    add("-c", "--check", type=int, default=1,
        help="checked (untimed, exact) iterations per round and implementation; 0: none")
    add("-d", "--datatype", choices=DTYPES, default="float")
    add("-o", "--op", choices=OPS, default="sum", help="(ignored by all_gather)")
    add("--collective", choices=COLLECTIVES, default="all_reduce")
    add("--machines", type=int, help="virtual machines (contiguous ranks); default: detect")
    add("--slice-bytes", type=parse_size)
    add("--staging-bytes", type=parse_size)
    add("--min-bytes", type=parse_size,
        help="below this ringreduce takes the flat route (default: the library's, 2M)")
    add("--wire", choices=(*WIRES, *QUANTIZED_WIRES),
        help="float32 crosses the network hop in this format; with a 16-bit one the row "
             "also times NCCL's all-reduce of the tensor cast to it (torch's "
             "bf16_compress_hook)")
    add("--buckets", type=int, default=1, help="back-to-back async all-reduces per iteration")
    add("--extra-buckets", type=int, default=0, metavar="K",
        help="after the sweep, one more row: K back-to-back calls of --bucket-bytes each")
    add("--bucket-bytes", type=parse_size, default=25 << 20,
        help="size of each --extra-buckets call (default 25M, DDP's bucket)")
    add("--only-references", action="store_true",
        help="time only NCCL's (the backend's) own collective, and its wire-dtype all-reduce "
             "with a 16-bit --wire: the cheap run under NCCL_ALGO=allreduce:tree (or ring) "
             "whose rows benchmark.summary merges into NCCL best (NCCL reads NCCL_ALGO once "
             "per process)")
    add("--link-gbit", type=float, help="per-machine link speed, for link efficiency")
    add("--fidelity", help="what the emulation stands for (emulate.py fills it in); "
                           "printed in the header")
    add("--json", help="write {meta, rows} here")
    add("--plot", help="write busbw and ratio against size as a PNG here (needs matplotlib)")
    add("--nprocs", type=int, help="processes to spawn without a launcher (default 4 on CPU)")
    add("--host-profile", type=parse_size, metavar="BYTES",
        help="after the sweep: host time of one call of BYTES on an idle pipeline, and a "
             "cProfile of it (rank 0)")
    return p


def complete(args: argparse.Namespace, cuda: bool) -> None:
    """Fill the defaults that differ between GPU and CPU runs."""
    for name, value in (GPU_LOOPS if cuda else CPU_LOOPS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    lo, hi = GPU_SIZES if cuda else CPU_SIZES
    args.minbytes = args.minbytes or min(lo, args.maxbytes or lo)
    args.maxbytes = args.maxbytes or max(hi, args.minbytes)


def validate(args: argparse.Namespace, launch: Launch, cuda: bool) -> None:
    """Reject bad flags before any process starts (or, under a launcher, before the
    process group is joined), each with the fix."""
    low = {"stepfactor": 2, "iters": 1, "warmup_iters": 0, "rounds": 1, "check": 0,
           "buckets": 1, "extra_buckets": 0}
    for name, least in low.items():
        if getattr(args, name) < least:
            raise SystemExit(f"--{name} {getattr(args, name)}: must be at least {least}")
    if args.maxbytes < args.minbytes:
        raise SystemExit(f"-e {args.maxbytes} < -b {args.minbytes}: swap them")
    if args.wire and args.datatype != "float":
        raise SystemExit(f"--wire {args.wire} applies to float32 only; drop it or use -d float")
    if args.only_references and args.plot:
        raise SystemExit("--plot draws ringreduce against its references; --only-references "
                         "runs no ringreduce: drop --plot (benchmark.summary plots the merge)")
    if args.collective != "all_reduce" and (args.extra_buckets or args.buckets > 1):
        raise SystemExit("--buckets/--extra-buckets time all-reduces; drop them with "
                         f"--collective {args.collective}")
    world = _world(args, launch, cuda)
    if args.machines is not None and (args.machines < 1 or world % args.machines):
        divisors = [k for k in range(1, world + 1) if world % k == 0]
        raise SystemExit(f"--machines {args.machines} with {world} ranks: every machine needs "
                         f"the same number of ranks; use one of {divisors}, or start a "
                         f"multiple of {args.machines} ranks (--nprocs / -np)")


def _world(args: argparse.Namespace, launch: Launch, cuda: bool) -> int:
    if launch.launcher != "standalone":
        if args.nprocs is not None:
            raise SystemExit(f"--nprocs {args.nprocs} is for runs without a launcher; "
                             f"{launch.launcher} already started {launch.world_size} ranks")
        return launch.world_size
    if args.nprocs is not None and args.nprocs < 1:
        raise SystemExit(f"--nprocs {args.nprocs}: must be at least 1")
    gpus = torch.cuda.device_count() if cuda else 0
    if cuda and args.nprocs and args.nprocs > gpus:
        raise SystemExit(f"--nprocs {args.nprocs} but {gpus} visible GPUs: one process per "
                         "GPU; to run more ranks than GPUs use benchmarks/emulate.py "
                         "(--physical-gpus, CUDA MPS)")
    return args.nprocs or (gpus if cuda else 4)


def sizes(args: argparse.Namespace) -> list[int]:
    """Sizes from -b to -e, each -f times the last."""
    out = [args.minbytes]
    while out[-1] * args.stepfactor <= args.maxbytes:
        out.append(out[-1] * args.stepfactor)
    return out


def cores_per_rank(ranks_here: int) -> float:
    """CPU cores this process may use, shared by the ranks on this host."""
    return len(os.sched_getaffinity(0)) / max(1, ranks_here)
