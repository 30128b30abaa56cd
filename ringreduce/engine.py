"""Communicator: the public object. Checks input, numbers and records a call, hands
it to execution/issue.py, which routes and issues it and hands out futures.

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

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ringreduce.config import Config, host_identity
from ringreduce.errors import RingReduceError
from ringreduce.execution import collectives, compressed, compressed_scatter, probe, quant
from ringreduce.execution.build import build_resources, group_store
from ringreduce.execution.context import CallContext
from ringreduce.execution.issue import Issuer, as_torch_future, untracked
from ringreduce.execution.resources import Resources
from ringreduce.plan import slicing, topology
from ringreduce.plan.topology import Topology
from ringreduce.safety import agreement, checks
from ringreduce.safety.flight import Record

log = logging.getLogger("ringreduce")

_WIRE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


class Communicator:
    """Hierarchical all-reduce over ``group`` (default: the whole world).

    Collective: every rank of the group constructs it, in the same order as other
    communicators, with the same settings (compared first: safety/agreement.py).
    Calls from several threads are serialised; every rank must make them in the same
    order, as for any collective. See Config for ``machines``, ``slice_bytes``, ``staging_bytes``,
    ``min_bytes``, ``wire`` (``wire_dtype``: its older spelling, a torch dtype),
    ``wire_block``, ``plan``, ``timeout_s``, ``debug`` and ``hook_feedback``; explicit
    arguments win over ``RINGREDUCE_*`` variables.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, machines: int | None = None,
                 slice_bytes: int | None = None, staging_bytes: int | None = None,
                 min_bytes: int | None = None, wire_dtype: torch.dtype | None = None,
                 wire: str | None = None,
                 wire_block: int | None = None, plan: str | None = None,
                 timeout_s: float | None = None, debug: bool | None = None,
                 hook_feedback: bool | None = None) -> None:
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
                                     hook_feedback=hook_feedback)
            host = _host(config, rank, world)
        except (ValueError, TypeError) as exc:
            agreement.refuse(store, rank, f"{type(exc).__name__}: {exc}")
            raise
        self.config = config
        self._setup(store, rank, world, _device_of(group), host)

    @classmethod
    def _on_store(cls, store: dist.Store, rank: int, world: int, device: torch.device, *,
                  defaults: dict[str, object] | None = None, **settings: Any) -> Communicator:
        """A communicator over ``world`` ranks meeting in ``store``, without a
        torch.distributed group (the "ringreduce" backend builds its engine so).
        ``defaults``: settings the environment may override (the backend's timeout)."""
        self = cls.__new__(cls)
        try:
            config = Config.from_env(defaults, **settings)
            host = _host(config, rank, world)
        except (ValueError, TypeError) as exc:
            agreement.refuse(store, rank, f"{type(exc).__name__}: {exc}")
            raise
        self.config = config
        self._setup(store, rank, world, device, host)
        return self

    @property
    def config(self) -> Config:
        """The effective settings. Replacing it (``dataclasses.replace``) changes what
        is read per call (``min_bytes``, ``debug``) from the next call on."""
        return self._config

    @config.setter
    def config(self, value: Config) -> None:
        self._config = value
        if "_issuer" in self.__dict__:
            self._issuer.config = value

    def _setup(self, store: dist.Store, rank: int, world: int, device: torch.device,
               host: str) -> None:
        hosts = agreement.meet(store, rank, world, self.config, host)
        self._res: Resources = build_resources(store, rank, world, device, self.config, hosts)
        self._issuer = Issuer(self._res, self.config)
        self._feedback = compressed.Feedback()
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
            note = _flat_note(self._res.topo, self.config, host)
            if note:
                log.warning("ringreduce: %s", note)

    @property
    def topology(self) -> Topology:
        """machines, devices_per_machine, machine_index, device_index (and ranks)."""
        return self._res.topo

    @property
    def op_number(self) -> int:
        """The number of the latest call; the construction probe's calls
        (execution/probe.py, CUDA) are numbered first."""
        return self._op_number

    def describe(self) -> str:
        """The effective configuration, one line (logged once on rank 0)."""
        t, r, c = self._res.topo, self._res, self.config
        return (f"{t.machines} machines x {t.devices_per_machine} devices, "
                f"{'cuda (nccl ' + str(r.nccl_version) + ')' if r.is_cuda else 'cpu (gloo)'}, "
                f"plan={r.plan.plan} ({r.plan.reason}), "
                f"slice_bytes={_slice_range(r)}, staging_bytes={c.staging_bytes} "
                f"({r.staging_slots} slots), min_bytes={c.min_bytes}, "
                f"rail_channels={c.rail_channels or 'nccl default'}, "
                f"wire={_wire_text(c)}, diffuse_gather={int(c.diffuse_gather)}, "
                f"check_call_end={int(r.call_check is not None)}, "
                f"issuer={r.native.mode if r.native is not None else 'python'}")

    def all_reduce(self, t: torch.Tensor, op: Any = dist.ReduceOp.SUM,
                   async_op: bool = False, *, wire: str | None = None,
                   feedback: str | None = None) -> torch.futures.Future[torch.Tensor] | None:
        """In-place all-reduce of ``t`` over the group, like ``dist.all_reduce``.

        Returns None, or with ``async_op=True`` a Future completed with ``t``. On CUDA a
        synchronous call makes the caller's current stream wait (the host does not),
        and an async call's Future is CUDA-aware: ``wait()`` syncs streams only.

        ``wire``: this call's network format, ``"int8"``, ``"fp8"`` or ``"int4"`` (None:
        the communicator's, Config.wire). ``feedback``: a key under which the
        quantization error is kept and added to the next call with the same key
        (execution/compressed.py; ``reset_feedback`` forgets it); it needs an 8- or
        4-bit wire. Every rank must pass the same ``wire``.
        """
        self._usable()
        op_name = checks.op_name(op)
        checks.tensor(t, "all_reduce", "t", self._res.device)
        quantized = compressed.call_wire(self.config, wire, feedback, t, op_name)
        if quantized is not None and not self._issuer.route_flat(t):
            return self._compressed(t, op_name, async_op, quantized, feedback)
        return self._call("all_reduce", t, op_name, async_op, t,
                          lambda rec: self._issuer.all_reduce(t, op_name, async_op, rec),
                          lambda rec: self._issuer.execute(t, op_name, rec))

    def _compressed(self, t: torch.Tensor, op: str, async_op: bool, wire: str,
                    feedback: str | None) -> torch.futures.Future[torch.Tensor] | None:
        """An all_reduce on the compressed route (execution/compressed.py): unpipelined,
        on the caller's stream, as reduce_scatter's route is. The wire format is part
        of the call's fingerprint, so ranks that pass different ones fail the call
        check instead of pairing mismatched messages."""
        fmt, block, issuer, tt = quant.FORMATS[wire], self.config.wire_block, self._issuer, \
            untracked(t)
        topo = self._res.topo
        k = compressed.padded_row(t.numel(), topo.devices_per_machine, topo.machines, block)

        def run(ctx: CallContext, stream: int | None) -> None:
            errors = None if feedback is None else self._feedback.errors(
                feedback, t.numel(), wire, topo.machines, k, t.device)
            compressed.all_reduce(tt, op, fmt, block, errors, ctx, stream)
        return self._call("all_reduce", t, f"{op} wire={wire}", async_op, t,
                          lambda rec: issuer.inline(run, rec, async_op, tt, tt),
                          lambda rec: run(issuer.ctx(rec), None), f"compressed {wire}")

    def reset_feedback(self, key: str | None = None) -> None:
        """Forget the error feedback kept under ``key`` (every key's when None), from
        the next call on: calls already made keep theirs (the CPU path waits for its
        queued calls first)."""
        with self._calls:
            if not self._res.is_cuda and not self._closed:
                self._issuer.wait_cpu()
            self._feedback.reset(key)

    def _hook_all_reduce(self, t: torch.Tensor,
                         bucket: int | None = None) -> torch.futures.Future[torch.Tensor]:
        """DDP's hook (integrations/hook.py): an asynchronous average of a bucket.

        16-bit buckets are divided by the world size first, in their own precision, and
        then summed, as plain DDP and torch's ``allreduce_hook`` do: a sum of N fp16
        gradients overflows (inf) where their average does not, and every route sums
        in the bucket's dtype somewhere (the flat all-reduce, the intra-machine
        reduce-scatter). Other dtypes take AVG: the exact sum, divided once.

        ``bucket``: DDP's bucket index; with an 8- or 4-bit wire and
        ``Config.hook_feedback`` the bucket keeps error feedback under it (a bucket whose
        size changes, as DDP's do when rebuilt after the first step, starts over)."""
        feedback = None
        if bucket is not None and self.config.hook_feedback and \
                self.config.wire in quant.FORMATS and t.dtype in compressed.FLOATS:
            feedback = f"ddp bucket {bucket}"
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

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor,
                       op: Any = dist.ReduceOp.SUM, async_op: bool = False, *,
                       wire: str | None = None,
                       feedback: str | None = None) -> torch.futures.Future[torch.Tensor] | None:
        """Like ``dist.reduce_scatter_tensor(output, input, op)``: rank r receives the
        reduction over ranks of block r of ``input`` (``world_size`` blocks, each the
        size of ``output``). Hierarchical at M > 1 and D > 1 from ``min_bytes`` of
        input (collectives.py says why), NCCL's (gloo's) own otherwise. Futures
        complete with ``output``, as all_reduce's do.

        ``wire``: ``"int8"``, ``"fp8"`` or ``"int4"`` quantizes the rail hop of a SUM or
        AVG of float tensors at M > 1 (execution/compressed_scatter.py; a shard has one
        owner, which keeps its own machine's partial exact); only per call, the
        communicator's ``Config.wire`` does not apply here. ``feedback``: a key for error
        feedback, as all_reduce's."""
        self._usable()
        op_name = checks.op_name(op)
        checks.pair(output, input, "reduce_scatter", self._res.topo.world_size,
                    self._res.device, input_blocks=True)
        if wire is None and feedback is not None:
            raise ValueError(f"feedback={feedback!r} needs wire='int8' (or 'fp8', 'int4') too")
        quantized = None if wire is None else \
            compressed.call_wire(self.config, wire, feedback, output, op_name)
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

    def _call(self, kind: str, t: torch.Tensor, op: str, async_op: bool, result: torch.Tensor,
              on_cuda: Callable[[Record], Any], on_cpu: Callable[[Record], Any],
              route: str = "") -> torch.futures.Future[torch.Tensor] | None:
        """What every collective shares: the call check, numbering, the flight record;
        then issue.py issues CUDA work here or queues CPU work in order (and poisons the
        communicator after a failure)."""
        with self._calls:
            guard = self._res.guard
            if self.config.debug:
                guard.agree(self._op_number + 1, t, op, kind)
            elif self.config.check_new_calls:
                guard.agree_if_new(self._op_number + 1, t, op, kind)
            self._op_number += 1
            record = guard.recorder.begin(self._op_number, t.numel(), str(t.dtype), op, route,
                                          kind)
            if self._res.is_cuda:
                return self._issuer.issue_cuda(record, on_cuda)
            job = self._issuer.queue_cpu(record, on_cpu)
            if async_op:
                return as_torch_future(job, result)
        job.result()  # outside the lock: other threads may queue behind this call meanwhile
        return None

    def _usable(self) -> None:
        """Closed or poisoned communicators refuse work before anything is checked."""
        if self._closed:
            raise RingReduceError("this ringreduce.Communicator is closed; create a new one")
        self._res.guard.check_usable()

    def raise_if_failed(self, op_number: int) -> None:
        """Raise RingReduceError if operation ``op_number`` (or one before it) failed;
        on CUDA as far as the watchdog knows now (it never waits for the device)."""
        self._res.guard.raise_if_failed(op_number)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block the host until every issued call finished on the device (True), or
        ``timeout_s`` passed (False). Raises RingReduceError when an operation failed
        (a dead or hung peer, after the deadline at most), or the communicator is
        closed. The CPU path: until the queued calls ran."""
        if self._closed:  # its worker and streams are gone: say so, not what broke inside
            raise RingReduceError("this ringreduce.Communicator is closed; create a new one")
        if not self._res.is_cuda:
            self._issuer.wait_cpu()
            self._res.guard.check_usable()
            return True
        return self._res.wait_idle(timeout_s)

    def close(self) -> None:
        """Finish outstanding work and release communicators. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._issuer.close()
        self._res.release()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _device_of(group: dist.ProcessGroup) -> torch.device:
    """CUDA when the group can run NCCL (its backend is nccl, or ringreduce's own with
    GPUs present), on the current device, as torch's NCCL group does; else the CPU."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend or ("ringreduce" in backend and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _wire_name(wire_dtype: torch.dtype | None) -> str | None:
    """Config's name of a wire dtype argument."""
    if wire_dtype is None:
        return None
    name = _WIRE_NAMES.get(wire_dtype)
    if name is None:
        raise TypeError(f"wire_dtype={wire_dtype} is not supported; use torch.bfloat16, "
                        "torch.float16 or None")
    return name


def _wire_text(config: Config) -> str:
    """The wire format for describe()."""
    if config.wire is None:
        return "tensor dtype"
    return f"{config.wire} (blocks of {config.wire_block})" if config.wire in quant.FORMATS \
        else config.wire


def _host(config: Config, rank: int, world: int) -> str:
    """This rank's host identity: its virtual machine with ``machines=K`` (the group's
    ranks in K machines of contiguous ranks), else the real host's (NCCL_HOSTID, or
    host name and boot id)."""
    if config.machines is not None:
        return topology.virtual_host(rank, world, config.machines)
    return host_identity()


def _flat_note(topo: Topology, config: Config, host: str) -> str:
    """What to tell the user when a group of several ranks takes only the flat route
    ("" when the hierarchy serves it)."""
    if topo.flat_reason:
        return f"every call takes the flat all-reduce: {topo.flat_reason}"
    if topo.machines > 1 or topo.world_size == 1 or config.machines is not None:
        return ""
    return (f"all {topo.world_size} ranks of this group are on one machine ({host!r}), so "
            "every call takes NCCL's (gloo's) own all-reduce, the fastest there; to emulate "
            "K machines on one host pass machines=K (RINGREDUCE_MACHINES) or give each "
            "machine's ranks their own NCCL_HOSTID")


def _slice_range(res: Resources) -> str:
    """``4194304``, or ``1048576..4194304`` when the slice size follows the call size."""
    low, high = res.smallest_slice_bytes, res.slice_bytes
    return f"{low}..{high}" if 0 < low < high else str(high)
