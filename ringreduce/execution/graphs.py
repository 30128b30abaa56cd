"""Replay: repeated hierarchical all-reduces as CUDA graphs, to cut their host time.

Issuing the pipeline from Python costs about a millisecond per 25 MiB call (1.2 ms at
2 x 1 on H200: per slice, NCCL groups, kernel launches, events, views), while data-parallel training
all-reduces the same gradient buckets, at the same addresses, every step. So, when
enabled (``graphs=N``, ``RINGREDUCE_GRAPHS``), the second time a communicator sees
a call with the same (address, numel, dtype, op), it captures the call into a
``torch.cuda.CUDAGraph`` on a stream of its own, and from then on replays it: one
graph launch instead of the Python walk. A tensor seen once is never captured, so
callers that allocate a fresh tensor per call pay nothing.

Why replay is correct:
  * A graph bakes addresses in. The key is the tensor's address and size, so a replay
    reads and writes exactly the caller's tensor; staging and padding memory are
    allocated once and never move, and the capture allocates nothing on the default
    path (the 16-bit wire path allocates inside the graph's private pool).
  * A replay is ordered with the calls around it the way eager calls are, slice by
    slice (streams.CudaStreams). In the capture, the waits and records that cross
    calls (a staging or padding slot's release, each stage's last work: the stage
    "tails") become external event nodes on the communicator's named events. CUDA
    honours those exactly as streams honour events: a wait sees the last record
    launched before it (benchmarks/graph_events.py checks it).
    So a replay's slice i waits only for its slot and for the previous call's work on
    the same stage (one NCCL communicator each, whose order every rank must share).
    Replays alternate between two streams, so consecutive ones can overlap.
  * Eager calls do not record the tails (each stage's stream orders them), so a
    replay after an eager call waits for that call's ``done`` first, and eager work on
    the stage communicators after a replay waits for the replay's ``done``.
  * CUDA runs the launches of one graph one after another, so a tensor replayed twice
    back to back never has two replays in flight.
  * NCCL keeps a communicator alive while any graph that captured it exists (its
    ncclCommDestroy waits for them), so closing drops these graphs first.

Measured (2 x 1 on one H200, 20 Gbit/s cap):
  * Host time per 25 MiB call: about 1200 us eager, 123-181 us replayed. A graph holding
    NCCL costs ~40 us per captured communicator to launch, one without 3 us.
  * 16 back-to-back 25 MiB buckets: 1.27x NCCL replayed against 1.24x eager in the same
    run. Replays that waited for the whole previous call ran 1.11x.
  * DLRM-style DDP, replayed: hook 0.99x, backend 0.97x NCCL, identical losses. The
    serialised replays ran 0.89x.
  * In that bucket stream the host waits for the device when replayed (14.6 ms per call,
    about the device's time per call). Eager calls there run ahead: 1.4 ms per call. Each
    of the 16 graphs is launched again while its previous launch may still be queued; that
    this is the cause is likely but not proven. DDP launches each bucket's graph once per
    step, long after the last launch ended. A loop that all-reduces the same tensor
    asynchronously would stall the host, so replay stays opt-in.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable

import torch

from ringreduce.errors import RingReduceError

log = logging.getLogger("ringreduce")

Key = tuple[int, int, torch.dtype, str]
"""(data_ptr, numel, dtype, op) of an all-reduce."""


class GraphCache:
    """At most ``capacity`` captured calls, least recently used dropped first."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self._graphs: collections.OrderedDict[Key, torch.cuda.CUDAGraph] = \
            collections.OrderedDict()
        self._seen: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self._device = device
        self._stream: torch.cuda.Stream | None = None  # made at the first capture
        self.captures = 0
        self.evicted = 0

    def get(self, key: Key) -> torch.cuda.CUDAGraph | None:
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
        return graph

    def seen_before(self, key: Key) -> bool:
        """True the second time ``key`` comes (then it is worth capturing); remembers
        a bounded number of keys seen once. Once as many graphs were dropped as the
        cache holds, more tensors repeat than fit: capturing on would re-capture
        every call (slower than not capturing), so no new captures are made."""
        if self.evicted >= self.capacity:
            return False
        if key in self._seen:
            del self._seen[key]
            return True
        self._seen[key] = None
        if len(self._seen) > 4 * self.capacity:
            self._seen.popitem(last=False)
        return False

    def capture(self, key: Key, issue: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """Capture what ``issue()`` enqueues on the current stream (and the streams it
        forks from it) into a graph kept under ``key``. Nothing runs until replay.

        Capture mode "thread_local": other threads (the watchdog's event queries, a
        data loader's allocations) may go on using CUDA meanwhile."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(self._device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self._stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                issue()
            except BaseException:
                with contextlib.suppress(Exception):  # the original error matters
                    graph.capture_end()
                del graph  # not kept alive by the traceback: NCCL would wait for it
                raise
            try:
                graph.capture_end()
            except RuntimeError as exc:
                raise RingReduceError(f"capturing an all-reduce of {key[1]} x {key[2]} into "
                                      f"a CUDA graph failed: {exc}; RINGREDUCE_GRAPHS=0 "
                                      "turns replay off") from exc
        self.captures += 1
        self._graphs[key] = graph
        if len(self._graphs) > self.capacity:
            self._graphs.popitem(last=False)  # NCCL reclaims its plans when it dies
            self.evicted += 1
            if self.evicted == self.capacity:
                log.warning("ringreduce: more repeated tensors than RINGREDUCE_GRAPHS=%d "
                            "graphs; new ones are no longer captured (raise it to capture "
                            "them)", self.capacity)
        return graph

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()
        self._seen.clear()
