"""CPU time by thread of this process, and each thread's role (the caller, ringreduce's
own threads, NCCL's): what benchmarks/native_host.py reports per call.

native_host.py imports this as a top-level module (its folder is on sys.path).
"""

from __future__ import annotations

import os
import threading


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """Every thread of this process: tid -> (its name, CPU seconds so far), from
    /proc/self/task: schedstat's run time in ns where the kernel keeps it, else stat's
    user + system ticks."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc/self/task"):
        task = f"/proc/self/task/{entry}"
        try:
            with open(f"{task}/comm") as f:
                name = f.read().strip()
            try:
                with open(f"{task}/schedstat") as f:
                    seconds = int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                with open(f"{task}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                seconds = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue  # the thread ended meanwhile
        out[int(entry)] = (name, seconds)
    return out


def thread_kind(tid: int, name: str, python: dict[int | None, str]) -> str:
    """A thread's role: the caller, ringreduce's own (Python threads by their
    threading name in ``python``, native id -> name), NCCL's (by the names
    NCCL_SET_THREAD_NAME=1 gives them), or "other"."""
    if tid == threading.main_thread().native_id:
        return "caller"
    if python.get(tid, "").startswith("ringreduce-"):
        return python[tid].removeprefix("ringreduce-")
    for prefix, kind in (("NCCL Progress", "nccl progress"), ("NCCL Sock", "nccl socket"),
                         ("NCCL Service", "nccl service")):
        if name.startswith(prefix):
            return kind
    return "other"
