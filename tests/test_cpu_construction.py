"""Construction and groups as other people's code meets them (CPU, gloo): subgroups spread
unevenly over machines, the process group's timeout, ranks that come late or not at
all, ranks configured differently, refused and corrected constructions, threads, and
strided tensors on the backend."""

from __future__ import annotations

import datetime
import logging
import threading
import time

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce.errors import RingReduceError
from ringreduce.integrations.backend import RingReduceGroup

from . import faults
from .multiproc import run_test_ranks

CPU = torch.device("cpu")
TWO_HOSTS = [{"NCCL_HOSTID": f"host{rank // 2}", "RINGREDUCE_MIN_BYTES": "0"}
             for rank in range(4)]
"""Ranks 0, 1 on one host and 2, 3 on another, told apart as NCCL tells them apart."""


def _routes(comm: ringreduce.Communicator) -> set[str]:
    return {r.route for r in comm._res.guard.recorder._records}


def _uneven_subgroups_worker(rank: int, world: int) -> None:
    three = dist.new_group([0, 1, 2])
    rail = dist.new_group([0, 2])
    if rank < 3:
        t = torch.full((1001,), float(rank + 1))
        dist.all_reduce(t, group=three)
        assert torch.equal(t, torch.full((1001,), 6.0))
        assert isinstance(three, RingReduceGroup)
        engine = three.communicator(CPU)
        assert engine.topology.machines == 1 and "'host0': 2, 'host1': 1" in \
            engine.topology.flat_reason
        assert _routes(engine) == {"flat"}
    if rank in (0, 2):  # even over the two hosts: one device on each, hierarchical
        t = torch.full((1001,), float(rank + 1))
        dist.all_reduce(t, group=rail)
        assert torch.equal(t, torch.full((1001,), 4.0))
        assert isinstance(rail, RingReduceGroup)
        assert rail.communicator(CPU).topology.machines == 2
        assert _routes(rail.communicator(CPU)) == {"hierarchical"}
    whole = torch.full((1001,), float(rank))
    dist.all_reduce(whole)
    assert torch.equal(whole, torch.full((1001,), 6.0))


def test_subgroups_spread_unevenly_over_machines_take_the_flat_route() -> None:
    run_test_ranks(_uneven_subgroups_worker, 4, backend="ringreduce", env=TWO_HOSTS)


def _machines_not_dividing_worker(rank: int, world: int) -> None:
    three = dist.new_group([0, 1, 2])
    if rank < 3:
        t = torch.full((77,), float(rank + 1))
        dist.all_reduce(t, group=three)
        assert torch.equal(t, torch.full((77,), 6.0))
        assert isinstance(three, RingReduceGroup)
        assert three.communicator(CPU).topology.machines == 1
    dist.barrier()


def test_a_group_the_configured_machine_count_does_not_divide_takes_the_flat_route() -> None:
    env = {"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"}
    run_test_ranks(_machines_not_dividing_worker, 4, backend="ringreduce", env=env)


def _timeout_worker(rank: int, world: int) -> None:
    """The group's timeout (5 s) is the engine's deadline: a rank that skips a call
    leaves the others raising within it, not after RINGREDUCE_TIMEOUT's 600 s."""
    t = torch.ones(64)
    dist.all_reduce(t)  # builds the engine on every rank
    engine = dist.group.WORLD.communicator(CPU)  # type: ignore[union-attr]
    assert engine.config.timeout_s == 5.0, engine.config
    if rank == 3:  # skips the next all_reduce, and stays alive until the others raised
        faults.meet("raised", 4, timeout_s=60)
        return
    start = time.monotonic()
    with pytest.raises(RingReduceError, match=r"stage '\w+' failed on rank \d"):
        dist.all_reduce(torch.ones(64))
    took = time.monotonic() - start
    assert took < 30, f"the survivors raised after {took:.1f} s, the group's timeout is 5 s"
    faults.meet("raised", 4, timeout_s=60)


def test_the_backend_takes_the_process_groups_timeout() -> None:
    run_test_ranks(_timeout_worker, 4, backend="ringreduce", pg_timeout=5,
                   env={"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"})


def _explicit_timeout_worker(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(4))
    engine = dist.group.WORLD.communicator(CPU)  # type: ignore[union-attr]
    assert engine.config.timeout_s == 42.0, engine.config


def test_an_explicit_ringreduce_timeout_wins_over_the_groups() -> None:
    run_test_ranks(_explicit_timeout_worker, 2, backend="ringreduce", pg_timeout=5,
                   env={"RINGREDUCE_TIMEOUT": "42"})


def _late_rank_worker(rank: int, world: int) -> None:
    """Rank 3 comes 1.5 s late to the first all_reduce (within the 4 s deadline): it
    works. Then a new group's rank 3 comes after the deadline (10 s: the new group's
    gloo connects under the same timeout, which a loaded 2-core machine once missed at
    4 s): the others raise naming it, it raises at once on arrival, and the next call
    on every rank works."""
    if rank == 3:
        time.sleep(1.5)
    t = torch.full((100,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((100,), 6.0))

    group = dist.new_group(timeout=datetime.timedelta(seconds=10))
    if rank != 3:
        with pytest.raises(RingReduceError, match=r"stage 'construction' failed .* ranks \[3\] "
                           r"did not arrive within 10 s"):
            dist.all_reduce(torch.ones(8), group=group)
        faults.meet("absent", 4)
    else:
        faults.meet("absent", 4)  # only once the others have given up
        with pytest.raises(RingReduceError, match=r"rank \d gave up waiting"):
            dist.all_reduce(torch.ones(8), group=group)
    t = torch.full((100,), float(rank))
    dist.all_reduce(t, group=group)  # every rank present now: a new build that works
    assert torch.equal(t, torch.full((100,), 6.0))


def test_a_late_rank_works_and_an_absent_one_is_named_without_poisoning_the_group() -> None:
    run_test_ranks(_late_rank_worker, 4, backend="ringreduce", pg_timeout=4, timeout=120,
                   env={"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"})


def _differing_settings_worker(rank: int, world: int) -> None:
    match = (r"settings differ.*slice_bytes \(RINGREDUCE_SLICE_BYTES\): ranks \[0, 2, 3\]: "
             r"None; ranks \[1\]: 1024 \| min_bytes \(RINGREDUCE_MIN_BYTES\): ranks "
             r"\[0, 2, 3\]: 0; ranks \[1\]: 4096\. Pass the same arguments")
    with pytest.raises(ValueError, match=match):
        ringreduce.Communicator(machines=2)
    # Explicit arguments win over the variables: the ranks agree, and it works at once.
    with ringreduce.Communicator(machines=2, min_bytes=0, slice_bytes=1024) as comm:
        t = torch.full((3000,), float(rank))
        comm.all_reduce(t)
        assert torch.equal(t, torch.full((3000,), 6.0))
    with pytest.raises(ValueError, match=r"slice_bytes \(RINGREDUCE_SLICE_BYTES\): ranks "
                       r"\[0, 2, 3\]: None; ranks \[1\]: 1024"):
        dist.all_reduce(torch.ones(8))  # the backend's engine compares them too


def test_ranks_configured_differently_fail_on_every_rank_naming_the_field() -> None:
    env = [{"RINGREDUCE_MIN_BYTES": "0"} for _ in range(4)]
    env[1] = {"RINGREDUCE_MIN_BYTES": "4096", "RINGREDUCE_SLICE_BYTES": "1024"}
    run_test_ranks(_differing_settings_worker, 4, backend="ringreduce", env=env, timeout=120)


def _refused_worker(rank: int, world: int) -> None:
    if rank in (0, 3):  # the slow ranks: the fast ones refuse and retry first
        time.sleep(1.0)
    with pytest.raises(ValueError, match="machines=3 must divide the world size 4"):
        ringreduce.Communicator(machines=3)
    start = time.monotonic()
    with ringreduce.Communicator(machines=2, min_bytes=0) as comm:
        t = torch.full((100,), float(rank))
        comm.all_reduce(t)
        assert torch.equal(t, torch.full((100,), 6.0))
    assert time.monotonic() - start < 20
    # Some ranks refuse, the others do not: every rank fails, naming the disagreement.
    if rank == 2:
        with pytest.raises(ValueError, match="machines=3 must divide"):
            ringreduce.Communicator(machines=3)
    else:
        with pytest.raises(ValueError, match=r"ranks \[2\] refused their arguments \(rank 2: "
                           r"ValueError: machines=3 must divide the world size 4"):
            ringreduce.Communicator(machines=2)
    with ringreduce.Communicator(machines=2, min_bytes=0) as comm:
        t = torch.full((100,), float(rank))
        comm.all_reduce(t)
        assert torch.equal(t, torch.full((100,), 6.0))


def test_a_refused_construction_leaves_nothing_behind() -> None:
    run_test_ranks(_refused_worker, 4, timeout=120)


def _threads_worker(rank: int, world: int) -> None:
    """Two threads call one Communicator 40 times each: every sum is exact. Each
    thread's tensors hold the same values on every rank, so a sum is right whichever
    thread's call a peer pairs it with: what is tested is that calls never interleave
    inside ringreduce (the order across ranks is the user's, as for any collective)."""
    errors: list[BaseException] = []
    with ringreduce.Communicator(machines=2, min_bytes=0, slice_bytes=1024) as comm:
        def calls(value: float) -> None:
            try:
                for i in range(40):
                    t = torch.full((4000,), value * (rank + 1))
                    fut = comm.all_reduce(t, async_op=i % 2 == 1)
                    if fut is not None:
                        fut.wait()
                    assert torch.equal(t, torch.full((4000,), value * 10)), t[:4]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=calls, args=(1.0,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, errors


def test_calls_from_two_threads_are_serialised() -> None:
    run_test_ranks(_threads_worker, 4, timeout=180)


def _backend_threads_worker(rank: int, world: int) -> None:
    """Two threads' first all_reduce on the backend build one engine between them."""
    results: list[torch.Tensor] = []
    barrier = threading.Barrier(2)

    def first_call() -> None:
        barrier.wait()
        t = torch.full((64,), float(rank))
        dist.all_reduce(t)
        results.append(t)

    threads = [threading.Thread(target=first_call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and all(torch.equal(t, torch.full((64,), 6.0)) for t in results)
    group = dist.group.WORLD
    assert isinstance(group, RingReduceGroup) and len(group._engines) == 1
    assert group._builds == {"cpu": 1}


def test_the_backends_engine_build_is_thread_safe() -> None:
    run_test_ranks(_backend_threads_worker, 4, backend="ringreduce", timeout=120,
                   env={"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"})


def _strided_worker(rank: int, world: int) -> None:
    buf = torch.arange(1001, dtype=torch.float32)
    before = buf.clone()
    with pytest.raises(ValueError, match=r"needs a contiguous tensor, got shape \(501,\) with "
                       r"strides \(2,\); call .contiguous\(\) and copy back"):
        dist.all_reduce(buf[::2])
    assert torch.equal(buf, before)  # nothing written, in the view or outside it
    t = buf[::2].contiguous()
    dist.all_reduce(t)
    assert torch.equal(t, before[::2] * world)


def test_a_strided_tensor_on_the_backend_is_refused_and_nothing_is_written() -> None:
    run_test_ranks(_strided_worker, 4, backend="ringreduce",
                   env={"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"})


def _one_machine_worker(rank: int, world: int) -> None:
    notes: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            notes.append(record.getMessage())

    logging.getLogger("ringreduce").addHandler(Collect())
    with ringreduce.Communicator(min_bytes=0) as comm:
        assert comm.topology.machines == 1
    said = [n for n in notes if "on one machine" in n]
    if rank == 0:  # said once, by rank 0, with the way out
        assert len(said) == 1 and "pass machines=K" in said[0], notes
    else:
        assert not said, notes


def test_a_communicator_on_one_machine_says_so_once() -> None:
    run_test_ranks(_one_machine_worker, 2)
