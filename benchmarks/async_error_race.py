"""Issue 15 item 6 on purpose: two threads polling ncclCommGetAsyncError on the same
non-blocking communicator while it carries traffic.

    python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 \\
        --mode loopback --script benchmarks/async_error_race.py -- --calls 300 [--unlocked]

NCCL's ncclCommGetAsyncError completes the group job a non-blocking ncclGroupEnd links
to the communicator, and frees it, without a lock (src/init.cc, src/group.cc), so two
threads that poll at once can free it twice. ringreduce serialises its polls
(execution/nccl/lifecycle.py) and polls non-blocking communicators only between issues
(cuda_setup.async_error_between_issues): ncclGroupEnd and the collectives touch the same
group job. Each rank makes hierarchical all-reduces on
non-blocking communicators with a group per stage (the most groups a call can have),
``--calls`` of them (a count, not a time: every rank must make the same calls), while a
second thread polls every one of the Communicator's NCCL
communicators in a tight loop: as the watchdog does now, or with ``--unlocked``
straight into NCCL as it did before the fix. Every rank prints one line:
how many calls, all exact, and how many polls; a crash shows as the rank's exit.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ringreduce
from ringreduce.benchmark.launch import Launch, run_ranks
from ringreduce.execution.cuda_setup import async_error_between_issues, distinct
from ringreduce.execution.nccl import library


def rank_body(launch: Launch, device: torch.device, calls: int, unlocked: bool,
              machines: int | None) -> None:
    os.environ.update(RINGREDUCE_NCCL_BLOCKING="0", RINGREDUCE_WAVE_GROUPS="0")
    comm = ringreduce.Communicator(machines=machines, min_bytes=0, slice_bytes=1 << 20)
    comms = distinct(comm._res.comms)
    stop, polls = threading.Event(), [0]

    def poll() -> None:  # what the watchdog does, 1000 times as often (unlocked: nonstop)
        while not stop.is_set():
            if unlocked:
                for c in comms.values():
                    library.raw.comm_get_async_error(c._comm)
            else:
                # A tight loop would take the issue lock back as soon as it left it and
                # starve the issuing thread (run 23); the watchdog sleeps 100 ms.
                async_error_between_issues(comm._res.issue_lock, comms)
                time.sleep(1e-4)
            polls[0] += 1

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    x = torch.full((4 << 20,), 1.0, device=device)  # 16 MiB: 16 slices, ~80 groups a call
    wrong, started = 0, time.monotonic()
    for _ in range(calls):
        x.fill_(1.0)
        comm.all_reduce(x)
        comm.wait_idle()  # raises a failure before the result is read
        wrong += int((x != launch.world_size).sum())
    stop.set()
    poller.join()
    print(f"[async-error-race] rank {launch.rank} {'unlocked' if unlocked else 'locked'}: "
          f"{calls} calls in {time.monotonic() - started:.1f} s, {wrong} elements wrong, "
          f"{polls[0]} polls, no crash", flush=True)
    comm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--machines", type=int, default=None, help="(emulate.py passes it)")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--unlocked", action="store_true",
                   help="poll NCCL directly, as before the fix (expected to crash)")
    args = p.parse_args()
    if "NCCL_HOSTID" in os.environ and "RANK" in os.environ:
        os.environ["NCCL_HOSTID"] += f"-rank{os.environ['RANK']}"  # ranks share a GPU
    run_ranks(lambda launch, device: rank_body(launch, device, args.calls, args.unlocked,
                                               args.machines))


if __name__ == "__main__":
    main()
