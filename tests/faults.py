"""What the CPU and GPU fault tests share: when the fault happened, how long a survivor
took to notice (one ``[fault ...]`` line each, for the README's table), meeting points
that need no network, and carrying on with a new Communicator after a fault."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce.plan.slicing import ONE_SLICE

from .cases import check_equal, expected, rank_input


def store() -> dist.Store:
    """The default group's store (run_test_ranks: a FileStore, or the test's TCPStore)."""
    return dist.distributed_c10d._get_default_store()


def mark_fault() -> None:
    """The injecting rank stamps the wall clock just before the fault (one host)."""
    store().set("fault_at", repr(time.time()))


def report(fault: str, rank: int, exc: BaseException, limit_s: float,
           fault_at: float | None = None) -> float:
    """Seconds from the fault (``fault_at``, else the injecting rank's stamp) to this
    survivor's error, printed and checked against ``limit_s``."""
    if fault_at is None:
        fault_at = float(store().get("fault_at").decode())
    since = time.time() - fault_at
    print(f"[fault {fault}] rank {rank}: {type(exc).__name__} {since:.2f} s after the fault: "
          f"{str(exc)[:240]}", flush=True)
    assert since < limit_s, f"rank {rank} took {since:.1f} s to notice ({fault})"
    return since


def meet(key: str, count: int, timeout_s: float = 120.0) -> None:
    """Wait until ``count`` ranks added 1 to ``key``; fail after ``timeout_s`` (a rank
    that died instead must fail the test with every rank's report, not hang it)."""
    store().add(key, 1)
    deadline = time.monotonic() + timeout_s
    while (arrived := store().add(key, 0)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {arrived} of {count} ranks reached {key!r} "
                                 f"within {timeout_s} s")
        time.sleep(0.02)


def carry_on(rank: int, ranks: Sequence[int], machines: int, device: torch.device) -> None:
    """After a fault: a new Communicator of ``ranks`` (only they take part in making it)
    and an exact all-reduce, hierarchical when ``machines`` > 1."""
    ranks = list(ranks)
    with _survivors_communicator(rank, ranks, machines, device) as comm:
        n = 1003  # a padding tail at every small topology
        t = rank_input(ranks.index(rank), n, torch.float32, device, salt=7)
        comm.all_reduce(t)
        check_equal(t, expected(len(ranks), n, torch.float32, dist.ReduceOp.SUM, device, salt=7),
                    f"rank {rank}: all-reduce on a new Communicator after the fault")
        record = comm._res.guard.recorder.last()
        assert record is not None
        # hierarchical: either plan, as the construction probe chose; or NCCL's own call
        # where the probe found it the fastest at this size
        route = record.route
        flat = machines == 1 or comm._res.plan.at(t.numel() * t.element_size()).flat
        assert route in ({"flat"} if flat else {"hierarchical", ONE_SLICE}), route


def _survivors_communicator(rank: int, ranks: list[int], machines: int,
                            device: torch.device) -> ringreduce.Communicator:
    """CPU: on a new gloo group of the survivors. CUDA: straight on the store, as the
    ringreduce backend builds its engine: torch's ``new_group`` on an NCCL default group
    bound to a device splits the default communicator, which needs every rank, the dead
    one too (it hung there on the H200, benchmarks/results/2026-11-23-h200-clusters)."""
    if device.type != "cuda":
        group = dist.new_group(ranks, use_local_synchronization=True)
        return ringreduce.Communicator(group, machines=machines, min_bytes=0)
    prefix = "carry_on/" + "-".join(map(str, ranks)) + "/"
    return ringreduce.Communicator._on_store(dist.PrefixStore(prefix, store()),
                                             ranks.index(rank), len(ranks), device,
                                             machines=machines, min_bytes=0)


@contextlib.contextmanager
def store_server() -> Iterator[tuple[int, int]]:
    """A TCPStore served by a process of its own: (port, pid). Killing it takes the
    store away from every rank at once, as when the launcher's store host exits."""
    server = subprocess.Popen(
        [sys.executable, "-c", "import time, torch.distributed as d; "
         "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False); "
         "print(s.port, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield int(server.stdout.readline()), server.pid
    finally:
        server.kill()
        server.wait()


def store_gone(rank: int, world: int, server_pid: int, fresh: str, device: torch.device,
               backend: str, limit_s: float) -> None:
    """The TCPStore's server goes away after setup (machines from RINGREDUCE_MACHINES).
    Calls of a kind made before do not use the store (connections are made): they stay
    exact. The first call of a new kind is checked through the store (as every call is
    with RINGREDUCE_DEBUG=1): RingReduceError, and the communicator stays usable. A
    Communicator on the dead store: an error, not a hang. Then a fresh group on a new
    store, and a new Communicator there."""
    comm = ringreduce.Communicator(min_bytes=0)
    debug = ringreduce.Communicator(min_bytes=0)  # made while the store lives
    debug.config = dataclasses.replace(debug.config, debug=True)  # RINGREDUCE_DEBUG=1
    machines = comm.topology.machines
    t = rank_input(rank, 100_003, torch.float32, device)
    comm.all_reduce(t)  # connected while the store lives
    dist.barrier()
    if rank == 0:
        os.kill(server_pid, signal.SIGKILL)
    dist.barrier()  # over the group's own connections: the store is gone from here on
    fault_at = time.time()
    t = rank_input(rank, 100_003, torch.float32, device, salt=1)
    comm.all_reduce(t)
    check_equal(t, expected(world, t.numel(), torch.float32, dist.ReduceOp.SUM, device, salt=1),
                "all-reduce after the store went away")
    with pytest.raises(ringreduce.RingReduceError,
                       match=r"stage 'call check' failed .*operation #1 \(RINGREDUCE_DEBUG "
                       r"check.*store") as info:
        debug.all_reduce(torch.ones(10, device=device))
    report("store gone (calls exact; RINGREDUCE_DEBUG=1 check)", rank, info.value, limit_s,
           fault_at)
    with pytest.raises(ringreduce.RingReduceError,
                       match=r"stage 'call check' failed .*operation #3 \(first call of its "
                       r"kind check.*store") as info:
        comm.all_reduce(torch.ones(10, device=device))
    report("store gone (a new kind of call)", rank, info.value, limit_s, fault_at)
    comm.all_reduce(t)  # the check communicated nothing: a known call is still exact
    check_equal(t, expected(world, t.numel(), torch.float32, dist.ReduceOp.SUM, device, salt=1)
                * world, "a known call after the check failed")
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 (torch's store error type varies by version)
        ringreduce.Communicator(min_bytes=0)
    assert time.monotonic() - started < limit_s, "a Communicator on a dead store hung"
    comm.close()
    debug.close()
    dist.destroy_process_group()
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=fresh, rank=rank, world_size=world, **kwargs)
    carry_on(rank, range(world), machines, device)
