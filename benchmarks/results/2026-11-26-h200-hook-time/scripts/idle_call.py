"""What a call costs the caller on an idle pipeline, which is where DDP's hook calls land
(backward compute between buckets), and where that time goes.

    python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 \
        --mode loopback --script <this file> -- --size 25M

One native-async Communicator and NCCL in the same processes, 25 MiB fp32, calls going
round 8 tensors. Rank 0 prints medians over ``--samples`` samples, each after every rank's
work finished (drain, synchronize, barrier), interleaved way by way:
  * the CUDA driver alone: one event record, one tiny kernel launch;
  * NCCL's async all_reduce, ringreduce's async call, and ringreduce's with the Future's
    completion left out (the completer never sees it);
  * the same calls right after an untimed event record on the caller's stream (is the
    first submission after idle what costs?);
  * ringreduce's call split at Issuer.submit: before it, inside it, after it;
  * back to back (32 calls), NCCL and ringreduce, the completer's quiet at 200 µs (the
    default) and at 1 ms, for the same machine's reference;
  * (added after run 73) ringreduce's async call with the worker woken as the job is
    queued (``woken at submit``, native._HOLD_WAKE off) against the default, where it is
    woken as the call returns (submit_held, kick), idle and back to back.
"""

from __future__ import annotations

import argparse
import itertools
import os
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
from ringreduce.execution import native as native_mod  # noqa: E402


class TimedWorker:
    """The extension's Issuer, with submit's start and end clocked."""

    def __init__(self, worker):
        self.worker, self.last = worker, (0.0, 0.0)

    def submit(self, *args):
        start = time.perf_counter()
        seq = self.worker.submit(*args)
        self.last = (start, time.perf_counter())
        return seq

    def submit_held(self, *args):
        start = time.perf_counter()
        seq = self.worker.submit_held(*args)
        self.last = (start, time.perf_counter())
        return seq

    def __getattr__(self, name):
        return getattr(self.worker, name)


def body(launch, device, size, samples, calls):
    say = print if launch.rank == 0 else (lambda *a, **k: None)
    os.environ["RINGREDUCE_ISSUER"] = "native-async"
    comm = ringreduce.Communicator()
    say("#", comm.describe(), flush=True)
    native = comm._res.native
    native_host._NATIVE.append(native)
    timed = TimedWorker(native.worker)
    native.worker = timed
    completer = native._completer
    n = size // 4
    base = ((torch.arange(n, device=device) * 7 + launch.rank * 3) % 11 - 5).float()
    ring = itertools.cycle([base.clone() for _ in range(8)])
    ref = base.clone()
    dist.all_reduce(ref)
    event, small = torch.cuda.Event(), torch.zeros(1, device=device)
    later = []

    def rr():
        return comm.all_reduce(next(ring), async_op=True)

    def rr_no_completer():
        native._completer = types.SimpleNamespace(put=later.append)
        try:
            return rr()
        finally:
            native._completer = completer

    def rr_woken():
        native_mod._HOLD_WAKE = False
        try:
            return rr()
        finally:
            native_mod._HOLD_WAKE = True

    ways = {
        "event record": event.record,
        "kernel launch": lambda: small.add_(1),
        "nccl async": lambda: dist.all_reduce(next(ring), async_op=True),
        "rr async": rr,
        "rr async, woken at submit": rr_woken,
        "rr async, no completion": rr_no_completer,
    }
    primed = {f"{k}, after an event": v for k, v in ways.items() if "async" in k}
    for call in ways.values():
        for _ in range(6):
            call()
    native_host.settle(device)
    rows = {k: [] for k in (*ways, *primed, "rr: before submit", "rr: submit",
                            "rr: after submit")}
    for _ in range(samples):
        for name, call in (*ways.items(), *primed.items()):
            native_host.settle(device)
            dist.barrier()
            if name in primed:
                event.record()
            start = time.perf_counter()
            call()
            end = time.perf_counter()
            rows[name].append((end - start) * 1e6)
            if name == "rr async":
                s0, s1 = timed.last
                rows["rr: before submit"].append((s0 - start) * 1e6)
                rows["rr: submit"].append((s1 - s0) * 1e6)
                rows["rr: after submit"].append((end - s1) * 1e6)
        for item in later:
            completer.put(item)
        later.clear()
    native_host.settle(device)

    back = {"nccl async b2b": lambda: dist.all_reduce(next(ring), async_op=True),
            "rr async b2b": rr, "rr async b2b, woken at submit": rr_woken,
            "rr async b2b, quiet 1 ms": rr}
    b2b = {k: [] for k in back}
    for _ in range(5):
        for name, call in back.items():
            native_mod._QUIET_S = 1e-3 if "quiet 1 ms" in name else 200e-6
            native_host.settle(device)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            b2b[name].append((time.perf_counter() - start) / calls * 1e6)
            native_host.settle(device)
    native_mod._QUIET_S = 200e-6

    t = base.clone()
    rr().wait()
    comm.all_reduce(t, async_op=True).wait()
    native_host.settle(device)
    assert torch.equal(t, ref), "wrong result"
    say("# exact")
    comm.wait_idle()
    native.worker = timed.worker
    comm.close()
    if launch.rank != 0:
        return
    print(f"# {torch.cuda.get_device_name(device)}, {dist.get_world_size()} ranks, {size} B "
          f"fp32; idle: {samples} samples each, interleaved; b2b: 5 rounds x {calls} calls")
    print(f"{'way (idle pipeline)':<44} {'median_us':>10} {'p90_us':>8}")
    for name, vals in rows.items():
        vals = sorted(vals)
        print(f"{name:<44} {statistics.median(vals):>10.1f} {vals[int(0.9 * len(vals))]:>8.1f}")
    print(f"{'way (back to back, per call)':<44} {'median_us':>10} {'min_us':>8}")
    for name, vals in b2b.items():
        print(f"{name:<44} {statistics.median(vals):>10.1f} {min(vals):>8.1f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--machines", type=int, default=None)
    p.add_argument("--size", type=parse_size, default=25 * 2**20)
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--calls", type=int, default=32)
    a = p.parse_args()
    if "NCCL_HOSTID" in os.environ and "RANK" in os.environ:
        os.environ["NCCL_HOSTID"] += f"-rank{os.environ['RANK']}"
    run_ranks(lambda launch, device: body(launch, device, a.size, a.samples, a.calls))


if __name__ == "__main__":
    main()
