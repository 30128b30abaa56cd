"""Soak: thousands of random collectives through one Communicator, each checked exactly.

    python benchmarks/soak.py --calls 300                  # spawns 4 ranks (GPUs or CPU)
    python benchmarks/emulate.py --machines 2 --gpus-per-machine 1 --physical-gpus 1 \\
        --mode loopback --script benchmarks/soak.py -- --calls 10000

Every rank draws the same sequence from one seed: sizes log-uniform from 1 element to
``--max-bytes``, every dtype and op, all_reduce (most calls), reduce_scatter and
all_gather, sync and async with up to 8 calls outstanding. Inputs are small integers,
so each result is compared bit for bit with the reference of benchmarks/workloads/exact.py,
computed on the device from every rank's input (no communication). After a warm-up,
``torch.cuda.memory_allocated`` must come back to the same figure and the staging buffer
must never grow or move.
Prints one summary line per rank; ``--json`` writes rank 0's.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ringreduce  # noqa: E402  (after the path: runs from any directory)
from benchmarks.workloads.exact import DTYPES, OPS, expected, rank_input  # noqa: E402
from ringreduce.benchmark import launch  # noqa: E402

WARMUP = 200
"""Calls before the memory baseline: the caching allocator and NCCL settle by then."""


class Call:
    """One issued collective and how to check it."""

    def __init__(self, comm: ringreduce.Communicator, rng: random.Random, index: int,
                 max_bytes: int, device: torch.device) -> None:
        rank, world = dist.get_rank(), dist.get_world_size()
        # The checks below close over locals, not self: a reference cycle would keep
        # finished tensors alive until the garbage collector runs (memory "grows").
        dtype, op = rng.choice(DTYPES), rng.choice(OPS)
        self.dtype, self.op, self.index = dtype, op, index
        n = max(1, int(math.exp(rng.uniform(0, math.log(max_bytes / self.dtype.itemsize)))))
        self.kind = rng.choices(("all_reduce", "reduce_scatter", "all_gather"), (8, 1, 1))[0]
        use_async = rng.random() < 0.5
        if self.kind == "all_reduce":
            self.out = rank_input(rank, n, dtype, device, index)
            self.fut = comm.all_reduce(self.out, op=op, async_op=use_async)
            self.want = lambda: expected(world, n, dtype, op, device, index)
        elif self.kind == "reduce_scatter":
            n = max(1, n // world)
            self.out = torch.empty(n, dtype=dtype, device=device)
            data = rank_input(rank, world * n, dtype, device, index)
            self.fut = comm.reduce_scatter(self.out, data, op=op, async_op=use_async)
            self.want = lambda: expected(world, world * n, dtype, op, device,
                                         index)[rank * n:(rank + 1) * n]
        else:
            n = max(1, n // world)
            self.out = torch.empty(world * n, dtype=dtype, device=device)
            self.fut = comm.all_gather(self.out, rank_input(rank, n, dtype, device, index),
                                       async_op=use_async)
            self.want = lambda: torch.cat([rank_input(r, n, dtype, device, index)
                                           for r in range(world)])
        self.numel = self.out.numel()

    def wrong(self) -> int:
        if self.fut is not None:
            self.fut.wait()
        return int((self.out != self.want()).sum())


def allocated(device: torch.device) -> int:
    """Bytes held by live tensors once the device is idle. Blocks that async calls
    used on other streams (record_stream) are handed back at the allocator's next
    allocation, so make one before reading the figure."""
    torch.cuda.synchronize(device)
    torch.empty(1, device=device)
    return torch.cuda.memory_allocated(device)


def settle(calls: list[Call], failures: list[str]) -> int:
    """Wait for and check ``calls``; wrong-element count, failures described."""
    wrong = 0
    for call in calls:
        bad = call.wrong()
        if bad:
            failures.append(f"call {call.index}: {call.kind} {call.numel} x {call.dtype} "
                            f"{call.op}: {bad} wrong")
        wrong += bad
    return wrong


def soak(args: argparse.Namespace, job: launch.Launch, device: torch.device) -> dict[str, Any]:
    rng = random.Random(args.seed)
    with ringreduce.Communicator(machines=args.machines, staging_bytes=args.staging_bytes,
                                 min_bytes=args.min_bytes) as comm:
        staging = comm._res.buffers.staging_bytes
        where = (staging.data_ptr(), staging.numel())
        wrong, pending, failures, baseline = 0, [], [], None
        started = time.monotonic()
        for index in range(args.calls):
            pending.append(Call(comm, rng, index, args.max_bytes, device))
            if len(pending) > rng.randint(0, 8) or index in (WARMUP - 1, args.calls - 1):
                wrong += settle(pending, failures)
                pending = []
            if job.rank == 0 and (index + 1) % 1000 == 0:
                print(f"# soak: {index + 1} calls, {wrong} wrong elements, "
                      f"{time.monotonic() - started:.0f} s", flush=True)
            if index + 1 == WARMUP and device.type == "cuda":  # nothing of ours is alive
                baseline = allocated(device)
        comm.wait_idle()
        elapsed = time.monotonic() - started
        final = allocated(device) if device.type == "cuda" else None
        return {"rank": job.rank, "calls": args.calls, "wrong_elements": wrong,
                "first_wrong": failures[0] if failures else None, "seconds": round(elapsed, 1),
                "topology": str(comm.topology), "describe": comm.describe(),
                "memory_after_warmup": baseline, "memory_at_end": final,
                "staging_bytes": where[1], "staging_unmoved":
                    (staging.data_ptr(), staging.numel()) == where,
                "staging_within_budget": where[1] <= comm.config.staging_bytes}


def report(args: argparse.Namespace, job: launch.Launch, device: torch.device) -> dict[str, Any]:
    result = soak(args, job, device)
    print(json.dumps(result), flush=True)
    if job.rank == 0 and args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    ok = (result["wrong_elements"] == 0 and result["staging_unmoved"]
          and result["staging_within_budget"]
          and result["memory_after_warmup"] == result["memory_at_end"])
    if not ok:
        raise SystemExit(f"rank {job.rank}: soak FAILED: {result}")
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--machines", type=int, default=None,
                   help="virtual machines of contiguous ranks (default: from host ids)")
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--staging-bytes", type=int, default=None)
    p.add_argument("--min-bytes", type=int, default=None,
                   help="flat-route threshold (default: the library's)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--json", default=None)
    p.add_argument("--nprocs", type=int, default=None, help="without a launcher")
    args = p.parse_args(argv)
    launch.run_ranks(partial(report, args), args.nprocs)


if __name__ == "__main__":
    main()
