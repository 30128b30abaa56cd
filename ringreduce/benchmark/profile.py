"""``--host-profile``: where the host time of one call goes, on an idle pipeline."""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from .measure import Bench, inputs


def host_profile(b: Bench, size: int) -> None:
    """Host time of one call when nothing else is queued (so no NCCL
    back-pressure is counted), median of 20 after 3 warm-up calls, three ways: the
    same tensor again and again, a new tensor every call, and NCCL's own all-reduce.
    Then where one call's time goes (cProfile)."""
    n = size // b.dtype.itemsize
    same = inputs(n, b.launch.rank, b)
    fresh = [inputs(n, b.launch.rank, b) for _ in range(23)]  # 23 addresses: seen once
    ways = {"same tensor": lambda i: b.comm.all_reduce(same, op=b.op),
            "new tensor": lambda i: b.comm.all_reduce(fresh[i], op=b.op),
            "nccl": lambda i: dist.all_reduce(same, op=b.op)}
    medians = {name: _host_samples(b, call) for name, call in ways.items()}
    profiles = {"new tensor": _profiled(b, [inputs(n, b.launch.rank, b)
                                            for _ in range(_PROFILED)])}
    if b.launch.rank == 0:
        for name, (median, low) in medians.items():
            print(f"# host time per call, {size} bytes, idle pipeline, {name}: median "
                  f"{median * 1e6:.1f} us (min {low * 1e6:.1f})")
        for name, profile in profiles.items():
            print(f"# {name}:")
            print_profile(profile, _PROFILED)


def _profiled(b: Bench, tensors: list[torch.Tensor]) -> cProfile.Profile:
    """cProfile of one all_reduce per tensor, each on an idle pipeline."""
    profile = cProfile.Profile()
    for t in tensors:
        _sync(b)
        dist.barrier()
        profile.enable()
        b.comm.all_reduce(t, op=b.op)
        profile.disable()
    _sync(b)
    return profile


_PROFILED = 10


def print_profile(profile: cProfile.Profile, calls: int, top: int = 22) -> None:
    """Where a call's host time goes: functions by own time, in microseconds per call
    (pstats prints milliseconds as 0.000). cProfile inflates Python-heavy lines; the
    ranking, not the sum, is the point."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    total = sum(v[2] for v in stats.values())
    print(f"# profile of {calls} calls: {total / calls * 1e6:.0f} us/call under cProfile; "
          "own us/call, cumulative us/call, calls/call, function")
    for (path, line, name), (_, ncalls, own, cum, _) in rows:
        where = f"{path.rsplit('/', 2)[-1]}:{line}" if line else "~"
        print(f"#   {own / calls * 1e6:8.1f} {cum / calls * 1e6:8.1f} {ncalls / calls:6.1f}  "
              f"{where}({name})")


def _sync(b: Bench) -> None:
    if b.device.type == "cuda":
        torch.cuda.synchronize()


def _host_samples(b: Bench, call: Callable[[int], object]) -> tuple[float, float]:
    """(median, min) seconds of host time of calls 3..22, each on an idle pipeline."""
    samples = []
    for i in range(23):
        _sync(b)
        dist.barrier()
        start = time.perf_counter()
        call(i)
        if i >= 3:  # the first calls allocate, connect and (same tensor) capture
            samples.append(time.perf_counter() - start)
    _sync(b)
    return statistics.median(samples), min(samples)


