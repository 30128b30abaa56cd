"""GPU tests of the native issuer (ringreduce/execution/native.py, native/issuer.cpp): exact
against the Python issuer and NCCL on the sweep (dtypes, ops, padding, wire format),
asynchronous futures, two Communicators in one process, DDP's hook, and a killed peer
still a RingReduceError within the deadline.

One GPU suffices: the topologies of ``RINGREDUCE_GPU_TOPOLOGIES`` (test_gpu.py), ranks
sharing the GPU (under MPS, except the killed-peer test). Run with ``pytest -m gpu``;
skipped without CUDA, nccl4py or the built extension. Communicators pin their plan;
the sweep runs both (the native issuer replays either).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from ringreduce.execution import native

from . import faults
from .cases import check_equal, expected, interleaved, rank_input, sizes_for, sweep
from .gpu import GPU_MARKS as gpu_marks
from .gpu import IDS, KILLED_UNDER_MPS, NUMEL, OPS, TOPOLOGIES
from .gpu import env_with_deadline as _env_with_deadline
from .gpu import gpu_env as _env
from .gpu import healthy as _healthy
from .gpu import leave as _leave
from .gpu import survive as _survive
from .multiproc import run_test_ranks
from .training import model, train

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    *gpu_marks,
    pytest.mark.skipif(native.extension()[0] is None, reason="ringreduce._native not built"),
]
HANG_S = 60.0
"""A rank still running after this prints its issuer's counters and every Python
thread's stack, so a hang on the GPU machine leaves the evidence behind."""


@contextlib.contextmanager
def _diagnosed(comm: ringreduce.Communicator, rank: int) -> Iterator[None]:
    def dump() -> None:
        native_issuer = comm._res.native
        counters = native_issuer.worker.counters() if native_issuer is not None else None
        print(f"[rank {rank}] still running after {HANG_S} s; native issuer {counters}",
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    timer = threading.Timer(HANG_S, dump)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _async_worker(rank: int, world: int, issuer: str) -> None:
    """Many futures in flight, then the caller's stream works on the results without a
    host wait: fut.wait() must order it after each all-reduce."""
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(plan="pipelined", issuer=issuer, min_bytes=0) as comm, \
            _diagnosed(comm, rank):
        assert comm.describe().endswith(f"issuer={issuer}"), comm.describe()
        n = (6 << 20) + 5  # 24 MiB fp32: several slices and a tail
        tensors = [rank_input(rank, n, torch.float32, dev, salt=s) for s in range(12)]
        futs = [comm.all_reduce(t, async_op=True) for t in tensors]
        outs = [fut.wait() * 2 for fut in futs]  # on the caller's stream, after the wait
        for s, out in enumerate(outs):
            check_equal(out, 2 * expected(world, n, torch.float32, dist.ReduceOp.SUM, dev,
                                          salt=s), f"future {s}")
        t = rank_input(rank, n, torch.bfloat16, dev)
        comm.all_reduce(t)  # synchronous: the caller's stream waits for it on the device
        check_equal(t.float(), expected(world, n, torch.bfloat16, dist.ReduceOp.SUM,
                                            dev).float(), "sync bf16")
        assert comm.wait_idle(60.0)


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_native_futures_order_the_callers_stream(machines: int, devices: int) -> None:
    run_test_ranks(_async_worker, machines * devices, "native", backend="nccl",
                   env=_env(machines, devices), timeout=HANG_S + 40)


def _issue_order_worker(rank: int, world: int) -> None:
    """Calls on one tensor with several in flight (async_op=True, nothing waited in
    between) run in issue order, as NCCL's do on a process group's one stream: sum,
    sum, max of small integers is world x the first sum, exactly. One or two slices
    (the default 4 MiB), so a call's reduce_scatter, which only follows the previous
    call's reduce_scatter on its stream, would overtake that call's all_gather."""
    dev = torch.device("cuda", torch.cuda.current_device())
    n = 1_000_003
    want = expected(world, n, torch.float32, dist.ReduceOp.SUM, dev) * world
    ops = (dist.ReduceOp.SUM, dist.ReduceOp.SUM, dist.ReduceOp.MAX)
    with ringreduce.Communicator(plan="pipelined", issuer="native", min_bytes=0) as comm, \
            _diagnosed(comm, rank):
        for round_ in range(4):  # the first round's calls are traced (native issuer)
            t = rank_input(rank, n, torch.float32, dev)
            futures = [comm.all_reduce(t, op=op, async_op=True) for op in ops]
            for fut in futures:
                fut.wait()
            check_equal(t, want, f"round {round_}: sum, sum, max in flight on one tensor")
        t = rank_input(rank, n, torch.float32, dev)
        comm.all_reduce(t, async_op=True)
        comm.all_reduce(t)  # synchronous, behind an asynchronous call on the same tensor
        check_equal(t, want, "async sum, then sync sum on one tensor")
        assert comm.wait_idle(60.0)


@pytest.mark.parametrize("issuer", ["native", "python"])
@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_calls_on_one_tensor_run_in_issue_order(machines: int, devices: int,
                                                     issuer: str) -> None:
    run_test_ranks(_issue_order_worker, machines * devices, backend="nccl",
                   env=_env(machines, devices), timeout=HANG_S + 40)


def _two_communicators_worker(rank: int, world: int) -> None:
    """Two Communicators with native issuers, asynchronous calls alternating between
    them with several in flight: each issuer's jobs, flags and done events are its own,
    and every Future orders its tensor. (With native-async's worker threads, each
    issuing on its own, the NCCL kernels of the two reached the device in different
    orders and waited for each other: a hang at 2x2, results
    2026-11-25-h100-caller-time, run 41.)"""
    dev = torch.device("cuda", torch.cuda.current_device())
    n = (3 << 20) + 7  # several 4 MiB slices
    with ringreduce.Communicator(plan="pipelined", issuer="native", min_bytes=0) as first, \
            ringreduce.Communicator(plan="pipelined", issuer="native", min_bytes=0,
                                    slice_bytes=8 << 20) as second, \
            _diagnosed(first, rank):
        for comm in (first, second):
            assert comm.describe().endswith("issuer=native"), comm.describe()
            comm.all_reduce(rank_input(rank, n, torch.float32, dev))  # traced: issued from Python
        for round_ in range(3):
            tensors = [rank_input(rank, n, torch.float32, dev, salt=s) for s in range(8)]
            futs = [(first if s % 2 else second).all_reduce(t, async_op=True)
                    for s, t in enumerate(tensors)]
            for s, (t, fut) in enumerate(zip(tensors, futs, strict=True)):
                fut.wait()
                check_equal(t, expected(world, n, torch.float32, dist.ReduceOp.SUM, dev,
                                        salt=s), f"round {round_}, call {s}")
        assert first.wait_idle(60.0) and second.wait_idle(60.0)


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_two_native_communicators_in_one_process(machines: int, devices: int) -> None:
    run_test_ranks(_two_communicators_worker, machines * devices, backend="nccl",
                   env=_env(machines, devices), timeout=HANG_S + 40)


def _killed_worker(rank: int, world: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    comm = _healthy(dev)
    assert comm.describe().endswith("issuer=native"), comm.describe()
    for _ in range(2):  # the next calls of this size replay the traced program
        comm.all_reduce(torch.ones(NUMEL, device=dev))
    comm.wait_idle()
    if rank == world - 1:
        for _ in range(OPS):
            comm.all_reduce(torch.ones(NUMEL, device=dev), async_op=True)
        time.sleep(0.02)
        faults.mark_fault()
        os.kill(os.getpid(), signal.SIGKILL)
    _survive(comm, dev, "killed")  # the error within DEADLINE + SLACK, names stage and size
    _leave()


@KILLED_UNDER_MPS
def test_gpu_native_issuer_killed_peer_becomes_an_error_within_the_deadline() -> None:
    run_test_ranks(_killed_worker, 2, backend="nccl",
                   env=_env_with_deadline(2, 1), timeout=240,
                   expect_exit={1: -signal.SIGKILL})


def _ddp_worker(rank: int, world: int, issuer: str) -> None:
    """The hook with the native issuer against DDP on NCCL alone, with
    find_unused_parameters: DDP then all-reduces its unused-parameter map on its own
    NCCL group right after the last bucket's hook, on the autograd thread, the thread
    that issued the buckets' jobs before each hook returned."""
    dev = torch.device("cuda", torch.cuda.current_device())
    nccl = dist.group.WORLD
    reference = train(DDP(model().to(dev), bucket_cap_mb=0.01, find_unused_parameters=True),
                      rank, 6, dev)
    with ringreduce.Communicator(nccl, plan="pipelined", issuer=issuer, min_bytes=0,
                                 slice_bytes=4096) as comm, \
            _diagnosed(comm, rank):
        assert comm.describe().endswith(f"issuer={issuer}"), comm.describe()
        hooked = DDP(model().to(dev), bucket_cap_mb=0.01, find_unused_parameters=True)
        hooked.register_comm_hook(comm, ringreduce.ddp_hook)
        for a, b in zip(train(hooked, rank, 6, dev), reference, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        last = comm._res.guard.recorder.last()  # the last bucket of the last step
        assert last is not None and last.route == f"hierarchical ({issuer})", last
        assert comm.wait_idle(60.0)


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_ddp_hook_with_unused_parameter_detection_matches_plain_ddp(
        machines: int, devices: int) -> None:
    run_test_ranks(_ddp_worker, machines * devices, "native", backend="nccl",
                   env=_env(machines, devices), timeout=240)


def _sweep_worker(rank: int, world: int, issuer: str, plan: str) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(plan=plan, issuer=issuer, min_bytes=0,
                                 slice_bytes=4096) as comm, \
            _diagnosed(comm, rank):
        assert comm.describe().endswith(f"issuer={issuer}"), comm.describe()
        sizes = [*sizes_for(comm.topology.devices_per_machine, comm.topology.machines),
                 65537]
        for _ in range(2):  # the first call of each kind is issued from Python, the rest
            assert sweep(comm, sizes, dev) > 0  # replay its program (NativeIssuer.program)
            interleaved(comm, [1, 1000, 4097, 300_001], dev)
            # ~1000 slices, so ~1000 wave groups: one dtype and op (every dtype x op of it
            # took longer than 180 s at 4 x 2 on one GPU, run 13), twice: traced, replayed
            assert sweep(comm, [(1 << 20) + 3], dev, (torch.float32,),
                         (dist.ReduceOp.SUM,)) == 1
        for _ in range(3):  # the same plan keys again: replayed programs, new addresses
            t = rank_input(rank, 500_003, torch.float32, dev)
            ref = t.clone()
            comm.all_reduce(t)
            dist.all_reduce(ref)
            check_equal(t, ref, f"{issuer} 500_003 floats")
        last = comm._res.guard.recorder.last()
        route = last.route if last is not None else "(no flight record)"
        assert route == f"{'hierarchical' if plan == 'pipelined' else plan}" + \
            (f" ({issuer})" if issuer == "native" else ""), route
        if plan == "one-slice":
            _one_slice_average_agrees(comm, rank, dev)
            _replayed_and_new_calls_in_flight_together(comm, rank, world, dev)
    # a 16-bit wire for float32 takes the pipeline on either plan
    for wire in (torch.bfloat16, torch.float16) if plan == "pipelined" else ():
        with ringreduce.Communicator(plan="pipelined", issuer=issuer, min_bytes=0,
                                     slice_bytes=65536, wire_dtype=wire) as comm:
            for n in (1000, 300_001, 1000, 300_001):
                t = rank_input(rank, n, torch.float32, dev)
                comm.all_reduce(t)
                check_equal(t, expected(world, n, torch.float32, dist.ReduceOp.SUM, dev),
                            f"{issuer} wire {wire} n={n}")


def _replayed_and_new_calls_in_flight_together(comm: ringreduce.Communicator, rank: int,
                                               world: int, dev: torch.device) -> None:
    """Asynchronous calls alternating a replayed kind with ever-new kinds (issued from
    Python at first sight), none waited for until the end, as DDP's buckets of many
    sizes: each call's end-of-call check must see its own words (they share buffers;
    issued on two streams they raced: 'ranks called different operations')."""
    jobs = []
    for i in range(24):
        n = 300_001 if i % 2 else 300_003 + 2 * i  # a replayed kind, then a new one
        t = rank_input(rank, n, torch.float32, dev, salt=i)
        jobs.append((t, comm.all_reduce(t, async_op=True), n, i))
    for t, fut, n, i in jobs:
        assert fut is not None
        fut.wait()
        check_equal(t, expected(world, n, torch.float32, dist.ReduceOp.SUM, dev, salt=i),
                    f"mixed issuers n={n} call {i}")
    assert comm.wait_idle(60.0)


def _one_slice_average_agrees(comm: ringreduce.Communicator, rank: int,
                              dev: torch.device) -> None:
    """AVG of random floats (not exact in any order): every rank holds the same bits,
    replayed as when issued from Python at the key's first sight."""
    g = torch.Generator(device=dev).manual_seed(rank)
    base = torch.randn(1_000_003, device=dev, generator=g)
    first, second = base.clone(), base.clone()
    comm.all_reduce(first, op=dist.ReduceOp.AVG)  # a new key: Python
    comm.all_reduce(second, op=dist.ReduceOp.AVG)  # traced and replayed
    assert torch.equal(first, second), "replayed one-slice AVG differs from Python's"
    hi, lo = second.clone(), second.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    assert torch.equal(hi, lo), "ranks disagree after a one-slice AVG"


@pytest.mark.parametrize("plan", ["pipelined", "one-slice"])
@pytest.mark.parametrize("issuer", ["native", "python"])
@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_both_issuers_are_exact_on_the_sweep(machines: int, devices: int,
                                                 issuer: str, plan: str) -> None:
    # with every rank on one GPU and 16 cores the time grows with the ranks
    run_test_ranks(_sweep_worker, machines * devices, issuer, plan, backend="nccl",
                   env=_env(machines, devices),
                   timeout=HANG_S + 60 * machines * devices)


def _compressed_replay_worker(rank: int, world: int) -> None:
    """The compressed route replayed (native) against issued from Python, call by
    call on the same inputs and keys: bit-identical results and feedback, synchronous
    and asynchronous, exact and padded sizes, across a reset and a size change."""
    dev = torch.device("cuda", torch.cuda.current_device())
    # a plan given: no probe, so every call takes the wire (the probe may find exact
    # as fast, and the two communicators could decide differently)
    with ringreduce.Communicator(min_bytes=0, wire="int8", plan="one-slice") as ours, \
            ringreduce.Communicator(min_bytes=0, wire="int8", issuer="python",
                                    plan="one-slice") as python, \
            _diagnosed(ours, rank):
        assert ours._res.native is not None and python._res.native is None
        topo = ours.topology
        exact = topo.machines * topo.devices_per_machine * 256 * 1000
        g = torch.Generator(device=dev).manual_seed(rank)
        avg, sum_ = dist.ReduceOp.AVG, dist.ReduceOp.SUM
        for numel, op, key in [(exact, avg, "b0"), (exact - 7, sum_, "b1"),
                               (exact - 7, sum_, None), (exact + 11, avg, "b0")]:
            for call in range(4):
                if call == 2 and key is not None:  # every key starts over on both
                    ours.reset_feedback(key)
                    python.reset_feedback(key)
                base = torch.randn(numel, device=dev, generator=g) * (call + 1)
                a, b = base.clone(), base.clone()
                fa = ours.all_reduce(a, op=op, async_op=call % 2 == 1, feedback=key)
                python.all_reduce(b, op=op, feedback=key)
                if fa is not None:
                    assert fa.wait() is a
                assert torch.equal(a, b), f"numel {numel} call {call}: replay != Python"
                # a kind of call is traced at its second sight; a reset makes new
                # feedback memory, a new kind
                first = call == 0 or (call == 2 and key is not None)
                route = ours._res.guard.recorder.last().route
                assert route == ("compressed int8" if first else "compressed int8 (native)"), \
                    (numel, call, route)
        ours.wait_idle()
        python.wait_idle()


@pytest.mark.parametrize("machines,devices", TOPOLOGIES, ids=IDS)
def test_gpu_compressed_replay_matches_python_call_by_call(machines: int, devices: int) -> None:
    run_test_ranks(_compressed_replay_worker, machines * devices, backend="nccl",
                   env=_env(machines, devices), timeout=HANG_S + 60 * machines * devices)
