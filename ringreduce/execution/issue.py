"""Issuing a checked call: how one collective becomes work, on CUDA or on the CPU.

Owns everything between a Communicator's checks and the work itself. On CUDA: the
issue lock and the watchdog's view of a call being issued, the choice between the
native issuer (native.py), the caller's own capture and issuing from Python
(pipeline.py's step loop, one_slice.py or a flat all-reduce), the CUDA-aware
Futures, and the events the watchdog waits on (memory_order.py keeps calls on the same
memory in issue order). On the CPU: the one worker thread that runs calls in order,
and Futures over its jobs. engine.py keeps the public surface (checks, routing
names) and engine_calls.py the numbering and the flight record; they hand each call
here.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from ringreduce.config import Config
from ringreduce.errors import RingReduceError
from ringreduce.execution import compressed, feedback, one_slice
from ringreduce.execution.context import CallContext
from ringreduce.execution.memory_order import MemoryOrder
from ringreduce.execution.pipeline import flat_here, run_waves
from ringreduce.execution.resources import Resources
from ringreduce.execution.streams import FLAT
from ringreduce.plan import schedule
from ringreduce.plan.schedule import DONE, ENTRY
from ringreduce.plan.slicing import TWO_LEVEL, UNSLICED, Choice
from ringreduce.safety.flight import Record

CALLER = "caller"
"""Stands for the caller's current stream in a call's stream ends."""

Ends = list[tuple[str, Any]]
"""(stage label, stream name or completion) pairs the watchdog waits on for a call."""


class Issuer:
    """Issues one Communicator's calls over its Resources, in the order they come:
    CUDA work is enqueued on the calling thread, CPU work queued to one worker."""

    def __init__(self, res: Resources, config: Config) -> None:
        self.res = res
        self.config = config
        """The Communicator's, replaced with it (Communicator.config): min_bytes is read
        per call."""
        self.wire = getattr(torch, config.wire_dtype) if config.wire_dtype else None
        self.worker = None if res.is_cuda else concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="ringreduce")
        self._stage_peers: dict[str, tuple[int, ...]] = {}
        self.memory = MemoryOrder(res)
        """One order for calls on the same memory (CUDA)."""

    # --- where a call goes ---------------------------------------------------------------

    def hierarchical_blocks(self, whole: torch.Tensor) -> bool:
        topo = self.res.topo
        return (topo.machines > 1 and topo.devices_per_machine > 1
                and whole.numel() * whole.element_size() >= self.config.min_bytes)

    def choice(self, t: torch.Tensor) -> Choice:
        """The route chosen for a call of ``t``'s size (Resources.plan, the probe's)."""
        return self.res.plan.at(t.numel() * t.element_size())

    def below_hierarchy(self, t: torch.Tensor) -> bool:
        """Whether ``t`` takes the flat route whatever was chosen (one machine, or below
        ``min_bytes``)."""
        return (self.res.topo.machines == 1
                or t.numel() * t.element_size() < self.config.min_bytes)

    def route_flat(self, t: torch.Tensor) -> bool:
        """Whether an exact all_reduce of ``t`` takes NCCL's flat all-reduce: below the
        hierarchy, or where the probe found it fastest (a float32 call narrowed by a
        16-bit wire keeps the pipeline: the probe did not time that wire)."""
        return self.below_hierarchy(t) or (self.choice(t).flat and not self._narrows(t))

    def unsliced(self, t: torch.Tensor) -> str:
        """The plan a hierarchical all_reduce of ``t`` takes when it is one slice or
        two-level (Resources.plan), else "" (the pipeline); a 16-bit wire for float32 is
        the pipeline's (its add narrows the rail rows)."""
        plan = self.choice(t).plan
        return plan if plan in UNSLICED and not self._narrows(t) else ""

    def takes_wire(self, t: torch.Tensor, explicit: bool) -> bool:
        """Whether a call the communicator's 8- or 4-bit wire carries takes the compressed
        route: above the hierarchy's threshold, and where the probe did not find exact as
        fast at its size; a call's own ``wire=`` (``explicit``) always does."""
        return not self.below_hierarchy(t) and (explicit or self.choice(t).wire)

    def _narrows(self, t: torch.Tensor) -> bool:
        return self.wire is not None and t.dtype == torch.float32

    def ctx(self, record: Record) -> CallContext:
        return CallContext(self.res, record)

    # --- CUDA: issued on the calling thread ----------------------------------------------

    def issue_cuda(self, record: Record, on_cuda: Callable[[Record], tuple[Any, Ends]]) -> Any:
        """``on_cuda(record)`` under the issue lock, watched while it is inside NCCL, its
        streams then handed to the watchdog. Returns its Future (or None)."""
        res = self.res
        with res.issue_lock:
            res.issuing = (record, time.monotonic())  # watched: NCCL may block inside
            try:
                fut, ends = on_cuda(record)
            except RingReduceError as exc:
                res.fail(exc, record)
                if res.guard.failure is not exc:  # the watchdog's abort ended the call:
                    raise RingReduceError(str(res.guard.failure)) from exc  # say why
                raise
            finally:
                res.issuing = None
            self._watch(record, ends)
        res.guard.finish(record)  # on CUDA: issued (the device finishes later)
        return fut

    def all_reduce(self, t: torch.Tensor, op: str, async_op: bool,
                   record: Record) -> tuple[Any, Ends]:
        """One all_reduce on CUDA: the native issuer when it takes the call (a
        hierarchical call, either plan, outside a capture), else from Python (in the
        caller's capture if any)."""
        capturing = torch.cuda.is_current_stream_capturing()
        native = self.res.native
        if native is not None:  # native.py; captures stay on this thread
            plan = self.unsliced(t)
            program = None if capturing or not t.numel() or self.route_flat(t) \
                else native.program(t, op, lambda: self.ctx(record), plan)
            if program is not None:
                record.why = self.choice(t).why
                return self._replay(t, program, async_op, record, plan)
        return self._from_python(t, async_op, record,
                                 lambda: self.execute(t, op, record, inline=not async_op))

    def compressed(self, t: torch.Tensor, op: str, spec: feedback.Spec, async_op: bool,
                   record: Record) -> tuple[Any, Ends]:
        """One all_reduce on the compressed route on CUDA (compressed.py): replayed by
        the native issuer where it takes the call (float32, the fused kernels, outside
        a capture), else from Python; either way on the last stage's stream after the
        caller's, so that calls sharing error-feedback memory run in one order."""
        route = f"compressed {spec.wire}"
        native = self.res.native
        if native is not None and t.dtype == torch.float32 and self.res.kernels is not None \
                and t.numel() and not torch.cuda.is_current_stream_capturing():
            program = native.program(t, op, lambda: self.ctx(record), spec)
            if program is not None:
                return self._replay(t, program, async_op, record, route)
        end = schedule.active_stages(self.res.topo.devices_per_machine)[-1]

        def run() -> str:
            ctx = self.ctx(record)
            on = compressed.On(self.res.sync.handle(end), end, compressed.Scratch(t.device))
            return self._on_stream(end, ctx, lambda: compressed.all_reduce(
                t.view(-1), op, spec.format, spec.block, spec.errors, ctx, on))
        return self._from_python(t, async_op, record, run)

    def _replay(self, t: torch.Tensor, program: Any, async_op: bool, record: Record,
                plan: str) -> tuple[Any, Ends]:
        """A traced program issued by the native issuer, after earlier calls on ``t``."""
        native = self.res.native
        after = self.memory.after_pending(t, native_jobs=True)
        fut, ends = native.issue(t, program, async_op, record, after, plan)
        if async_op:
            self.memory.pend(t, ends[0][1].seq)
        return fut, ends

    def _from_python(self, t: torch.Tensor, async_op: bool, record: Record,
                     execute: Callable[[], str]) -> tuple[Any, Ends]:
        """``execute()`` (returns the stream that ends the call, execute's way) issued
        from this thread, after earlier calls on ``t``, in the caller's capture if
        any."""
        if not torch.cuda.is_current_stream_capturing():
            self.memory.after_pending(t)
            return self._issue_now(t, async_op, record, execute)
        self.res.user_captures += 1  # closing waits for it (cuda_setup.finalize)
        with self.res.sync.capturing():
            return self._issue_now(t, async_op, record, execute)

    def inline(self, run: Callable[[CallContext, int], None], record: Record,
               async_op: bool, result: torch.Tensor, *reads: torch.Tensor) -> tuple[Any, Ends]:
        """CUDA: ``run`` on the caller's current stream (no stage streams to join),
        writing ``result`` and reading ``reads``. Returns the Future (or None) and what
        the watchdog should watch."""
        if not torch.cuda.is_current_stream_capturing():
            self.memory.after_pending(result, *reads)
        if result.numel():
            run(self.ctx(record), self.res.sync.caller().cuda_stream)
        ends: Ends = [(record.kind, CALLER)]
        if not async_op:
            return None, ends
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[result.device])
        fut.set_result(result)  # records an event on the current stream
        return fut, ends

    def execute(self, t: torch.Tensor, op: str, record: Record, inline: bool = True) -> str:
        """Issue (CUDA) or run (CPU) one all_reduce. Returns the stage whose stream ends
        the call, or "" when the work went onto the caller's stream (nothing to wait for)."""
        if t.numel() == 0:
            return ""
        t = untracked(t)
        res, ctx = self.res, self.ctx(record)
        if self.route_flat(t):
            record.route = "flat"
            if not self.below_hierarchy(t):
                record.why = self.choice(t).why
            return self._unsliced(flat_here, t, op, ctx, inline)
        record.why = self.choice(t).why
        plan = self.unsliced(t)
        if plan:
            record.route = plan
            run = functools.partial(_run_unsliced, apart=plan == TWO_LEVEL)
            if res.native is not None:
                # on the replays' stream: one-slice calls share the end-of-call check's
                # buffers, so they must all run on one stream (call_check.py)
                end = schedule.active_stages(res.topo.devices_per_machine)[-1]
                return self._unsliced(run, t, op, ctx, False, end)
            return self._unsliced(run, t, op, ctx, inline)
        record.route = "hierarchical"
        res.sync.enter()
        topo = res.topo
        ctx.wire = self.wire if t.dtype == torch.float32 else None
        plans, waves = schedule.plan_waves(
            t.numel(), t.element_size(), topo.devices_per_machine, topo.machines,
            res.call_slice_bytes(t.numel() * t.element_size()), res.staging_slots,
            "add" if ctx.wire is None else "diffuse")
        run_waves(waves, t.view(-1), plans, op, ctx)
        return schedule.active_stages(topo.devices_per_machine)[-1]

    def _unsliced(self, run: Callable[[torch.Tensor, str, CallContext, int | None], None],
                  t: torch.Tensor, op: str, ctx: CallContext, inline: bool,
                  stream: str = FLAT) -> str:
        """A call issued as a few collectives on one stream (the flat route, one
        slice): the caller's when ``inline`` (synchronous calls, like
        ``dist.all_reduce``: events and a stream switch would cost a third of the
        host time), else ``stream`` (_on_stream)."""
        if inline:
            run(t.view(-1), op, ctx, self.res.sync.caller().cuda_stream if self.res.is_cuda
                else None)
            return ""
        return self._on_stream(stream, ctx,
                               lambda: run(t.view(-1), op, ctx, ctx.sync.handle(stream)))

    def _on_stream(self, stream: str, ctx: CallContext, run: Callable[[], None]) -> str:
        """``run()`` with ``stream`` (a stage's or the flat one) current, after the
        caller's stream (the entry event); a stage's records the done event a
        synchronous call's caller waits for. Returns ``stream``."""
        self.res.sync.enter()
        ctx.sync.wait(stream, [ENTRY])
        with ctx.sync.on(stream):
            run()
        if stream != FLAT:  # calls on the flat stream here are asynchronous: no leave()
            ctx.sync.record(stream, [DONE])
        return stream

    def _issue_now(self, t: torch.Tensor, async_op: bool, record: Record,
                   execute: Callable[[], str]) -> tuple[Any, Ends]:
        last = execute()
        sync = self.res.sync
        ends = _stage_ends(last, self.res.topo.devices_per_machine, record.route)
        if not async_op:
            if last:
                sync.leave()
            return None, ends
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[t.device])
        if not last:
            fut.set_result(t)
            return fut, ends
        if not torch.cuda.is_current_stream_capturing():
            self.memory.pend(t, last)
        sync.adopt(t, (*schedule.STAGES, FLAT))
        sync.complete(last, fut, t)  # its event on the last stage's stream
        return fut, ends

    def _watch(self, record: Record, ends: Ends) -> None:
        """Hand the issued call to the watchdog: one fresh event per stream it used
        (stage label, stream), recorded after its last work there."""
        res = self.res
        if res.watchdog is None:
            return
        # A native call is never captured and records nothing here, so it asks CUDA
        # nothing. Another call may be inside a capture, whose work runs at replay:
        # events recorded now would mean nothing.
        native = all(not isinstance(stream, str) for _, stream in ends)
        if not native and torch.cuda.is_current_stream_capturing():
            return
        done = []
        for label, stream in ends:
            if not isinstance(stream, str):  # the native issuer's completion (native.py)
                done.append((label, stream, self._peers(label)))
                continue
            event = torch.cuda.Event()
            event.record(res.sync.caller() if stream == CALLER
                         else res.sync.streams[stream])
            # a call on one stream (one slice, compressed) has every rank as its peers
            done.append((label, event, self._peers(label if _one_stream(label) else stream)))
        res.watchdog.watch(record.op_number, f"{record.kind} of {record.numel} x {record.dtype}",
                           done)

    def _peers(self, stage: str) -> tuple[int, ...]:
        """Topology.peers, computed once per stage: every call names them."""
        peers = self._stage_peers.get(stage)
        if peers is None:
            peers = self._stage_peers[stage] = self.res.topo.peers(stage)
        return peers

    # --- CPU: run in order on one worker thread ------------------------------------------

    def queue_cpu(self, record: Record,
                  on_cpu: Callable[[Record], Any]) -> concurrent.futures.Future[None]:
        """``on_cpu(record)`` queued behind earlier calls on the worker thread."""
        return self.worker.submit(self._run_cpu, on_cpu, record)  # type: ignore[union-attr]

    def _run_cpu(self, run: Callable[[Record], Any], record: Record) -> None:
        """One call on the worker thread; a failure poisons the calls queued behind it."""
        guard = self.res.guard
        guard.check_usable()
        try:
            run(record)
        except RingReduceError as exc:
            guard.fail(exc, record)
            raise
        guard.finish(record)

    def wait_cpu(self) -> None:
        """Until the calls queued so far ran."""
        self.worker.submit(lambda: None).result()  # type: ignore[union-attr]

    def close(self) -> None:
        """Let the queued CPU calls finish; no more are taken."""
        if self.worker is not None:
            self.worker.shutdown(wait=True)


def untracked(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory without autograd's view of it. The stages write views of the
    caller's tensor in place; autograd refuses that for a leaf that requires grad, or
    a view an op like ``split`` made ("... is being modified inplace"), while gloo and
    NCCL write through C++ and never ask it. ``dist.all_reduce`` does not record the
    reduction in the graph either, so neither do we."""
    return t.detach() if t.requires_grad else t


def _stage_ends(last: str, devices: int, route: str) -> Ends:
    """(stage, stream) pairs whose completion means an all_reduce finished: every
    active stage for the pipeline (in order, so the watchdog names the first stuck
    one), else the one stream of a call issued on one (flat, one slice, compressed:
    the flat stream, a stage's or the caller's), labelled with its route."""
    if route == "hierarchical":
        return [(s, s) for s in schedule.active_stages(devices)]
    return [(route if _one_stream(route) else FLAT, last or CALLER)]


def _one_stream(route: str) -> bool:
    """Whether ``route`` runs a hierarchical call on one stream (every rank its peers)."""
    return route in UNSLICED or route.startswith("compressed")


def _run_unsliced(flat: torch.Tensor, op: str, ctx: CallContext, stream: int | None,
                  apart: bool) -> None:
    """one_slice.run, the two-level plan's way when ``apart``."""
    one_slice.run(flat, op, ctx, stream, apart)


def as_torch_future(job: concurrent.futures.Future[Any],
                     t: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def done(j: concurrent.futures.Future[Any]) -> None:
        exc = j.exception()
        if exc is not None:
            fut.set_exception(exc)  # type: ignore[arg-type]  # torch's stub: "result: T"
        else:
            fut.set_result(t)

    job.add_done_callback(done)
    return fut
