"""The native issuer: trace a call once per plan key, replay it from a C++ worker thread.

The Python issuer (pipeline.run_steps) already makes exactly the right CUDA and NCCL
calls; what costs is making ~100 of them from Python on the caller's thread (about
1.2 ms of host time per 25 MiB call at 2 x 2). So the same walk runs once per plan key
(numel, dtype, op, slot cursor, base alignment) against *recording* collaborators:

  pipeline.run_steps --sync-->      RecordedStreams   wait/record events, tail copies
                     --transport--> NcclTransport(calls=RecordedNccl)  NCCL groups
                     --kernels-->   Kernels copy with ``emit`` set      kernel launches

which write instructions into a Recorder instead of executing them. The result is a
validated ``_native.Program`` (native/issuer.cpp): pointers inside the caller's tensor
are stored relative to its start, staging and padding pointers absolutely. A call then
costs the caller a dictionary lookup and one ``Issuer.submit``: record the entry event
on its stream and queue (program, data_ptr, seq) for the worker, whose last instruction
writes ``seq`` into the completion flag (host memory: the watchdog reads it) and records
the job's done event. A stream that must follow the result waits for that event, but
only once the worker has issued the job: a stream waiting on work nobody has enqueued
yet deadlocked the first GPU run (a context-wide
synchronisation, e.g. CUDA loading a kernel lazily, waits for that stream, and the
worker was the thread synchronising). Synchronous calls: the host waits until the job
is issued (not for the device), then the caller's stream waits. Asynchronous calls
return at once; a completer thread completes the Future on a communicator-owned
``done`` stream after the device wait, so the caller's compute is not serialised
behind the all-reduce and ``fut.wait()`` waits on the host only until the issue.

The watchdog watches each call through ``Completion`` (the flag reached ``seq``), one
per active stage as for Python-issued calls (the device does not say which stage is
stuck, so it names the first, with that stage's peers); a
worker failure (an NCCL error) makes ``query()`` raise, and a stuck issue or device
(a dead peer) leaves the flag short until the deadline: either way the watchdog aborts
the communicators, after ``stop()`` made the worker leave NCCL, and the worker still
writes every job's flag so that no stream waits forever.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import logging
import queue
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from . import nccl, schedule
from .errors import RingReduceError
from .pipeline import run_steps
from .schedule import ENTRY, Cursor
from .transport import NcclTransport

log = logging.getLogger("ringreduce")

_INSTR = struct.Struct("<9q")
_ARG = struct.Struct("<2q")
_LIBCUDA = "libcuda.so.1"
_DRAIN_POLL_S = 0.1
"""How often a host waiting for the worker to issue its queue looks for a failure."""
_PROGRAMS = 4096
"""Traced programs kept per Communicator (about 14 KB each for a 25 MiB call at 2 x 2):
the keys repeat in training (DDP's bucket sizes times the slot positions), and a
workload of ever-new sizes must not grow memory without bound."""
_STOP_WAIT_S = 2.0
"""How long a failure waits for the worker to leave NCCL before aborting anyway (the
same bound as for a Python issuing thread, resources._ABORT_LOCK_WAIT_S)."""


@functools.cache
def extension() -> tuple[Any, str]:
    """(ringreduce._native or None, why not)."""
    try:
        return importlib.import_module("ringreduce._native"), ""
    except ImportError as exc:
        return None, f"ringreduce._native is not built ({exc})"


def ops() -> dict[str, int]:
    module, why = extension()
    if module is None:
        raise RingReduceError(why)
    return dict(module.OPS)


def loaded_library(stem: str) -> str | None:
    """The path of a shared library this process has mapped (e.g. the libnccl that
    nccl4py loaded), from /proc/self/maps: the native issuer must call the same one."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                if f"/{stem}" in path:
                    return path
    except OSError:
        return None
    return None


def why_not(config: Any, is_cuda: bool, blocking: bool, has_kernels: bool) -> str:
    """"" when CUDA calls would use the native issuer, else the reason (for info)."""
    if not is_cuda:
        return "CPU path (gloo): the Python issuer runs the plan"
    if config.issuer == "python":
        return "issuer='python' (RINGREDUCE_ISSUER)"
    module, why = extension()
    if module is None:
        return why
    if not blocking:
        return "non-blocking NCCL communicators (RINGREDUCE_NCCL_BLOCKING=0) need polling"
    if not has_kernels:
        return "cupy is not importable (the add stage runs torch ops)"
    return ""


class Recorder:
    """Instructions of one call, in issue order, with tensor pointers made relative."""

    def __init__(self, base: int, extent: int, stages: Sequence[str]) -> None:
        self.ops = ops()
        self.base, self.extent = base, extent
        self.stages = tuple(stages)
        self.stage = 0
        self.code = bytearray()
        self.args = bytearray()
        self.nargs = 0

    def _rel(self, value: int) -> tuple[int, bool]:
        if self.base <= value < self.base + self.extent:
            return value - self.base, True
        return value, False

    def emit(self, op: str, *a: int, pointers: Sequence[int] = ()) -> None:
        values, reloc = [*a, *[0] * (6 - len(a))], 0
        for i in pointers:
            values[i], inside = self._rel(values[i])
            reloc |= inside << i
        self.code += _INSTR.pack(self.ops[op], self.stage, reloc, *values)

    def launch(self, fn: Any, blocks: int, threads: int, args: Sequence[Any],
               stream: int) -> None:
        """A cupy kernel launch (kernels.Kernels._launch), by its CUfunction handle."""
        first = self.nargs
        for arg in args:
            raw = np.asarray(arg)
            size = raw.dtype.itemsize
            value = int.from_bytes(raw.tobytes().ljust(8, b"\0"), "little", signed=True)
            inside = False
            if raw.dtype == np.uint64:  # kernels pass pointers, and only pointers, so
                value, inside = self._rel(int(arg))
            self.args += _ARG.pack(size | (inside << 8), value)
            self.nargs += 1
        handle = getattr(fn, "kernel", fn).ptr
        self.emit("launch", handle, blocks, threads, first, len(args), stream)

    def program(self) -> Any:
        module, _ = extension()
        return module.Program(bytes(self.code), bytes(self.args), self.extent)


class RecordedNccl:
    """The functions NcclTransport calls on the nccl module, writing instructions."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder

    @contextlib.contextmanager
    def group_ready(self, comms: Sequence[Any], deadline: float, what: str) -> Iterator[None]:
        assert not comms, "the native issuer needs blocking communicators"
        self.rec.emit("group_start")
        yield
        self.rec.emit("group_end")

    def send(self, comm: Any, t: torch.Tensor, peer: int, stream: int) -> None:
        self.rec.emit("send", comm._comm, t.data_ptr(), t.numel(), nccl.dtype_code(t.dtype),
                      peer, stream, pointers=(1,))

    def recv(self, comm: Any, t: torch.Tensor, peer: int, stream: int) -> None:
        self.rec.emit("recv", comm._comm, t.data_ptr(), t.numel(), nccl.dtype_code(t.dtype),
                      peer, stream, pointers=(1,))

    def reduce_scatter(self, comm: Any, send: torch.Tensor, recv: torch.Tensor, op: str,
                       stream: int) -> None:
        self.rec.emit("reduce_scatter", comm._comm, send.data_ptr(), recv.data_ptr(),
                      recv.numel(), nccl.dtype_code(send.dtype) | nccl.op_code(op) << 8,
                      stream, pointers=(1, 2))

    def all_gather(self, comm: Any, send: torch.Tensor, recv: torch.Tensor,
                   stream: int) -> None:
        self.rec.emit("all_gather", comm._comm, send.data_ptr(), recv.data_ptr(), send.numel(),
                      nccl.dtype_code(send.dtype), stream, pointers=(1, 2))

    def all_reduce(self, comm: Any, t: torch.Tensor, op: str, stream: int) -> None:
        self.rec.emit("all_reduce", comm._comm, t.data_ptr(), t.data_ptr(), t.numel(),
                      nccl.dtype_code(t.dtype) | nccl.op_code(op) << 8, stream,
                      pointers=(1, 2))


class RecordedStreams:
    """CudaStreams' eager behaviour (stage tails left to stream order), recorded: the
    same named events and stage streams; ENTRY becomes the job's own entry event."""

    def __init__(self, real: Any, recorder: Recorder) -> None:
        self.real, self.rec = real, recorder

    def handle(self, stage: str) -> int:
        return self.real.handle(stage)

    def wait(self, stage: str, names: Sequence[str]) -> None:
        self.rec.stage = self.rec.stages.index(stage)  # each step starts with its waits
        for name in names:
            if name == ENTRY:
                self.rec.emit("wait_event", self.handle(stage), 0)
            elif not name.startswith("tail"):  # stage tails: stream order (eager calls)
                self.rec.emit("wait_event", self.handle(stage), self.real.events[name].cuda_event)

    def record(self, stage: str, names: Sequence[str]) -> None:
        for name in names:
            if not name.startswith("tail"):
                self.rec.emit("record_event", self.handle(stage),
                              self.real.events[name].cuda_event)

    def on(self, stage: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def copy(self, stage: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.rec.emit("memcpy", dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size(),
                      self.handle(stage), pointers=(0, 1))


def _raw_stream_lookup() -> Callable[[int], int]:
    """device index -> the caller's current cudaStream_t. torch's CUDA builds have a
    direct lookup (what torch.compile's generated code calls, ~10x cheaper than making
    a torch.cuda.Stream object per call); otherwise the public way."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class Completion:
    """For the watchdog: done once the flag reached ``seq``; raises after a worker
    failure, naming the stage and its peers."""

    __slots__ = ("issuer", "seq")

    def __init__(self, issuer: NativeIssuer, seq: int) -> None:
        self.issuer, self.seq = issuer, seq

    def query(self) -> bool:
        state = self.issuer.worker.state(self.seq)
        if state < 0:
            raise RingReduceError(self.issuer.failure_text())
        return bool(state)

    def progress(self) -> str:
        """Where the worker is, for the watchdog's deadline error: a job never issued
        points at the host (inside NCCL or CUDA), one issued at the device."""
        c = self.issuer.worker.counters()
        where = "idle" if c["at_op"] == "-" else \
            f"inside {c['at_op']} (instruction {c['at_instruction']} of job {c['at_job']})"
        return (f"native issuer: this call is job {self.seq}; submitted {c['submitted']}, "
                f"issued {c['issued']}, finished on the device {c['flag']}; worker {where}")


class NativeIssuer:
    """One Communicator's worker thread and its traced programs."""

    def __init__(self, res: Any, wire: torch.dtype | None, inline: bool = True) -> None:
        module, why = extension()
        if module is None:
            raise RingReduceError(why)
        libnccl = loaded_library("libnccl.so")
        if libnccl is None:
            raise RingReduceError("the native issuer found no libnccl mapped in this process "
                                  "(nccl4py loads it when the communicators are made)")
        self.res, self.wire = res, wire
        self.inline = inline
        """Issue on the caller's thread (Issuer.run, "native"), else queue for the
        worker thread (Issuer.submit, "native-async")."""
        self.mode = "native" if inline else "native-async"
        self.topo = res.topo
        self.stages = schedule.active_stages(self.topo.devices_per_machine)
        last = self.stages[-1]
        self.worker = module.Issuer(_LIBCUDA, libnccl, res.sync.handle(last))
        self.libnccl = libnccl
        self.done = torch.cuda.Stream(res.device, priority=-1)
        self._done_handle = self.done.cuda_stream
        self._completer: queue.SimpleQueue[tuple[int, Any, torch.Tensor] | None] = \
            queue.SimpleQueue()
        self._completer_thread = threading.Thread(target=self._complete, daemon=True,
                                                  name="ringreduce-native-futures")
        self._completer_thread.start()
        self._index = res.device.index
        self._raw_stream = _raw_stream_lookup()
        self._programs: dict[tuple[Any, ...], tuple[Any, Cursor]] = {}
        self._warm: set[tuple[Any, ...]] = set()
        """Kinds of call (size, dtype, op, alignment) the Python issuer ran once."""

    def warm(self, t: torch.Tensor, op: str) -> bool:
        """Whether this call may be issued natively: not the first of its kind (size,
        dtype, op, alignment). The first goes through the Python issuer on the caller's
        thread, so that everything done once happens there, while no stream waits on a
        flag: NCCL connecting peers and loading kernels, cupy kernels loading. CUDA loads
        a kernel lazily at its first launch, and loading may synchronise the context;
        seen on H200 (2026-11-23): with the caller's stream already waiting for the
        worker's flag, first calls issued by the worker hung."""
        kind = (t.numel(), t.dtype, op, t.data_ptr() & 15)
        if kind in self._warm:
            return True
        self._warm.add(kind)
        return False

    def issue(self, t: torch.Tensor, op: str, async_op: bool, cursor: Cursor,
              make_ctx: Callable[[], Any]) -> tuple[Any, list[tuple[str, Any]], Cursor]:
        """Queue one hierarchical all_reduce; returns (Future or None, watchdog ends,
        the cursor after it). Raises at once if the worker already failed."""
        error = self.worker.error()
        if error is not None:
            raise RingReduceError(self.failure_text())
        base = t.data_ptr()
        key = (t.numel(), t.dtype, op, cursor, base & 15)
        entry = self._programs.get(key)
        if entry is None:
            if len(self._programs) >= _PROGRAMS:
                del self._programs[next(iter(self._programs))]  # the oldest traced
            entry = self._programs[key] = self._trace(t, op, cursor, make_ctx())
        program, after = entry
        caller = self._raw_stream(self._index)
        if self.inline:
            fut, seq = self._run(program, t, async_op, caller)
            return fut, [(stage, Completion(self, seq)) for stage in self.stages], after
        seq = self.worker.submit(program, base, caller)
        done = Completion(self, seq)
        ends = [(stage, done) for stage in self.stages]
        if not async_op:
            self._wait_issued(seq)  # the host waits for the issue, never for the device
            error = self.worker.error()
            if error is not None and error[0] <= seq:  # NCCL refused it: raise as Python does
                raise RingReduceError(self.failure_text())
            self.worker.stream_wait(caller, seq)
            return None, ends, after
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[t.device])
        t.record_stream(self.done)  # the done stream is the tensor's last user here
        self._completer.put((seq, fut, t))
        return fut, ends, after

    def _run(self, program: Any, t: torch.Tensor, async_op: bool,
             caller: int) -> tuple[Any, int]:
        """Issue on this thread ("native"); (the Future or None, as the Python issuer
        returns it, and the job's seq). The caller's stream, or the done stream the
        Future records on, waits for the job's done event."""
        seq = self.worker.run(program, t.data_ptr(), caller)
        error = self.worker.error()
        if error is not None and error[0] <= seq:  # NCCL refused it: raise as Python does
            raise RingReduceError(self.failure_text())
        if not async_op:
            self.worker.stream_wait(caller, seq)
            return None, seq
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[t.device])
        t.record_stream(self.done)  # the done stream is the tensor's last user here
        self.worker.stream_wait(self._done_handle, seq)
        with torch.cuda.stream(self.done):  # the Future records its event after the wait
            fut.set_result(t)
        return fut, seq

    def _wait_issued(self, seq: int) -> None:
        while not self.worker.wait_issued(seq, _DRAIN_POLL_S):
            if self.res.guard.failure is not None:
                raise RingReduceError(str(self.res.guard.failure))

    def _complete(self) -> None:
        """The completer thread: completes each async call's Future once the worker has
        issued it, on the done stream after a device wait for its done event, so ``wait()``
        orders the caller's stream after the result. Futures of calls the worker failed
        or never issued (a failure, close) get the RingReduceError."""
        torch.cuda.set_device(self.res.device)
        while True:
            item = self._completer.get()
            if item is None:
                return
            seq, fut, t = item
            while not self.worker.wait_issued(seq, _DRAIN_POLL_S):
                if self.res.guard.failure is not None:
                    break
            error = self.worker.error()
            if (error is not None and error[0] <= seq) or \
                    not self.worker.wait_issued(seq, 0):
                fut.set_exception(RingReduceError(self.failure_text()))
                continue
            self.worker.stream_wait(self._done_handle, seq)
            with torch.cuda.stream(self.done):  # the Future records its event after the wait
                fut.set_result(t)

    def _trace(self, t: torch.Tensor, op: str, cursor: Cursor, ctx: Any) -> tuple[Any, Cursor]:
        """Walk the plan against recording collaborators; nothing is issued."""
        res, topo = self.res, self.topo
        ctx.wire = self.wire if t.dtype == torch.float32 else None
        plans, steps, after = schedule.plan_call(
            t.numel(), t.element_size(), topo.devices_per_machine, topo.machines,
            res.slice_bytes, res.staging_slots, cursor,
            "add" if ctx.wire is None else "diffuse")
        rec = Recorder(t.data_ptr(), t.numel() * t.element_size(), self.stages)
        kernels = copy.copy(res.kernels)
        kernels.emit = rec
        ctx.kernels = kernels
        ctx.sync = RecordedStreams(res.sync, rec)
        transport = res.transport
        ctx.transport = NcclTransport(topo, transport.comms, transport.timeout_s, True,
                                      kernels, calls=RecordedNccl(rec))
        run_steps(steps, t.view(-1), plans, op, ctx)
        rec.stage = len(self.stages) - 1
        rec.emit("write_flag")
        return rec.program(), after

    def failure_text(self) -> str:
        error = self.worker.error()
        if error is None:
            return "the native issuer stopped"
        seq, stage_index, index, message = error
        stage = self.stages[stage_index] if 0 <= stage_index < len(self.stages) else "-"
        return (f"ringreduce stage '{stage}' failed on rank {self.topo.rank} in the native "
                f"issuer (its job {seq}, instruction {index}), peers (group ranks) "
                f"{list(self.topo.peers(stage))}: {message}")

    def drain(self) -> None:
        """Before Python issues CUDA work itself: the worker must have issued all it was
        given (host-side; nothing waits for the device), so that NCCL calls and events
        keep one order. A worker stuck inside NCCL (a dead peer) is the watchdog's to
        end: this wait ends with its error rather than outliving it."""
        while not self.worker.drain(_DRAIN_POLL_S):
            if self.res.guard.failure is not None:
                raise RingReduceError(str(self.res.guard.failure))

    def stop(self) -> bool:
        """A failure: issue nothing more, let the streams that wait on queued calls go
        (no stream waits forever); True once the worker is outside NCCL and CUDA."""
        self.worker.release()
        return bool(self.worker.stop(_STOP_WAIT_S))

    def close(self) -> None:
        """Issue what is queued (after a failure: flags only), complete every Future."""
        self.worker.close()
        self._completer.put(None)
        self._completer_thread.join()
