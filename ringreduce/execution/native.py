"""The native issuer: a call's program (recording.py) replayed from C++.

A call costs the caller a dictionary lookup (the program of its plan key, traced the
first time by recording.trace) and one call into ringreduce._native (native/issuer.cpp):

  native        Issuer.run, the default: on the caller's thread, without the GIL,
                before the call returns. The same work, order and thread as the Python
                issuer, without its ~100 Python calls.
  native-async  Issuer.submit, opt-in: the job is queued for a worker thread (C++, no
                GIL) and an asynchronous call returns without waiting for it; a
                completer thread completes its Future once the job is issued and
                the caller stopped making calls (at most 5 ms after the issue). A
                synchronous call still waits on the host until its job is issued. A
                call on memory an earlier queued call still uses follows it on the
                device (``after``: the worker adds the wait), so the caller never waits
                for the worker then either.

The rules it keeps, each because breaking it deadlocks:

* One issue order per process: every Issuer issues in the order of the calls (a
  ticket per job, native/issuer.cpp ``Order``), whichever thread issues, because NCCL
  kernels of different communicators must reach each device in the same order on every
  rank; workers issuing independently hang. ``drain`` waits for every Issuer's queue,
  so work the caller issues from Python comes after all of it.
* While jobs are queued, the caller's thread issues no NCCL work of its own (torch's
  dist calls): two threads issuing on communicators of one device at once hang. DDP's
  hook keeps the rule: its last bucket of a backward returns once every queued job is
  issued (engine._hook_all_reduce), and DDP issues NCCL work of its own only after
  that bucket (with find_unused_parameters, right after it). NCCL work issued during
  the backward itself (SyncBatchNorm, tensor-parallel layers) does not.
* The GIL is never requested while the issuer's lock is held (native/issuer.cpp
  ``wait_released``): the two taken in opposite orders stop the worker, and with it the
  peers' NCCL kernels, which looks like a device hang.
* A stream waits only on issued work: the program records an entry event on the
  caller's stream first; its last instruction writes the call's number into a flag in
  host memory (what the watchdog polls) and records the job's done event, which the
  stream that must follow the result waits for only once the job is issued. A stream
  waiting on work nobody has enqueued yet blocks any context-wide synchronisation
  (e.g. CUDA loading a kernel lazily), and so the issuer.

On failure, the watchdog watches each call through ``Completion`` (the flag reached
``seq``), one per active stage as for Python-issued calls (the device does not say which
stage is stuck, so it names the first, with that stage's peers, and where the issuer
is); an NCCL error inside the replay makes ``query()`` raise, and a dead peer leaves the
flag short until the deadline: either way the watchdog aborts the communicators, after
``stop()`` made the issuing thread leave NCCL, and every job's flag is still written so
that no stream waits forever.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from ringreduce.errors import RingReduceError, stage_error
from ringreduce.execution import recording
from ringreduce.execution.recording import extension
from ringreduce.plan import schedule
from ringreduce.safety.flight import Record

log = logging.getLogger("ringreduce")

_LIBCUDA = "libcuda.so.1"
_DRAIN_POLL_S = 0.1
"""How often a host waiting for the worker to issue its queue looks for a failure."""
_PROGRAMS = 4096
"""Traced programs kept per Communicator (about 14 KB each for a 25 MiB call at 2 x 2):
the keys repeat in training (one per DDP bucket size), and a workload of ever-new
sizes must not grow memory without bound."""
_QUIET_S = 200e-6
"""The completer completes Futures once no call was submitted for this long (a caller
making calls back to back submits every 40-80 µs at 2 x 2), so it takes the GIL while
the caller does not need it."""
_MAX_DELAY_S = 5e-3
"""... or, while calls keep coming, this long after a job was issued."""
_SEQS = 1 << 32
"""Job numbers are the extension's uint32 and wrap around."""
_STOP_WAIT_S = 2.0
"""How long a failure waits for the worker to leave NCCL before aborting anyway (the
same bound as for a Python issuing thread, resources._ABORT_LOCK_WAIT_S)."""


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
                f"issued {c['issued']}, finished on the device {c['flag']}; worker {where}; "
                f"{self._events()}; {self.issuer.streams_busy()}"
                f"{self.issuer.probe_text(self.seq)}")

    def _events(self) -> str:
        """Whether the caller's stream got to this job (its entry event) and whether the
        job ended (its done event): which side of the call the device waits on."""
        states = self.issuer.worker.events(self.seq)
        if states is None:
            return "no events (CPU)"
        words = {1: "reached", 0: "not reached", -1: "unknown"}
        return f"entry {words[states[0]]}, done {words[states[1]]}"


_Pending = tuple[int, "torch.futures.Future[torch.Tensor]", torch.Tensor, Record]
"""A Future to complete: (job, Future, tensor, flight record)."""


class Completer:
    """native-async's completer thread: completes each asynchronous call's Future once
    the worker has issued its job, after the done stream waits for the job's done event
    (so ``wait()`` orders the waiter's stream after the result); Futures of calls the
    worker failed or never issued (a failure, close) get the RingReduceError.

    Its GIL time is the caller's loss: each time this thread takes the GIL from a caller
    making calls back to back, the caller waits (measured: 99 µs a call against 59 with
    completion deferred). So it completes Futures while the caller is quiet: once a job
    is issued, ``Issuer.follow`` waits (without the GIL) until the process submitted
    nothing for ``_QUIET_S`` or ``_MAX_DELAY_S`` passed, then completes every queued
    Future whose job is issued by then, each after the done stream waits for its own job
    (measured: 1.10-1.17x NCCL's call back to back, against 1.71-1.79x)."""

    def __init__(self, worker: Any, stream: int, failed: Callable[[], bool],
                 failure_text: Callable[[Record], str], setup: Callable[[], None]) -> None:
        self.worker, self.stream = worker, stream
        """The extension's Issuer; the cudaStream_t each Future records its event on."""
        self._failed, self._failure_text, self._setup = failed, failure_text, setup
        self._jobs: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="ringreduce-native-futures")
        self._thread.start()

    def put(self, item: _Pending) -> None:
        self._jobs.put(item)

    def close(self) -> None:
        """Once the worker closed (every job issued, or flagged after a failure): complete
        what is queued and end the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        self._setup()  # CUDA: the done stream becomes this thread's current stream
        pending: collections.deque[_Pending] = collections.deque()
        closing = False
        while pending or not closing:
            if not pending and not self._take(pending, block=True):
                return
            closing = not self._take(pending, block=False) or closing
            seq, fut, _, record = pending[0]
            try:
                n = self._follow(seq, pending[-1][0], record)
            except (RingReduceError, RuntimeError) as exc:
                pending.popleft()
                self._fail(fut, record, exc)
                continue
            self._complete_issued(pending, seq, n)

    def _complete_issued(self, pending: collections.deque[_Pending], seq: int, n: int) -> None:
        """The Futures of jobs ``seq`` .. ``seq + n - 1``, issued (the stream already waits
        for ``seq``), each after the stream waits for its own job: a Future's event then
        follows its job, not a later one of the batch."""
        while pending and (pending[0][0] - seq) % _SEQS < n:
            job, fut, t, record = pending.popleft()
            try:
                if job != seq:  # issued: the stream waits for it, the host does not
                    self.worker.stream_wait(self.stream, job)
            except RuntimeError as exc:
                self._fail(fut, record, exc)
                continue
            fut.set_result(t)

    def _fail(self, fut: torch.futures.Future[torch.Tensor], record: Record,
              exc: Exception) -> None:
        error = exc if isinstance(exc, RingReduceError) else \
            RingReduceError(f"{self._failure_text(record)}: {exc}")
        fut.set_exception(error)  # type: ignore[arg-type]  # torch's stub: "result: T"

    def _take(self, pending: collections.deque[_Pending], block: bool) -> bool:
        """Move queued Futures to ``pending``: one, waiting for it (``block``), or every
        one queued now. False once close() asked the thread to end."""
        while True:
            try:
                item = self._jobs.get(block)
            except queue.Empty:
                return True
            if item is None:
                return False
            pending.append(item)
            if block:
                return True

    def _follow(self, seq: int, last: int, record: Record) -> int:
        """The stream waits for job ``seq`` once it is issued and the caller is quiet;
        how many jobs from ``seq`` up to ``last`` are issued by then (and not failed).
        Raises if job ``seq`` failed, or was never issued before this communicator
        failed."""
        follow, stream = self.worker.follow, self.stream
        n = follow(stream, seq, _DRAIN_POLL_S, last, _QUIET_S, _MAX_DELAY_S)
        while n == 0 and not self._failed():
            n = follow(stream, seq, _DRAIN_POLL_S, last, _QUIET_S, _MAX_DELAY_S)
        if n == 0:  # the communicator failed: one last look, without waiting
            n = follow(stream, seq, 0, last)
        if n <= 0:
            raise RingReduceError(self._failure_text(record))
        return n


class NativeIssuer:
    """One Communicator's traced programs and the extension's Issuer that replays them
    (on the caller's thread, or on its worker thread for native-async)."""

    def __init__(self, res: Any, wire: torch.dtype | None, inline: bool = True,
                 probes: int = 0) -> None:
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
        self.route = f"hierarchical ({self.mode})"
        """What the flight record says of the calls it issues."""
        self.topo = res.topo
        self.stages = schedule.active_stages(self.topo.devices_per_machine)
        last = self.stages[-1]
        self.worker = module.Issuer(_LIBCUDA, libnccl, res.sync.handle(last))
        self.libnccl = libnccl
        if probes:
            self.worker.enable_probes(probes)  # Config.issue_probes: a hang's diagnosis
        self.done = torch.cuda.Stream(res.device, priority=-1)
        self._done_handle = self.done.cuda_stream
        self._completer: Completer | None = None
        """Completes the Futures of queued calls (native-async: Issuer.submit)."""
        if not inline:
            self._completer = Completer(self.worker, self._done_handle,
                                        lambda: self.res.guard.failure is not None,
                                        self.failure_text, self._current_done)
        self._index = res.device.index
        self._raw_stream = _raw_stream_lookup()
        self._programs: dict[tuple[Any, ...], Any] = {}
        self._warm: set[tuple[Any, ...]] = set()
        """Kinds of call (size, dtype, op, alignment) the Python issuer ran once."""

    def streams_busy(self) -> str:
        """Which of the communicator's streams still have work queued (cudaStreamQuery,
        host side, nothing waits): for a deadline error, where on the device a call is
        stuck, e.g. the rail streams of two ranks busy on different jobs."""
        streams = dict(self.res.sync.streams) | {"done": self.done}
        busy = [name for name, stream in streams.items() if not stream.query()]
        return f"streams busy: {', '.join(busy) or 'none'}"

    def probe_text(self, seq: int) -> str:
        """With Config.issue_probes: per stream, the first instruction of job ``seq`` the
        device has not passed, and for a wait the instruction that recorded its event,
        e.g. "; probes: collect at #61 wait_event (recorded by #58 on reduce_scatter)".
        "" when probes are off or the job is no longer kept."""
        rows = self.worker.probe(seq)
        if rows is None:
            return ""
        names = {s.cuda_stream: n for n, s in self.res.sync.streams.items()}
        names[self._done_handle] = "done"
        recorded: dict[int, tuple[int, int]] = {}  # event -> (instruction, stream)
        stuck: dict[int, str] = {}
        passed: dict[int, int] = {}
        for i, op, _stage, stream, reached, a1 in rows:
            if reached == 1:
                passed[stream] = passed.get(stream, 0) + 1
            elif stream not in stuck:
                stuck[stream] = f"#{i} {op}" + self._waits_on(op, a1, recorded, names)
            if op == "record_event":
                recorded[a1] = (i, stream)
        parts = [f"{names.get(h, hex(h))} at {what} ({passed.get(h, 0)} passed)"
                 for h, what in stuck.items()]
        return f"; probes: {'; '.join(parts) or 'every instruction passed'}"

    @staticmethod
    def _waits_on(op: str, event: int, recorded: dict[int, tuple[int, int]],
                  names: dict[int, str]) -> str:
        if op != "wait_event":
            return ""
        if event == 0:
            return " (the entry event, on the caller's stream)"
        if event not in recorded:
            return " (recorded by an earlier job)"
        i, stream = recorded[event]
        return f" (recorded by #{i} on {names.get(stream, hex(stream))})"

    def program(self, t: torch.Tensor, op: str, make_ctx: Callable[[], Any]) -> Any:
        """The program of this kind of call (size, dtype, op, alignment), traced at its
        second sight; None at its first, which goes through the Python issuer on the
        caller's thread, so that everything done once happens there while no stream
        waits on a flag: NCCL connecting peers and loading kernels, cupy kernels
        loading. CUDA loads a kernel lazily at its first launch, and loading may
        synchronise the context: with the caller's stream already waiting for the
        worker's flag, first calls issued by the worker hung (seen on H200)."""
        key = (t.numel(), t.dtype, op, t.data_ptr() & 15)
        program = self._programs.get(key)
        if program is not None:
            return program
        if key not in self._warm:
            self._warm.add(key)
            return None
        if len(self._programs) >= _PROGRAMS:
            del self._programs[next(iter(self._programs))]  # the oldest traced
        program = self._programs[key] = recording.trace(self.res, self.wire, self.stages, t,
                                                        op, make_ctx())
        return program

    def issue(self, t: torch.Tensor, program: Any, async_op: bool, record: Record,
              after: int = 0) -> tuple[Any, list[tuple[str, Any]]]:
        """Issue (native) or queue (native-async) one hierarchical all_reduce of
        ``program`` (see ``program``); returns (Future or None, watchdog ends). ``after``:
        an earlier job on the same memory that this one follows on the device (0: none);
        the issuing thread adds the wait, so the caller never waits for that job's issue.
        Raises at once if the issuer already failed."""
        if self.worker.error() is not None:
            raise RingReduceError(self.failure_text(record))
        record.route = self.route
        caller = self._raw_stream(self._index)
        if self.inline:  # issued before run() returns: the caller's thread is the issuer
            seq = self.worker.run(program, t.data_ptr(), caller, after)
        else:
            seq = self.worker.submit(program, t.data_ptr(), caller, after)
            if not async_op:
                self.wait_issued(seq)  # the host waits for the issue, never for the device
        if self.inline or not async_op:  # issued by now: a refusal raises from this call
            self._raise_if_refused(seq, record)
        # One end: the device does not say which stage is stuck, so the watchdog names
        # the first (with its peers), and polls one completion rather than one per stage.
        ends = [(self.stages[0], Completion(self, seq))]
        if not async_op:
            self.worker.stream_wait(caller, seq)
            return None, ends
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[t.device])
        t.record_stream(self.done)  # the done stream is the tensor's last user here
        if self.inline:
            self._complete_after(seq, fut, t)
        else:
            assert self._completer is not None
            self._completer.put((seq, fut, t, record))
        return fut, ends

    def _raise_if_refused(self, seq: int, record: Record) -> None:
        """An issued job that NCCL or CUDA refused raises from its call, as Python does."""
        error = self.worker.error()
        if error is not None and error[0] <= seq:
            raise RingReduceError(self.failure_text(record))

    def _complete_after(self, seq: int, fut: torch.futures.Future[torch.Tensor],
                        t: torch.Tensor) -> None:
        """Complete ``fut`` on the done stream after it waited for issued job ``seq``, so
        ``wait()`` orders the waiter's stream after the result, not after the caller's."""
        self.worker.stream_wait(self._done_handle, seq)
        with torch.cuda.stream(self.done):  # the Future records its event after the wait
            fut.set_result(t)

    def wait_issued(self, seq: int) -> None:
        while not self.worker.wait_issued(seq, _DRAIN_POLL_S):
            if self.res.guard.failure is not None:
                raise RingReduceError(str(self.res.guard.failure))

    def _current_done(self) -> None:
        """The completer thread's setup: the done stream is its current stream for good,
        so each Future records its event after the wait (entering a stream context cost
        20 µs a Future)."""
        torch.cuda.set_device(self.res.device)
        torch.cuda.set_stream(self.done)

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

    def drain(self) -> None:
        """Before Python issues CUDA work itself: every native issuer of the process must
        have issued all it was given (host-side; nothing waits for the device), so that
        NCCL calls and events keep one order. A worker stuck inside NCCL (a dead peer) is
        its watchdog's to end: this wait ends with this communicator's error rather than
        outliving it."""
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
        if self._completer is not None:
            self._completer.close()
