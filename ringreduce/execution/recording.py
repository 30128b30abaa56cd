"""Recording: a call's CUDA and NCCL work, traced once into a native program.

The Python issuer (pipeline.run_waves) already makes exactly the right CUDA and NCCL
calls; what costs is making ~100 of them from Python. So the same walk runs once per
plan key (numel, dtype, op, base alignment) against *recording*
collaborators:

  pipeline.run_waves --sync-->      RecordedStreams   wait/record events, tail copies
                     --transport--> NcclTransport(calls=RecordedNccl)  NCCL groups
                     --kernels-->   Kernels copy with ``emit`` set      kernel launches

which write instructions into a Recorder instead of executing them. A one-slice call
(one_slice.run) and a compressed one (compressed.all_reduce, with work buffers made
once and kept beside the program) are walked the same way, on the last stage's stream:
the job's entry wait, their groups, kernels and copies, then the flag and done event
on that stream.
The result is a validated ``_native.Program`` (native/program.h): pointers inside the
caller's tensor are stored relative to its start, staging and padding pointers
absolutely. Replaying it is native.py's.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import struct
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ringreduce.errors import RingReduceError
from ringreduce.execution import call_check, compressed, feedback, nccl, one_slice
from ringreduce.execution.pipeline import run_waves
from ringreduce.execution.transport import NcclTransport
from ringreduce.plan import schedule
from ringreduce.plan.schedule import ENTRY
from ringreduce.plan.slicing import TWO_LEVEL, UNSLICED

if TYPE_CHECKING:
    from ringreduce.execution.context import CallContext

_INSTR = struct.Struct("<9q")
_ARG = struct.Struct("<2q")


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
        self.depth = 0

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """A group; one inside another is recorded as part of it (NCCL merges nested
        groups into the outermost, and a program holds no nesting: native/program.cpp)."""
        outer = self.depth == 0
        if outer:
            self.rec.emit("group_start")
        self.depth += 1
        yield
        self.depth -= 1
        if outer:
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
        self.all_reduce_into(comm, t, t, op, stream)

    def all_reduce_into(self, comm: Any, send: torch.Tensor, recv: torch.Tensor, op: str,
                        stream: int) -> None:
        self.rec.emit("all_reduce", comm._comm, send.data_ptr(), recv.data_ptr(), send.numel(),
                      nccl.dtype_code(send.dtype) | nccl.op_code(op) << 8, stream,
                      pointers=(1, 2))


class RecordedStreams:
    """CudaStreams' eager behaviour (stage tails left to stream order), recorded: the
    same named events and stage streams; ENTRY becomes the job's own entry event."""

    def __init__(self, real: Any, recorder: Recorder) -> None:
        self.real, self.rec = real, recorder

    def handle(self, stage: str) -> int:
        self.rec.stage = self.rec.stages.index(stage)  # what the next instructions serve
        return self.real.handle(stage)

    def wait(self, stage: str, names: Sequence[str]) -> None:
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
        assert dst.dtype == src.dtype and dst.numel() == src.numel(), (dst.shape, src.shape)
        self.rec.emit("memcpy", dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size(),
                      self.handle(stage), pointers=(0, 1))



class StagedTransport(NcclTransport):
    """A call walked on one stream (one slice, compressed) is named after the group
    that failed: each group sets the recorder's stage, mapped by ``stage_of_group``
    where a group's first communicator is not a stage's own (one_slice.STAGE_OF_GROUP)."""

    def __init__(self, rec: Recorder, stage_of_group: dict[str, str], *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rec, self.stage_of_group = rec, stage_of_group

    def group(self, stages: Sequence[str]) -> contextlib.AbstractContextManager[None]:
        if stages:
            stage = self.stage_of_group.get(stages[0], stages[0])
            if stage in self.rec.stages:
                self.rec.stage = self.rec.stages.index(stage)
        return super().group(stages)


def walk_one_slice(t: torch.Tensor, op: str, ctx: CallContext, stages: Sequence[str],
                   apart: bool = False) -> None:
    """A one-slice (two-level when ``apart``) call against recording collaborators: on
    the last stage's stream, whose flag and done event end the job (no event joins it
    to another), after the job's entry event."""
    stream = ctx.sync.handle(stages[-1])
    ctx.sync.wait(stages[-1], [ENTRY])
    one_slice.run(t.view(-1), op, ctx, stream, apart)


def walk_compressed(t: torch.Tensor, op: str, ctx: CallContext, stages: Sequence[str],
                    spec: feedback.Spec, keep: list[torch.Tensor]) -> None:
    """A compressed call against recording collaborators, on the last stage's stream
    as walk_one_slice's. Its work buffers are made here, once, on that stream (the
    caching allocator's order for them is the replays'), into ``keep``, which the
    native issuer holds beside the program; the copies into and out of them become
    memcpy instructions, so the tensor must be float32 (a widening copy is a torch
    op: 16-bit tensors take the route from Python)."""
    if t.dtype != torch.float32:
        raise ValueError(f"the compressed route replays float32 tensors only, not {t.dtype}")
    end = stages[-1]
    stream = ctx.sync.handle(end)
    ctx.sync.wait(end, [ENTRY])
    with ctx.sync.real.on(end):  # the buffers are made on the stream that uses them
        on = compressed.On(stream, end, compressed.Scratch(t.device, keep))
        compressed.all_reduce(t.view(-1), op, spec.format, spec.block, spec.errors, ctx, on)


def trace(res: Any, wire: torch.dtype | None, stages: Sequence[str], t: torch.Tensor,
          op: str, ctx: CallContext, route: str | feedback.Spec,
          keep: list[torch.Tensor]) -> Any:
    """The program of this call: its plan walked against recording collaborators
    (``route``: "" the pipeline, ONE_SLICE or TWO_LEVEL, or a feedback.Spec); the
    memory it points into beyond the tensor and the communicator's (a compressed
    call's work buffers, the end-of-call check's words) goes into ``keep``, which
    must live as long as the program. Nothing is issued."""
    topo = res.topo
    rec = Recorder(t.data_ptr(), t.numel() * t.element_size(), stages)
    kernels = copy.copy(res.kernels)
    kernels.emit = rec
    ctx.kernels = kernels
    ctx.recording = True
    ctx.sync = RecordedStreams(res.sync, rec)
    transport = res.transport
    calls, comms = RecordedNccl(rec), transport.comms
    if ctx.check is not None:  # its words written once, now: no put per replay
        last = res.sync.streams[stages[-1]]
        ctx.check = call_check.KeptWords(
            ctx.check, lambda own: call_check.written_words(own, last), keep)
    if isinstance(route, feedback.Spec):
        ctx.transport = StagedTransport(rec, {}, topo, comms, kernels, calls=calls,
                                        gathers=transport.gathers)
        walk_compressed(t, op, ctx, stages, route, keep)
    elif route in UNSLICED:
        ctx.transport = StagedTransport(rec, one_slice.STAGE_OF_GROUP, topo, comms, kernels,
                                        calls=calls, gathers=transport.gathers)
        walk_one_slice(t, op, ctx, stages, route == TWO_LEVEL)
    else:
        ctx.wire = wire if t.dtype == torch.float32 else None
        plans, waves = schedule.plan_waves(
            t.numel(), t.element_size(), topo.devices_per_machine, topo.machines,
            res.call_slice_bytes(t.numel() * t.element_size()), res.staging_slots,
            "add" if ctx.wire is None else "diffuse")
        ctx.transport = NcclTransport(topo, comms, kernels, calls=calls,
                                      gathers=transport.gathers)
        run_waves(waves, t.view(-1), plans, op, ctx)
    rec.stage = len(stages) - 1
    rec.emit("write_flag")
    return rec.program()
