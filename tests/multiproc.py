"""``run_test_ranks``: run a function on N local processes joined by torch.distributed.

Most cases run in a pool of rank processes kept for the whole pytest session, one pool
per (world size, backend): starting a Python that imports torch costs seconds per rank
on two cores, more than most cases. The pool gives each case its environment (the
parent's, as spawn would, plus the case's ``env``) and the default group built under it
(rebuilt when the environment differs from the previous case's), runs the function, then
cleans up: ringreduce's cached Communicators released, the case's other Communicators
closed, every group but the default destroyed, the environment and torch's seed restored.
A case that raises, hangs or kills a rank fails alone, naming itself, and its pool is
thrown away (the next case starts a fresh one).

Fault cases keep fresh processes, as every case had before: those that expect ranks to
die (``expect_exit``), meet in their own store (``store``), set the group's
``pg_timeout``, or join a network namespace (``RR_TEST_NETNS``); GPU cases do too
(``nccl``, ``RR_TEST_DEVICE``, or the ringreduce backend where CUDA is present).
``RR_TEST_POOL=0`` gives every case fresh processes (to rule the pool out).

CPU ranks, pooled or fresh, fork from multiprocessing's fork server, which imported torch
and ringreduce once; GPU ranks are spawned. ``RR_TEST_FORKSERVER=0`` spawns every rank.

Rendezvous goes through a FileStore in a temporary directory (no fixed ports). A
rank that raises sends its traceback back; a rank that hangs past the deadline is
killed and the test fails naming it.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import faulthandler
import gc
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

Env = dict[str, str] | list[dict[str, str]]
"""Variables for every rank, or one dict per rank (lambdas do not survive spawn)."""

MAX_POOLS = int(os.environ.get("RR_TEST_POOLS", "3"))
"""Pools kept at once (least recently used goes first): each idle rank holds a few
hundred MB, and the machines that run the suite are small."""

AFTER_FAILURE_S = 3.0
"""How long the other ranks get to report once one rank failed: in a pool the failed
rank stays alive, so peers blocked in a collective with it would wait until the case's
deadline (fresh processes saw the peer exit and failed at once)."""


def run_test_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
              env: Env | None = None, timeout: float = 300.0,
              expect_exit: dict[int, int] | None = None,
              store: tuple[str, int] | None = None, pg_timeout: float | None = None) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes. ``expect_exit``
    maps ranks to the exit code they must end with (fault-injection tests). ``store``:
    meet in the TCPStore served at (host, port) instead of a FileStore (a test that
    takes the store away). ``pg_timeout``: the default group's ``timeout`` in seconds
    (torch's default when None). A rank whose env has ``RR_TEST_NETNS`` joins that network
    namespace before anything connects (tests/netns.py). ``fn`` must be picklable (a
    module-level function). Pooled unless the arguments ask for fresh processes (the
    module docstring says which)."""
    if _needs_fresh_processes(backend, env, expect_exit, store, pg_timeout):
        _run_fresh(fn, world_size, args, backend, env, timeout, expect_exit, store, pg_timeout)
        return
    envs = [_case_env(env, rank) for rank in range(world_size)]
    _pool(world_size, backend).run(fn, args, envs, timeout, _case_name())


def _needs_fresh_processes(backend: str, env: Env | None, expect_exit: dict[int, int] | None,
                           store: tuple[str, int] | None, pg_timeout: float | None) -> bool:
    if os.environ.get("RR_TEST_POOL") == "0":
        return True
    if expect_exit is not None or store is not None or pg_timeout is not None:
        return True
    envs = env if isinstance(env, list) else [env or {}]
    return any("RR_TEST_NETNS" in e for e in envs) or _on_gpu(backend, env)


def _on_gpu(backend: str, env: Env | None) -> bool:
    """GPU cases keep spawned processes of their own, as they always had: a CUDA context
    and NCCL communicators per case."""
    envs = env if isinstance(env, list) else [env or {}]
    return backend == "nccl" or any("RR_TEST_DEVICE" in e for e in envs) \
        or (backend == "ringreduce" and torch.cuda.is_available())


_PRELOAD = ["torch", "torch.distributed", "ringreduce", "tests.multiproc"]


def _context(gpu: bool) -> Any:
    """CPU ranks fork from a server that imported torch and ringreduce once (a spawned
    rank spends seconds importing them); GPU ranks are spawned (never a fork of a process
    that may touch CUDA). ``RR_TEST_FORKSERVER=0`` spawns every rank."""
    if gpu or os.environ.get("RR_TEST_FORKSERVER") == "0":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _case_env(env: Env | None, rank: int) -> dict[str, str]:
    """What a fresh rank of this case would see: the parent's environment (spawn copies
    it, and tests set variables there too) with the case's on top."""
    merged = dict(os.environ)
    merged.pop("PYTEST_CURRENT_TEST", None)  # changes every phase; no rank reads it
    if env is not None:
        merged.update(env[rank] if isinstance(env, list) else env)
    return merged


def _case_name() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "(outside pytest)").rsplit(" ", 1)[0]


def _fail(reason: str) -> None:
    """Fail the test; the reason also goes to stderr at once (shown with ``-s``): a GPU
    run cut by its time limit ends pytest before the summary that would print it."""
    print(f"[run_test_ranks] FAILED: {reason[-4000:]}", file=sys.stderr, flush=True)
    raise AssertionError(reason)


# The pool ----------------------------------------------------------------------------

_pools: dict[tuple[int, str], _Pool] = {}
"""Live pools by (world size, backend), least recently used first."""


def _pool(world_size: int, backend: str) -> _Pool:
    key = (world_size, backend)
    pool = _pools.pop(key, None)
    if pool is None:
        while len(_pools) >= max(1, MAX_POOLS):
            _pools.pop(next(iter(_pools))).close()
        pool = _Pool(world_size, backend)
    _pools[key] = pool  # most recently used last
    return pool


@atexit.register
def _close_pools() -> None:
    while _pools:
        _pools.popitem()[1].close()


class _Pool:
    """``world_size`` ranks (forked from the fork server), each waiting on its end of a
    pipe for a case."""

    def __init__(self, world_size: int, backend: str) -> None:
        ctx = _context(gpu=False)
        self.world_size, self.backend = world_size, backend
        self.folder = tempfile.mkdtemp(prefix="rr-test-pool-")
        self.generation = 0
        self.group_env: list[dict[str, str]] | None = None
        """The environment the ranks' default group was built under (None: rebuild)."""
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_pool_rank, daemon=True,
                               args=(child, rank, world_size, backend))
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], envs: list[dict[str, str]],
            timeout: float, case: str) -> None:
        init = None
        if self.group_env != envs or self.backend != "gloo":
            self.generation += 1
            init = f"file://{os.path.join(self.folder, f'store-{self.generation}')}"
        self.group_env = None  # until every rank says its group survived the case
        try:
            for rank, conn in enumerate(self.conns):
                conn.send((init, fn, args, envs[rank], timeout))
            reports, intact, hung, died = self._collect(timeout)
        except BaseException:  # fn that does not pickle, Ctrl-C: some ranks may be in the case
            self._discard()
            raise
        if not (reports or hung or died) and all(intact.values()):
            self.group_env = envs
        if reports or hung or died:
            self._discard()
            _fail(_failure(case, reports, hung, died, timeout))

    def _collect(self, timeout: float) -> tuple[dict[int, str], dict[int, bool], list[int],
                                                 dict[int, int | None]]:
        """Wait for every rank's answer: (tracebacks, group kept, hung ranks, died ranks
        with their exit codes)."""
        deadline = time.monotonic() + timeout
        waiting = set(range(self.world_size))
        reports: dict[int, str] = {}
        intact: dict[int, bool] = {}
        died: dict[int, int | None] = {}
        by_object: dict[Any, int] = {}
        for rank in waiting:
            by_object[self.conns[rank]] = rank
            by_object[self.procs[rank].sentinel] = rank
        while waiting:
            left = deadline - time.monotonic()
            if reports or died:
                left = min(left, AFTER_FAILURE_S)
            ready = wait([o for o, r in by_object.items() if r in waiting], max(0.0, left))
            if not ready:
                break
            for obj in ready:
                rank = by_object[obj]
                if rank not in waiting:
                    continue
                waiting.discard(rank)
                try:
                    ok, payload = self.conns[rank].recv()
                except (EOFError, OSError):
                    self.procs[rank].join(5)
                    died[rank] = self.procs[rank].exitcode
                    continue
                if ok:
                    intact[rank] = payload
                else:
                    reports[rank] = payload
        return reports, intact, sorted(waiting), died

    def _discard(self) -> None:
        _pools.pop((self.world_size, self.backend), None)
        self.close()

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(10)
        for conn in self.conns:
            conn.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _failure(case: str, reports: dict[int, str], hung: list[int], died: dict[int, int | None],
             timeout: float) -> str:
    lines = [f"rank {r} failed:\n{tb}" for r, tb in sorted(reports.items())]
    if died:
        lines.append(f"ranks exited abnormally (rank, exit code): {sorted(died.items())}")
    if hung:
        after = (f"{AFTER_FAILURE_S} s after another rank failed" if reports or died
                 else f"within {timeout} s")
        lines.append(f"ranks {hung} did not finish {after}")
    # The case's name last: _fail prints the reason's tail, and the traceback's first line
    # stays "rank N failed" as it was with fresh processes.
    return "\n".join(lines) + f"\n(in {case}; its rank pool was stopped, the next case " \
        "starts a fresh one)"


def _pool_rank(conn: Connection, rank: int, world_size: int, backend: str) -> None:
    """A pooled rank: run cases until the parent closes the pipe or kills it."""
    # Die with pytest: a killed session would otherwise leave a rank busy in a case.
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    torch.set_num_threads(1)  # CI has two cores and up to six ranks
    import ringreduce  # noqa: F401  (registers the "ringreduce" backend)

    own_env = dict(os.environ)
    seed = torch.initial_seed()
    built: Any = None  # the default group this rank built
    while True:
        try:
            init, fn, args, env, timeout = conn.recv()
        except EOFError:
            os._exit(0)
        os.environ.clear()
        os.environ.update(env)
        faulthandler.dump_traceback_later(max(1.0, timeout - 5), exit=False)
        try:
            if init is not None:
                if dist.is_initialized():
                    dist.destroy_process_group()
                dist.init_process_group(backend, init_method=init, rank=rank,
                                        world_size=world_size)
                built = dist.distributed_c10d._get_default_group()
            torch.manual_seed(seed)  # what a fresh process's generator starts from
            torch.set_num_threads(1)
            before = weakref.WeakSet(_communicators())
            with warnings.catch_warnings():
                fn(rank, world_size, *args)
            _clean_up(before, keep_default=backend == "gloo")
            answer: tuple[bool, Any] = (True, dist.is_initialized()
                                        and dist.distributed_c10d._get_default_group() is built)
        except BaseException:
            answer = (False, traceback.format_exc())
        finally:
            faulthandler.cancel_dump_traceback_later()
            os.environ.clear()
            os.environ.update(own_env)
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(answer)


def _communicators() -> list[Any]:
    from ringreduce.engine import Communicator

    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, Communicator)]


def _clean_up(before: weakref.WeakSet[Any], keep_default: bool) -> None:
    """Undo what a passing case left: ringreduce's cache, the Communicators it did not
    close, the groups it made. A default group of the ringreduce backend goes too: its
    engine keeps state (call numbers, the probed plan, feedback) that a fresh process
    would not have, so every case gets a new one."""
    import ringreduce

    ringreduce.release_cached()
    for comm in _communicators():
        if comm not in before:
            comm.close()
    c10d = dist.distributed_c10d
    default = c10d._world.default_pg
    for group in list(c10d._world.pg_map):
        if group is not default:
            dist.destroy_process_group(group)
    if not keep_default and dist.is_initialized():
        dist.destroy_process_group()


# Fresh processes (fault and GPU cases) -------------------------------------------------

def _run_fresh(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...], backend: str,
               env: Env | None, timeout: float, expect_exit: dict[int, int] | None,
               store: tuple[str, int] | None, pg_timeout: float | None) -> None:
    ctx = _context(_on_gpu(backend, env))
    envs = [_case_env(env, rank) for rank in range(world_size)]
    errors = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'store')}"
        procs = [ctx.Process(target=_entry, daemon=True,
                             args=(fn, rank, world_size, init, backend, envs[rank], args, errors,
                                   timeout, store, pg_timeout))
                 for rank in range(world_size)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    reports = []
    while not errors.empty():
        reports.append(errors.get())
    if reports:
        _fail("\n".join(f"rank {r} failed:\n{tb}" for r, tb in sorted(reports)))
    if hung:
        ended = {rank: p.exitcode for rank, p in enumerate(procs) if rank not in hung}
        _fail(f"ranks {hung} did not finish within {timeout} s; the others ended with exit "
              f"codes {ended}")
    want = expect_exit or {}
    bad = [(rank, p.exitcode) for rank, p in enumerate(procs) if p.exitcode != want.get(rank, 0)]
    if bad:
        _fail(f"ranks exited abnormally (rank, exit code): {bad}")


def _entry(fn: Callable[..., Any], rank: int, world_size: int, init: str, backend: str,
           env: dict[str, str], args: tuple[Any, ...], errors: Any, timeout: float,
           store: tuple[str, int] | None, pg_timeout: float | None) -> None:
    # A rank still running shortly before the deadline prints every thread's stack, so
    # a hang in CI says where it is (the parent then kills it and fails the test).
    faulthandler.dump_traceback_later(max(1.0, timeout - 5), exit=False)
    os.environ.clear()  # a forked rank has the fork server's environment: the case's is whole
    os.environ.update(env)
    torch.set_num_threads(1)  # CI has two cores and up to six ranks
    try:
        if "RR_TEST_NETNS" in os.environ:
            join_netns(os.environ["RR_TEST_NETNS"])
        kwargs: dict[str, Any] = {}
        if backend == "nccl" or "RR_TEST_DEVICE" in os.environ:  # a GPU test
            device = torch.device("cuda", int(os.environ.get("RR_TEST_DEVICE", rank)))
            torch.cuda.set_device(device)
            if backend == "nccl":
                kwargs["device_id"] = device
        if store is not None:
            kwargs["store"] = dist.TCPStore(store[0], store[1], world_size, is_master=False,
                                            timeout=datetime.timedelta(seconds=timeout))
        else:
            kwargs["init_method"] = init
        if pg_timeout is not None:
            kwargs["timeout"] = datetime.timedelta(seconds=pg_timeout)
        dist.init_process_group(backend, rank=rank, world_size=world_size, **kwargs)
        fn(rank, world_size, *args)
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # A passing rank leaves without interpreter finalisation: once in CI (torch 2.13,
    # CPU), a rank whose test had passed aborted in C++ static teardown after all
    # process groups were destroyed ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_CLONE_NEWNET = 0x40000000  # sched.h
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def join_netns(name: str) -> None:
    """Move this process into the network namespace ``name`` (``ip netns add``): every
    socket it opens from now on lives there. Python 3.11 has no os.setns."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name}")
    finally:
        os.close(fd)
