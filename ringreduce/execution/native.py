"""The native issuer: a call's program (recording.py) replayed from C++.

A call costs the caller a dictionary lookup (the program of its plan key, traced the
first time by recording.trace) and one call into ringreduce._native (native/issuer.cpp),
Issuer.run: the job is issued on the caller's thread, without the GIL, before the call
returns. The same work, order and thread as the Python issuer, without its ~100 Python
calls.

The rules it keeps, each because breaking it deadlocks:

* One job at a time per process: native jobs of every Communicator are issued under one
  process-wide lock (native/issuer.cpp ``issue_mutex``), because NCCL kernels of
  different communicators must reach each device in the same order on every rank, and
  two threads issuing on communicators of one device at once hang.
* The GIL is never requested while an issuer's lock is held: run releases the GIL
  before it takes one and gives every lock back before it takes the GIL again. The two
  taken in opposite orders stop the issuing thread, and with it the peers' NCCL
  kernels, which looks like a device hang.
* A stream waits only on issued work: the program records an entry event on the
  caller's stream first; its last instruction writes the call's number into a flag in
  host memory (what the watchdog polls) and records the job's done event, which a
  synchronous call's stream waits for only once the job is issued (after run
  returned); an asynchronous call's Future then records its own event on that last
  stream, after the job. A stream waiting on work nobody has enqueued yet blocks any
  context-wide synchronisation (e.g. CUDA loading a kernel lazily), and so the issuer.

On failure, the watchdog watches each call through ``Completion`` (the flag reached
``seq``), one per active stage as for Python-issued calls (the device does not say which
stage is stuck, so it names the first, with that stage's peers, and where the issuer
is); an NCCL error inside the replay makes the call and ``query()`` raise, and a dead
peer leaves the flag short until the deadline: either way the watchdog aborts the
communicators, after ``stop()`` made the issuing thread leave NCCL, and every job's flag
is still written so that no stream waits forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ringreduce.errors import RingReduceError, stage_error
from ringreduce.execution import feedback, recording
from ringreduce.execution.recording import extension
from ringreduce.execution.streams import complete_on
from ringreduce.plan import schedule
from ringreduce.safety.flight import Record

log = logging.getLogger("ringreduce")

_LIBCUDA = "libcuda.so.1"
_PROGRAMS = 4096
"""Traced programs kept per Communicator (about 14 KB each for a 25 MiB call at 2 x 2):
the keys repeat in training (one per DDP bucket size), and a workload of ever-new
sizes must not grow memory without bound."""
_STOP_WAIT_S = 2.0
"""How long a failure waits for the issuing thread to leave NCCL before aborting anyway
(the same bound as for a Python issuing thread, resources._ABORT_LOCK_WAIT_S)."""


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


def why_not(config: Any, is_cuda: bool, has_kernels: bool) -> str:
    """"" when CUDA calls would use the native issuer, else the reason (for info)."""
    if not is_cuda:
        return "CPU path (gloo): the Python issuer runs the plan"
    if config.issuer == "python":
        return "issuer='python' (set by Communicator(issuer=...))"
    module, why = extension()
    if module is None:
        return why
    if not has_kernels:
        return "cupy is not importable (the add stage runs torch ops)"
    return ""


def _raw_stream_lookup() -> Callable[[int], int]:
    """device index -> the caller's current cudaStream_t. torch's CUDA builds have a
    direct lookup (what torch.compile's generated code calls, ~10x cheaper than making
    a torch.cuda.Stream object per call); otherwise the public way."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class Completion:
    """For the watchdog: done once the flag reached ``seq``; raises after an issuer
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
        """Where the issuer is, for the watchdog's deadline error: a job never issued
        points at the host (inside NCCL or CUDA), one issued at the device."""
        c = self.issuer.worker.counters()
        where = "idle" if c["at_op"] == "-" else \
            f"inside {c['at_op']} (instruction {c['at_instruction']} of job {c['at_job']})"
        return (f"native issuer: this call is job {self.seq}; submitted {c['submitted']}, "
                f"issued {c['issued']}, finished on the device {c['flag']}; issuing thread "
                f"{where}; {self._events()}; {self.issuer.streams_busy()}")

    def _events(self) -> str:
        """Whether the caller's stream got to this job (its entry event) and whether the
        job ended (its done event): which side of the call the device waits on."""
        states = self.issuer.worker.events(self.seq)
        if states is None:
            return "no events (CPU)"
        words = {1: "reached", 0: "not reached", -1: "unknown"}
        return f"entry {words[states[0]]}, done {words[states[1]]}"


class NativeIssuer:
    """One Communicator's traced programs and the extension's Issuer that replays them
    on the caller's thread."""

    mode = "native"
    """The issuer's name (Communicator.describe, the flight record)."""
    route = f"hierarchical ({mode})"
    """What the flight record says of the calls it issues."""

    def __init__(self, res: Any, wire: torch.dtype | None) -> None:
        module, why = extension()
        if module is None:
            raise RingReduceError(why)
        libnccl = loaded_library("libnccl.so")
        if libnccl is None:
            raise RingReduceError("the native issuer found no libnccl mapped in this process "
                                  "(nccl4py loads it when the communicators are made)")
        self.res, self.wire = res, wire
        self.topo = res.topo
        self.stages = schedule.active_stages(self.topo.devices_per_machine)
        last = self.stages[-1]
        self.worker = module.Issuer(_LIBCUDA, libnccl, res.sync.handle(last))
        self.libnccl = libnccl
        self.last = res.sync.streams[last]
        """Where every job ends (its flag and done event): asynchronous calls' Futures
        complete on it, right after their job."""
        self._index = res.device.index
        self._raw_stream = _raw_stream_lookup()
        self._programs: dict[tuple[Any, ...], tuple[Any, list[torch.Tensor]]] = {}
        """Traced programs by kind of call, each with the work buffers it points into."""
        self._warm: set[tuple[Any, ...]] = set()
        """Kinds of call (``program``'s keys) the Python issuer ran once."""

    def streams_busy(self) -> str:
        """Which of the communicator's streams still have work queued (cudaStreamQuery,
        host side, nothing waits): for a deadline error, where on the device a call is
        stuck, e.g. the rail streams of two ranks busy on different jobs."""
        busy = [name for name, stream in self.res.sync.streams.items() if not stream.query()]
        return f"streams busy: {', '.join(busy) or 'none'}"

    def program(self, t: torch.Tensor, op: str, make_ctx: Callable[[], Any],
                route: str | feedback.Spec = "") -> Any:
        """The program of this kind of call (size, dtype, op, alignment and ``route``:
        "" the pipeline, ONE_SLICE or TWO_LEVEL the plan of three collectives, which
        the Communicator fixes for a size, a feedback.Spec the compressed route),
        traced at its second sight;
        None at its first, which goes through the Python issuer on the caller's
        thread, so that everything done once happens there while no stream waits on a
        flag: NCCL connecting peers and loading kernels, cupy kernels loading. CUDA
        loads a kernel lazily at its first launch, and loading may synchronise the
        context: with the caller's stream already waiting for a job's flag, first calls
        issued by native-async's worker thread hung (seen on H200)."""
        key = (t.numel(), t.dtype, op, t.data_ptr() & 15, route)
        kept = self._programs.get(key)
        if kept is not None:
            return kept[0]
        if key not in self._warm:
            if len(self._warm) >= 4 * _PROGRAMS:  # ever-new sizes: bounded, as _programs
                self._warm.clear()
            self._warm.add(key)
            return None
        if len(self._programs) >= _PROGRAMS:
            del self._programs[next(iter(self._programs))]  # the oldest traced
        keep: list[torch.Tensor] = []  # what the program points into (recording.trace)
        program = recording.trace(self.res, self.wire, self.stages, t, op, make_ctx(), route,
                                  keep)
        self._programs[key] = (program, keep)
        return program

    def forget_feedback(self, errors: Any) -> None:
        """Drop the programs that point into ``errors`` (feedback.Errors), memory
        that error feedback let go (``reset_feedback``, a key's size changed): the
        next call of their kind makes new memory and is traced again."""
        def points_into(key: tuple[Any, ...]) -> bool:
            return isinstance(key[-1], feedback.Spec) and key[-1].errors is errors

        for key in [k for k in self._programs if points_into(k)]:
            del self._programs[key]
        self._warm = {k for k in self._warm if not points_into(k)}  # keys hold the memory

    def issue(self, t: torch.Tensor, program: Any, async_op: bool, record: Record,
              after: int = 0, plan: str = "") -> tuple[Any, list[tuple[str, Any]]]:
        """Issue one hierarchical all_reduce of ``program`` (see ``program``) on this
        thread; returns (Future or None, watchdog ends). ``after``: an earlier job on the
        same memory that this one follows on the device (0: none); ``plan``: the slice
        plan, for the flight record. Raises if the issuer already failed, or if NCCL or
        CUDA refused this job."""
        if self.worker.error() is not None:
            raise RingReduceError(self.failure_text(record))
        record.route = f"{plan} ({self.mode})" if plan else self.route
        caller = self._raw_stream(self._index)
        seq = self.worker.run(program, t.data_ptr(), caller, after)  # issued on return
        self._raise_if_refused(seq, record)
        # One end: the device does not say which stage is stuck, so the watchdog names
        # the first (with its peers; a plan on one stream: every rank), and polls one
        # completion rather than one per stage.
        ends = [(plan or self.stages[0], Completion(self, seq))]
        if not async_op:
            self.worker.stream_wait(caller, seq)
            return None, ends
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[t.device])
        # The job is on the last stage's stream now (issued on this thread, under the
        # issue lock): the tensor's last user, where the Future's event follows the job.
        t.record_stream(self.last)
        complete_on(self.last, fut, t)
        return fut, ends

    def _raise_if_refused(self, seq: int, record: Record) -> None:
        """An issued job that NCCL or CUDA refused raises from its call, as Python does."""
        error = self.worker.error()
        if error is not None and error[0] <= seq:
            raise RingReduceError(self.failure_text(record))

    def failure_text(self, record: Record | None = None) -> str:
        """The issuer's first failure, naming its stage and peers, and ``record``'s
        operation when the error is raised for a call (the job that failed may be an
        earlier one)."""
        error = self.worker.error()
        if error is None:
            return "the native issuer stopped"
        seq, stage_index, index, message = error
        stage = self.stages[stage_index] if 0 <= stage_index < len(self.stages) else "-"
        job = f"the native issuer's job {seq}, instruction {index}"
        where = (f"operation #{record.op_number} (tensor of {record.numel} x {record.dtype}; "
                 f"{job})" if record is not None else job)
        return str(stage_error(stage, self.topo.rank, where, self.topo.peers(stage), message))

    def stop(self) -> bool:
        """A failure: issue nothing more, and the flag jumps to the last job (the
        watchdog stops polling a job stuck inside NCCL); True once the issuing thread is
        outside NCCL and CUDA."""
        self.worker.release()
        return bool(self.worker.stop(_STOP_WAIT_S))

    def close(self) -> None:
        """No job is taken from now on (none is queued: nothing is left to issue)."""
        self.worker.close()
