"""The two loops each implementation runs per round of a row (measure.py): the timed
loop, back-to-back calls on the same buffers, and the checked loop, run outside it,
which counts the wrong elements."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .references import Pair, Reduce


def time_loop(reduce: Reduce, bufs: list[Pair], iters: int,
              cuda: bool) -> tuple[float, float, float]:
    """Seconds per iteration of ``iters`` back-to-back calls: (device time, host time
    to issue, process CPU time). CUDA events time the device work; the host clock
    times how long the calls kept the caller; CPU time runs until the device is done
    (NCCL's proxy threads work until then), waited for with a blocking-sync event so
    the wait itself sleeps instead of spinning. The barrier keeps a late rank out."""
    dist.barrier()
    if not cuda:
        cpu, start = time.process_time(), time.perf_counter()
        for _ in range(iters):
            reduce(bufs)
        host = (time.perf_counter() - start) / iters
        return host, host, (time.process_time() - cpu) / iters
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True, blocking=True)
    begin.record()
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(iters):
        reduce(bufs)
    host = (time.perf_counter() - start) / iters
    end.record()
    end.synchronize()
    cpu = (time.process_time() - cpu) / iters
    return begin.elapsed_time(end) / 1e3 / iters, host, cpu


def check_loop(reduce: Reduce, bufs: list[Pair], pattern: torch.Tensor,
               want: torch.Tensor, iters: int, tol: float) -> int:
    """Wrong elements over ``iters`` calls, re-initialising the inputs (and clearing
    the outputs) each time: the all-reduce is in place."""
    wrong = 0
    for _ in range(iters):
        for i, o in bufs:
            o.fill_(99)
            i.copy_(pattern)
        reduce(bufs)
        for _, t in bufs:
            ok = t == want if tol == 0 else torch.isclose(t.double(), want.double(),
                                                          rtol=tol, atol=tol)
            wrong += int((~ok).sum())
    return wrong
