"""Does a helper thread that wakes up take the caller's core? ringreduce's threads as
SCHED_BATCH (Linux: a woken batch thread never preempts the running one; same CPU share
otherwise) against SCHED_OTHER, in one process, interleaved.

    python3 benchmarks/emulate.py --physical-gpus 1 --machines 4 --gpus-per-machine 2 \
        --mode loopback --script <this file> -- --size 25M

One native-async Communicator and NCCL in the same processes, 25 MiB fp32, calls going
round 8 tensors. Ways: NCCL's async call; ringreduce's async call with its threads
(the native worker "rr-issuer", the completer, the watchdog) SCHED_OTHER, the default,
or SCHED_BATCH. Rank 0 prints, per way, the median host time and the calling thread's
own CPU time on an idle pipeline (every rank's work finished, then a barrier) and back
to back (32 calls a round); the difference between the two is time the caller was not
running.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

import native_host  # noqa: E402

import ringreduce  # noqa: E402
from ringreduce.benchmark.launch import run_ranks  # noqa: E402
from ringreduce.config import parse_size  # noqa: E402


def helper_tids() -> list[int]:
    """ringreduce's threads in this process: the native worker by its OS name, the
    Python ones by their threading names."""
    tids = [t.native_id for t in threading.enumerate() if t.name.startswith("ringreduce-")]
    for entry in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{entry}/comm") as f:
                if f.read().strip() == "rr-issuer":
                    tids.append(int(entry))
        except OSError:
            pass
    return [t for t in tids if t is not None]


def set_policy(policy: int) -> None:
    for tid in helper_tids():
        os.sched_setscheduler(tid, policy, os.sched_param(0))


def body(launch, device, size, samples, calls, rounds):
    say = print if launch.rank == 0 else (lambda *a, **k: None)
    os.environ["RINGREDUCE_ISSUER"] = "native-async"
    comm = ringreduce.Communicator()
    say("#", comm.describe(), flush=True)
    native_host._NATIVE.append(comm._res.native)
    n = size // 4
    base = ((torch.arange(n, device=device) * 7 + launch.rank * 3) % 11 - 5).float()
    ring = itertools.cycle([base.clone() for _ in range(8)])
    ref = base.clone()
    dist.all_reduce(ref)

    def rr():
        return comm.all_reduce(next(ring), async_op=True)

    # Warm each way on its own: NCCL work the caller issues while native-async jobs are
    # queued may hang (native.py; run 75 did that here, and the watchdog ended it).
    for call in (rr, lambda: dist.all_reduce(next(ring), async_op=True)):
        for _ in range(6):
            call()
        native_host.settle(device)
    ways = {"nccl async": (os.SCHED_OTHER, lambda: dist.all_reduce(next(ring), async_op=True)),
            "rr async, threads SCHED_OTHER": (os.SCHED_OTHER, rr),
            "rr async, threads SCHED_BATCH": (os.SCHED_BATCH, rr)}
    say(f"# helper threads: {len(helper_tids())}", flush=True)
    idle = {k: [] for k in ways}
    b2b = {k: [] for k in ways}
    for _ in range(rounds):
        for name, (policy, call) in ways.items():
            set_policy(policy)
            for _ in range(samples):
                native_host.settle(device)
                dist.barrier()
                s, c = time.perf_counter(), time.thread_time()
                call()
                idle[name].append(((time.perf_counter() - s) * 1e6,
                                   (time.thread_time() - c) * 1e6))
            native_host.settle(device)
            dist.barrier()
            s, c = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                call()
            b2b[name].append(((time.perf_counter() - s) / calls * 1e6,
                              (time.thread_time() - c) / calls * 1e6))
            native_host.settle(device)
    set_policy(os.SCHED_OTHER)
    t = base.clone()
    comm.all_reduce(t, async_op=True).wait()
    native_host.settle(device)
    assert torch.equal(t, ref), "wrong result"
    say("# exact")
    comm.wait_idle()
    comm.close()
    if launch.rank != 0:
        return
    print(f"# {torch.cuda.get_device_name(device)}, {dist.get_world_size()} ranks, {size} B "
          f"fp32; {rounds} rounds, ways interleaved: {samples} idle samples, {calls} calls "
          "back to back")
    print(f"{'way':<32} {'idle_us':>8} {'own_cpu':>8} {'b2b_us':>8} {'own_cpu':>8}")
    for name in ways:
        print(f"{name:<32} {statistics.median(v[0] for v in idle[name]):>8.1f} "
              f"{statistics.median(v[1] for v in idle[name]):>8.1f} "
              f"{statistics.median(v[0] for v in b2b[name]):>8.1f} "
              f"{statistics.median(v[1] for v in b2b[name]):>8.1f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--machines", type=int, default=None)
    p.add_argument("--size", type=parse_size, default=25 * 2**20)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--calls", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    if "NCCL_HOSTID" in os.environ and "RANK" in os.environ:
        os.environ["NCCL_HOSTID"] += f"-rank{os.environ['RANK']}"
    run_ranks(lambda launch, device: body(launch, device, a.size, a.samples, a.calls,
                                          a.rounds))


if __name__ == "__main__":
    main()
