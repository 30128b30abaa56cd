"""The stage operations, over NCCL (CUDA) or over torch.distributed gloo (CPU):
NcclTransport here, GlooTransport in gloo_transport.py, with the parts and the wire
casts both use.

Both transports move the same bytes between the same ranks; the gloo one exists so
that slicing, padding and every stage run in CI without a GPU. A stage call takes
the *parts* of one slice (its body and, on the last slice, its padding slot). The
step loop opens one ``group`` around every stage of a wave (schedule.waves), so
their NCCL operations are enqueued by one ncclGroupEnd; ``finish`` then does what
must follow a stage's kernels on its stream.

Per part, on rank (machine m, device d), ``view`` is ``(D, M, k)``:
  reduce_scatter  view[d]    = sum over devices of view[d]          (intra-machine)
  collect         staging[i] = machine j's view[d][m], j != m        (rail)
  diffuse         view[d][j] = machine j's reduced view[d][j]        (rail; one
                  all-gather when ``gathers``, Config.diffuse_gather)
  all_gather      view[e]    = device e's view[e], every e           (intra-machine)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ringreduce.execution import nccl
from ringreduce.plan.topology import Topology

NcclCalls = Any
"""What NcclTransport calls NCCL through: the nccl module, or a recorder with the same
functions (ringreduce.execution.native.RecordedNccl) that writes them into a native program."""


@dataclass(frozen=True)
class Part:
    """A (D, M, k) view travelling through the stages, with its collect rows."""

    view: torch.Tensor
    staging: torch.Tensor
    """(M-1, k): row i holds machine ``others[i]``'s partial of ``view[d][m]``."""
    wire_out: torch.Tensor | None = None
    """(M-1, k) in the 16-bit wire format when one is in use: what this rank sends.
    ``staging`` is then in the wire format too, and diffuse receives into it."""


def other_machines(topo: Topology) -> list[int]:
    """Peers on the rail, in a fixed order; staging row i belongs to entry i."""
    return [j for j in range(topo.machines) if j != topo.machine_index]


class WireCasts(Protocol):
    """The wire casts of native/wire.cu (ringreduce.execution.kernels.Kernels)."""

    def narrow_rows(self, view: torch.Tensor, packed: torch.Tensor, skip: int,
                    stream: int | None) -> None: ...

    def widen_rows(self, packed: torch.Tensor, view: torch.Tensor, skip: int,
                   stream: int | None) -> None: ...


def collect_sends(p: Part, topo: Topology, others: Sequence[int]) -> list[torch.Tensor]:
    """What collect sends to each other machine: view[d][j], or its wire-format copy
    (narrow_collected made it)."""
    d = topo.device_index
    if p.wire_out is None:
        return [p.view[d][j] for j in others]
    return list(p.wire_out)


def narrow_collected(p: Part, topo: Topology, others: Sequence[int],
                     casts: WireCasts | None = None, stream: int | None = None) -> None:
    """With a wire format, before collect: view[d][j] -> wire_out, by native/wire.cu when
    ``casts`` are given, else by torch copies."""
    if p.wire_out is None:
        return
    d, m = topo.device_index, topo.machine_index
    if casts is not None:
        casts.narrow_rows(p.view[d], p.wire_out, m, stream)
        return
    for i, j in enumerate(others):
        p.wire_out[i].copy_(p.view[d][j])


def gathers_diffuse(p: Part, gather: bool) -> bool:
    """Whether diffuse is one in-place all-gather of view[d] over the rail (the rail's
    ranks are the machines, in order): Config.diffuse_gather, and no wire format (whose
    rows arrive in the staging slot, which has no row of this machine's own)."""
    return gather and p.wire_out is None


def diffuse_buffers(p: Part, d: int, m: int,
                    others: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(what diffuse sends, where row i arrives). With a wire format the add stage
    already wrote the reduced row, rounded, into ``wire_out[0]``."""
    if p.wire_out is None:
        return p.view[d][m], [p.view[d][j] for j in others]
    return p.wire_out[0], list(p.staging)


def widen_diffused(p: Part, topo: Topology, others: Sequence[int],
                   casts: WireCasts | None = None, stream: int | None = None) -> None:
    """With a wire format: the received rows, from the staging slot into the tensor."""
    if p.wire_out is None:
        return
    d = topo.device_index
    if casts is not None:
        casts.widen_rows(p.staging, p.view[d], topo.machine_index, stream)
        return
    for i, j in enumerate(others):
        p.view[d][j].copy_(p.staging[i])


class NcclTransport:
    """Stage operations on NCCL communicators, one per stage, so that stages of
    different slices run concurrently on their own streams."""

    def __init__(self, topo: Topology, comms: dict[str, nccl.Comm],
                 casts: WireCasts | None, calls: NcclCalls = nccl,
                 gathers: bool = True) -> None:
        self.topo = topo
        self.gathers = gathers
        """Config.diffuse_gather (gathers_diffuse)."""
        self.calls = calls
        self.casts = casts
        """native/wire.cu's casts; None: torch copies (no cupy)."""
        self.comms = comms
        self.others = other_machines(topo)
        self.stage = "-"
        """The communicator of the latest group issued: what the watchdog names when a
        call never returns from NCCL (Resources.stuck_issue)."""

    def group(self, stages: Sequence[str]) -> contextlib.AbstractContextManager[None]:
        """One NCCL group over the communicators of ``stages``, enqueued when it
        returns (blocking communicators: the watchdog bounds the wait when one connects
        to a peer)."""
        if not stages:
            return contextlib.nullcontext()
        self.stage = "+".join(stages)
        return self.calls.group()

    def reduce_scatter(self, parts: Sequence[Part], op: str, stream: int) -> None:
        d, comm = self.topo.device_index, self.comms["reduce_scatter"]
        for p in parts:  # in place: recv is the d-th block of send
            self.calls.reduce_scatter(comm, p.view, p.view[d], op, stream)

    def collect(self, parts: Sequence[Part], stream: int) -> None:
        comm = self.comms["collect"]
        sends = [collect_sends(p, self.topo, self.others) for p in parts]
        for p, out in zip(parts, sends, strict=True):
            for i, j in enumerate(self.others):
                self.calls.send(comm, out[i], j, stream)
                self.calls.recv(comm, p.staging[i], j, stream)

    def diffuse(self, parts: Sequence[Part], stream: int) -> None:
        d, m, comm = self.topo.device_index, self.topo.machine_index, self.comms["diffuse"]
        for p in parts:
            if gathers_diffuse(p, self.gathers):  # in place: send is the m-th block of recv
                self.calls.all_gather(comm, p.view[d][m], p.view[d], stream)
                continue
            mine, into = diffuse_buffers(p, d, m, self.others)
            for i, j in enumerate(self.others):
                self.calls.send(comm, mine, j, stream)
                self.calls.recv(comm, into[i], j, stream)

    def all_gather(self, parts: Sequence[Part], stream: int) -> None:
        d, comm = self.topo.device_index, self.comms["all_gather"]
        for p in parts:  # in place: send is the d-th block of recv
            self.calls.all_gather(comm, p.view[d], p.view, stream)

    def prepare(self, stage: str, parts: Sequence[Part], stream: int) -> None:
        """Before the group: collect's rows take the wire format."""
        if stage == "collect":
            for p in parts:
                narrow_collected(p, self.topo, self.others, self.casts, stream)

    def finish(self, stage: str, parts: Sequence[Part], stream: int) -> None:
        """After the group: diffuse's received rows leave the wire format."""
        if stage == "diffuse":
            for p in parts:
                widen_diffused(p, self.topo, self.others, self.casts, stream)

    def flat_all_reduce(self, t: torch.Tensor, op: str, stream: int) -> None:
        self.all_reduce_on("world", t, op, stream)

    def all_reduce_on(self, comm: str, t: torch.Tensor, op: str, stream: int) -> None:
        """In-place all-reduce of ``t`` over ``comm``'s ranks, as one group."""
        with self.group([comm]):
            self.calls.all_reduce(self.comms[comm], t, op, stream)

    def exchange_signature(self, comm: str, words: torch.Tensor, got: torch.Tensor,
                           stream: int) -> None:
        """got = elementwise MAX of ``words`` over ``comm``'s ranks (the end-of-call
        check), inside the group the step loop has open."""
        self.calls.all_reduce_into(self.comms[comm], words, got, "max", stream)

    def reduce_scatter_into(self, comm: str, send: torch.Tensor, recv: torch.Tensor, op: str,
                            stream: int) -> None:
        """recv = block ``rank`` of the reduction of ``send`` over ``comm``'s ranks."""
        with self.group([comm]):
            self.calls.reduce_scatter(self.comms[comm], send, recv, op, stream)

    def all_gather_into(self, comm: str, send: torch.Tensor, recv: torch.Tensor,
                        stream: int) -> None:
        """recv = every rank's ``send`` of ``comm``, in its rank order."""
        with self.group([comm]):
            self.calls.all_gather(self.comms[comm], send, recv, stream)

    def rail_exchange(self, comm: str, sends: Sequence[torch.Tensor],
                      recvs: Sequence[torch.Tensor], stream: int) -> None:
        """A rail all-to-all on ``comm`` (collect or diffuse), one group: ``sends[i]``
        goes to machine ``others[i]``, whose message to this machine lands in
        ``recvs[i]``."""
        with self.group([comm]):
            for i, j in enumerate(self.others):
                self.calls.send(self.comms[comm], sends[i], j, stream)
                self.calls.recv(self.comms[comm], recvs[i], j, stream)
