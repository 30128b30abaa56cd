"""The stage operations over torch.distributed gloo (CPU): GlooTransport, the
counterpart of transport.py's NcclTransport, so that slicing, padding and every stage
run in CI without a GPU. Same stage calls, same parts, same bytes between the same
ranks (transport.py's docstring has what each stage does per part).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from ringreduce.execution.transport import (
    Part,
    collect_sends,
    diffuse_buffers,
    gathers_diffuse,
    narrow_collected,
    other_machines,
    widen_diffused,
)
from ringreduce.plan.topology import Topology


class GlooTransport:
    """Stage operations on gloo groups ("world", "intra", "rail"), called directly
    with group-local ranks: device index inside a machine, machine index on a rail."""

    def __init__(self, topo: Topology, groups: dict[str, Any],
                 gathers: bool = True) -> None:
        self.topo = topo
        self.groups = groups
        """dist.ProcessGroupGloo by name (typed Any: torch's stub lists none of the
        collectives called here)."""
        self.gathers = gathers
        """Config.diffuse_gather (gathers_diffuse)."""
        self.others = other_machines(topo)

    def reduce_scatter(self, parts: Sequence[Part], op: str, stream: None = None) -> None:
        d = self.topo.device_index
        for p in parts:
            out = torch.empty_like(p.view[d])  # gloo gets no aliased buffers
            self.reduce_scatter_into("reduce_scatter", p.view, out, op)
            p.view[d].copy_(out)

    def collect(self, parts: Sequence[Part], stream: None = None) -> None:
        self._exchange([(i, out[i], p.staging[i]) for p in parts
                        for out in [collect_sends(p, self.topo, self.others)]
                        for i in range(len(self.others))])

    def diffuse(self, parts: Sequence[Part], stream: None = None) -> None:
        d, m = self.topo.device_index, self.topo.machine_index
        moves = []
        for p in parts:
            if gathers_diffuse(p, self.gathers):
                self.all_gather_into("diffuse", p.view[d][m].clone(), p.view[d])
                continue
            mine, into = diffuse_buffers(p, d, m, self.others)
            moves += [(i, mine, into[i]) for i in range(len(self.others))]
        self._exchange(moves)

    def all_gather(self, parts: Sequence[Part], stream: None = None) -> None:
        d = self.topo.device_index
        for p in parts:
            self.all_gather_into("all_gather", p.view[d].clone(), p.view)

    def group(self, stages: Sequence[str]) -> contextlib.AbstractContextManager[None]:
        """gloo runs each stage to completion: nothing to group."""
        return contextlib.nullcontext()

    def prepare(self, stage: str, parts: Sequence[Part], stream: None = None) -> None:
        if stage == "collect":
            for p in parts:
                narrow_collected(p, self.topo, self.others)

    def finish(self, stage: str, parts: Sequence[Part], stream: None = None) -> None:
        if stage == "diffuse":
            for p in parts:
                widen_diffused(p, self.topo, self.others)

    def flat_all_reduce(self, t: torch.Tensor, op: str, stream: None = None) -> None:
        self._all_reduce("world", t, _gloo_op(op))

    def all_reduce_on(self, comm: str, t: torch.Tensor, op: str, stream: None = None) -> None:
        """In-place all-reduce of ``t`` over ``comm``'s group."""
        self._all_reduce(comm, t, _gloo_op(op))

    def exchange_signature(self, comm: str, words: torch.Tensor, got: torch.Tensor,
                           stream: None = None) -> None:
        """got = elementwise MAX of ``words`` over ``comm``'s ranks (the end-of-call
        check; the CPU check uses "world")."""
        got.copy_(words)
        self._all_reduce(comm, got, dist.ReduceOp.MAX)

    def _all_reduce(self, comm: str, t: torch.Tensor, op: dist.ReduceOp.RedOpType) -> None:
        opts = c10d.AllreduceOptions()
        opts.reduceOp = op  # type: ignore[assignment]  # a RedOpType converts implicitly
        self.groups[_GROUP_OF[comm]].allreduce([t], opts).wait()

    def reduce_scatter_into(self, comm: str, send: torch.Tensor, recv: torch.Tensor, op: str,
                            stream: None = None) -> None:
        """recv = block ``rank`` of the reduction of ``send`` over ``comm``'s ranks;
        ``recv`` may be that block of ``send`` (in place, as NCCL allows)."""
        opts = c10d.ReduceScatterOptions()
        opts.reduceOp = _gloo_op(op)  # type: ignore[assignment]  # as in _all_reduce
        out = torch.empty_like(recv) if _aliased(send, recv) else recv
        self.groups[_GROUP_OF[comm]]._reduce_scatter_base(out.view(-1), send.view(-1),
                                                          opts).wait()
        if out is not recv:
            recv.copy_(out)

    def all_gather_into(self, comm: str, send: torch.Tensor, recv: torch.Tensor,
                        stream: None = None) -> None:
        """recv = every rank's ``send`` of ``comm``, in group-rank order; ``send`` may
        be this rank's block of ``recv`` (in place, as NCCL allows)."""
        src = send.clone() if _aliased(send, recv) else send
        self.groups[_GROUP_OF[comm]]._allgather_base(recv.view(-1), src.view(-1)).wait()

    def rail_exchange(self, comm: str, sends: Sequence[torch.Tensor],
                      recvs: Sequence[torch.Tensor], stream: None = None) -> None:
        """A rail all-to-all (``comm``: collect or diffuse, both the rail group here):
        ``sends[i]`` goes to machine ``others[i]``, whose message lands in ``recvs[i]``."""
        assert _GROUP_OF[comm] == "rail", comm
        self._exchange([(i, sends[i], recvs[i]) for i in range(len(self.others))])

    def _exchange(self, moves: list[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        """For each (i, out, into): send ``out`` to and receive ``into`` from rail peer i.
        Both sides list moves in the same order, so gloo's per-peer FIFO pairs them."""
        rail, works = self.groups["rail"], []
        for i, out, into in moves:
            peer = self.others[i]  # a rail's group rank is the machine index
            works.append(rail.send([out], peer, 0))
            works.append(rail.recv([into], peer, 0))
        for w in works:
            w.wait()


_GROUP_OF = {"world": "world", "reduce_scatter": "intra", "all_gather": "intra",
             "collect": "rail", "diffuse": "rail"}
"""Which gloo group plays each NCCL communicator's part."""


def _aliased(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share memory (gloo must not read what it writes)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _gloo_op(op: str) -> dist.ReduceOp.RedOpType:
    """AVG travels as SUM (gloo has no AVG; the engine divides once at the end)."""
    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM,
            "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
