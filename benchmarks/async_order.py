"""Does the native-async worker hang only when another thread issues NCCL work beside it?

    python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 \\
        --mode loopback --script benchmarks/async_order.py -- --phase mixed

The hypothesis it was written to test (results 2026-11-23-h200-native):
NCCL forbids issuing on independent communicators of one device from several threads at
once, because the order in which kernels reach the device's hardware queues then differs
between ranks, and a kernel that waits for a peer can sit in front of the kernel that
peer needs. The worker (RINGREDUCE_ISSUER=native-async) issues ringreduce's jobs while
the caller's thread goes on; the tests and benchmarks that hung also made torch NCCL
calls on the caller's thread meanwhile. Measured since (results 2026-11-25-h100-engine-v2,
run 8): the worker hung already in the 70 synchronous warm-up calls, with no other thread
issuing NCCL work, so that hypothesis does not explain it. Found with this script
(results 2026-11-25-h200-worker-hang): a host deadlock between the GIL and the issuer's
lock, fixed; since then ``alone`` completes exact, while ``mixed`` still hangs, which is
the hypothesis above, now measured on its own.

Each phase makes ``--calls`` asynchronous 25 MiB all-reduces (AVG of identical
integers, so the tensor stays exact however often it is reduced), ``--in-flight`` at a
time, after the programs are warm:
  alone   nothing else: the worker is the only thread issuing NCCL work
  mixed   after every call the caller's thread issues a small torch NCCL all-reduce
``--tensors K`` sends them round K tensors: calls on one tensor run in issue order (each
waits for the one before on the device), so only K > 1 overlaps calls on the device, as
DDP's buckets do; before that order was enforced (results 2026-11-25-h100-issue-order),
the calls on one tensor overlapped, and raced.
``--issuer native`` runs the same calls on the caller's thread, the control. Every rank
prints one line per phase: completed (seconds), or the RingReduceError the
watchdog raised at the deadline. One phase per process, so a failed one cannot
poison the other. A rank still running ``RINGREDUCE_TIMEOUT`` + 15 s after its start
prints its worker's counters and where its first unfinished job is (with
RINGREDUCE_ISSUE_PROBES, per stream), then every Python thread's stack.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ringreduce
from ringreduce.benchmark.launch import Launch, run_ranks


def rank_body(launch: Launch, device: torch.device, phase: str, calls: int, in_flight: int,
              machines: int | None, issuer: str, tensors: int, side_stream: bool) -> None:
    if side_stream:  # the caller on a stream of its own, not the legacy default stream
        torch.cuda.set_stream(torch.cuda.Stream(device))
    os.environ["RINGREDUCE_ISSUER"] = issuer  # read at construction
    # The watchdog's error as soon as it fires: a hang may keep the call from raising.
    logging.basicConfig(level=logging.WARNING, format=f"[rank {launch.rank}] %(message)s")
    comm = ringreduce.Communicator(machines=machines)
    assert comm.describe().endswith(f"issuer={issuer}"), comm.describe()
    n = 25 * 2**20 // 4
    x = ((torch.arange(n, device=device) * 7) % 11 - 5).float()  # the same on every rank
    want, small = x.clone(), torch.ones(1, device=device)
    xs = [x] + [x.clone() for _ in range(tensors - 1)]
    report_hang(comm, launch.rank, comm.config.timeout_s + 15)
    for _ in range(70):  # traced once, then replayed; each waited for
        comm.all_reduce(x, op=dist.ReduceOp.AVG)
    torch.cuda.synchronize(device)
    print(f"[async-order] rank {launch.rank} issuer={issuer}: 70 synchronous calls done",
          flush=True)
    dist.barrier()
    started, outcome = time.monotonic(), "completed"
    try:
        pending = []
        for i in range(calls):
            pending.append(comm.all_reduce(xs[i % tensors], op=dist.ReduceOp.AVG,
                                           async_op=True))
            if phase == "mixed":
                dist.all_reduce(small)  # torch's NCCL, on the caller's thread
            if len(pending) == in_flight or i == calls - 1:
                for fut in pending:
                    fut.wait()
                pending.clear()
        comm.wait_idle()
        torch.cuda.synchronize(device)
        faulthandler.cancel_dump_traceback_later()
        wrong = sum(int((y != want).sum()) for y in xs)
        outcome = f"completed, {wrong} elements wrong"
    except ringreduce.RingReduceError as exc:
        outcome = f"RingReduceError: {exc}"
    seconds = time.monotonic() - started
    print(f"[async-order] rank {launch.rank} issuer={issuer} phase={phase} calls={calls} "
          f"in_flight={in_flight} tensors={tensors}: {outcome} after {seconds:.1f} s",
          flush=True)
    os._exit(0)  # a poisoned communicator's teardown is not what is measured here


def report_hang(comm: ringreduce.Communicator, rank: int, after_s: float) -> None:
    """If the rank has not ended ``after_s`` from now: every Python thread's stack
    (faulthandler needs no GIL), then where the first unfinished native job is on the
    device (the issue probes, RINGREDUCE_ISSUE_PROBES), whatever the watchdog did."""
    faulthandler.dump_traceback_later(after_s + 5, exit=False)
    native = comm._res.native

    def report() -> None:
        time.sleep(after_s)
        if native is None:
            return
        from ringreduce.execution.native import Completion
        counters = native.worker.counters()
        first = counters["flag"] + 1
        where = Completion(native, first).progress() if first <= counters["issued"] else ""
        print(f"[hang] rank {rank}: {counters}; {where}", flush=True)

    threading.Thread(target=report, daemon=True).start()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--machines", type=int, default=None, help="(emulate.py passes it)")
    p.add_argument("--phase", choices=("alone", "mixed"), required=True)
    p.add_argument("--calls", type=int, default=64)
    p.add_argument("--in-flight", type=int, default=8)
    p.add_argument("--tensors", type=int, default=1,
                   help="asynchronous calls go round this many tensors (DDP: its buckets); "
                        "calls on one tensor run in order, so with 1 they do not overlap")
    p.add_argument("--issuer", choices=("native-async", "native"), default="native-async",
                   help="native: the same calls issued on the caller's thread (the control)")
    p.add_argument("--side-stream", action="store_true",
                   help="the caller's current stream is a created one (default: the legacy "
                        "default stream, which orders itself against blocking streams)")
    args = p.parse_args()
    if "NCCL_HOSTID" in os.environ and "RANK" in os.environ:
        os.environ["NCCL_HOSTID"] += f"-rank{os.environ['RANK']}"  # ranks share a GPU
    run_ranks(lambda launch, device: rank_body(launch, device, args.phase, args.calls,
                                               args.in_flight, args.machines, args.issuer,
                                               args.tensors, args.side_stream))


if __name__ == "__main__":
    main()
