"""What a CUDA graph replay costs the host, by graph shape (target T6's floor).

A replayed ringreduce call spends about half its host time in ``CUDAGraph.replay()``.
This times ``replay()`` alone, on an idle device, for graphs of tiny kernels shaped
two ways: N kernels on one stream, and ringreduce's pipeline shape (S slices x 5
stages, each stage on its own stream, each slice's stages linked by events, as
pipeline.py issues them). One GPU, no NCCL: the cost of the graph's shape itself.

    python3 benchmarks/graph_launch.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

STAGES = 5
REPLAYS = 200


def one_stream(kernels: int, x: torch.Tensor) -> Callable[[], None]:
    def issue() -> None:
        for _ in range(kernels):
            x.add_(1)
    return issue


def pipeline(slices: int, x: torch.Tensor, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
    def issue() -> None:
        entry = torch.cuda.current_stream()
        start = torch.cuda.Event()
        start.record(entry)
        for s in streams:
            s.wait_event(start)
        for _ in range(slices):
            previous: torch.cuda.Event | None = None
            for stream in streams:
                if previous is not None:
                    stream.wait_event(previous)
                with torch.cuda.stream(stream):
                    x.add_(1)
                previous = torch.cuda.Event()
                previous.record(stream)
        for s in streams:
            end = torch.cuda.Event()
            end.record(s)
            entry.wait_event(end)
    return issue


def replay_us(issue: Callable[[], None]) -> float:
    """Median host time of ``replay()`` over REPLAYS replays, each on an idle device."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        issue()  # warm-up outside the capture (kernel loading)
        graph.capture_begin()
        issue()
        graph.capture_end()
    torch.cuda.synchronize()
    samples = []
    for _ in range(REPLAYS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        samples.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(samples[10:]) * 1e6


def main() -> None:
    x = torch.zeros(1, device="cuda")
    streams = [torch.cuda.Stream() for _ in range(STAGES)]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA "
          f"{torch.version.cuda}; median host time of CUDAGraph.replay(), {REPLAYS} replays")
    print(f"{'graph':<40} {'kernels':>8} {'replay_us':>10}")
    for n in (1, 5, 10, 35, 70):
        print(f"{f'one stream, {n} kernels':<40} {n:>8} {replay_us(one_stream(n, x)):>10.1f}")
    for s in (1, 2, 7, 14):
        name = f"pipeline, {s} slices x {STAGES} streams"
        print(f"{name:<40} {s * STAGES:>8} {replay_us(pipeline(s, x, streams)):>10.1f}")


if __name__ == "__main__":
    main()
