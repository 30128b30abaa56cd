"""Communicator: the public object. Checks input, routes a call, hands out futures.

A call takes one of three routes, each a deliberate decision:
  * one machine (M == 1), or a tensor below ``min_bytes``: NCCL's (gloo's) own flat
    all-reduce on the whole group, because on NVLink alone and for latency-bound
    sizes nothing beats it (Fairring lost both cases by not having this route);
  * otherwise the hierarchical pipeline of pipeline.py, with reduce-scatter and
    all-gather skipped when each machine has one device.
The CUDA route only enqueues work (no host-device synchronisation); the CPU route
runs the same plan over gloo on one worker thread, so calls keep their order.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ringreduce.config import Config
from ringreduce.errors import RingReduceError
from ringreduce.execution import collectives
from ringreduce.execution.context import CallContext
from ringreduce.execution.pipeline import flat_here, run_flat, run_waves
from ringreduce.execution.resources import Resources, build_resources, group_store
from ringreduce.execution.streams import FLAT
from ringreduce.plan import schedule
from ringreduce.plan.topology import Topology
from ringreduce.safety import checks
from ringreduce.safety.flight import Record

log = logging.getLogger("ringreduce")

_WIRE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


class Communicator:
    """Hierarchical all-reduce over ``group`` (default: the whole world).

    Collective: every rank of the group constructs it, in the same order as other
    communicators. See Config for ``machines``, ``slice_bytes``, ``staging_bytes``,
    ``min_bytes``, ``wire_dtype`` and ``graphs``; explicit arguments win over
    ``RINGREDUCE_*`` variables.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, machines: int | None = None,
                 slice_bytes: int | None = None, staging_bytes: int | None = None,
                 min_bytes: int | None = None, wire_dtype: torch.dtype | None = None,
                 graphs: int | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ringreduce.Communicator needs torch.distributed: call "
                               "dist.init_process_group(...) first")
        wire = None if wire_dtype is None else _WIRE_NAMES.get(wire_dtype)
        if wire_dtype is not None and wire is None:
            raise TypeError(f"wire_dtype={wire_dtype} is not supported; use torch.bfloat16, "
                            "torch.float16 or None")
        self.config = Config.from_env(machines=machines, slice_bytes=slice_bytes,
                                      staging_bytes=staging_bytes, min_bytes=min_bytes,
                                      wire_dtype=wire, graphs=graphs)
        group = group or dist.group.WORLD
        world = dist.get_world_size(group)
        self._setup(group_store(group, world), dist.get_rank(group), world, _device_of(group))

    @classmethod
    def _on_store(cls, store: dist.Store, rank: int, world: int, device: torch.device,
                  **settings: Any) -> Communicator:
        """A communicator over ``world`` ranks meeting in ``store``, without a
        torch.distributed group (the "ringreduce" backend builds its engine so)."""
        self = cls.__new__(cls)
        self.config = Config.from_env(**settings)
        self._setup(store, rank, world, device)
        return self

    def _setup(self, store: dist.Store, rank: int, world: int, device: torch.device) -> None:
        self._wire = getattr(torch, self.config.wire_dtype) if self.config.wire_dtype else None
        self._res: Resources = build_resources(store, rank, world, device, self.config)
        self._op_number = 0
        self._cursor = schedule.Cursor()
        self._closed = False
        self._worker = None if self._res.is_cuda else concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="ringreduce")
        if self._res.topo.rank == 0:
            log.info("ringreduce: %s", self.describe())

    @property
    def topology(self) -> Topology:
        """machines, devices_per_machine, machine_index, device_index (and ranks)."""
        return self._res.topo

    @property
    def op_number(self) -> int:
        return self._op_number

    def describe(self) -> str:
        """The effective configuration, one line (logged once on rank 0)."""
        t, r = self._res.topo, self._res
        return (f"{t.machines} machines x {t.devices_per_machine} devices, "
                f"{'cuda (nccl ' + str(r.nccl_version) + ')' if r.is_cuda else 'cpu (gloo)'}, "
                f"slice_bytes={r.slice_bytes}, staging_bytes={self.config.staging_bytes} "
                f"({r.staging_slots} slots), min_bytes={self.config.min_bytes}, "
                f"rail_channels={self.config.rail_channels or 'nccl default'}, "
                f"wire={self.config.wire_dtype or 'tensor dtype'}, "
                f"graphs={self.config.graphs if r.is_cuda else 'n/a (cpu)'}, "
                f"nccl_blocking={int(self.config.nccl_blocking) if r.is_cuda else 'n/a (cpu)'}, "
                f"issuer={r.native.mode if r.native is not None else 'python'}")

    def all_reduce(self, t: torch.Tensor, op: Any = dist.ReduceOp.SUM,
                   async_op: bool = False) -> torch.futures.Future[torch.Tensor] | None:
        """In-place all-reduce of ``t`` over the group, like ``dist.all_reduce``.

        Returns None, or with ``async_op=True`` a Future completed with ``t``. On CUDA a
        synchronous call makes the caller's current stream wait (the host does not),
        and an async call's Future is CUDA-aware: ``wait()`` syncs streams only.
        """
        self._usable()
        op_name = checks.op_name(op)
        checks.tensor(t, "all_reduce", "t", self._res.device)
        return self._call("all_reduce", t, op_name, async_op, t,
                          lambda rec: self._issue_cuda(t, op_name, async_op, rec),
                          lambda rec: self._execute(t, op_name, rec))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor,
                       op: Any = dist.ReduceOp.SUM,
                       async_op: bool = False) -> torch.futures.Future[torch.Tensor] | None:
        """Like ``dist.reduce_scatter_tensor(output, input, op)``: rank r receives the
        reduction over ranks of block r of ``input`` (``world_size`` blocks, each the
        size of ``output``). Hierarchical at M > 1 and D > 1 from ``min_bytes`` of
        input (collectives.py says why), NCCL's (gloo's) own otherwise. Futures
        complete with ``output``, as all_reduce's do."""
        self._usable()
        op_name = checks.op_name(op)
        checks.pair(output, input, "reduce_scatter", self._res.topo.world_size,
                    self._res.device, input_blocks=True)
        hier = self._hierarchical_blocks(input)
        run = collectives.reduce_scatter if hier else collectives.flat_reduce_scatter
        return self._call("reduce_scatter", input, op_name, async_op, output,
                          lambda rec: self._issue_inline(
                              lambda ctx, s: run(_untracked(output), _untracked(input), op_name,
                                                 ctx, s), rec, async_op, output),
                          lambda rec: run(_untracked(output), _untracked(input), op_name,
                                          self._ctx(rec), None),
                          "hierarchical" if hier else "flat")

    def all_gather(self, output: torch.Tensor, input: torch.Tensor,
                   async_op: bool = False) -> torch.futures.Future[torch.Tensor] | None:
        """Like ``dist.all_gather_into_tensor(output, input)``: block r of ``output``
        becomes rank r's ``input``. Routes as reduce_scatter does (on ``output``'s
        size); Futures complete with ``output``."""
        self._usable()
        checks.pair(output, input, "all_gather", self._res.topo.world_size, self._res.device,
                    input_blocks=False)
        hier = self._hierarchical_blocks(output)
        run = collectives.all_gather if hier else collectives.flat_all_gather
        return self._call("all_gather", output, "-", async_op, output,
                          lambda rec: self._issue_inline(
                              lambda ctx, s: run(_untracked(output), _untracked(input), ctx, s),
                              rec, async_op, output),
                          lambda rec: run(_untracked(output), _untracked(input), self._ctx(rec),
                                          None),
                          "hierarchical" if hier else "flat")

    def _call(self, kind: str, t: torch.Tensor, op: str, async_op: bool, result: torch.Tensor,
              on_cuda: Callable[[Record], Any], on_cpu: Callable[[Record], Any],
              route: str = "") -> torch.futures.Future[torch.Tensor] | None:
        """What every collective shares: the debug check, numbering, the flight record,
        poisoning after a failure; CUDA work is issued here, CPU work queued in order."""
        guard = self._res.guard
        if self.config.debug:
            guard.agree(self._op_number + 1, t, op, kind)
        self._op_number += 1
        record = guard.recorder.begin(self._op_number, t.numel(), str(t.dtype), op, route, kind)
        if self._res.is_cuda:
            res = self._res
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
            guard.finish(record)  # on CUDA: issued (the device finishes later)
            return fut
        job = self._worker.submit(self._run_cpu, on_cpu, record)  # type: ignore[union-attr]
        if not async_op:
            job.result()
            return None
        return _as_torch_future(job, result)

    def _run_cpu(self, run: Callable[[Record], Any], record: Record) -> None:
        """One call on the worker thread; a failure poisons the calls queued behind it."""
        guard = self._res.guard
        guard.check_usable()
        try:
            run(record)
        except RingReduceError as exc:
            guard.fail(exc, record)
            raise
        guard.finish(record)

    def _issue_inline(self, run: Callable[[CallContext, int], None], record: Record,
                      async_op: bool,
                      result: torch.Tensor) -> tuple[Any, list[tuple[str, str]]]:
        """CUDA: ``run`` on the caller's current stream (no stage streams to join).
        Returns the Future (or None) and what the watchdog should watch."""
        if self._res.native is not None:
            self._res.native.drain()  # its queued calls are issued before this one
        if result.numel():
            caller = self._res.sync.caller()
            self._res.sync.join_replay(caller)  # a replay may still use the communicators
            run(self._ctx(record), caller.cuda_stream)
        ends = [(record.kind, CALLER)]
        if not async_op:
            return None, ends
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[result.device])
        fut.set_result(result)  # records an event on the current stream
        return fut, ends

    def _usable(self) -> None:
        """Closed or poisoned communicators refuse work before anything is checked."""
        if self._closed:
            raise RingReduceError("this ringreduce.Communicator is closed; create a new one")
        self._res.guard.check_usable()

    def _hierarchical_blocks(self, whole: torch.Tensor) -> bool:
        topo = self._res.topo
        return (topo.machines > 1 and topo.devices_per_machine > 1
                and whole.numel() * whole.element_size() >= self.config.min_bytes)

    def _route_flat(self, t: torch.Tensor) -> bool:
        return (self._res.topo.machines == 1
                or t.numel() * t.element_size() < self.config.min_bytes)

    def _execute(self, t: torch.Tensor, op: str, record: Record, inline: bool = True) -> str:
        """Issue (CUDA) or run (CPU) one call. Returns the stage whose stream ends the
        call, or "" when the work went onto the caller's stream (nothing to wait for)."""
        if t.numel() == 0:
            return ""
        t = _untracked(t)
        res, ctx = self._res, self._ctx(record)
        if self._route_flat(t):
            record.route = "flat"
            if inline:
                stream = res.sync.caller().cuda_stream if res.is_cuda else None
                flat_here(t.view(-1), op, ctx, stream)
                return ""
            res.sync.enter()
            run_flat(t.view(-1), op, ctx)
            return FLAT
        record.route = "hierarchical"
        res.sync.enter()
        topo = res.topo
        ctx.wire = self._wire if t.dtype == torch.float32 else None
        plans, waves, self._cursor = schedule.plan_waves(
            t.numel(), t.element_size(), topo.devices_per_machine, topo.machines,
            res.slice_bytes, res.staging_slots, self._cursor,
            "add" if ctx.wire is None else "diffuse", res.wave_groups)
        run_waves(waves, t.view(-1), plans, op, ctx)
        return schedule.active_stages(topo.devices_per_machine)[-1]

    def _issue_cuda(self, t: torch.Tensor, op: str, async_op: bool,
                    record: Record) -> tuple[Any, list[tuple[str, Any]]]:
        capturing = torch.cuda.is_current_stream_capturing()
        native = self._res.native
        if native is not None:  # native.py; captures and graphs stay on this thread
            if not capturing and self._res.graphs is None and t.numel() \
                    and not self._route_flat(t) and native.warm(t, op):
                record.route = f"hierarchical ({native.mode})"
                fut, ends, self._cursor = native.issue(t, op, async_op, self._cursor,
                                                       lambda: self._ctx(record))
                return fut, ends
            native.drain()  # Python issues next: the worker's calls must come first
        if capturing:  # the caller's own CUDA graph
            self._res.user_captures += 1  # closing must then wait for it (resources.py)
            with self._res.sync.capturing():
                return self._issue_now(t, op, async_op, record)
        graph = self._graph_for(t, op, record)
        if graph is not None:
            return self._replay(graph, t, async_op, record)
        return self._issue_now(t, op, async_op, record)

    def _issue_now(self, t: torch.Tensor, op: str, async_op: bool,
                   record: Record) -> tuple[Any, list[tuple[str, str]]]:
        last = self._execute(t, op, record, inline=not async_op)
        sync = self._res.sync
        ends = _stage_ends(last, self._res.topo.devices_per_machine)
        if not async_op:
            if last:
                sync.leave()
            return None, ends
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[t.device])
        if not last:
            fut.set_result(t)
            return fut, ends
        sync.adopt(t, (*schedule.STAGES, FLAT))
        with sync.on(last):  # the Future records an event on the last stage's stream
            fut.set_result(t)
        return fut, ends

    def _graph_for(self, t: torch.Tensor, op: str, record: Record) -> Any:
        """The captured graph of this call (graphs.py), capturing it the second time
        the same tensor comes back; None: issue it the slow way."""
        graphs = self._res.graphs
        if graphs is None or t.numel() == 0 or self._route_flat(t):
            return None
        key = (t.data_ptr(), t.numel(), t.dtype, op)
        graph = graphs.get(key)
        if graph is None and graphs.seen_before(key):
            def issue() -> None:
                with self._res.sync.capturing(external=True):
                    if self._execute(t, op, record):
                        self._res.sync.leave()  # joins every stage stream into the capture
            graph = graphs.capture(key, issue)
        return graph

    def _replay(self, graph: Any, t: torch.Tensor, async_op: bool,
                record: Record) -> tuple[Any, list[tuple[str, str]]]:
        record.route = "hierarchical (graph)"
        sync = self._res.sync
        stream = sync.replay(graph)
        ends = [("replay", stream)]
        if not async_op:
            sync.leave()  # the caller's stream waits for the replay's end (done)
            return None, ends
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[t.device])
        sync.adopt(t, (stream,))
        with sync.on(stream):  # the Future records an event on the replay stream
            fut.set_result(t)
        return fut, ends

    def _ctx(self, record: Record) -> CallContext:
        return CallContext(self._res, record)

    def _watch(self, record: Record, ends: list[tuple[str, str]]) -> None:
        """Hand the issued call to the watchdog: one fresh event per stream it used
        (stage label, stream), recorded after its last work there."""
        res = self._res
        if res.watchdog is None or torch.cuda.is_current_stream_capturing():
            return  # a captured graph's work runs at replay; events recorded now mean nothing
        topo, done = res.topo, []
        for label, stream in ends:
            if not isinstance(stream, str):  # the native issuer's completion (native.py)
                done.append((label, stream, topo.peers(label)))
                continue
            event = torch.cuda.Event()
            event.record(res.sync.caller() if stream == CALLER
                         else res.sync.streams[stream])
            done.append((label, event, topo.peers(stream)))
        res.watchdog.watch(record.op_number, f"{record.kind} of {record.numel} x {record.dtype}",
                           done)

    def raise_if_failed(self, op_number: int) -> None:
        """Raise RingReduceError if operation ``op_number`` (or one before it) failed;
        on CUDA as far as the watchdog knows now (it never waits for the device)."""
        self._res.guard.raise_if_failed(op_number)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block the host until every issued call finished on the device (True), or
        ``timeout_s`` passed (False). Raises RingReduceError when an operation failed
        (a dead or hung peer, after the deadline at most). The CPU path: until the
        queued calls ran."""
        if not self._res.is_cuda:
            self._worker.submit(lambda: None).result()  # type: ignore[union-attr]
            self._res.guard.check_usable()
            return True
        return self._res.wait_idle(timeout_s)

    def close(self) -> None:
        """Finish outstanding work and release communicators. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        self._res.release()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


CALLER = "caller"
"""Stands for the caller's current stream in a call's stream ends."""


def _stage_ends(last: str, devices: int) -> list[tuple[str, str]]:
    """(stage, stream) pairs whose completion means an all_reduce finished: every
    active stage for the hierarchical route (in order, so the watchdog names the
    first stuck one), the flat stream, or the caller's stream."""
    if not last:
        return [(FLAT, CALLER)]
    if last == FLAT:
        return [(FLAT, FLAT)]
    return [(s, s) for s in schedule.active_stages(devices)]


def _untracked(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory without autograd's view of it. The stages write views of the
    caller's tensor in place; autograd refuses that for a leaf that requires grad, or
    a view an op like ``split`` made ("... is being modified inplace"), while gloo and
    NCCL write through C++ and never ask it. ``dist.all_reduce`` does not record the
    reduction in the graph either, so neither do we."""
    return t.detach() if t.requires_grad else t


def _device_of(group: dist.ProcessGroup) -> torch.device:
    """CUDA when the group can run NCCL (its backend is nccl, or ringreduce's own with
    GPUs present), on the current device, as torch's NCCL group does; else the CPU."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend or ("ringreduce" in backend and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _as_torch_future(job: concurrent.futures.Future[Any],
                     t: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def done(j: concurrent.futures.Future[Any]) -> None:
        exc = j.exception()
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(t)

    job.add_done_callback(done)
    return fut
