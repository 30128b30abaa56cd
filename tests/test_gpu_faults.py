"""GPU fault injection: every fault becomes a RingReduceError naming the stage and the
peers on the survivors within the deadline (RINGREDUCE_TIMEOUT) plus slack, never a hang
or a wrong result reported as success, and the survivors go on with a new Communicator.

At every topology of RINGREDUCE_GPU_TOPOLOGIES (tests/gpu.py; virtual machines by
NCCL_HOSTID, ranks sharing GPUs under MPS): the last rank killed mid-operation, alive
but never calling, absent when the first call connects, and two kinds of call of the
same bytes every rank made before, swapped (the end-of-call check names both on every
rank). At one topology (SMALL): a rank
stopped (SIGSTOP), the rail link cut mid-call (tests/netns.py: a network namespace per
virtual machine, NCCL_SOCKET_IFNAME on the cable; needs root and ``ip``, or .iproute/),
a mismatched call (a new kind of call, checked by default; with RINGREDUCE_DEBUG=1
every call; two kinds every rank made before, swapped: the deadline, or the end-of-call
check when every rank reaches the end), the
store gone after setup. The pipeline faults run with the new-call check off: their calls
stand for a training step's, which every rank made before and the check skips. Each
survivor prints one ``[fault ...]`` line (``-s``).

The survivor learns of a failure from ``Communicator.wait_idle()`` (blocks until
outstanding work is done, or raises the watchdog's RingReduceError) or from its next
``all_reduce``. Run with ``pytest -m gpu``; skipped without CUDA or nccl4py.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
import time

import pytest
import torch

import ringreduce

from . import faults, netns
from .gpu import (
    DEADLINE,
    GPU_MARKS,
    HANG_S,
    IDS,
    KILLED_UNDER_MPS,
    NUMEL,
    OPS,
    SLACK,
    SMALL,
    STAGE_ERROR,
    TOPOLOGIES,
    env_with_deadline,
    healthy,
    leave,
    survive,
)
from .multiproc import run_test_ranks

pytestmark = GPU_MARKS


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _survivors_carry_on(rank: int, world: int, dev: torch.device) -> None:
    """Every rank but the last (the victim) goes on: D = 1 on the new group."""
    survivors = list(range(world - 1))
    faults.carry_on(rank, survivors, len(survivors), dev)


def _killed_worker(rank: int, world: int) -> None:
    dev = _device()
    comm = healthy(dev)
    if rank == world - 1:
        for _ in range(OPS):
            comm.all_reduce(torch.ones(NUMEL, device=dev), async_op=True)
        time.sleep(0.02)  # the survivors' calls are now in flight
        faults.mark_fault()
        os.kill(os.getpid(), signal.SIGKILL)
    survive(comm, dev, "killed")
    _survivors_carry_on(rank, world, dev)
    leave()


@KILLED_UNDER_MPS
@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_rank_killed_mid_operation_becomes_an_error(machines: int, devices: int) -> None:
    world = machines * devices
    run_test_ranks(_killed_worker, world, backend="nccl", env=env_with_deadline(machines, devices),
                   timeout=240, expect_exit={world - 1: -signal.SIGKILL})


def _absent_worker(rank: int, world: int, connected: bool) -> None:
    """The last rank stays alive but never makes the next call. ``connected``: after a
    healthy call; otherwise the survivors' first call must connect to their peers, and
    blocking NCCL communicators wait for that inside the call, on the host."""
    dev = _device()
    if connected:
        comm = healthy(dev)
    else:
        faulthandler.dump_traceback_later(HANG_S, exit=True)
        comm = ringreduce.Communicator(min_bytes=0, check_new_calls=False)
    if rank == world - 1:
        faulthandler.cancel_dump_traceback_later()  # idle by design, however long
        faults.meet("survived", world)  # alive until every survivor is through
        leave()  # its peers aborted the shared communicators: no teardown here
    started = time.monotonic()
    message = survive(comm, dev, "never calls" if connected else "absent at setup")
    assert "RINGREDUCE_TIMEOUT" in message, message  # the deadline fired, not an error
    assert time.monotonic() - started >= DEADLINE - 1
    _survivors_carry_on(rank, world, dev)
    faults.meet("survived", world)
    leave()


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_rank_that_never_calls_becomes_an_error(machines: int, devices: int) -> None:
    run_test_ranks(_absent_worker, machines * devices, True, backend="nccl",
                   env=env_with_deadline(machines, devices), timeout=240)


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_rank_absent_at_connection_setup_becomes_an_error(machines: int,
                                                              devices: int) -> None:
    run_test_ranks(_absent_worker, machines * devices, False, backend="nccl",
                   env=env_with_deadline(machines, devices), timeout=240)


def _stopped_worker(rank: int, world: int) -> None:
    """The last rank stops (SIGSTOP) mid-operation and stays stopped past the deadline:
    its sockets stay open, only the deadline can tell. Rank 0 kills it at the end."""
    dev = _device()
    comm = healthy(dev)
    if rank == world - 1:
        faults.store().set("stopped_pid", str(os.getpid()))
        for _ in range(OPS):
            comm.all_reduce(torch.ones(NUMEL, device=dev), async_op=True)
        time.sleep(0.02)
        faults.mark_fault()
        os.kill(os.getpid(), signal.SIGSTOP)
        raise AssertionError("the stopped rank ran on: it should have been killed")
    message = survive(comm, dev, "stopped (SIGSTOP)", stamped=True)
    assert "RINGREDUCE_TIMEOUT" in message, message
    _survivors_carry_on(rank, world, dev)
    faults.meet("carried_on", world - 1)
    if rank == 0:
        os.kill(int(faults.store().get("stopped_pid").decode()), signal.SIGKILL)
    leave()


@KILLED_UNDER_MPS  # the stopped rank is killed at the end, with its work on the GPU
def test_gpu_rank_stopped_past_the_deadline_becomes_an_error() -> None:
    world = SMALL[0] * SMALL[1]
    run_test_ranks(_stopped_worker, world, backend="nccl", env=env_with_deadline(*SMALL),
                   timeout=240, expect_exit={world - 1: -signal.SIGKILL})


def _cut_worker(rank: int, world: int, link: netns.Link) -> None:
    """Virtual machine m's ranks live in namespace m; the rail crosses the cable. Rank 0
    cuts it while every rank has large calls in flight: no process dies, no socket
    closes, every rank is a survivor. The cable is mended, then all carry on."""
    dev = _device()
    comm = healthy(dev)
    if rank == 0:
        for _ in range(OPS):
            comm.all_reduce(torch.ones(NUMEL, device=dev), async_op=True)
        time.sleep(0.05)
        faults.mark_fault()
        link.set("down")
        with pytest.raises(ringreduce.RingReduceError, match=STAGE_ERROR) as info:
            comm.wait_idle()
        faults.report("rail link cut", rank, info.value, DEADLINE + SLACK)
        comm.close()
        link.set("up")
    else:
        survive(comm, dev, "rail link cut", stamped=True)
    faults.meet("mended", world)
    faults.carry_on(rank, range(world), SMALL[0], dev)
    leave()


def test_gpu_rail_link_cut_mid_call_becomes_an_error() -> None:
    link = netns.make_link()
    if isinstance(link, str):
        pytest.skip(link)
    try:
        env = [{**e, **link.rank_env(r // SMALL[1])}
               for r, e in enumerate(env_with_deadline(*SMALL))]
        run_test_ranks(_cut_worker, SMALL[0] * SMALL[1], link, backend="nccl", env=env, timeout=240)
    finally:
        netns.remove(link)


MISMATCHES = {"numel": (torch.float32, 1_000_001), "dtype": (torch.float64, 1_000_000),
              "width": (torch.int32, 1_000_000)}
"""What rank 1 calls with while the others call 1,000,000 x float32: another size, a
dtype of another width, a dtype of the same width (the same bytes: every NCCL operation
completes, and only the end-of-call check can tell)."""
CALL_CHECK = (r"stage 'call check' failed on rank \d+ in (one of )?operations? #[\d.#]+.*, "
              r"peers \(group ranks\) \[[\d, ]+\]: ranks called different operations: this "
              r"rank all_reduce\(numel=1000000, dtype=torch.(float32|int32), op=sum\), another "
              r"all_reduce\(numel=1000000, dtype=torch.(int32|float32), op=sum\)")

CHECKS = {"debug": {"RINGREDUCE_DEBUG": "1"}, "new": {}, "swap": {}}
"""How the mismatch meets the checks: every call checked; a kind of call no rank made
before (the default check); both kinds made by every rank before, then swapped on
rank 1 (the store checks pass both: the end-of-call check, or the deadline)."""


def _mismatch_worker(rank: int, world: int, what: str, check: str,
                     machines: int = SMALL[0]) -> None:
    dev = _device()
    comm = healthy(dev, check_new_calls=check != "debug")  # debug: every call checked
    wrong_kind = MISMATCHES[what]
    if check == "swap":  # every rank makes both calls once, in agreement
        for dtype, n in ((torch.float32, 1_000_000), wrong_kind):
            t = torch.ones(n, dtype=dtype, device=dev)
            comm.all_reduce(t)
            comm.wait_idle()
            assert torch.equal(t, torch.full_like(t, float(world)))
    dtype, n = wrong_kind if rank == 1 else (torch.float32, 1_000_000)
    if rank == 1:
        faults.mark_fault()
    op = 4 if check == "swap" else 2
    rule = (CALL_CHECK if what == "width" else f"{STAGE_ERROR}|stage 'call check'"
            if check == "swap" else
            rf"collective mismatch at operation #{op}: rank \d+ calls all_reduce\(numel=\d+, "
            r"dtype=torch.float\d+")
    with pytest.raises(ringreduce.RingReduceError, match=rule) as info:
        t = torch.ones(n, dtype=dtype, device=dev)
        comm.all_reduce(t)
        comm.wait_idle()
        # Reached only when the call returned: say so at once, with what it returned
        # (the test fails below; the line shows in the log even if a peer then hangs).
        wrong = int((t != world).sum())
        print(f"[fault mismatched {what}] rank {rank}: the call RETURNED, {wrong} of {n} "
              f"elements wrong", flush=True)
    faults.report(f"mismatched {what}, {check} check", rank, info.value, DEADLINE + SLACK)
    if check != "swap":  # checked before communicating: still usable, every rank names rank 1
        assert "rank 1 calls" in str(info.value), str(info.value)
        t = torch.ones(1000, device=dev)
        comm.all_reduce(t)
        assert torch.equal(t, torch.full_like(t, float(world)))
        comm.close()
    else:  # the deadline, NCCL's own error after a peer aborted, or the end check
        assert any(why in str(info.value) for why in
                   ("RINGREDUCE_TIMEOUT", "NCCL", "ranks called different operations"))
        faults.meet("raised", world, DEADLINE + SLACK)
        faults.carry_on(rank, range(world), machines, dev)
    leave()


@pytest.mark.parametrize("what,check", [
    ("dtype", "debug"), ("numel", "debug"), ("dtype", "new"), ("numel", "new"),
    ("numel", "swap"), ("dtype", "swap"), ("width", "swap")],
    ids=["dtype-debug", "numel-debug", "dtype-new", "numel-new", "numel-swap", "dtype-swap",
         "width-swap"])
def test_gpu_mismatched_call_becomes_an_error(what: str, check: str) -> None:
    run_test_ranks(_mismatch_worker, SMALL[0] * SMALL[1], what, check, backend="nccl",
                   env=env_with_deadline(*SMALL, CHECKS[check]), timeout=240)


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_same_width_swap_is_named_at_every_topology(machines: int, devices: int) -> None:
    """The end-of-call check's hops (inside the machine, then along the rail) reach
    every rank: each names both calls, whichever rank swapped."""
    run_test_ranks(_mismatch_worker, machines * devices, "width", "swap", machines,
                   backend="nccl", env=env_with_deadline(machines, devices, CHECKS["swap"]),
                   timeout=240)


def _store_gone_worker(rank: int, world: int, server_pid: int, fresh: str) -> None:
    faults.store_gone(rank, world, server_pid, fresh, _device(), "nccl", DEADLINE + SLACK)
    leave()


def test_gpu_store_gone_after_setup_is_no_hang_and_no_wrong_result() -> None:
    with faults.store_server() as (port, pid), tempfile.TemporaryDirectory() as folder:
        fresh = f"file://{os.path.join(folder, 'fresh')}"
        run_test_ranks(_store_gone_worker, SMALL[0] * SMALL[1], pid, fresh, backend="nccl",
                       env=env_with_deadline(*SMALL),
                       timeout=240, store=("127.0.0.1", port))
