"""``run_test_ranks``: run a function on N local processes joined by torch.distributed.

Rendezvous goes through a FileStore in a temporary directory (no fixed ports). A
rank that raises sends its traceback back; a rank that hangs past the deadline is
killed and the test fails naming it.
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

Env = dict[str, str] | list[dict[str, str]]
"""Variables for every rank, or one dict per rank (lambdas do not survive spawn)."""


def run_test_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
              env: Env | None = None, timeout: float = 300.0,
              expect_exit: dict[int, int] | None = None,
              store: tuple[str, int] | None = None, pg_timeout: float | None = None) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes. ``expect_exit``
    maps ranks to the exit code they must end with (fault-injection tests). ``store``:
    meet in the TCPStore served at (host, port) instead of a FileStore (a test that
    takes the store away). ``pg_timeout``: the default group's ``timeout`` in seconds
    (torch's default when None). A rank whose env has ``RR_TEST_NETNS`` joins that network
    namespace before anything connects (tests/netns.py)."""
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'store')}"
        procs = [ctx.Process(target=_entry, daemon=True,
                             args=(fn, rank, world_size, init, backend, env, args, errors,
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


def _fail(reason: str) -> None:
    """Fail the test; the reason also goes to stderr at once (shown with ``-s``): a GPU
    run cut by its time limit ends pytest before the summary that would print it."""
    print(f"[run_test_ranks] FAILED: {reason[-4000:]}", file=sys.stderr, flush=True)
    raise AssertionError(reason)


def _entry(fn: Callable[..., Any], rank: int, world_size: int, init: str, backend: str,
           env: Env | None, args: tuple[Any, ...], errors: Any, timeout: float,
           store: tuple[str, int] | None, pg_timeout: float | None) -> None:
    # A rank still running shortly before the deadline prints every thread's stack, so
    # a hang in CI says where it is (the parent then kills it and fails the test).
    faulthandler.dump_traceback_later(max(1.0, timeout - 5), exit=False)
    if env is not None:
        os.environ.update(env[rank] if isinstance(env, list) else env)
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
