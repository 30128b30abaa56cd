"""The CUDA half of a Communicator's resources: NCCL communicators made and let go.

Owns their setup, collective on every rank (a non-blocking root communicator from a
unique id in the store, the stage communicators split off it, the transport, stage
streams and watchdog over them, then the native issuer), and their
teardown: finalizing each (bounded while CUDA graphs may still hold it), aborting all
of them at once after a failure, and the async-error poll the watchdog runs.
resources.py builds the Resources these fill in; every NCCL call is the nccl package's.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ringreduce.config import Config
from ringreduce.errors import RingReduceError
from ringreduce.execution import call_check, kernels, native, nccl
from ringreduce.execution.call_check import DeviceCallCheck
from ringreduce.execution.streams import CudaStreams
from ringreduce.execution.transport import NcclTransport
from ringreduce.plan import layout, schedule
from ringreduce.plan.topology import Topology
from ringreduce.safety.watchdog import Watchdog

if TYPE_CHECKING:
    from ringreduce.execution.resources import Resources

log = logging.getLogger("ringreduce")
_ABORT_WAIT_S = 20.0
"""How long the aborts may take before the failure is reported without them."""
_GRAPH_GRACE_S = 10.0
"""How long closing waits for NCCL to let go of communicators that CUDA graphs
captured, once every graph ringreduce knows of is gone and the device is idle."""


def build_cuda(res: Resources, store: dist.Store, config: Config) -> None:
    """NCCL communicators, kernels, transport, stage streams and the watchdog for
    ``res`` (collective: every rank makes the same NCCL calls in the same order); the
    divisors and then build_native come after (build.build_resources)."""
    topo, timeout_s = res.topo, config.timeout_s
    if topo.rank == 0:
        store.set("nccl/world", nccl.new_unique_id())  # type: ignore[arg-type]  # bytes work
    deadline = time.monotonic() + timeout_s  # a peer that never arrives: an error, no hang
    root = nccl.init_nonblocking(topo.world_size, topo.rank, store.get("nccl/world"), deadline)
    comms = res.comms
    comms["world"] = root
    try:
        # Splits are collective over the root; every rank makes the same calls in order.
        # The root stays non-blocking, so initialisation and splitting end at the
        # deadline; it only splits. Traffic goes over blocking communicators (the flat
        # route gets a blocking copy of the root): NCCL hands every ncclGroupEnd on a
        # non-blocking communicator to a new thread (2 x 1, 25 MiB, H200: 3003 us of
        # host time a call against 1465 blocking), and the one wait a blocking
        # communicator adds, connection setup inside the first call to a peer, is
        # bounded by the watchdog, which also watches calls being issued.
        split = functools.partial(nccl.split, root, deadline=deadline, blocking=True)
        comms["root"], comms["world"] = root, split(0, topo.rank)
        _split_stages(comms, split, topo)
    except RingReduceError:
        for comm in distinct(comms).values():  # aborting the parent stops a split in progress
            nccl.abort(comm)
        raise
    res.nccl_version = nccl.version()
    if kernels.available():
        res.kernels = kernels.Kernels(res.device)
    elif topo.rank == 0:
        log.warning("cupy is not importable: the add stage and the quantized wires use "
                    "torch ops instead of the fused kernels of native/add.cu and quant.cu; "
                    "install ringreduce[cu12] or [cu13]")
    res.transport = NcclTransport(topo, comms, res.kernels, gathers=config.diffuse_gather)
    res.sync = CudaStreams(res.device, schedule.event_names(
        topo.devices_per_machine, max(res.staging_slots, 1), layout.PADDING_SLOTS))
    if config.check_call_end and res.kernels is not None:
        res.call_check = DeviceCallCheck.on(res.device, call_check.hops(
            topo.devices_per_machine, topo.machines))
    unique = distinct(comms)  # fixed from here on; the watchdog polls it, teardown walks it
    res.abort = lambda: abort_together(comms, res.device)
    res.watchdog = Watchdog(timeout_s, rank=topo.rank, async_error=lambda: async_error(unique),
                            on_failure=lambda exc: res.fail(exc, None),
                            stuck_issue=res.stuck_issue,
                            call_check=res.call_check and res.call_check.mismatch,
                            everyone=range(topo.world_size),
                            on_start=relaxed_capture_mode)
    res.watchdog.start()  # before the first call: its connection setup may hang
    res.release_steps += [
        lambda c=c, b=name != "root": finalize(res, c, timeout_s, b)
        for name, c in unique.items()]


_CAPTURE_MODE_RELAXED = 2
"""CU_STREAM_CAPTURE_MODE_RELAXED (cuda.h's CUstreamCaptureMode)."""


def relaxed_capture_mode() -> None:
    """Let the calling thread (the watchdog's) query events and streams while another
    thread captures a CUDA graph in the default, global mode, as torch.cuda.graph()
    does: CUDA refuses such calls from every thread then
    (cudaErrorStreamCaptureUnsupported), and the watchdog took the refusal for a failed
    call and aborted (seen with a caller's capture at 4 x 2). The thread's own calls are
    never captured, so relaxed is safe for it."""
    mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
    try:
        exchange = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
    except (OSError, AttributeError) as exc:
        log.warning("ringreduce: no cuThreadExchangeStreamCaptureMode (%s); the watchdog "
                    "may mistake a CUDA graph capture for a failure", exc)
        return
    result = exchange(ctypes.byref(mode))
    if result != 0:
        log.warning("ringreduce: cuThreadExchangeStreamCaptureMode returned CUresult %d; "
                    "the watchdog may mistake a CUDA graph capture for a failure", result)


def distinct(comms: dict[str, Any]) -> dict[str, Any]:
    """Each NCCL communicator once, named after every stage it carries
    (``reduce_scatter+all_gather`` when paired): finalizing or aborting one twice
    is undefined in NCCL."""
    names: dict[int, list[str]] = {}
    first: dict[int, Any] = {}
    for name, comm in comms.items():
        names.setdefault(id(comm), []).append(name)
        first.setdefault(id(comm), comm)
    return {"+".join(names[key]): comm for key, comm in first.items()}


def _split_stages(comms: dict[str, Any], split: Callable[..., Any], topo: Topology) -> None:
    """The stage communicators: inside the machine (color: the machine) and along the
    rail (color: the device index). A pair of stages shares one: a wave (one NCCL
    group) holds at most one step of each, so its group launches one kernel per pair,
    and half the communicators means half the proxy threads (H100 under MPS, 2 x 2
    loopback, 25 MiB: CPU per call 43 ms against 69 with one per stage)."""
    pairs: list[tuple[str, str, int, int]] = []
    if topo.devices_per_machine > 1:
        pairs.append(("reduce_scatter", "all_gather", topo.machine_index, topo.device_index))
    if topo.machines > 1:
        pairs.append(("collect", "diffuse", topo.device_index, topo.machine_index))
    for first, second, color, key in pairs:
        comms[first] = comms[second] = split(color, key)


def build_native(res: Resources, config: Config) -> None:
    """The native issuer when it can run (native.why_not), else the Python issuer; an
    explicit issuer='native' that cannot run is an error, the default a logged fallback.
    Last, once everything its trace reads (communicators, streams, divisors) exists."""
    why = native.why_not(config, True, res.kernels is not None)
    if not why:
        wire = getattr(torch, config.wire_dtype) if config.wire_dtype else None
        try:
            res.native = native.NativeIssuer(res, wire)
            return
        except (RingReduceError, RuntimeError) as exc:
            why = str(exc)
    if config.issuer == "native":
        raise RingReduceError(f"issuer={config.issuer!r} cannot run: {why}")
    if res.topo.rank == 0:
        log.info("ringreduce: CUDA calls are issued from Python: %s", why)


def finalize(res: Resources, comm: Any, timeout_s: float, blocking: bool) -> None:
    """Close one of ``res``'s NCCL communicators (a release step). NCCL frees a
    communicator only after every CUDA graph that captured it is destroyed, and waits
    for that forever (abort too): with captures, wait a grace period, then say what
    holds it instead of hanging."""
    if not res.captured():
        nccl.finalize_and_destroy(comm, time.monotonic() + timeout_s, blocking=blocking)
        return
    try:
        nccl.finalize_and_destroy(comm, time.monotonic() + _GRAPH_GRACE_S, abort=False,
                                  blocking=blocking)
    except RingReduceError as exc:
        holder = (f"{res.user_captures} call(s) were captured into CUDA graphs of "
                  "yours and one of those graphs is still alive" if res.user_captures
                  else "a CUDA graph ringreduce captured is still referenced")
        raise RingReduceError(
            f"close(): NCCL still holds ringreduce's communicators after "
            f"{_GRAPH_GRACE_S:.0f} s: {holder}. NCCL frees a communicator only once "
            f"every graph that captured it is destroyed: delete them (del graph) "
            f"before close(). The communicators are left to process exit.") from exc


def abort_together(comms: dict[str, Any], device: torch.device) -> None:
    """ncclCommAbort on every communicator at once, one thread each, waiting a bounded
    time. One after another hangs (seen on H200, NCCL 2.28): the first
    abort frees device memory, which waits for the device, where the other
    communicators' kernels still wait for the dead peer; they leave only once their
    own abort flag is set. A communicator whose abort does not return in time is
    logged, and the failure is reported anyway."""
    def abort(comm: Any) -> None:
        torch.cuda.set_device(device)  # the current device is per thread
        nccl.abort(comm)

    threads = {name: threading.Thread(target=abort, args=(comm,), daemon=True,
                                      name=f"ringreduce-abort-{name}")
               for name, comm in distinct(comms).items()}
    for t in threads.values():
        t.start()
    deadline = time.monotonic() + _ABORT_WAIT_S
    for t in threads.values():
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [name for name, t in threads.items() if t.is_alive()]
    if stuck:
        log.error("ringreduce: ncclCommAbort of the %s communicator(s) did not return within "
                  "%.0f s; reporting the failure anyway (the process may need to exit)",
                  ", ".join(stuck), _ABORT_WAIT_S)


def async_error(comms: dict[str, Any]) -> str | None:
    """The first NCCL asynchronous error over ``comms`` (each communicator once,
    ``distinct``), named."""
    for name, comm in comms.items():
        message = nccl.async_error(comm)
        if message:
            return f"{name} communicator: {message}"
    return None
