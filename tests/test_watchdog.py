"""The watchdog on the CPU: completion flags stand in for CUDA events, a callable for
NCCL's async error. Also the nccl package's non-blocking polling helpers over a fake
binding, and that no other module imports nccl4py."""

from __future__ import annotations

import ast
import enum
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ringreduce.errors import RingReduceError
from ringreduce.execution import issue, nccl
from ringreduce.execution.cuda_setup import distinct
from ringreduce.execution.nccl import library
from ringreduce.safety.watchdog import Issue, Watchdog

POLL = 0.01  # fast polls keep each test well under a second
PEERS = {"collect": [0, 2], "add": [], "diffuse": [0, 2]}


class Flag:
    """A completion that finishes when the test says so."""

    def __init__(self, done: bool = False) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


class Failures:
    """on_failure that records every call."""

    def __init__(self) -> None:
        self.errors: list[RingReduceError] = []
        self.called = threading.Event()

    def __call__(self, error: RingReduceError) -> None:
        self.errors.append(error)
        self.called.set()


class AsyncError:
    """async_error that reports nothing until ``message`` is set; counts its calls."""

    def __init__(self) -> None:
        self.message: str | None = None
        self.calls = 0

    def __call__(self) -> str | None:
        self.calls += 1
        return self.message


def _stages(*done: bool) -> tuple[list[tuple[str, Flag, list[int]]], list[Flag]]:
    flags = [Flag(d) for d in done]
    return [(s, f, PEERS[s]) for s, f in zip(("collect", "add", "diffuse"), flags,
                                             strict=False)], flags


def _watchdog(timeout_s: float = 30.0, **kw: Any) -> tuple[Watchdog, Failures, AsyncError]:
    failures, errors = Failures(), AsyncError()
    wd = Watchdog(timeout_s, async_error=errors, on_failure=failures, poll_s=POLL, rank=1, **kw)
    return wd, failures, errors


def _until(condition: Any, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(POLL)
    return condition()


def test_completed_operations_are_dropped() -> None:
    wd, failures, _ = _watchdog()
    entries, flags = _stages(False, False, False)
    wd.watch(1, "tensor of 100 x torch.float32", entries)
    wd.watch(2, "tensor of 100 x torch.float32", _stages(True, True, True)[0])
    assert _until(lambda: wd.pending() == 1)  # op 2 finished out of order: dropped
    for f in flags:
        f.done = True
    assert wd.wait_idle(timeout_s=2.0)
    assert wd.pending() == 0 and not failures.errors
    wd.stop()


def test_timeout_names_the_first_unfinished_stage() -> None:
    wd, failures, _ = _watchdog(timeout_s=0.2)
    started = time.monotonic()
    wd.watch(7, "tensor of 1048576 x torch.float32", _stages(True, False, False)[0])
    assert failures.called.wait(3.0)
    assert 0.2 <= time.monotonic() - started < 2.0
    message = str(failures.errors[0])
    assert message.startswith("ringreduce stage 'add' failed on rank 1 in operation #7 "
                              "(tensor of 1048576 x torch.float32), peers (group ranks) []")
    assert "no progress within the deadline of 0.2 s (RINGREDUCE_TIMEOUT)" in message
    with pytest.raises(RingReduceError, match=r"stage 'add' .* operation #7"):
        wd.wait_idle()
    assert wd.failure is failures.errors[0] and wd.pending() == 0
    with pytest.raises(RingReduceError, match="refuses new work"):
        wd.watch(8, "tensor of 1 x torch.float32", _stages(False)[0])
    wd.stop()


class Located(Flag):
    """A completion that can say where its work is (as native.Completion does)."""

    def progress(self) -> str:
        return "worker inside group_end (instruction 7 of job 3)"


def test_timeout_says_where_a_completion_that_knows_is_stuck() -> None:
    wd, failures, _ = _watchdog(timeout_s=0.2)
    wd.watch(3, "tensor of 8 x torch.float32", [("collect", Located(), [0, 1])])
    assert failures.called.wait(3.0)
    assert str(failures.errors[0]).endswith(
        "never made this call (worker inside group_end (instruction 7 of job 3))")
    wd.stop()


def test_async_error_fails_at_once_naming_the_oldest_operation() -> None:
    wd, failures, errors = _watchdog(timeout_s=60.0)
    wd.watch(3, "tensor of 10 x torch.float32", _stages(False, False, False)[0])
    wd.watch(4, "tensor of 20 x torch.float32", _stages(False, False, False)[0])
    time.sleep(5 * POLL)
    assert not failures.errors
    errors.message = "ncclRemoteError (remote process exited or there was a network error)"
    assert failures.called.wait(2.0)
    message = str(failures.errors[0])
    assert "stage 'collect' failed on rank 1 in operation #3 (tensor of 10 x " in message
    assert "peers (group ranks) [0, 2]" in message
    assert message.endswith("NCCL reported an asynchronous error: ncclRemoteError (remote "
                            "process exited or there was a network error)")


def test_a_call_the_end_check_failed_is_never_counted_finished() -> None:
    """The check's report is read after the completions, in the same poll: a call whose
    end event completed fails (wait_idle raises) instead of being dropped as done."""
    found = AsyncError()
    wd, failures, _ = _watchdog(timeout_s=60.0, call_check=found, everyone=range(4))
    wd.watch(5, "tensor of 10 x torch.float32", _stages(False, False, False)[0])
    time.sleep(5 * POLL)
    assert wd.pending() == 1 and not failures.errors and found.calls > 0
    found.message = "ranks called different operations: this rank all_reduce(...)"
    wd.watch(6, "tensor of 20 x torch.float32", _stages(True, True, True)[0])
    assert failures.called.wait(2.0)
    message = str(failures.errors[0])
    assert message.startswith("ringreduce stage 'call check' failed on rank 1 in one of "
                              "operations #5..#6, peers (group ranks) [0, 1, 2, 3]: ranks "
                              "called different operations"), message
    with pytest.raises(RingReduceError, match="call check"):
        wd.wait_idle(2.0)
    wd.stop()


def test_on_failure_runs_once_and_the_thread_stops() -> None:
    wd, failures, errors = _watchdog(timeout_s=0.05)
    for n in range(5):
        wd.watch(n + 1, "tensor of 1 x torch.int32", _stages(False, False, False)[0])
    errors.message = "ncclSystemError"  # both causes hold, and keep holding
    assert failures.called.wait(2.0)
    assert _until(lambda: not wd.running)
    time.sleep(10 * POLL)
    assert len(failures.errors) == 1


def test_failure_is_published_after_on_failure_returns() -> None:
    """wait_idle raises only once on_failure (the engine's abort) has finished."""
    release = threading.Event()
    seen: list[RingReduceError | None] = []
    wd: Watchdog

    def slow_abort(error: RingReduceError) -> None:
        seen.append(wd.failure)
        release.wait(2.0)

    wd = Watchdog(0.05, async_error=lambda: None, on_failure=slow_abort, poll_s=POLL)
    wd.watch(1, "tensor of 1 x torch.int32", _stages(False)[0])
    assert not wd.wait_idle(timeout_s=0.3)  # on_failure still running: not published
    release.set()
    with pytest.raises(RingReduceError, match=r"stage 'collect' failed in operation #1"):
        wd.wait_idle(timeout_s=2.0)
    assert seen == [None]


def test_on_failure_that_raises_still_fails_the_operation() -> None:
    def broken(error: RingReduceError) -> None:
        raise RuntimeError("abort blew up")

    wd = Watchdog(0.05, async_error=lambda: None, on_failure=broken, poll_s=POLL)
    wd.watch(1, "tensor of 1 x torch.int32", _stages(False)[0])
    with pytest.raises(RingReduceError, match="no progress within the deadline"):
        wd.wait_idle(timeout_s=2.0)


def test_deadline_runs_from_when_an_operation_became_the_oldest() -> None:
    wd, failures, _ = _watchdog(timeout_s=0.6)
    first, first_flags = _stages(False)
    wd.watch(1, "tensor of 1 x torch.float32", first)
    wd.watch(2, "tensor of 1 x torch.float32", _stages(False)[0])
    time.sleep(0.5)
    first_flags[0].done = True  # op 2 becomes the oldest now, not at its issue
    time.sleep(0.35)  # 0.85 s after op 2's issue, 0.35 s after it became the oldest
    assert not failures.errors and wd.pending() == 1
    assert failures.called.wait(2.0)
    assert "operation #2" in str(failures.errors[0])


def test_a_query_that_raises_is_a_failure() -> None:
    class Broken:
        def query(self) -> bool:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    wd, failures, _ = _watchdog()
    wd.watch(5, "tensor of 1 x torch.float32", [("diffuse", Broken(), [1])])
    assert failures.called.wait(2.0)
    assert "stage 'diffuse'" in str(failures.errors[0])
    assert "illegal memory access" in str(failures.errors[0])


def test_the_start_step_runs_on_the_watchdogs_thread_and_cannot_stop_it() -> None:
    """CUDA sets the thread's graph-capture mode there (cuda_setup.relaxed_capture_mode):
    a step that fails is logged, and the watchdog still fails a stuck call."""
    threads: list[threading.Thread] = []

    def start() -> None:
        threads.append(threading.current_thread())
        raise OSError("libcuda.so.1: cannot open shared object file")

    wd, failures, _ = _watchdog(timeout_s=0.2, on_start=start)
    wd.watch(3, "tensor of 1 x torch.float32", _stages(False)[0])
    assert failures.called.wait(2.0), "the watchdog stopped with its start step"
    assert [t.name for t in threads] == ["ringreduce-watchdog"]
    assert "no progress within the deadline" in str(failures.errors[0])


def test_an_idle_watchdog_does_not_poll() -> None:
    wd, _, errors = _watchdog()
    wd.watch(1, "tensor of 1 x torch.float32", _stages(True)[0])
    assert wd.wait_idle(timeout_s=2.0)
    time.sleep(2 * POLL)
    calls = errors.calls
    time.sleep(20 * POLL)
    assert errors.calls == calls
    wd.stop()


def test_stop_joins_and_is_idempotent() -> None:
    wd, failures, _ = _watchdog()
    wd.stop()  # never started: nothing to join
    wd, failures, _ = _watchdog()
    wd.watch(1, "tensor of 1 x torch.float32", _stages(False)[0])
    assert wd.running
    wd.stop()
    assert not wd.running
    wd.stop()
    assert not failures.errors
    assert not wd.wait_idle(timeout_s=0.1)  # stopped with work pending: never idle
    with pytest.raises(RingReduceError, match="stopped"):
        wd.watch(2, "tensor of 1 x torch.float32", _stages(False)[0])


def test_watch_from_many_threads() -> None:
    wd, failures, _ = _watchdog()

    def issue(base: int) -> None:
        for n in range(50):
            wd.watch(base + n, "tensor of 1 x torch.float32", _stages(True, True, True)[0])

    threads = [threading.Thread(target=issue, args=(1000 * i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wd.wait_idle(timeout_s=2.0) and not failures.errors
    wd.stop()


class Issuing:
    """stuck_issue: the engine's view of the call it is issuing (None between calls)."""

    def __init__(self) -> None:
        self.issue: Issue | None = None

    def __call__(self) -> Issue | None:
        return self.issue


def test_a_call_stuck_while_issuing_fails_after_the_deadline() -> None:
    """A blocking NCCL call that never returns (connecting to an absent peer) leaves no
    event to watch: the watchdog fails it from the issue's start, idle or not."""
    issuing = Issuing()
    wd, failures, errors = _watchdog(timeout_s=0.4, stuck_issue=issuing)
    wd.start()
    started = time.monotonic()
    issuing.issue = Issue(7, "all_reduce of 8 x torch.float32", "collect", (0, 2), started)
    assert failures.called.wait(3.0), "a stuck issue was never failed"
    assert time.monotonic() - started >= 0.4  # not before the deadline
    message = str(failures.errors[0])
    assert "stage 'collect' failed on rank 1 in operation #7" in message, message
    assert "peers (group ranks) [0, 2]" in message and "issuing it did not return" in message
    assert errors.calls == 0  # idle: NCCL's async error is polled only with work pending
    with pytest.raises(RingReduceError, match="issuing it did not return"):
        wd.wait_idle(timeout_s=2.0)


def test_calls_issued_within_the_deadline_never_fail() -> None:
    issuing = Issuing()
    wd, failures, _ = _watchdog(timeout_s=0.3, stuck_issue=issuing)
    wd.start()
    for n in range(20):  # each issue takes a tenth of the deadline
        issuing.issue = Issue(n, "all_reduce of 8 x torch.float32", "collect", (0, 2),
                              time.monotonic())
        time.sleep(0.03)
        issuing.issue = None
    time.sleep(0.5)
    assert not failures.errors
    wd.stop()


def test_bad_settings_are_caller_mistakes() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        Watchdog(0, async_error=lambda: None, on_failure=lambda e: None)
    with pytest.raises(ValueError, match="poll_s"):
        Watchdog(1, async_error=lambda: None, on_failure=lambda e: None, poll_s=0)


# --- the nccl package's non-blocking helpers over a fake binding -----------------------

class _Result(enum.IntEnum):
    Success = 0
    RemoteError = 6
    InProgress = 7


class _FakeRaw:
    """The slice of nccl.bindings.nccl the helpers use; states are returned in turn,
    the last one forever."""

    Result = _Result

    def __init__(self, *states: int) -> None:
        self.states = list(states)

    def comm_get_async_error(self, handle: Any) -> int:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def get_error_string(self, code: int) -> str:
        return "remote process exited or there was a network error"

    def get_last_error(self, handle: Any) -> str:
        return "socket closed by peer\n"


class _Comm:
    def __init__(self, handle: int = 1) -> None:
        self._comm = handle


def _fake(monkeypatch: pytest.MonkeyPatch, *states: int) -> None:
    monkeypatch.setattr(library, "core", object())  # require() passes without nccl4py
    monkeypatch.setattr(library, "raw", _FakeRaw(*states))


class _OneAtATime(_FakeRaw):
    """Records how many threads are inside ncclCommGetAsyncError at once: NCCL's is not
    safe to call concurrently on a non-blocking communicator (lifecycle.py)."""

    def __init__(self) -> None:
        super().__init__(0)
        self.inside = self.most = 0
        self.guard = threading.Lock()

    def comm_get_async_error(self, handle: Any) -> int:
        with self.guard:
            self.inside += 1
            self.most = max(self.most, self.inside)
        time.sleep(1e-4)  # as the real call, the GIL is free while inside
        with self.guard:
            self.inside -= 1
        return 0


def test_polls_of_nccl_async_errors_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's async_error and the issuing thread's wait_ready on the same
    communicator, concurrently: one thread inside NCCL's poll at a time."""
    raw = _OneAtATime()
    monkeypatch.setattr(library, "core", object())
    monkeypatch.setattr(library, "raw", raw)
    comm = _Comm()

    def watchdog() -> None:
        for _ in range(300):
            assert nccl.async_error(comm) is None

    threads = [threading.Thread(target=watchdog) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(300):
        nccl.wait_ready(comm, time.monotonic() + 5, "group")
    for t in threads:
        t.join()
    assert raw.most == 1, f"{raw.most} threads polled NCCL at once"


def test_async_error_ignores_success_and_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, 0)
    assert nccl.async_error(_Comm()) is None
    _fake(monkeypatch, 7)
    assert nccl.async_error(_Comm()) is None
    _fake(monkeypatch, 6)
    assert nccl.async_error(_Comm()) == ("ncclRemoteError (remote process exited or there "
                                         "was a network error); last NCCL error: socket "
                                         "closed by peer")
    assert nccl.async_error(_Comm(0)) == "the communicator was aborted or destroyed"


def test_wait_ready_polls_until_success(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, 7, 7, 7, 0)
    nccl.wait_ready(_Comm(), time.monotonic() + 2.0, "ncclCommSplit")
    _fake(monkeypatch, 7, 6)
    with pytest.raises(RingReduceError, match=r"ncclCommSplit: NCCL reported ncclRemoteError"):
        nccl.wait_ready(_Comm(), time.monotonic() + 2.0, "ncclCommSplit")
    _fake(monkeypatch, 7)
    started = time.monotonic()
    with pytest.raises(RingReduceError, match="still in progress at the deadline"):
        nccl.wait_ready(_Comm(), started + 0.1, "ncclCommInitRankScalable")
    assert time.monotonic() - started < 1.0


class _Closing(_Comm):
    """A communicator whose ncclCommFinalize blocks until ``release`` is set (a blocking
    communicator that a live CUDA graph or a silent peer holds), or raises ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.release = threading.Event()
        self.error = error
        self.calls: list[str] = []

    def finalize(self) -> None:
        self.calls.append("finalize")
        if self.error is not None:
            raise self.error
        self.release.wait(10.0)

    def abort(self) -> None:
        self.calls.append("abort")

    def destroy(self) -> None:
        self.calls.append("destroy")


def test_blocking_finalize_is_bounded_by_the_deadline() -> None:
    stuck = _Closing()
    started = time.monotonic()
    with pytest.raises(RingReduceError, match="ncclCommFinalize: still in progress"):
        nccl.finalize_and_destroy(stuck, started + 0.2, blocking=True)
    assert 0.2 <= time.monotonic() - started < 2.0
    assert stuck.calls == ["finalize", "abort"]  # never destroyed while finalizing
    kept = _Closing()
    with pytest.raises(RingReduceError):
        nccl.finalize_and_destroy(kept, time.monotonic() + 0.1, abort=False, blocking=True)
    assert kept.calls == ["finalize"]  # a live graph: abort would wait for it too
    stuck.release.set()
    kept.release.set()


def test_blocking_finalize_destroys_once_finished_and_reports_errors() -> None:
    fine = _Closing()
    fine.release.set()
    nccl.finalize_and_destroy(fine, time.monotonic() + 2.0, blocking=True)
    assert fine.calls == ["finalize", "destroy"]
    broken = _Closing(error=RuntimeError("ncclInternalError"))
    with pytest.raises(RingReduceError, match="ncclCommFinalize: ncclInternalError"):
        nccl.finalize_and_destroy(broken, time.monotonic() + 2.0, blocking=True)
    assert broken.calls == ["finalize", "abort"]


def test_only_the_nccl_package_imports_nccl4py() -> None:
    """Every NCCL call stays in ringreduce/execution/nccl/ (the binding's one home);
    everything else goes through it."""
    package = Path(nccl.__file__).parent
    importers = []
    for path in Path(nccl.__file__).parents[2].rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom)
                     and node.level == 0 else [])
            if any(n == "nccl" or n.startswith("nccl.") for n in names):
                importers.append(path)
    assert importers and all(p.parent == package for p in importers), importers


def test_a_communicator_shared_by_a_stage_pair_is_aborted_and_polled_once() -> None:
    """Paired stages share one NCCL communicator (cuda_setup._split_stages): teardown, the
    abort after a failure and the async-error poll must see it once, named after both
    stages (NCCL's abort or destroy of a freed communicator is undefined)."""
    rail, intra, world = object(), object(), object()
    comms = {"world": world, "reduce_scatter": intra, "all_gather": intra,
             "collect": rail, "diffuse": rail}
    got = distinct(comms)
    assert list(got) == ["world", "reduce_scatter+all_gather", "collect+diffuse"]
    assert [id(c) for c in got.values()] == [id(world), id(intra), id(rail)]
    separate = {"collect": rail, "diffuse": object()}
    assert distinct(separate) == separate


@pytest.mark.parametrize(("route", "last", "want", "one_stream"), [
    ("hierarchical", "all_gather", [(s, s) for s in ("reduce_scatter", "collect", "add",
                                                     "diffuse", "all_gather")], False),
    ("one-slice", "all_gather", [("one-slice", "all_gather")], True),
    ("compressed int8", "all_gather", [("compressed int8", "all_gather")], True),
    ("flat", "flat", [("flat", "flat")], False),
    ("flat", "", [("flat", "caller")], False),
    ("", "", [("flat", "caller")], False),  # an empty tensor: nothing issued
])
def test_what_the_watchdog_waits_on_for_each_route(route: str, last: str,
                                                   want: list[tuple[str, str]],
                                                   one_stream: bool) -> None:
    """A call's ends (execution/issue.py): every stage of the pipeline, named by its
    stage; one stream for the rest, named by the route where the call is hierarchical
    on one stream (one slice, compressed: every rank is a peer there), else flat."""
    assert issue._stage_ends(last, 2, route) == want
    assert issue._one_stream(route) == one_stream
