"""Do CUDA graphs order against each other through *external* event nodes the way
streams order through events? The question behind overlapping replays (graphs.py:
replays now wait for the whole previous call; overlapping them needs the slot events
captured as external record and wait nodes, replays launched on rotating streams).

One GPU, no NCCL. A slow "producer" (sleep, then flag += 1) and a "consumer" (copy
the flag out) run on different streams; only an event orders them. Each case prints
what the consumer saw and what stream semantics would give:

  eager_to_graph   producer issued eagerly, recording E; consumer a graph whose
                   first node is an external wait on E (cudaEventWaitExternal)
  graph_to_graph   producer a graph ending in an external record of E
                   (cudaEventRecordExternal), consumer as above
  latest_record    producer graph replayed twice, a consumer graph after each on its
                   own stream: does each consumer wait for the record launched just
                   before it (stream semantics), or for an older or newer one?
  self_cycle       a graph that waits on E, then records E itself: does its wait
                   see the record launched before it, not its own (which would hang)?
  no_wait          control: the consumer graph without the wait (must see 0 or the
                   test cannot tell)

    python3 benchmarks/graph_events.py
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

EXTERNAL = 1  # cudaEventRecordExternal == cudaEventWaitExternal == 0x01
SLEEP_CYCLES = 100_000_000  # ~50 ms at H100/H200 clocks: the producer is surely late


def _cudart() -> ctypes.CDLL:
    """The CUDA runtime torch loaded (found in this process's mappings)."""
    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart" in line}
    if not paths:
        raise RuntimeError("libcudart is not mapped into this process")
    return ctypes.CDLL(sorted(paths)[0])


CUDART = _cudart()


def record_external(event: torch.cuda.Event, stream: torch.cuda.Stream) -> None:
    rc = CUDART.cudaEventRecordWithFlags(ctypes.c_void_p(event.cuda_event),
                                         ctypes.c_void_p(stream.cuda_stream), EXTERNAL)
    assert rc == 0, f"cudaEventRecordWithFlags returned {rc}"


def wait_external(stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
    rc = CUDART.cudaStreamWaitEvent(ctypes.c_void_p(stream.cuda_stream),
                                    ctypes.c_void_p(event.cuda_event), EXTERNAL)
    assert rc == 0, f"cudaStreamWaitEvent returned {rc}"


def capture(body: Callable[[torch.cuda.Stream], None]) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        graph.capture_begin()
        body(side)
        graph.capture_end()
    torch.cuda.synchronize()
    return graph


def produce(flag: torch.Tensor) -> None:
    torch.cuda._sleep(SLEEP_CYCLES)
    flag.add_(1)


def main() -> None:
    flag = torch.zeros(1, device="cuda")
    out = torch.zeros(2, device="cuda")
    event = torch.cuda.Event()
    event.record()  # creates the CUDA event, so its handle exists before any capture
    torch.cuda.synchronize()
    a, b, c = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()

    def consumer(slot: int, wait: bool) -> torch.cuda.CUDAGraph:
        def body(s: torch.cuda.Stream) -> None:
            if wait:
                wait_external(s, event)
            out[slot].copy_(flag[0])
        return capture(body)

    def producer_graph() -> torch.cuda.CUDAGraph:
        def body(s: torch.cuda.Stream) -> None:
            produce(flag)
            record_external(event, s)
        return capture(body)

    def reset() -> None:
        torch.cuda.synchronize()
        flag.zero_()
        out.fill_(-1)
        torch.cuda.synchronize()

    results = []
    take0, take1, blind = consumer(0, True), consumer(1, True), consumer(0, False)
    producer = producer_graph()

    reset()
    with torch.cuda.stream(a):
        produce(flag)
        event.record(a)
    with torch.cuda.stream(b):
        take0.replay()
    torch.cuda.synchronize()
    results.append(("eager_to_graph", out[0].item(), 1.0))

    reset()
    with torch.cuda.stream(a):
        producer.replay()
    with torch.cuda.stream(b):
        take0.replay()
    torch.cuda.synchronize()
    results.append(("graph_to_graph", out[0].item(), 1.0))

    reset()
    with torch.cuda.stream(a):
        producer.replay()
    with torch.cuda.stream(b):
        take0.replay()
    with torch.cuda.stream(a):
        producer.replay()
    with torch.cuda.stream(c):
        take1.replay()
    torch.cuda.synchronize()
    results.append(("latest_record, first consumer", out[0].item(), 1.0))
    results.append(("latest_record, second consumer", out[1].item(), 2.0))

    def relay_body(s: torch.cuda.Stream) -> None:
        wait_external(s, event)
        out[0].copy_(flag[0])
        flag.add_(1)
        record_external(event, s)
    relay = capture(relay_body)
    reset()
    with torch.cuda.stream(a):
        produce(flag)
        event.record(a)
    with torch.cuda.stream(b):
        relay.replay()
    with torch.cuda.stream(c):
        take1.replay()
    torch.cuda.synchronize()
    results.append(("self_cycle, the graph itself", out[0].item(), 1.0))
    results.append(("self_cycle, a consumer after it", out[1].item(), 2.0))

    reset()
    with torch.cuda.stream(a):
        producer.replay()
    with torch.cuda.stream(b):
        blind.replay()
    torch.cuda.synchronize()
    results.append(("no_wait (control)", out[0].item(), 0.0))

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"{'case':<34} {'saw':>5} {'stream semantics':>17} {'same':>5}")
    for name, saw, want in results:
        print(f"{name:<34} {saw:>5.0f} {want:>17.0f} {saw == want!s:>5}")


if __name__ == "__main__":
    main()
