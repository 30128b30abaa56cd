"""The end-of-call check (Config.check_call_end): its buffers and its steps.

ringreduce.safety.signature says what is compared and why. The step loop issues the
steps in the wave that carries the last slice's last stage, on that stage's stream:

  before the group     put       words = [s, ~s] (a traced program: written once, when
                                 traced, into words of its own: KeptWords)
  in the group         exchange  got = MAX of words over the first hop's ranks
  after it, one group  exchange  got = MAX of got over the next hop's ranks, if any
  each
  then                 verify    got against s

The hops (``hops``) cover every rank: inside the machine on the all_gather
communicator, then along the rail on the diffuse one (a rail's ranks then hold every
machine's maximum, so every rank holds the world's); one of the two when there is one
device per machine or one machine. The one-slice plan takes the rail hop first, in its
rail group on the chunk's communicator (one_slice.py). The CPU path uses its world gloo
group.

Everything the check touches lives on that one stream, so consecutive calls never
race on the two buffers. On CUDA, ``verify`` is a kernel that writes a mismatch into
host memory, which the watchdog reads before it counts a call finished; on the CPU
the host compares at once and the call raises.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ringreduce.errors import CALL_CHECK, RingReduceError, stage_error
from ringreduce.safety import signature

if TYPE_CHECKING:
    from ringreduce.execution.context import CallContext

STAGE = CALL_CHECK
"""What errors of the check name as their stage (as the Guard's store checks do)."""


class DeviceCallCheck:
    """CUDA: the words on the device; a mismatch lands in pinned host memory as
    [state, largest, smallest, own] (native/check.cu)."""

    def __init__(self, hops: tuple[str, ...], words: torch.Tensor, got: torch.Tensor,
                 report: torch.Tensor, report_pointer: int) -> None:
        self.hops, self.words, self.got = hops, words, got
        self._report = report  # kept alive: kernels write into it
        self._seen = report.numpy()  # reads the pinned words, no copy, no sync
        self._report_pointer = report_pointer

    @classmethod
    def on(cls, device: torch.device, hops: tuple[str, ...]) -> DeviceCallCheck:
        report = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        return cls(hops, torch.zeros(2, dtype=torch.int64, device=device),
                   torch.zeros(2, dtype=torch.int64, device=device), report,
                   _device_pointer(report.data_ptr()))

    def put(self, ctx: CallContext, own: int, stream: int) -> None:
        ctx.kernels.put_signature(self.words, own, stream)

    def exchange(self, ctx: CallContext, hop: int, stream: int) -> None:
        ctx.transport.exchange_signature(self.hops[hop], self.got if hop else self.words,
                                         self.got, stream)

    def verify(self, ctx: CallContext, own: int, stream: int) -> None:
        ctx.kernels.check_signature(self.got, own, self._report_pointer, stream)

    def mismatch(self) -> str | None:
        """For the watchdog, after a call's end event completed: what the ranks called
        differently, or None. The kernel wrote the words before the state."""
        if not self._seen[0]:
            return None
        largest, smallest, own = (int(v) for v in self._seen[1:])
        return signature.disagreement(largest, smallest, own) or \
            "the end-of-call check reported a mismatch it could not decode"


class KeptWords(DeviceCallCheck):
    """The check as a traced program holds it (recording.trace). A program's signature
    is the same at every replay, so its words are written once, when it is traced, into
    memory kept with the program (``make``, ``keep``), and the put is not part of the
    program: a kernel launch less per call, a sizeable share of a replayed call's host
    time (results 2026-11-27-h100x2-one-path). The exchanges and the verdict are the
    communicator's check's (its ``got`` and report)."""

    def __init__(self, check: DeviceCallCheck, make: Callable[[int], torch.Tensor],
                 keep: list[torch.Tensor]) -> None:
        super().__init__(check.hops, check.words, check.got, check._report,
                         check._report_pointer)
        self._make, self._keep = make, keep

    def put(self, ctx: CallContext, own: int, stream: int) -> None:
        self.words = self._make(own)
        self._keep.append(self.words)


def written_words(own: int, stream: torch.cuda.Stream) -> torch.Tensor:
    """[own, ~own] in new device memory, made and written on ``stream``: every read of
    the check's words (put's reader, the first hop) is on the last stage's stream, whatever
    the route (one slice, compressed, the pipeline's end check), so that stream's order
    puts the write before every replay's read, and the allocator reuses the memory only
    after the last of them. No host wait."""
    with torch.cuda.stream(stream):
        words = torch.full((2,), own, dtype=torch.int64, device=stream.device)
        words[1].fill_(~own)
    return words


def hops(devices: int, machines: int) -> tuple[str, ...]:
    """The communicators (by stage name) the check's all-reduce travels, in order. Not
    the world communicator: its proxy thread, idle otherwise, would poll on every call
    (H100 under MPS, 2 x 2 loopback, 25 MiB: one more busy core per rank, CPU per call
    57 against 42 ms)."""
    inside = ("all_gather",) if devices > 1 else ()
    return inside + (("diffuse",) if machines > 1 else ())


def _device_pointer(host: int) -> int:
    """Where kernels reach pinned host memory (cuMemHostGetDevicePointer: the same
    address under unified addressing, asked anyway, since torch may pin by
    registering). Neither torch nor cupy exposes the call, so the driver (the
    process has it loaded) is asked through ctypes, once per Communicator."""
    device = ctypes.c_uint64()
    result = ctypes.CDLL("libcuda.so.1").cuMemHostGetDevicePointer_v2(
        ctypes.byref(device), ctypes.c_void_p(host), ctypes.c_uint(0))
    if result != 0:
        raise RingReduceError(f"cuMemHostGetDevicePointer returned CUresult {result} for the "
                              "end-of-call check's pinned report; check_call_end=False "
                              "runs without the check")
    return device.value


class HostCallCheck:
    """CPU (gloo): the same exchange, compared on the host when it returns."""

    hops = ("world",)

    def __init__(self) -> None:
        self.words = torch.zeros(2, dtype=torch.int64)
        self.got = torch.zeros(2, dtype=torch.int64)

    def put(self, ctx: CallContext, own: int, stream: None) -> None:
        self.words[0], self.words[1] = own, ~own

    def exchange(self, ctx: CallContext, hop: int, stream: None) -> None:
        ctx.transport.exchange_signature(self.hops[hop], self.words, self.got, stream)

    def verify(self, ctx: CallContext, own: int, stream: None) -> None:
        why = signature.disagreement(int(self.got[0]), ~int(self.got[1]), own)
        if why is not None:
            raise stage_error(STAGE, ctx.topo.rank, f"operation #{ctx.op_number}",
                              tuple(range(ctx.topo.world_size)), why)

    def mismatch(self) -> str | None:
        return None  # the call that disagreed raised already
