"""Executes a call's steps: stage operations on their streams, linked by events.

The same walk runs on CUDA and on the CPU. On CUDA each stage has its own stream and
the steps only *enqueue* work: the host never waits for the device. On the CPU the
host thread is the order, so waits and records are no-ops and each stage runs to
completion before the next.

Timeline of the five streams for a tensor of three slices, D > 1 (time ->):

  reduce_scatter  [rs 0][rs 1][rs 2]
  collect               [coll 0][coll 1][coll 2]
  add                           [a0]    [a1]    [a2]
  diffuse                           [diff 0][diff 1][diff 2]
  all_gather                                [ag 0]  [ag 1]  [ag 2] -> done
                 ^ entry (caller's stream)                          caller waits

Edges ``rs_to_collect`` ... ``diffuse_to_ag`` order one slice's stages. Slot
events protect memory reused by later slices: ``collect`` of slice i+S waits on
``staging_free[i % S]``, recorded after ``add`` of slice i read the slot; the tail's
padding slot is reused only after ``all_gather`` copied it back (``padding_free``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ringreduce.errors import RingReduceError, stage_error
from ringreduce.execution import call_check
from ringreduce.execution.add import add, add_wire, finish_average
from ringreduce.execution.buffers import Buffers
from ringreduce.execution.streams import FLAT
from ringreduce.execution.transport import Part
from ringreduce.plan import schedule
from ringreduce.plan.layout import SlicePlan
from ringreduce.plan.schedule import Step, Wave
from ringreduce.safety import signature
from ringreduce.safety.flight import FlightRecorder

if TYPE_CHECKING:
    from ringreduce.execution.context import CallContext

stamp = FlightRecorder.stamp

_NO_STREAM = contextlib.nullcontext()


class SliceIO:
    """The parts of one slice and, when it has a tail, where the tail lives."""

    def __init__(self, flat: torch.Tensor, plan: SlicePlan, step: Step, buffers: Buffers,
                 wire: torch.dtype | None) -> None:
        topo = buffers.topo
        self.parts: list[Part] = []
        if plan.k:
            body = flat[plan.offset:plan.offset + plan.body]
            view = body.view(topo.devices_per_machine, topo.machines, plan.k)
            rows, out = buffers.staging(step.staging_slot, flat.dtype, plan.k, wire)
            self.parts.append(Part(view, rows, out))
        self.tail: torch.Tensor | None = None
        self.pad: Part | None = None
        if step.padding_slot is not None:
            self.tail = flat[plan.offset + plan.body:plan.offset + plan.numel]
            self.pad = buffers.padding(step.padding_slot, flat.dtype, wire)
            self.parts.append(self.pad)

    def copy_in(self, sync: Any, stage: str) -> None:
        """Tail into the padding slot. The slot's other elements are left as they
        are: their results are never read back."""
        if self.pad is not None and self.tail is not None:
            sync.copy(stage, self.pad.view.view(-1)[:self.tail.numel()], self.tail)

    def copy_out(self, sync: Any, stage: str) -> None:
        if self.pad is not None and self.tail is not None:
            sync.copy(stage, self.tail, self.pad.view.view(-1)[:self.tail.numel()])


def run_waves(waves: Sequence[Wave], flat: torch.Tensor, plans: Sequence[SlicePlan],
              op: str, ctx: CallContext) -> None:
    """Unpipelined meaning, per slice s:
        view = s.as(D, M, k); rs(view); collect(view); add(view); diffuse(view); ag(view)
    ``ctx`` carries topology, transport, sync (streams) and buffers. Each wave enqueues
    its NCCL steps' waits, their operations as one group, their records, and then its
    add steps, each with its waits and records (schedule.waves says why that order)."""
    stages = schedule.active_stages(ctx.topo.devices_per_machine)
    end = _EndCheck(ctx, flat, op, stages[-1], len(plans) - 1) if ctx.check else None
    ios: dict[int, SliceIO] = {}
    for wave in waves:
        todo = [(step, _io(ios, step, flat, plans, ctx)) for step in wave]
        grouped = [(step, io) for step, io in todo if step.stage != schedule.AFTER_GROUP]
        for step, _ in grouped:
            ctx.sync.wait(step.stage, step.waits)
            stamp(ctx.record, step.stage, step.slice_index, "start")
        if grouped:
            closing = end if end is not None and any(end.closes(s) for s, _ in grouped) else None
            _issue_wave(grouped, stages, flat, op, ctx, closing)
        for step, io in todo:
            if step.stage == schedule.AFTER_GROUP:
                ctx.sync.wait(step.stage, step.waits)
                stamp(ctx.record, step.stage, step.slice_index, "start")
                with _on_step(ctx, step, io, flat):
                    _run_stage(step.stage, io.parts, op, ctx)
            elif step.stage == stages[-1]:
                del ios[step.slice_index]
            ctx.sync.record(step.stage, step.records)
            stamp(ctx.record, step.stage, step.slice_index, "end")


def _io(ios: dict[int, SliceIO], step: Step, flat: torch.Tensor,
        plans: Sequence[SlicePlan], ctx: CallContext) -> SliceIO:
    io = ios.get(step.slice_index)
    if io is None:
        io = ios[step.slice_index] = SliceIO(flat, plans[step.slice_index], step,
                                             ctx.buffers, ctx.wire)
    return io


class _EndCheck:
    """The end-of-call check of one call (call_check.py): its signature, and the step
    whose wave carries it (the last slice's last stage), on whose stream it runs."""

    def __init__(self, ctx: CallContext, flat: torch.Tensor, op: str, last_stage: str,
                 last_slice: int) -> None:
        self.check, self.stage, self.last_slice = ctx.check, last_stage, last_slice
        self.own = signature.encode(flat.numel(), str(flat.dtype).removeprefix("torch."), op)

    def closes(self, step: Step) -> bool:
        return step.stage == self.stage and step.slice_index == self.last_slice


def _issue_wave(todo: Sequence[tuple[Step, SliceIO]], stages: Sequence[str],
                flat: torch.Tensor, op: str, ctx: CallContext,
                end: _EndCheck | None = None) -> None:
    """The wave's NCCL steps in three phases: what precedes the NCCL kernels on their
    streams (tail copies in, wire narrowing); their NCCL operations as one group
    (nothing but NCCL inside it: a group defers NCCL's launches to its end, not
    CUDA's); what must follow them (wire widening, tail copies back). ``end``: this
    wave closes the call, and carries its end-of-call check (in the group after the
    stages' operations, over every rank). A failure names its step, or every stage of
    the group."""
    grouped = [step.stage for step, _ in todo]
    for step, io in todo:
        with _on_step(ctx, step, io, flat):
            if step.stage == stages[0]:
                io.copy_in(ctx.sync, step.stage)
            ctx.transport.prepare(step.stage, io.parts, ctx.sync.handle(step.stage))
    if end is not None:
        end.check.put(ctx, end.own, ctx.sync.handle(end.stage))
        if end.check.hops[0] not in grouped:
            grouped.append(end.check.hops[0])
    with _wave_errors(ctx, grouped, todo, flat), ctx.transport.group(grouped):
        for step, io in todo:
            with stage_errors(ctx, step.stage, flat, str(step.slice_index)):
                _run_stage(step.stage, io.parts, op, ctx)
        if end is not None:
            with stage_errors(ctx, call_check.STAGE, flat):
                end.check.exchange(ctx, 0, ctx.sync.handle(end.stage))
    for step, io in todo:
        with _on_step(ctx, step, io, flat):
            ctx.transport.finish(step.stage, io.parts, ctx.sync.handle(step.stage))
            if step.stage == stages[-1]:
                io.copy_out(ctx.sync, step.stage)
    if end is not None:
        _finish_check(end, flat, ctx)


def _finish_check(end: _EndCheck, flat: torch.Tensor, ctx: CallContext) -> None:
    """The end-of-call check's further hops, a group each, then its verdict; all on
    the stream of the stage that closed the call."""
    stream = ctx.sync.handle(end.stage)
    for hop in range(1, len(end.check.hops)):
        with stage_errors(ctx, call_check.STAGE, flat), \
                ctx.transport.group([end.check.hops[hop]]):
            end.check.exchange(ctx, hop, stream)
    end.check.verify(ctx, end.own, stream)


@contextlib.contextmanager
def _on_step(ctx: CallContext, step: Step, io: SliceIO, flat: torch.Tensor) -> Iterator[None]:
    """Torch ops of ``step`` on its stream, failures named after it. NCCL calls and
    native kernels take their stream explicitly; only torch ops (tail copies; without
    cupy the add and the wire casts) need it current, and entering a torch stream
    context costs host time on every step."""
    torch_ops = ctx.kernels is None or io.pad is not None
    with ctx.sync.on(step.stage) if torch_ops else _NO_STREAM, \
            stage_errors(ctx, step.stage, flat, str(step.slice_index)):
        yield


@contextlib.contextmanager
def _wave_errors(ctx: CallContext, grouped: Sequence[str],
                 todo: Sequence[tuple[Step, SliceIO]], t: torch.Tensor) -> Iterator[None]:
    """Failures of the group itself (ncclGroupEnd) name all its stages and peers; the
    names are only built on a failure, not on every wave."""
    try:
        yield
    except Exception:
        if not grouped:
            raise
        peers = sorted({p for stage in grouped for p in ctx.topo.peers(stage)})
        slices = ",".join(str(step.slice_index) for step, _ in todo)
        with _errors(ctx, "+".join(grouped), slices, peers, t):
            raise


def _run_stage(stage: str, parts: Sequence[Part], op: str, ctx: CallContext) -> None:
    handle = ctx.sync.handle(stage)
    if stage == "add":
        d, m = ctx.topo.device_index, ctx.topo.machine_index
        for p in parts:
            if p.wire_out is not None and ctx.kernels is not None:
                ctx.kernels.add_wire(p.view[d][m], p.staging, p.wire_out[0], op,
                                     ctx.topo.world_size, handle)
            elif p.wire_out is not None:
                add_wire(p.view[d][m], p.staging, p.wire_out[0], op, ctx.topo.world_size)
            elif ctx.kernels is not None:
                ctx.kernels.add(p.view[d][m], p.staging, op, ctx.topo.world_size, handle)
            else:
                add(p.view[d][m], p.staging, op, ctx.topo.world_size)
    elif stage == "reduce_scatter":
        ctx.transport.reduce_scatter(parts, op, handle)
    else:
        getattr(ctx.transport, stage)(parts, handle)


def flat_here(t: torch.Tensor, op: str, ctx: CallContext, stream: int | None) -> None:
    """all_reduce(t, op) on ``stream``, which must be current. Synchronous calls use
    the caller's stream, like ``dist.all_reduce``: at sizes where the flat route is
    taken, host time is the cost, and events plus a stream switch are a third of it."""
    with stage_errors(ctx, FLAT, t):
        ctx.transport.flat_all_reduce(t, op, stream)
        if op == "avg":
            finish_average(t, ctx.topo.world_size, ctx.divisors.get(t.dtype))


def stage_errors(ctx: CallContext, stage: str, t: torch.Tensor,
                 slice_index: str = "-") -> contextlib.AbstractContextManager[None]:
    """Failures inside ``stage`` become RingReduceError naming the stage's peers."""
    return _errors(ctx, stage, slice_index, ctx.topo.peers(stage), t)


@contextlib.contextmanager
def _errors(ctx: CallContext, stage: str, slice_index: str, peers: Sequence[int],
            t: torch.Tensor) -> Iterator[None]:
    try:
        yield
    except (ValueError, TypeError, AssertionError):
        raise
    except Exception as exc:
        if isinstance(exc, RingReduceError) and exc.stage is not None:
            raise  # an inner step already named its stage
        raise stage_error(
            stage, ctx.topo.rank,
            f"operation #{ctx.op_number} (slice {slice_index}, tensor of {t.numel()} x "
            f"{t.dtype})", peers, exc) from exc
