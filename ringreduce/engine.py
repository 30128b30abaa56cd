"""Communicator: the public object. Builds its state, checks input and hands a call
to engine_calls.py (its base class: numbering, the flight record), which hands it to
execution/issue.py, which routes and issues it and hands out futures.

An all-reduce takes one of four routes, each a deliberate decision:
  * one machine (M == 1), or a tensor below ``min_bytes``: NCCL's (gloo's) own flat
    all-reduce on the whole group, because on NVLink alone and for latency-bound
    sizes nothing beats it (Fairring lost both cases by not having this route);
  * otherwise the route the Communicator chose at construction by measuring them
    (plan/slicing.py, execution/probe.py): NCCL's flat all-reduce, one slice
    (one_slice.py: three collectives) or the pipeline of pipeline.py, with
    reduce-scatter and all-gather skipped when each machine has one device;
  * with an 8- or 4-bit wire, the compressed route (compressed.py), where the probe
    did not find exact as fast (a call's own ``wire=`` always takes it).
The CUDA route only enqueues work (no host-device synchronisation); the CPU route
runs the same plan over gloo on one worker thread, so calls keep their order.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import torch
import torch.distributed as dist

from ringreduce.config import Config, internal_settings
from ringreduce.engine_calls import Calls
from ringreduce.execution import (
    collectives,
    compressed,
    compressed_scatter,
    probe,
    quant,
    saved_state,
)
from ringreduce.execution.buckets import BucketKeys, Names
from ringreduce.execution.build import build_resources, device_of, group_store, host_of
from ringreduce.execution.context import CallContext
from ringreduce.execution.describe import describe, flat_note
from ringreduce.execution.feedback import FLOATS, Feedback, Spec, call_wire
from ringreduce.execution.issue import Issuer, untracked
from ringreduce.execution.regroup import Regroup
from ringreduce.execution.resources import Resources
from ringreduce.plan import slicing
from ringreduce.safety import agreement, checks
from ringreduce.safety.flight import Record

log = logging.getLogger("ringreduce")

_WIRE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


class Communicator(Calls):
    """Hierarchical all-reduce over ``group`` (default: the whole world).

    Collective: every rank of the group constructs it, in the same order as other
    communicators, with the same settings (compared first: safety/agreement.py).
    Calls from several threads are serialised; every rank must make them in the same
    order, as for any collective. See Config for ``machines``, ``slice_bytes``, ``staging_bytes``,
    ``min_bytes``, ``wire`` (``wire_dtype``: its older spelling, a torch dtype),
    ``wire_block``, ``plan``, ``timeout_s``, ``debug``, ``hook_feedback`` and
    ``flight_file``; explicit arguments win over ``RINGREDUCE_*`` variables. ``internal``:
    Config's internal fields (config.INTERNAL, for tests and measurements; no variables).

    With an 8- or 4-bit wire it keeps error feedback per key where asked: with
    ``hook_feedback``, per DDP bucket of each model its hook serves (several models may
    share it) and per FSDP module whose ``ringreduce.fsdp`` hooks reduce through it;
    always per user key (``feedback=``). ``state_dict()`` / ``load_state_dict()`` carry
    it to a resumed run.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, machines: int | None = None,
                 slice_bytes: int | None = None, staging_bytes: int | None = None,
                 min_bytes: int | None = None, wire_dtype: torch.dtype | None = None,
                 wire: str | None = None,
                 wire_block: int | None = None, plan: str | None = None,
                 timeout_s: float | None = None, debug: bool | None = None,
                 hook_feedback: bool | None = None, flight_file: str | None = None,
                 **internal: Any) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ringreduce.Communicator needs torch.distributed: call "
                               "dist.init_process_group(...) first")
        group = group or dist.group.WORLD
        assert group is not None  # initialised (checked above): WORLD exists
        store = group_store(group)
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        try:
            config = Config.from_env(machines=machines, slice_bytes=slice_bytes,
                                     staging_bytes=staging_bytes, min_bytes=min_bytes,
                                     wire_dtype=_wire_name(wire_dtype),
                                     wire=wire, wire_block=wire_block, plan=plan,
                                     timeout_s=timeout_s, debug=debug,
                                     hook_feedback=hook_feedback, flight_file=flight_file,
                                     **internal_settings(internal))
            host = host_of(config, rank, world)
        except (ValueError, TypeError) as exc:
            agreement.refuse(store, rank, f"{type(exc).__name__}: {exc}")
            raise
        self.config = config
        self._global_ranks: tuple[int, ...] | None = tuple(dist.get_process_group_ranks(group))
        """The group's ranks by their global numbers (ddp.apply checks DDP's against them)."""
        self._setup(store, rank, world, device_of(group), host)

    @classmethod
    def _on_store(cls, store: dist.Store, rank: int, world: int, device: torch.device, *,
                  defaults: dict[str, object] | None = None, exact: bool = False,
                  **settings: Any) -> Communicator:
        """A communicator over ``world`` ranks meeting in ``store``, without a
        torch.distributed group (the "ringreduce" backend builds its engine so).
        ``defaults``: settings the environment may override (the backend's timeout).
        ``exact``: no wire format, whatever RINGREDUCE_WIRE says (the backend's rule)."""
        self = cls.__new__(cls)
        try:
            config = Config.from_env(defaults, **settings)
            if exact:
                config = dataclasses.replace(config, wire=None, wire_dtype=None)
            host = host_of(config, rank, world)
        except (ValueError, TypeError) as exc:
            agreement.refuse(store, rank, f"{type(exc).__name__}: {exc}")
            raise
        self.config = config
        self._global_ranks = None
        self._setup(store, rank, world, device, host)
        return self

    def _setup(self, store: dist.Store, rank: int, world: int, device: torch.device,
               host: str) -> None:
        hosts = agreement.meet(store, rank, world, self.config, host)
        self._res: Resources = build_resources(store, rank, world, device, self.config, hosts)
        self._issuer = Issuer(self._res, self.config)
        native = self._res.native  # its programs point into the feedback memory let go
        self._feedback = Feedback(None if native is None else native.forget_feedback)
        self._buckets = BucketKeys(self.reset_feedback)
        """The DDP buckets' feedback keys, per model (execution/buckets.py)."""
        self._regroup = Regroup(self._buckets, self._hook_average)
        self._names = Names()
        """FSDP hooks' feedback keys (execution/buckets.py)."""
        self._op_number = 0
        self._closed = False
        self._calls = threading.RLock()
        """Serialises calls: numbering, the checks and issue are one step per call, so
        calls from several threads never interleave inside ringreduce."""
        if self._res.plan is slicing.UNDECIDED:
            probe.compare(self._res, self.all_reduce, self.config)
            self._res.probe_calls = self._op_number
            self._res.guard.recorder.forget()
        if self._res.topo.rank == 0:
            log.info("ringreduce: %s", self.describe())
            note = flat_note(self._res.topo, self.config, host)
            if note:
                log.warning("ringreduce: %s", note)

    def describe(self) -> str:
        """The effective configuration, one line (logged once on rank 0)."""
        return describe(self._res, self.config)

    def all_reduce(self, t: torch.Tensor, op: Any = dist.ReduceOp.SUM,
                   async_op: bool = False, *, wire: str | None = None,
                   feedback: str | None = None) -> torch.futures.Future[torch.Tensor] | None:
        """In-place all-reduce of ``t`` over the group, like ``dist.all_reduce``.

        Returns None, or with ``async_op=True`` a Future completed with ``t``. On CUDA a
        synchronous call makes the caller's current stream wait (the host does not),
        and an async call's Future is CUDA-aware: ``wait()`` syncs streams only.

        ``wire``: this call's network format, ``"int8"``, ``"fp8"`` or ``"int4"``
        (Config.wire says what each is; None:
        the communicator's, Config.wire). ``feedback``: a key under which the
        quantization error is kept and added to the next call with the same key
        (execution/compressed.py; ``reset_feedback`` forgets it); it needs an 8- or
        4-bit wire. Every rank must pass the same ``wire``.
        """
        self._usable()
        op_name = checks.op_name(op)
        checks.tensor(t, "all_reduce", "t", self._res.device)
        quantized = call_wire(self.config, wire, feedback, t, op_name)
        if quantized is not None and self._issuer.takes_wire(t, wire is not None):
            # the probe's reason where it chose the wire; a call's own wire= is its own
            why = "" if wire is not None else self._issuer.choice(t).why
            return self._compressed(t, op_name, async_op, quantized, feedback, why)
        return self._call("all_reduce", t, op_name, async_op, t,
                          lambda rec: self._issuer.all_reduce(t, op_name, async_op, rec),
                          lambda rec: self._issuer.execute(t, op_name, rec))

    def _compressed(self, t: torch.Tensor, op: str, async_op: bool, wire: str,
                    feedback: str | None, why: str) -> torch.futures.Future[torch.Tensor] | None:
        """An all_reduce on the compressed route (execution/compressed.py): unpipelined,
        on the last stage's stream (CUDA; replayed natively where it can be). The wire
        format is part of the call's fingerprint, so ranks that pass different ones
        fail the call check instead of pairing mismatched messages."""
        block, issuer, tt, topo = self.config.wire_block, self._issuer, untracked(t), \
            self._res.topo
        k = compressed.padded_row(t.numel(), topo.devices_per_machine, topo.machines, block)

        def spec() -> Spec:
            errors = None if feedback is None else self._feedback.errors(
                feedback, t.numel(), wire, topo.machines, k, t.device)
            return Spec(wire, block, errors)

        def on_cuda(rec: Record) -> Any:
            rec.why = why
            return issuer.compressed(tt, op, spec(), async_op, rec)

        def on_cpu(rec: Record) -> None:
            rec.why = why
            s = spec()
            compressed.all_reduce(tt, op, s.format, block, s.errors, issuer.ctx(rec),
                                  compressed.On(None, "", compressed.Scratch(t.device)))
        return self._call("all_reduce", t, f"{op} wire={wire}", async_op, t,
                          on_cuda, on_cpu, f"compressed {wire}")

    def reset_feedback(self, key: str | None = None) -> None:
        """Forget the error feedback kept under ``key`` (every key's when None), from
        the next call on: calls already made keep theirs (the CPU path waits for its
        queued calls first)."""
        with self._calls:
            if not self._res.is_cuda and not self._closed:
                self._issuer.wait_cpu()
            self._feedback.reset(key)

    def _hook_all_reduce(
            self, t: torch.Tensor,
            bucket: dist.GradBucket | None = None) -> torch.futures.Future[torch.Tensor]:
        """DDP's hook (integrations/hook.py): an asynchronous average of a bucket.

        ``bucket``: DDP's; with an 8- or 4-bit wire and ``Config.hook_feedback`` it keeps
        error feedback under its model's key for it (execution/buckets.py), so models
        sharing this Communicator keep theirs apart; after ``load_state_dict``, in the
        saved layouts until DDP forms them (execution/regroup.py)."""
        if bucket is None or not (self.config.hook_feedback and
                                  self.config.wire in quant.FORMATS and t.dtype in FLOATS):
            return self._hook_average(t, None)
        with self._calls:  # one numbering of parameters, whichever thread runs the hook
            self._usable()
            ordinals = self._buckets.ordinals(bucket.parameters())
            key = self._buckets.key(ordinals)
            if key is None:
                return self._regroup.hook(bucket, ordinals)
            return self._hook_average(t, key)

    def _hook_average(self, t: torch.Tensor,
                      feedback: str | None) -> torch.futures.Future[torch.Tensor]:
        """An asynchronous average of ``t`` in place (error feedback under ``feedback``).

        16-bit tensors are divided by the world size first, in their own precision, and
        then summed, as plain DDP and torch's ``allreduce_hook`` do: a sum of N fp16
        gradients overflows (inf) where their average does not, and every route sums
        in the bucket's dtype somewhere (the flat all-reduce, the intra-machine
        reduce-scatter). Other dtypes take AVG: the exact sum, divided once."""
        if t.dtype in (torch.float16, torch.bfloat16):
            # checked before dividing, so a refused call leaves the bucket untouched
            self._usable()
            checks.tensor(t, "all_reduce", "t", self._res.device)
            t.div_(self._res.topo.world_size)
            fut = self.all_reduce(t, dist.ReduceOp.SUM, async_op=True, feedback=feedback)
        else:
            fut = self.all_reduce(t, dist.ReduceOp.AVG, async_op=True, feedback=feedback)
        assert fut is not None
        return fut

    def _feedback_name(self, kind: str) -> str:
        """A stable feedback key for an FSDP hook (execution/buckets.Names)."""
        with self._calls:
            return self._names.claim(kind)

    def state_dict(self) -> dict[str, Any]:
        """This rank's state for resuming, like an optimizer's: the error feedback of
        every key (every DDP bucket of every model, every FSDP module, a user's keys)
        and the DDP buckets' layouts, with the topology and wire it belongs to (checked
        by ``load_state_dict``). Tensors (copies, on this Communicator's device) and
        plain values under one key, ``"rank N"`` (torch.distributed.checkpoint keeps one
        value of a key saved by every rank): for ``torch.save`` and
        ``torch.distributed.checkpoint`` (a new process loads with
        integrations/resume.dcp_template)."""
        with self._calls:
            self._usable()
            if not self._res.is_cuda:
                self._issuer.wait_cpu()
            return {saved_state.rank_key(self._res.topo.rank): {
                **saved_state.identity(self._res.topo, self.config),
                "feedback": self._feedback.state_dict(), "ddp": self._buckets.state()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s result, saved by the same rank of a job with
        the same world, machines and wire: before the first backward of a new process
        (the way an optimizer's is) or later. Replaces every key's feedback. Raises
        ValueError, changing nothing, for a state of another rank, world, topology,
        wire or block; a state whose models differ from this process's fails at their
        first backward, before any communication of it."""
        with self._calls:
            self._usable()
            state = saved_state.check(state, self._res.topo, self.config)
            if not self._res.is_cuda:
                self._issuer.wait_cpu()
            self._feedback.reset()
            self._buckets.load(state["ddp"])
            self._feedback.load_state_dict(state["feedback"], self._res.device)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor,
                       op: Any = dist.ReduceOp.SUM, async_op: bool = False, *,
                       wire: str | None = None,
                       feedback: str | None = None) -> torch.futures.Future[torch.Tensor] | None:
        """Like ``dist.reduce_scatter_tensor(output, input, op)``: rank r receives the
        reduction over ranks of block r of ``input`` (``world_size`` blocks, each the
        size of ``output``). Hierarchical at M > 1 and D > 1 from ``min_bytes`` of
        input (collectives.py says why), NCCL's (gloo's) own otherwise. Futures
        complete with ``output``, as all_reduce's do.

        ``wire``: ``"int8"``, ``"fp8"`` or ``"int4"`` quantizes the rail
        hop of a SUM or AVG of float tensors at M > 1 (execution/compressed_scatter.py; a
        shard has one owner, which keeps its own machine's partial exact); only per call, the
        communicator's ``Config.wire`` does not apply here. ``feedback``: a key for error
        feedback, as all_reduce's."""
        self._usable()
        op_name = checks.op_name(op)
        checks.pair(output, input, "reduce_scatter", self._res.topo.world_size,
                    self._res.device, input_blocks=True)
        if wire is None and feedback is not None:
            raise ValueError(f"feedback={feedback!r} needs wire='int8' (or 'fp8', 'int4') too")
        quantized = None if wire is None else \
            call_wire(self.config, wire, feedback, output, op_name)
        if quantized is not None and self._res.topo.machines > 1:
            return self._compressed_scatter(output, input, op_name, async_op, quantized,
                                            feedback)
        hier = self._issuer.hierarchical_blocks(input)
        run = collectives.reduce_scatter if hier else collectives.flat_reduce_scatter
        out, inp, issuer = untracked(output), untracked(input), self._issuer
        return self._call("reduce_scatter", input, op_name, async_op, output,
                          lambda rec: issuer.inline(
                              lambda ctx, s: run(out, inp, op_name, ctx, s), rec, async_op,
                              output, inp),
                          lambda rec: run(out, inp, op_name, issuer.ctx(rec), None),
                          "hierarchical" if hier else "flat")

    def _compressed_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str,
                            async_op: bool, wire: str,
                            feedback: str | None) -> torch.futures.Future[torch.Tensor] | None:
        """A reduce_scatter on the compressed route, numbered, checked and recorded as
        every call is (the wire format is part of the call's fingerprint)."""
        fmt, block, issuer = quant.FORMATS[wire], self.config.wire_block, self._issuer
        out, inp, topo = untracked(output), untracked(input), self._res.topo
        k = compressed_scatter.padded_block(output.numel(), block)

        def run(ctx: CallContext, stream: int | None) -> None:
            error = None if feedback is None else self._feedback.errors(
                feedback, output.numel(), wire, topo.machines, k, output.device).collect
            compressed_scatter.reduce_scatter(out, inp, op, fmt, block, error, ctx, stream)
        return self._call("reduce_scatter", input, f"{op} wire={wire}", async_op, output,
                          lambda rec: issuer.inline(run, rec, async_op, output, inp),
                          lambda rec: run(issuer.ctx(rec), None), f"compressed {wire}")

    def all_gather(self, output: torch.Tensor, input: torch.Tensor,
                   async_op: bool = False) -> torch.futures.Future[torch.Tensor] | None:
        """Like ``dist.all_gather_into_tensor(output, input)``: block r of ``output``
        becomes rank r's ``input``. Routes as reduce_scatter does (on ``output``'s
        size); Futures complete with ``output``."""
        self._usable()
        checks.pair(output, input, "all_gather", self._res.topo.world_size, self._res.device,
                    input_blocks=False)
        hier = self._issuer.hierarchical_blocks(output)
        run = collectives.all_gather if hier else collectives.flat_all_gather
        out, inp, issuer = untracked(output), untracked(input), self._issuer
        return self._call("all_gather", output, "-", async_op, output,
                          lambda rec: issuer.inline(lambda ctx, s: run(out, inp, ctx, s), rec,
                                                    async_op, output, inp),
                          lambda rec: run(out, inp, issuer.ctx(rec), None),
                          "hierarchical" if hier else "flat")

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wire_name(wire_dtype: torch.dtype | None) -> str | None:
    """Config's name of a wire dtype argument."""
    if wire_dtype is None:
        return None
    name = _WIRE_NAMES.get(wire_dtype)
    if name is None:
        raise TypeError(f"wire_dtype={wire_dtype} is not supported; use torch.bfloat16, "
                        "torch.float16 or None")
    return name
