"""Fault injection on the CPU path (gloo): every fault becomes RingReduceError naming the
stage and the peers within the deadline, never a hang or a wrong result reported as
success, and the process can go on with a new Communicator afterwards.

Faults: a peer killed mid-operation, one that never calls, one stopped (SIGSTOP), the
rail link cut mid-call (tests/netns.py), a peer calling with another size or dtype
(named by the new-call check, or with RINGREDUCE_DEBUG=1 by the per-call check; two
calls of the same bytes swapped, named by the end-of-call check), the store taken away
after setup. Each survivor prints
one ``[fault ...]`` line (run with ``-s``): the README's fault table comes from those.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections.abc import Sequence

import pytest
import torch

import ringreduce

from . import faults, netns
from .multiproc import run_test_ranks

DEADLINE = 3.0
SLACK = 8.0  # process scheduling on a 2-core CI machine with 4 ranks
ENV = {"RINGREDUCE_TIMEOUT": str(DEADLINE)}
KNOWN_CALLS = {"check_new_calls": False}
"""The faults hit the pipeline (their workers pass KNOWN_CALLS): the calls here stand for a
training step's calls, which every rank has made before and the new-call check therefore
skips (it has tests of its own below; with it on, a dead peer at a new kind of call ends in
that check instead)."""
CPU = torch.device("cpu")
STAGE_ERROR = (r"stage '(reduce_scatter|collect|diffuse|all_gather)' failed on rank \d "
               r"in operation #2 \(slice \d+, tensor of {n} x torch.float32\), peers")
BIG = 8 << 20  # 32 MiB: 8 slices, long enough on gloo that a fault lands mid-operation


def _healthy(**internal: bool) -> ringreduce.Communicator:
    """``internal``: Config's internal settings (check_new_calls, check_call_end)."""
    comm = ringreduce.Communicator(machines=2, min_bytes=0, **internal)
    t = torch.ones(10)
    comm.all_reduce(t)  # everyone healthy first: the gloo pairs are connected
    assert torch.equal(t, torch.full_like(t, 4.0))
    return comm


def _survivor(comm: ringreduce.Communicator, fault: str, rank: int, n: int = 100_000,
              fault_at: float | None = None) -> None:
    with pytest.raises(ringreduce.RingReduceError, match=STAGE_ERROR.format(n=n)) as info:
        comm.all_reduce(torch.ones(n))
    _report(fault, rank, info.value, fault_at)
    with pytest.raises(ringreduce.RingReduceError, match="refuses new work"):
        comm.all_reduce(torch.ones(10))


def _report(fault: str, rank: int, exc: BaseException, fault_at: float | None = None) -> None:
    faults.report(fault, rank, exc, DEADLINE + SLACK, fault_at)


def _carry_on(rank: int, ranks: Sequence[int], machines: int) -> None:
    faults.carry_on(rank, ranks, machines, CPU)


def _absent_worker(rank: int, world: int, folder: str) -> None:
    comm = _healthy(**KNOWN_CALLS)
    if rank == 3:  # alive, its communicator too, but it never makes the second call
        faults.meet("carried_on", 4)
        comm.close()
        return
    _survivor(comm, "never calls", rank, fault_at=time.time())
    with open(os.path.join(folder, f"flight-{rank}.json")) as f:
        dump = json.load(f)
    last = dump["operations"][-1]
    assert (last["op_number"], last["numel"], last["finished"]) == (2, 100_000, None), last
    assert dump["operations"][0]["finished"] is not None
    _carry_on(rank, (0, 1, 2), 3)
    faults.meet("carried_on", 4)


def test_rank_that_never_calls_becomes_an_error() -> None:
    with tempfile.TemporaryDirectory() as folder:
        env = {**ENV, "RINGREDUCE_FLIGHT_FILE": os.path.join(folder, "flight-{rank}.json")}
        run_test_ranks(_absent_worker, 4, folder, env=env, timeout=120)


def _killed_worker(rank: int, world: int) -> None:
    comm = _healthy(**KNOWN_CALLS)
    if rank == 3:
        comm.all_reduce(torch.ones(BIG), async_op=True)
        time.sleep(0.1)
        faults.mark_fault()
        os.kill(os.getpid(), signal.SIGKILL)  # dies in the middle of the operation
    _survivor(comm, "killed", rank, BIG)
    _carry_on(rank, (0, 1, 2), 3)


def test_rank_killed_mid_operation_becomes_an_error() -> None:
    run_test_ranks(_killed_worker, 4, env=ENV, timeout=120, expect_exit={3: -signal.SIGKILL})


def _stopped_worker(rank: int, world: int) -> None:
    """Rank 3 stops (SIGSTOP) in the middle of an operation and stays stopped past the
    deadline: its sockets stay open, so nothing but the deadline can tell. Rank 0 kills
    it once the survivors carried on without it."""
    comm = _healthy(**KNOWN_CALLS)
    if rank == 3:
        faults.store().set("stopped_pid", str(os.getpid()))
        comm.all_reduce(torch.ones(BIG), async_op=True)
        time.sleep(0.1)
        faults.mark_fault()
        os.kill(os.getpid(), signal.SIGSTOP)
        raise AssertionError("rank 3 ran on after SIGSTOP: it should have been killed")
    _survivor(comm, "stopped (SIGSTOP)", rank, BIG)
    _carry_on(rank, (0, 1, 2), 3)
    faults.meet("carried_on", 3)
    if rank == 0:
        os.kill(int(faults.store().get("stopped_pid").decode()), signal.SIGKILL)


def test_rank_stopped_past_the_deadline_becomes_an_error() -> None:
    run_test_ranks(_stopped_worker, 4, env=ENV, timeout=120, expect_exit={3: -signal.SIGKILL})


def _cut_worker(rank: int, world: int, link: netns.Link) -> None:
    """Machine m's ranks live in namespace m; the rail crosses the cable. Rank 0 cuts it
    while every rank is inside a large all-reduce: no process dies and no socket closes,
    every rank is a survivor. The cable is mended, then all four carry on."""
    comm = _healthy(**KNOWN_CALLS)
    started = time.monotonic()
    with pytest.raises(ringreduce.RingReduceError, match=STAGE_ERROR.format(n=BIG)) as info:
        if rank == 0:
            comm.all_reduce(torch.ones(BIG), async_op=True)
            time.sleep(0.1)
            faults.mark_fault()
            link.set("down")
            comm.wait_idle()  # raises the failure of the call in flight
        else:
            comm.all_reduce(torch.ones(BIG))
    _report("rail link cut", rank, info.value)
    assert time.monotonic() - started >= DEADLINE - 0.5  # the deadline ended it: no error
    if rank == 0:
        link.set("up")
    faults.meet("mended", world)
    _carry_on(rank, range(world), 2)


def test_rail_link_cut_mid_call_becomes_an_error() -> None:
    link = netns.make_link()
    if isinstance(link, str):
        pytest.skip(link)
    try:
        env = [{**ENV, **link.rank_env(r // 2)} for r in range(4)]
        run_test_ranks(_cut_worker, 4, link, env=env, timeout=120)
    finally:
        netns.remove(link)


def _mismatch_worker(rank: int, world: int) -> None:
    comm = ringreduce.Communicator(machines=2, min_bytes=0)
    n = 101 if rank == 1 else 100
    rule = (r"collective mismatch at operation #1: rank \d calls all_reduce\(numel=\d+, "
            r"dtype=torch.float32, op=sum\), rank \d calls all_reduce\(numel=\d+")
    with pytest.raises(ringreduce.RingReduceError, match=rule) as info:
        comm.all_reduce(torch.ones(n))
    assert "numel=101" in str(info.value) and "rank 1" in str(info.value)
    t = torch.ones(100)
    comm.all_reduce(t)  # nothing was communicated: still usable, still in step
    assert torch.equal(t, torch.full((100,), float(world)))
    with pytest.raises(ringreduce.RingReduceError, match=r"rank 2 calls .*dtype=torch.float64"):
        comm.all_reduce(torch.ones(100, dtype=torch.float64 if rank == 2 else torch.float32))
    # The same width moves the same bytes: without the check this call would return
    # wrong values on every rank (so do gloo's and NCCL's own); with it, an error.
    with pytest.raises(ringreduce.RingReduceError, match=r"rank 3 calls .*dtype=torch.int32"):
        comm.all_reduce(torch.ones(100, dtype=torch.int32 if rank == 3 else torch.float32))
    comm.close()


def test_mismatched_calls_raise_on_every_rank() -> None:
    run_test_ranks(_mismatch_worker, 4, env={"RINGREDUCE_DEBUG": "1"}, timeout=120)


def _new_call_worker(rank: int, world: int) -> None:
    """Without RINGREDUCE_DEBUG: a mismatch in a kind of call no rank made before is
    named before anything is communicated; a rank alone in making a new call ends at the
    deadline in the check, its peers in the pipeline; nobody returns."""
    comm = ringreduce.Communicator(machines=2, min_bytes=0)
    t = torch.ones(100)
    comm.all_reduce(t)
    assert torch.equal(t, torch.full_like(t, float(world)))
    started = time.monotonic()
    with pytest.raises(ringreduce.RingReduceError, match=(
            r"collective mismatch at operation #2: rank \d calls all_reduce\(numel=10[12], "
            r"dtype=torch.float32, op=sum\), rank \d calls all_reduce\(numel=10[12]")):
        comm.all_reduce(torch.ones(101 if rank == 1 else 102))
    assert time.monotonic() - started < DEADLINE, "a mismatch of new calls waited for the deadline"
    comm.all_reduce(t.fill_(1.0))  # nothing was communicated: still usable, still in step
    assert torch.equal(t, torch.full_like(t, float(world)))
    if rank == 2:
        faults.mark_fault()  # int32 is new to rank 2 only; float32 x 100 the others know
    check = r"stage 'call check' failed on rank 2 in operation #3 .*diverged"
    with pytest.raises(ringreduce.RingReduceError,
                       match=check if rank == 2 else STAGE_ERROR.format(n=100).replace("#2", "#3")
                       ) as info:
        comm.all_reduce(torch.ones(100, dtype=torch.int32 if rank == 2 else torch.float32))
    _report("new call on one rank only", rank, info.value)


def test_new_kind_of_call_is_checked_without_debug() -> None:
    run_test_ranks(_new_call_worker, 4, env={"RINGREDUCE_TIMEOUT": str(DEADLINE)}, timeout=120)


MISMATCHES = {"numel": (torch.float32, 100_001, ()), "dtype": (torch.float64, 100_000, (0,))}
"""What rank 1 calls with while the others call 100,000 x float32 (a different size, or a
dtype of another width), and the ranks that gloo itself terminates: the receiver of a
message longer than it posted (rank 1's intra-machine peer, in reduce_scatter) dies in
gloo's I/O thread ("Received data size doesn't match expected size"). A dtype of the
same width moves the same bytes: the end-of-call check's test is below."""


def _undebugged_mismatch_worker(rank: int, world: int, what: str) -> None:
    """Default configuration; every rank has made both calls before (the new-call check
    passed them), then rank 1 makes the other one: only the deadline can tell."""
    comm = _healthy()
    dtype, n, aborted = MISMATCHES[what]
    for known in ((torch.float32, 100_000), (dtype, n)):
        t = torch.ones(known[1], dtype=known[0])
        comm.all_reduce(t)
        assert torch.equal(t, torch.full_like(t, float(world)))
    if rank == 1:
        faults.mark_fault()
    else:
        dtype, n = torch.float32, 100_000
    survivors = [r for r in range(world) if r not in aborted]
    if rank in aborted:
        comm.all_reduce(torch.ones(n, dtype=dtype))
        raise AssertionError(f"rank {rank} was expected to be terminated by gloo")
    with pytest.raises(ringreduce.RingReduceError, match=r"stage '\w+' failed on rank \d in "
                       r"operation #4 .*, peers") as info:
        comm.all_reduce(torch.ones(n, dtype=dtype))
    _report(f"mismatched {what}, no debug, both calls known", rank, info.value)
    faults.meet("raised", len(survivors))  # nobody starts the next group while a peer still waits
    _carry_on(rank, survivors, 2 if len(survivors) == 4 else len(survivors))


@pytest.mark.parametrize("what", sorted(MISMATCHES))
def test_mismatched_known_calls_without_debug_end_at_the_deadline(what: str) -> None:
    aborted = {r: -signal.SIGABRT for r in MISMATCHES[what][2]}
    run_test_ranks(_undebugged_mismatch_worker, 4, what, timeout=120, expect_exit=aborted,
                   env={"RINGREDUCE_TIMEOUT": str(DEADLINE)})


def _same_width_worker(rank: int, world: int, check_call_end: bool) -> None:
    """Every rank has made both calls before; then rank 1 reduces int32 where the others
    reduce float32, 100,000 of each: the same bytes, so every stage completes. The
    end-of-call check makes every rank raise, naming both calls; without it (the
    control) every rank returns values that are wrong, as success."""
    comm = _healthy(check_call_end=check_call_end)
    for dtype in (torch.float32, torch.int32):
        t = torch.ones(100_000, dtype=dtype)
        comm.all_reduce(t)
        assert torch.equal(t, torch.full_like(t, world))
    dtype = torch.int32 if rank == 1 else torch.float32
    t = torch.ones(100_000, dtype=dtype)
    if not check_call_end:
        comm.all_reduce(t)
        assert not torch.equal(t, torch.full_like(t, world)), "the control reduced correctly"
        return
    if rank == 1:
        faults.mark_fault()
    started = time.monotonic()
    with pytest.raises(ringreduce.RingReduceError, match=(
            r"stage 'call check' failed on rank \d in operation #4, peers \(group ranks\) "
            r"\[0, 1, 2, 3\]: ranks called different operations: this rank all_reduce\("
            r"numel=100000, dtype=torch.(float32|int32), op=sum\), another all_reduce\("
            r"numel=100000, dtype=torch.(int32|float32), op=sum\)")) as info:
        comm.all_reduce(t)
    assert time.monotonic() - started < DEADLINE, "the check waited for the deadline"
    _report("dtype of the same width, both calls known", rank, info.value)
    faults.meet("raised", world)
    _carry_on(rank, range(world), 2)


@pytest.mark.parametrize("check_call_end", [True, False], ids=["checked", "control"])
def test_same_width_dtype_swap_is_named_by_the_end_of_call_check(check_call_end: bool) -> None:
    run_test_ranks(_same_width_worker, 4, check_call_end, timeout=120,
                   env={"RINGREDUCE_TIMEOUT": str(DEADLINE)})


def _store_gone_worker(rank: int, world: int, server_pid: int, fresh: str) -> None:
    faults.store_gone(rank, world, server_pid, fresh, CPU, "gloo", DEADLINE + SLACK)


def test_store_gone_after_setup_is_no_hang_and_no_wrong_result() -> None:
    with faults.store_server() as (port, pid), tempfile.TemporaryDirectory() as folder:
        fresh = f"file://{os.path.join(folder, 'fresh')}"
        run_test_ranks(_store_gone_worker, 4, pid, fresh,
                       env={"RINGREDUCE_TIMEOUT": str(DEADLINE), "RINGREDUCE_MACHINES": "2"},
                       timeout=120, store=("127.0.0.1", port))
