"""Watchdog: turns a hung or failed CUDA operation into a RingReduceError.

The CUDA path only enqueues work, so nothing on the host notices a dead peer: NCCL has
no timeout of its own and its kernels wait forever. One daemon thread per Communicator
watches what was issued and fails it after a deadline or on an NCCL asynchronous error:

  engine thread                          watchdog thread (every poll_s while work is pending)
  issue operation n, record one event    query each pending operation's stage events
  per stage at its end                   drop operations whose events all completed
  watch(n, what, stage events)  ----->   async_error() says something   -> fail
                                         oldest pending operation waited
                                         longer than timeout_s          -> fail
                                         fail: on_failure(error) once, then stop

The engine aborts its communicators, poisons its Guard and dumps the flight recorder in
``on_failure``; ``wait_idle`` lets a host wait for outstanding work without hanging.

It also watches the issuing itself (``stuck_issue``): a blocking NCCL call connecting
to a peer that died or never calls waits on the host, inside the call, before any event
exists. An issue older than the deadline fails the same way, and the abort is what
returns the stuck call. For that the thread also wakes while idle, every quarter
deadline.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence

from ringreduce.errors import CALL_CHECK, RingReduceError, stage_error
from ringreduce.safety.watched import Completion, Issue, Op

log = logging.getLogger("ringreduce")

#: How often the thread looks while work is pending. 100 ms, as torch's ProcessGroupNCCL
#: watchdog (kWatchdogThreadSleepMillis): detection latency is nothing next to the
#: deadline (600 s by default, seconds in tests), and one poll costs a few microseconds
#: of GIL per pending operation (cudaEventQuery, ncclCommGetAsyncError: an atomic load),
#: so the issuing thread does not feel it. An idle watchdog does not poll at all.
DEFAULT_POLL_S = 0.1


class Watchdog:
    """Fails ringreduce's outstanding CUDA work after ``timeout_s`` without progress,
    or as soon as ``async_error()`` returns a message.

    ``on_failure`` runs once, on the watchdog thread, with the RingReduceError; it must
    not wait for this watchdog (``stop`` from inside it is allowed and does not join).
    """

    def __init__(self, timeout_s: float, *, async_error: Callable[[], str | None],
                 on_failure: Callable[[RingReduceError], None],
                 poll_s: float = DEFAULT_POLL_S, rank: int | None = None,
                 stuck_issue: Callable[[], Issue | None] | None = None,
                 call_check: Callable[[], str | None] | None = None,
                 everyone: Sequence[int] = (),
                 on_start: Callable[[], None] | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} must be positive seconds")
        if not poll_s > 0:
            raise ValueError(f"poll_s={poll_s!r} must be positive seconds")
        self.timeout_s, self.poll_s, self.rank = timeout_s, poll_s, rank
        self._on_start = on_start
        """Runs first on the watchdog's thread (CUDA: its graph-capture mode)."""
        self._async_error, self._on_failure = async_error, on_failure
        self._stuck_issue = stuck_issue
        self._call_check, self._everyone = call_check, tuple(everyone)
        """What the end-of-call check found (ranks called different operations), read
        after the completions, so a call it failed is never counted finished; the
        error names ``everyone``, the ranks that took part."""
        self._idle_s = None if stuck_issue is None else poll_s
        """How long an idle thread sleeps: forever, unless issues are watched too (CUDA:
        the thread then polls every ``poll_s`` even when idle, so ``watch`` need not wake
        it; woken, it would run a whole poll under the GIL while the caller is still in
        its call. Not measured apart: with this, an idle call's host time was the
        caller's own CPU, 224 of 229 us)."""
        self._cond = threading.Condition()
        self._ops: collections.deque[Op] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._failing: RingReduceError | None = None
        """Set before on_failure runs: no new work is accepted from then on."""
        self._failure: RingReduceError | None = None
        """Set after on_failure returned (communicators aborted): waiters raise it."""

    @property
    def failure(self) -> RingReduceError | None:
        return self._failure

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def pending(self) -> int:
        """Operations watched and not yet seen finished."""
        with self._cond:
            return len(self._ops)

    def watch(self, op_number: int, what: str,
              stage_done: Sequence[tuple[str, Completion, Sequence[int]]]) -> None:
        """Watch operation ``op_number`` (``what``: e.g. "tensor of 1048576 x
        torch.float32"). ``stage_done``: (stage, completion, peer ranks) in pipeline
        order; each completion must not be recorded again after this call."""
        op = Op(op_number, what, tuple((s, c, tuple(p)) for s, c, p in stage_done), None)
        with self._cond:
            if self._failing is not None:
                raise RingReduceError(f"the watchdog refuses new work after a failure: "
                                      f"{self._failing}")
            if self._stopping:
                raise RingReduceError("the watchdog is stopped (the communicator is closed)")
            if not self._ops:
                op.oldest_since = time.monotonic()
                if self._idle_s is None:
                    self._cond.notify_all()  # an idle thread sleeps until woken
            self._ops.append(op)
            self._start_locked()

    def start(self) -> None:
        """Start the thread now rather than at the first ``watch`` (idempotent)."""
        with self._cond:
            if not self._stopping:
                self._start_locked()

    def _start_locked(self) -> None:
        if self._thread is None:
            # Daemon: a process whose peers hang must still be able to exit.
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="ringreduce-watchdog")
            self._thread.start()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until every watched operation finished (True) or ``timeout_s`` passed
        (False); raise the watchdog's RingReduceError if it failed. Never hangs past
        the watchdog's own deadline while the thread runs."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._failure is not None:
                    raise RingReduceError(str(self._failure))
                if not self._ops and self._failing is None:
                    return True
                if self._stopping and self._failing is None:
                    return False  # nothing will make progress any more
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)

    def stop(self) -> None:
        """Stop and join the thread (idempotent). Pending operations stay unchecked."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception:  # the watchdog must run regardless
                log.exception("ringreduce: the watchdog's start-up step failed")
        while True:
            with self._cond:
                if not self._ops and not self._stopping:
                    self._cond.wait(self._idle_s)  # idle: a slow look at the issuing only
                if self._stopping:
                    return
                ops = list(self._ops)  # only this thread removes, so a snapshot is safe
            try:
                error = self._check(ops)
            except Exception as exc:  # a watchdog that dies silently would hide hangs
                error = (self._error(ops[0], f"the watchdog itself failed: {exc!r}") if ops
                         else RingReduceError(f"the ringreduce watchdog failed: {exc!r}"))
            if error is not None:
                self._fail(error)
                return
            with self._cond:
                self._drop_finished()
                if self._stopping:
                    return
                self._cond.wait(self.poll_s)

    def _check(self, ops: list[Op]) -> RingReduceError | None:
        """One poll: advance every operation, then look for an error or an expiry."""
        for op in ops:
            try:
                _advance(op)
            except Exception as exc:  # e.g. a sticky CUDA error surfacing in the query
                return self._error(op, f"querying its completion raised {exc!r}")
        stuck = self._expired_issue()
        if stuck is not None or not ops:
            return stuck
        mismatch = self._call_check() if self._call_check is not None else None
        if mismatch:
            return self._mismatch(ops, mismatch)
        pending = [op for op in ops if not op.finished()]
        message = self._async_error()
        if message:
            target = pending[0] if pending else ops[-1]
            return self._error(target, f"NCCL reported an asynchronous error: {message}")
        head = pending[0] if pending else None
        if head is not None and head.oldest_since is not None \
                and time.monotonic() - head.oldest_since > self.timeout_s:
            return self._error(head, f"no progress within the deadline of {self.timeout_s:g} s "
                                     "(RINGREDUCE_TIMEOUT); a peer died, hangs, or never "
                                     f"made this call{_progress(head)}")
        return None

    def _expired_issue(self) -> RingReduceError | None:
        issue = self._stuck_issue() if self._stuck_issue is not None else None
        if issue is None or time.monotonic() - issue.since <= self.timeout_s:
            return None
        return stage_error(
            issue.stage, self.rank, f"operation #{issue.op_number} ({issue.what})", issue.peers,
            f"issuing it did not return within the deadline of {self.timeout_s:g} s "
            "(RINGREDUCE_TIMEOUT); NCCL waits inside the call to connect to a peer that died, "
            "hangs, or never made this call")

    def _drop_finished(self) -> None:
        """Under the lock: forget finished operations, start the new oldest's clock."""
        before = len(self._ops)
        self._ops = collections.deque(op for op in self._ops if not op.finished())
        if self._ops and self._ops[0].oldest_since is None:
            self._ops[0].oldest_since = time.monotonic()
        if len(self._ops) != before:
            self._cond.notify_all()  # wait_idle

    def _mismatch(self, ops: list[Op], cause: str) -> RingReduceError:
        """The check does not say which call it failed: one of those watched since
        the last poll, so it names them."""
        first, last = ops[0], ops[-1]
        where = (f"operation #{first.op_number} ({first.what})" if first is last else
                 f"one of operations #{first.op_number}..#{last.op_number}")
        return stage_error(CALL_CHECK, self.rank, where, self._everyone, cause)

    def _error(self, op: Op, cause: str) -> RingReduceError:
        stage, peers = "-", tuple[int, ...]()
        if op.stages:  # the first unfinished stage, or the last one if all finished
            stage, _, peers = op.stages[min(op.done, len(op.stages) - 1)]
        return stage_error(stage, self.rank, f"operation #{op.op_number} ({op.what})", peers,
                           cause)

    def _fail(self, error: RingReduceError) -> None:
        with self._cond:
            self._failing = error
        log.error("ringreduce watchdog: %s", error)
        try:
            self._on_failure(error)
        except Exception:
            log.exception("ringreduce watchdog: on_failure raised; the operation stays failed")
        with self._cond:  # published only now: communicators are aborted when waiters wake
            self._failure = error
            self._ops.clear()
            self._cond.notify_all()


def _progress(op: Op) -> str:
    """What the head's completion says about where it is (the native issuer's worker
    position), when it can say it."""
    stage = op.stages[min(op.done, len(op.stages) - 1)] if op.stages else None
    progress = getattr(stage[1], "progress", None) if stage else None
    return f" ({progress()})" if progress is not None else ""


def _advance(op: Op) -> None:
    while not op.finished() and op.stages[op.done][1].query():
        op.done += 1
