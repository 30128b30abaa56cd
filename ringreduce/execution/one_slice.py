"""The one-slice plan (plan/slicing.py): a hierarchical all-reduce as three collectives.

For rank (machine m, device d) of M machines x D devices, the tensor's first
``D * (n // D)`` elements seen as (D, k), ``chunk`` its row d:

  reduce_scatter  chunk = the machine's sum of row d                 (inside, in place)
  rail            chunk = every machine's sum of row d               (along the rail)
                  and the last n mod D elements over every rank       (same NCCL group)
  all_gather      row e = device e's chunk, for every e               (inside, in place)

Three NCCL groups, in place, nothing staged. The two-level plan (``apart``) issues
the same collectives with nothing else in their groups, as torch.distributed's
two-level composition does, and the end-of-call check in two groups of its own after
the all-gather (rail, then machine: the same hops). AVG travels as SUM and divides the chunk
once before the all-gather (torch's true division; when the native issuer records
the call, native/add.cu's with no rows, a launch its program can hold: the same
correctly rounded quotient), so every rank ends with the same bits. The end-of-call
check (call_check.py) rides in the rail group (the maximum over the rail) and in the
all-gather's (over the machine: then every rank holds the world's), adding no group.
All of it runs on ``stream``, which the caller made current (torch's division needs
it): from Python the caller's own for a synchronous call, the flat stream for an
asynchronous one; replayed by the native issuer (recording.py) the last stage's, whose
flag and done event end the job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ringreduce.execution.add import finish_average
from ringreduce.execution.pipeline import stage_errors
from ringreduce.safety import signature

if TYPE_CHECKING:
    from ringreduce.execution.context import CallContext

RAIL = "collect"
"""The rail all-reduce runs on the collect stage's communicator (a rail's ranks are
its machines); errors name it so, with the rail's ranks as peers."""
STAGE_OF_GROUP = {"world": RAIL}
"""The stage a group's failure is named after, by the group's first communicator
where it is not a stage's own: the tail rides the rail's group."""


def run(flat: torch.Tensor, op: str, ctx: CallContext, stream: int | None,
        apart: bool = False) -> None:
    """Unpipelined meaning: all_reduce(flat, op) over every rank of the group.
    ``apart``: the two-level plan, the end-of-call check in groups of its own."""
    topo, transport, check = ctx.topo, ctx.transport, ctx.check
    devices = topo.devices_per_machine
    k = flat.numel() // devices
    body, tail = flat[:k * devices], flat[k * devices:]
    chunk = body.view(devices, k)[topo.device_index]
    own = signature.encode(flat.numel(), str(flat.dtype).removeprefix("torch."), op) \
        if check is not None else 0
    if check is not None:
        check.put(ctx, own, stream)
    if devices > 1 and k:
        with stage_errors(ctx, "reduce_scatter", flat):
            transport.reduce_scatter_into("reduce_scatter", body, chunk, op, stream)
    with stage_errors(ctx, RAIL, flat), transport.group([RAIL, "world"]):
        if k:
            transport.all_reduce_on(RAIL, chunk, op, stream)
        if tail.numel():
            transport.all_reduce_on("world", tail, op, stream)
        if check is not None and not apart:  # the rail's maximum: on the chunk's
            # communicator, so that the group launches on one communicator (host time)
            transport.exchange_signature(RAIL, check.words, check.got, stream)
    if op == "avg":
        for part in (chunk, tail):
            if part.numel():
                _average(part, ctx, stream)
    if devices > 1:
        with stage_errors(ctx, "all_gather", flat), transport.group(["all_gather"]):
            if k:
                transport.all_gather_into("all_gather", chunk, body, stream)
            if check is not None and not apart:  # the machine's maximum of the rails'
                transport.exchange_signature("all_gather", check.got, check.got, stream)
    if check is not None:
        if apart:
            _check_apart(flat, ctx, stream)
        check.verify(ctx, own, stream)


def _check_apart(flat: torch.Tensor, ctx: CallContext, stream: int | None) -> None:
    """The two-level plan's end-of-call check, after the data: the rail's maximum, then
    the machine's maximum of the rails' (the world's), each in a group of its own."""
    transport, check = ctx.transport, ctx.check
    assert check is not None
    with stage_errors(ctx, RAIL, flat), transport.group([RAIL]):
        transport.exchange_signature(RAIL, check.words, check.got, stream)
    if ctx.topo.devices_per_machine > 1:
        with stage_errors(ctx, "all_gather", flat), transport.group(["all_gather"]):
            transport.exchange_signature("all_gather", check.got, check.got, stream)


def _average(part: torch.Tensor, ctx: CallContext, stream: int | None) -> None:
    """``part /= world size`` on ``stream``: torch's true division, or the add kernel
    with no rows while the native issuer records (recording.py: a torch op would run
    at trace time instead of landing in the program). Both divide in the element
    type, 16-bit types in fp32 and rounded once: the same bits."""
    if ctx.recording:
        ctx.kernels.add(part, part.view(1, -1)[:0], "avg", ctx.topo.world_size, stream)
    else:
        finish_average(part, ctx.topo.world_size, ctx.divisors.get(part.dtype))
