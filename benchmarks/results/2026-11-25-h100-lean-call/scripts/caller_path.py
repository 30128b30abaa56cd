"""Where native-async's asynchronous call spends the caller's time, back to back.

    python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 \
        --mode loopback --script <this file> -- --size 25M

One native-async Communicator and NCCL in the same processes, 25 MiB fp32, calls going
round 8 tensors as DDP's buckets do. Rank 0 prints:
  * back to back, interleaved rounds of 32 calls: host time and the calling thread's own
    CPU per call, NCCL async, ringreduce async, and ringreduce async with the Futures'
    completion deferred to the end of the round (what the completer thread's GIL costs
    the caller);
  * hot loops (2000 each, no communication) of the pieces a call is made of;
  * a cProfile (wall clock) of one round of ringreduce's calls.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import os
import pstats
import statistics
import sys
import time
import types
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
from ringreduce.safety import checks  # noqa: E402


def round_us(call, calls, device):
    native_host.settle(device)
    dist.barrier()
    host = own = 0.0
    for _ in range(calls):
        s, c = time.perf_counter(), time.thread_time()
        call()
        own += time.thread_time() - c
        host += time.perf_counter() - s
    native_host.settle(device)
    return host / calls * 1e6, own / calls * 1e6


def lock_once(lock):
    with lock:
        pass


def hot(fn, n=2000):
    fn()
    s = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - s) / n * 1e6


def body(launch, device, size, calls, rounds):
    say = print if launch.rank == 0 else (lambda *a, **k: None)
    os.environ["RINGREDUCE_ISSUER"] = "native-async"
    comm = ringreduce.Communicator()
    say("#", comm.describe(), flush=True)
    native = comm._res.native
    native_host._NATIVE.append(native)
    n = size // 4
    base = ((torch.arange(n, device=device) * 7 + launch.rank * 3) % 11 - 5).float()
    ring_t = [base.clone() for _ in range(8)]
    ring = itertools.cycle(ring_t)
    ref = base.clone()
    dist.all_reduce(ref)
    held = []

    def rr():
        return comm.all_reduce(next(ring), async_op=True)

    def deferred():
        held.append(comm.all_reduce(next(ring), async_op=True))

    ways = {"nccl async": lambda: dist.all_reduce(next(ring), async_op=True),
            "rr async": rr}
    for call in ways.values():
        for _ in range(6):
            call()
    native_host.settle(device)
    rows = {k: [] for k in (*ways, "rr async, completion deferred")}
    completer = native._completer
    for _ in range(rounds):
        for name, call in ways.items():
            rows[name].append(round_us(call, calls, device))
        later = []
        native._completer = types.SimpleNamespace(put=later.append)  # sees nothing
        native_host.settle(device)
        dist.barrier()
        host = own = 0.0
        for _ in range(calls):
            s, c = time.perf_counter(), time.thread_time()
            comm.all_reduce(next(ring), async_op=True)
            own += time.thread_time() - c
            host += time.perf_counter() - s
        native._completer = completer
        for item in later:
            completer.put(item)
        native_host.settle(device)
        rows["rr async, completion deferred"].append((host / calls * 1e6, own / calls * 1e6))
    # exactness after all of it: every ring tensor was reduced the same number of times
    # per rank; check one fresh call instead
    t = base.clone()
    comm.all_reduce(t, async_op=True).wait()
    native_host.settle(device)
    assert torch.equal(t, ref), "wrong result"
    say("# exact")

    # cProfile (wall clock) of one round
    prof = cProfile.Profile()
    native_host.settle(device)
    dist.barrier()
    prof.enable()
    for _ in range(calls):
        rr()
    prof.disable()
    native_host.settle(device)

    # hot loops, no communication
    res, iss = comm._res, comm._issuer
    x = ring_t[0]
    rec = res.guard.recorder.begin(0, n, "torch.float32", "sum", "", "all_reduce")
    stream = torch.cuda.Stream(device)
    pieces = {
        "checks.op_name": lambda: checks.op_name(dist.ReduceOp.SUM),
        "checks.tensor": lambda: checks.tensor(x, "all_reduce", "t", device),
        "guard.agree_if_new (seen)": lambda: res.guard.agree_if_new(1, x, "sum", "all_reduce"),
        "recorder.begin": lambda: res.guard.recorder.begin(1, n, str(x.dtype), "sum", "", "ar"),
        "issue_lock enter/exit": lambda: lock_once(res.issue_lock),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "native program lookup": (lambda: native.warm(x, "sum")) if hasattr(native, "warm")
        else (lambda: native.program(x, "sum", lambda: None)),
        "route_flat": lambda: iss.route_flat(x),
        "storage ptr": lambda: x.untyped_storage().data_ptr(),
        "raw stream": lambda: native._raw_stream(device.index),
        "worker.error": native.worker.error,
        "Future(devices)": lambda: torch.futures.Future(devices=[device]),
        "record_stream": lambda: x.record_stream(stream),
        "guard.finish": lambda: res.guard.finish(rec),
        "time.monotonic": time.monotonic,
    }

    def set_result_ctx():
        f = torch.futures.Future(devices=[device])
        with torch.cuda.stream(stream):
            f.set_result(x)

    def set_result_current():
        f = torch.futures.Future(devices=[device])
        f.set_result(x)

    pieces["Future+set_result in stream ctx"] = set_result_ctx
    pieces["Future+set_result current"] = set_result_current
    micro = {k: hot(v) for k, v in pieces.items()}
    native_host.settle(device)
    comm.wait_idle()
    comm.close()
    if launch.rank != 0:
        return
    print(f"# {torch.cuda.get_device_name(device)}, {dist.get_world_size()} ranks, {size} B "
          f"fp32, {rounds} rounds x {calls} back-to-back calls, interleaved")
    print(f"{'way':<32} {'host_us':>9} {'own_cpu_us':>11}  (median of rounds; min host)")
    for name, vals in rows.items():
        h = statistics.median(v[0] for v in vals)
        o = statistics.median(v[1] for v in vals)
        print(f"{name:<32} {h:>9.1f} {o:>11.1f}  min {min(v[0] for v in vals):.1f}")
    print("# hot loops, us per call")
    for k, v in micro.items():
        print(f"#   {v:7.2f}  {k}")
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    print(f"# cProfile (wall), {calls} back-to-back rr async calls, by own time:")
    print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--machines", type=int, default=None)
    p.add_argument("--size", type=parse_size, default=25 * 2**20)
    p.add_argument("--calls", type=int, default=32)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    if "NCCL_HOSTID" in os.environ and "RANK" in os.environ:
        os.environ["NCCL_HOSTID"] += f"-rank{os.environ['RANK']}"
    run_ranks(lambda launch, device: body(launch, device, a.size, a.calls, a.rounds))


if __name__ == "__main__":
    main()
