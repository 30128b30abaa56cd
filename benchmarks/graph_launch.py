"""What a CUDA graph replay costs the host, by graph shape (target T6's floor).

A replayed ringreduce call spends about half its host time in ``CUDAGraph.replay()``.
This times ``replay()`` alone, on an idle device, for graphs of tiny kernels shaped
two ways: N kernels on one stream, and ringreduce's pipeline shape (S slices x 5
stages, each stage on its own stream, each slice's stages linked by events, as
pipeline.py issues them). One GPU, no NCCL: the cost of the graph's shape itself.
With ``--nccl``, under a launcher (emulate.py's ``--script``): the same for NCCL's own
all-reduce captured through torch.distributed, and for ringreduce's captured call,
both of 25 MiB, so NCCL's share of a replay shows.

    python3 benchmarks/graph_launch.py
    python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1 \
        --mode loopback --script benchmarks/graph_launch.py -- --nccl
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import ringreduce
from ringreduce.benchmark.launch import Launch, run_ranks

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


def captured(issue: Callable[[], None]) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        issue()  # warm-up outside the capture (kernel loading, NCCL connections)
        torch.cuda.synchronize()
        graph.capture_begin(capture_error_mode="thread_local")  # NCCL's watchdog polls
        issue()
        graph.capture_end()
    torch.cuda.synchronize()
    return graph


def replay_us(issue: Callable[[], None], replays: int = REPLAYS,
              between: Callable[[], None] = lambda: None) -> float:
    """Median host time of ``replay()``, each on an idle device (``between`` runs
    before each: a barrier when ranks replay together)."""
    return time_us(captured(issue).replay, replays, between)


def time_us(call: Callable[[], object], replays: int,
            between: Callable[[], None] = lambda: None) -> float:
    samples = []
    for _ in range(replays):
        torch.cuda.synchronize()
        between()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(samples[len(samples) // 10:]) * 1e6


def nccl_rank(launch: Launch, device: torch.device) -> None:
    """Rank body for --nccl: replay() of NCCL's captured all-reduce and of ringreduce's
    captured call (its cached graph, replayed directly), 25 MiB fp32."""
    n = 25 * 2**20 // 4
    x = torch.ones(n, device=device)
    rows = {"nccl all_reduce, eager call": time_us(lambda: dist.all_reduce(x), 50, dist.barrier),
            "nccl all_reduce, replay()": replay_us(lambda: dist.all_reduce(x), 50, dist.barrier)}
    comm = ringreduce.Communicator(graphs=4)
    y = torch.ones(n, device=device)
    for _ in range(3):  # seen, captured, replayed
        comm.all_reduce(y)
    graphs = comm._res.graphs
    assert graphs is not None and len(graphs) == 1, "ringreduce did not capture the call"
    graph = graphs.get((y.data_ptr(), y.numel(), y.dtype, "sum"))
    assert graph is not None
    rows["ringreduce all_reduce, replay()"] = time_us(graph.replay, 50, dist.barrier)
    rows["ringreduce all_reduce, whole call"] = time_us(lambda: comm.all_reduce(y), 50,
                                                       dist.barrier)
    del graph
    comm.close()
    if launch.rank == 0:
        mixing = os.environ.get("NCCL_GRAPH_MIXING_SUPPORT", "default (1)")
        print(f"# {dist.get_world_size()} ranks, NCCL_GRAPH_MIXING_SUPPORT={mixing}; "
              "median host time, 50 calls, each on an idle device")
        for name, us in rows.items():
            print(f"{name:<40} {us:>10.1f}")


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
    if "--nccl" in sys.argv[1:]:
        run_ranks(nccl_rank)
    else:
        main()
