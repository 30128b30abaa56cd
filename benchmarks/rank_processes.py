"""The ranks benchmarks/emulate.py launched, as processes: wait for every one, or cut a
virtual machine's link under them and report when each ends; stop those still running.

emulate.py imports this as a top-level module (its folder is on sys.path).
"""

from __future__ import annotations

import subprocess
import time

from netns import Iproute, namespace, veths


def wait_all(procs: list[subprocess.Popen[bytes]]) -> int:
    """0 when every rank succeeds; on the first failure stop the others (they would
    wait for the dead rank until their timeout) and return its exit code."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def wait_with_cut(procs: list[subprocess.Popen[bytes]], iproute: Iproute, m: int,
                  after_s: float, grace_s: float) -> int:
    """Cut machine m's link (both veth ends down) ``after_s`` seconds in, then let every
    rank end on its own (each must notice and raise within its deadline), at most
    ``grace_s`` seconds; prints when each ended. Returns the first non-zero exit code
    (a rank that finished before the cut, or hung past the grace, counts as 0 / 124)."""
    start = time.monotonic()
    while time.monotonic() - start < after_s and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    outer, inner = veths(m)
    iproute.run("ip", "link", "set", outer, "down")
    iproute.run("ip", "-n", namespace(m), "link", "set", inner, "down")
    cut = time.monotonic()
    print(f"# emulate: cut vm{m}'s link at {cut - start:.1f} s", flush=True)
    ended: dict[int, float] = {}
    while len(ended) < len(procs) and time.monotonic() - cut < grace_s:
        for rank, p in enumerate(procs):
            if rank not in ended and p.poll() is not None:
                ended[rank] = time.monotonic() - cut
                print(f"# emulate: rank {rank} ended {ended[rank]:.1f} s after the cut, "
                      f"exit {p.returncode}", flush=True)
        time.sleep(0.1)
    hung = [r for r in range(len(procs)) if r not in ended]
    if hung:
        print(f"# emulate: ranks {hung} still running {grace_s:.0f} s after the cut: HANG",
              flush=True)
        return 124
    return next((p.returncode for p in procs if p.returncode), 0)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
