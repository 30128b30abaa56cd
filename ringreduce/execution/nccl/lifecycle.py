"""A communicator's life in NCCL: init, split, waiting out ncclInProgress, async errors,
abort, finalize and destroy.

Owns everything about NCCL's non-blocking mode, which the watchdog needs: the findings
below (what nccl4py and NCCL do while a call is in progress), the per-communicator
config, the polling that turns ncclInProgress into success, an error or a deadline,
and the bounded close. Calls go through ``library.raw`` / ``library.core`` looked up
at call time, so tests can swap in a fake binding (tests/test_watchdog.py); none of
them is on the per-slice hot path (calls.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ringreduce.errors import RingReduceError
from ringreduce.execution.nccl import library
from ringreduce.execution.nccl.library import IN_PROGRESS, SUCCESS, Comm, describe_result

# --- Non-blocking communicators: what the watchdog needs, and what switching takes -----
#
# Findings for nccl4py 0.6.0 (the wheel in .whl/) and NCCL 2.2x (NVIDIA/nccl: user guide
# docs/userguide/source/usage/{communicators,groups}.rst, src/init.cc, src/group.cc):
#  * nccl4py never raises on ncclInProgress. Every raw wrapper ends in check_status(),
#    which raises NCCLError unless the result is ncclSuccess or ncclInProgress (bindings
#    template in NVIDIA/nccl bindings/nccl4py; on 0.6.0 nccl.bindings.nccl.check_status(7)
#    returns, check_status(1..6, 8) raise). A call that merely started therefore looks
#    like one that finished: only ncclCommGetAsyncError tells them apart.
#  * Init (Communicator.init calls ncclCommInitRankScalable) returns at once with the
#    new handle in ncclInProgress: poll the new communicator (user guide, "Creating a
#    communicator with options"). Split: the child handle stays NULL "until comm split
#    fully complete" (src/init.cc ncclCommSplit), so poll the *parent*, then the child
#    (user guide, Fault Tolerance example; nccl4py keeps children referenced in
#    Communicator._children_in_progress until the parent leaves ncclInProgress).
#  * A split given a config does not inherit the parent's blocking flag (parseCommConfig,
#    not copyCommConfig): every split needs blocking=False. NCCL_COMM_BLOCKING=0/1 in the
#    environment overrides the config (envConfigOverride).
#  * Collectives and ncclGroupEnd: on a non-blocking communicator a group that must first
#    connect peers (first use of a peer or algorithm) or holds init/split jobs runs on an
#    NCCL thread and returns ncclInProgress (src/group.cc ncclGroupEndInternal); otherwise
#    the kernels are enqueued before it returns ncclSuccess. Until the state is
#    ncclSuccess: no CUDA work on the streams NCCL uses (recording stage events included;
#    groups.rst "Nonblocking Group Operation"), and the next NCCL call on that
#    communicator fails with ncclInvalidArgument, "Attempt to use communicator before the
#    previous operation returned ncclSuccess" (ncclCommEnsureReady), which nccl4py raises
#    as NCCLError. So call wait_ready on every communicator after each group_end or
#    ungrouped collective (lifecycle.wait_ready).
#  * The price: NCCL 2.2x (src/group.cc ncclGroupEndInternal) starts a thread for
#    *every* ncclGroupEnd of a non-blocking group, connected or not, and the group is
#    in progress until that thread launched the kernels. A 25 MiB call at 2 x 1 (14
#    groups) cost 3003 us of host time, 1465 us on blocking communicators (H200, NCCL
#    2.28.9). So the communicators that carry traffic are split off blocking
#    (comm_config), from a non-blocking root: init and split stay bounded by the
#    deadline, and the watchdog bounds the one blocking wait left, connection setup
#    inside a call (execution/cuda_setup.py: traffic goes over blocking communicators).
#  * ncclCommGetAsyncError is *not* safe to call from two threads at once on a
#    non-blocking communicator: once the state is ncclSuccess it completes the group job
#    linked to the communicator and clears the link (src/init.cc ncclCommGetAsyncError,
#    reading comm->groupJob without a lock), and ncclGroupJobComplete deletes the job when
#    its reference count, one per communicator, reaches zero (src/group.cc). Two threads
#    that both see the link complete it twice: a use after free. That was issue 15's
#    crash: the issuing thread polling a group (wait_ready) while the watchdog polled
#    the same communicator (async_error) segfaulted one rank in a few runs of 4 x 2
#    non-blocking. ncclGroupEnd links the job and the collectives' ncclCommEnsureReady
#    completes it too, so polls must not overlap any NCCL call on the communicator:
#    every poll in the process goes through _POLL_LOCK, and the watchdog polls
#    non-blocking communicators only between issues
#    (cuda_setup.async_error_between_issues). Otherwise the call reads atomics, and
#    blocking communicators never link a group job. ncclCommAbort is local and may be
#    called at any point on non-blocking communicators, but only while no other thread
#    is inside an NCCL call (user guide, Fault Tolerance). nccl4py's abort() then sets
#    comm._comm to NULL; later raw calls fail on the NULL handle.
#  * Close: finalize() is non-blocking too; destroy() may block unless the state is
#    ncclSuccess first ("Destroying a communicator"): see finalize_and_destroy.

# Polling a communicator: first spin (yielding the GIL) for up to _SPIN_S, because in
# steady state a non-blocking ncclGroupEnd hands the launch to a helper thread and
# returns ncclInProgress for tens of microseconds; sleeping then cost ~150 us a group
# (half of 28 groups slept in a 25 MiB call, H200). Connecting peers takes milliseconds
# to seconds: after the spin, sleep from 100 us doubling to 10 ms, which keeps the extra
# wait below 2x while leaving the CPU to other threads.
_SPIN_S = 5e-4
_FIRST_PAUSE_S = 1e-4
_MAX_PAUSE_S = 1e-2


def comm_config(channels_per_net_peer: int | None = None, blocking: bool = False) -> Any:
    """Per-communicator settings (ncclConfig_t), so that nothing process-wide changes
    for the user's own NCCL communicators:
      blocking               False: no NCCL call waits for peers (init, split, and the
                             root); True: calls return once their kernels are enqueued,
                             without a helper thread per group (traffic, see above);
      launch_order_implicit  kernels of ringreduce's communicators start on a GPU in
                             host issue order (launch_order says when NCCL does it).
                             Stages use several communicators on five streams; a GPU
                             that cannot hold all their kernels at once could start
                             them in different orders on two ranks, each waiting on
                             the other;
      n_channels_per_net_peer  how many channels (sockets) send/recv to one network
                             peer may use: the rail stages are send/recv."""
    library.require()
    return library.core.NCCLConfig(blocking=blocking, launch_order_implicit=True,
                                   n_channels_per_net_peer=channels_per_net_peer)


_ORDER_CONFIG = 23100
"""The first NCCL with launch_order_implicit in ncclConfig_t (nccl4py's NCCLConfig says
2.31; 2.30's nccl.h has no such field, and an older NCCL ignores what it does not know)."""
_ORDER_ENV = 22600
"""The first NCCL that reads NCCL_LAUNCH_ORDER_IMPLICIT (src/enqueue.cc, v2.26.2)."""


def launch_order(version: int, env: Mapping[str, str]) -> str:
    """Whether NCCL starts ringreduce's kernels in host issue order (comm_config asks
    it to), for ``ringreduce.info``: NCCL < 2.31 has no per-communicator setting, and
    only the environment variable, for every communicator of the process, turns it on.
    ``version`` is NCCL's code, e.g. 22809 for 2.28.9."""
    name = f"NCCL {version // 10000}.{version // 100 % 100}.{version % 100}"
    setting = env.get("NCCL_LAUNCH_ORDER_IMPLICIT", "")
    if version >= _ORDER_ENV and setting:  # the variable takes precedence over the config
        return ("on (NCCL_LAUNCH_ORDER_IMPLICIT: every communicator of the process)"
                if setting != "0" else "off (NCCL_LAUNCH_ORDER_IMPLICIT=0)")
    if version >= _ORDER_CONFIG:
        return "on (per communicator, ncclConfig_t)"
    if version >= _ORDER_ENV:
        return (f"off: {name} has no per-communicator setting (2.31 adds it); "
                "NCCL_LAUNCH_ORDER_IMPLICIT=1 turns it on for every communicator of the "
                "process")
    return f"off: {name} has none (2.26 adds NCCL_LAUNCH_ORDER_IMPLICIT)"


_POLL_LOCK = threading.Lock()
"""Serialises ncclCommGetAsyncError across the process's threads (see above)."""


# ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
def _poll(comm: Comm) -> int:
    with _POLL_LOCK:
        return int(library.raw.comm_get_async_error(comm._comm))


def async_error(comm: Comm) -> str | None:
    """None while ``comm`` is healthy (ncclSuccess) or still working (ncclInProgress),
    else what went wrong. Callable from the watchdog thread (see above)."""
    library.require()
    if not comm._comm:
        return "the communicator was aborted or destroyed"
    code = _poll(comm)
    return None if code in (SUCCESS, IN_PROGRESS) else describe_result(code, comm)


def wait_ready(comm: Comm, deadline: float, what: str) -> None:
    """Poll ``comm`` until it leaves ncclInProgress. RingReduceError on an NCCL error
    or once ``time.monotonic()`` passes ``deadline``; aborting is the caller's call."""
    library.require()
    pause = _FIRST_PAUSE_S
    spin_until = time.monotonic() + _SPIN_S
    while True:
        code = _poll(comm)
        if code == SUCCESS:
            return
        if code != IN_PROGRESS:
            raise RingReduceError(f"{what}: NCCL reported {describe_result(code, comm)}")
        if time.monotonic() >= deadline:
            raise RingReduceError(f"{what}: still in progress at the deadline "
                                  "(RINGREDUCE_TIMEOUT); a peer died, hangs, or never "
                                  "made this call")
        if time.monotonic() < spin_until:
            time.sleep(0)  # yield the GIL, do not sleep a scheduler tick
            continue
        time.sleep(pause)
        pause = min(2 * pause, _MAX_PAUSE_S)


def init_nonblocking(world_size: int, rank: int, unique_id: bytes, deadline: float) -> Comm:
    """init() on a non-blocking communicator, ready when it returns. On failure the
    half-made communicator is aborted (no one else holds it) before raising."""
    library.require()
    uid = library.core.UniqueId.from_bytes(unique_id)
    comm = library.core.Communicator.init(world_size, rank, uid, comm_config())
    try:
        wait_ready(comm, deadline, f"ncclCommInitRankScalable (rank {rank} of {world_size})")
    except RingReduceError:
        comm.abort()
        raise
    return comm


def split(parent: Comm, color: int, key: int, deadline: float,
          channels_per_net_peer: int | None = None, blocking: bool = False) -> Comm:
    """split() of a non-blocking ``parent``, ready when it returns; the child is
    ``blocking`` or not. The split runs as a non-blocking group (the parent's mode), so
    polling the parent bounds it by ``deadline``. On failure the caller must abort
    ``parent``: that is what stops a split in progress (user guide)."""
    child = parent.split(color=color, key=key,
                         config=comm_config(channels_per_net_peer, blocking))
    what = f"ncclCommSplit (color {color}, key {key})"
    try:
        wait_ready(parent, deadline, f"{what}, parent")
        if not child._comm:
            raise RingReduceError(f"{what}: NCCL returned no communicator")
        wait_ready(child, deadline, f"{what}, child")  # at once, once the parent is done
    except RingReduceError:
        child.abort()  # a no-op while the handle is still NULL
        raise
    return child


def abort(comm: Comm) -> None:
    """ncclCommAbort: local, safe on error paths."""
    comm.abort()


def finalize_and_destroy(comm: Comm, deadline: float, abort: bool = True,
                         blocking: bool = False) -> None:
    """Happy-path close: ncclCommFinalize, then ncclCommDestroy. A non-blocking
    communicator is polled to ncclSuccess; a blocking one finalizes on a helper thread,
    since its ncclCommFinalize does not return while work is outstanding, and NCCL
    counts a live CUDA graph that captured the communicator as outstanding forever.
    Raises when finalizing fails or outlives ``deadline`` (a peer that never closes,
    a live graph), after aborting unless ``abort`` is False (ncclCommAbort waits for
    live CUDA graphs just as finalizing does). The stuck helper is left to the process."""
    try:
        if blocking:
            _bounded(comm.finalize, deadline, "ncclCommFinalize")
        else:
            comm.finalize()
            wait_ready(comm, deadline, "ncclCommFinalize")
    except RingReduceError:
        if abort:
            comm.abort()
        raise
    comm.destroy()


def _bounded(call: Callable[[], object], deadline: float, what: str) -> None:
    """``call()`` on a daemon thread, waited for until ``deadline``; its exception, or
    RingReduceError when it is still running then."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the waiting thread
            failure.append(exc)

    helper = threading.Thread(target=run, daemon=True, name="ringreduce-nccl-close")
    helper.start()
    helper.join(max(0.0, deadline - time.monotonic()))
    if helper.is_alive():
        raise RingReduceError(f"{what}: still in progress at the deadline")
    if failure:
        raise RingReduceError(f"{what}: {failure[0]}") from failure[0]
