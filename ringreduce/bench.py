"""Bandwidth of ringreduce against the process group's own collective (NCCL on GPUs,
gloo on CPU), in the same run, nccl-tests style: all-reduce by default, or
``--collective reduce_scatter|all_gather`` (size = the whole tensor: the input of a
reduce-scatter, the output of an all-gather, as in nccl-tests).

    python -m ringreduce.bench                           # no launcher: 4 CPU processes,
                                                         # 2 virtual machines x 2 devices
    torchrun --nproc-per-node 8 -m ringreduce.bench -b 1M -e 256M
    mpirun -np 16 python -m ringreduce.bench --link-gbit 100 --json out.json

Per size and round, ringreduce's timed loop runs, then the reference's, on the same
buffers (interleaved, so drift in the network or clocks hits both alike). A round's
time is the slowest rank's (the collective ends when its last rank does); the row
shows the median over rounds. Checked iterations (-c) run outside the timed loops.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import pstats
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import ringreduce
from ringreduce.launch import Launch, default_nprocs, detect, run_ranks
from ringreduce.report import format_row, header, write_outputs

OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG,
       "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
DTYPES = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16,
          "double": torch.float64, "int32": torch.int32, "int64": torch.int64}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}  # nccl-tests: powers of 1024

Pair = tuple[torch.Tensor, torch.Tensor]
"""(input, output) of one call; the same tensor twice for the in-place all-reduce."""
Reduce = Callable[[list[Pair]], None]
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def parse_size(text: str) -> int:
    """``64M`` -> 67108864, like nccl-tests' -b/-e."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: expected an integer with an optional K, M or G suffix, e.g. 64M")
    return int(match[1]) * _UNITS[match[2].upper()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ringreduce.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("-b", "--minbytes", type=parse_size, help="smallest size (default 1M on GPU, 64K on CPU)")
    add("-e", "--maxbytes", type=parse_size, help="largest size (default 256M on GPU, 4M on CPU)")
    add("-f", "--stepfactor", type=int, default=2, help="size multiplier between rows")
    add("-n", "--iters", type=int, default=20, help="timed iterations per round")
    add("-w", "--warmup_iters", type=int, default=5)
    add("-r", "--rounds", type=int, default=5, help="interleaved rounds; the median is shown")
    add("-c", "--check", type=int, default=1,
        help="checked (untimed, exact) iterations per round and implementation; 0: none")
    add("-d", "--datatype", choices=DTYPES, default="float")
    add("-o", "--op", choices=OPS, default="sum", help="(ignored by all_gather)")
    add("--collective", choices=COLLECTIVES, default="all_reduce")
    add("--machines", type=int, help="virtual machines (contiguous ranks); default: detect")
    add("--slice-bytes", type=parse_size)
    add("--staging-bytes", type=parse_size)
    add("--min-bytes", type=parse_size)
    add("--buckets", type=int, default=1, help="back-to-back async all-reduces per iteration")
    add("--link-gbit", type=float, help="per-machine link speed, for link efficiency")
    add("--json", help="write {meta, rows} here")
    add("--plot", help="write a busbw-vs-size PNG here (needs matplotlib)")
    add("--nprocs", type=int, help="processes to spawn without a launcher (default 4 on CPU)")
    add("--host-profile", type=parse_size, metavar="BYTES",
        help="after the sweep: host time of one call of BYTES on an idle pipeline, and a "
             "cProfile of it (rank 0)")
    return p


@dataclasses.dataclass(frozen=True)
class Bench:
    """What every measurement needs; built once per process."""

    args: argparse.Namespace
    comm: ringreduce.Communicator
    launch: Launch
    backend: str
    device: torch.device
    dtype: torch.dtype
    op: dist.ReduceOp


def validate(args: argparse.Namespace) -> None:
    """Reject bad flags before any process starts."""
    low = {"stepfactor": 2, "iters": 1, "warmup_iters": 0, "rounds": 1, "check": 0, "buckets": 1}
    for name, least in low.items():
        if getattr(args, name) < least:
            raise SystemExit(f"--{name} {getattr(args, name)}: must be at least {least}")
    if args.minbytes and args.maxbytes and args.maxbytes < args.minbytes:
        raise SystemExit(f"-e {args.maxbytes} < -b {args.minbytes}: swap them")


def sweep(args: argparse.Namespace, cuda: bool) -> list[int]:
    """Sizes from -b to -e. The CPU default is small: 4 gloo ranks on 2 cores take
    ~5 ms per call, so 64K..4M (flat and hierarchical routes) runs in ~20 s."""
    lo = args.minbytes or (1 << 20 if cuda else 64 << 10)
    hi = args.maxbytes or (256 << 20 if cuda else 4 << 20)
    sizes = [lo]
    while sizes[-1] * args.stepfactor <= hi:
        sizes.append(sizes[-1] * args.stepfactor)
    return sizes


def inputs(count: int, rank: int, b: Bench) -> torch.Tensor:
    """Rank r, element i: ((i + r) % 7) - 3. Sums over n ranks stay within 3n, exact
    in fp16 up to n = 682 and in bf16 up to n = 85, so results compare bit for bit."""
    i = torch.arange(count, device=b.device)
    return ((i + rank) % 7 - 3).to(b.dtype)


def expected(count: int, b: Bench) -> tuple[torch.Tensor, float]:
    """The all-reduce of every rank's inputs, computed locally in float64 (element i
    depends only on i % 7: a 7-entry table gives all of it), and the tolerance: 0
    except float AVG over a world that is not a power of two, where x / n is not
    representable and NCCL pre-multiplies by 1/n before summing."""
    n = b.launch.world_size
    table = (torch.arange(7, dtype=torch.float64)[:, None] + torch.arange(n)[None, :]) % 7 - 3
    op = b.args.op
    col = table.amax(1) if op == "max" else table.amin(1) if op == "min" else table.sum(1)
    if op == "avg":
        col = col / n if b.dtype.is_floating_point else torch.trunc(col / n)
    rounded = op == "avg" and b.dtype.is_floating_point and n & (n - 1) != 0
    index = torch.arange(count, device=b.device) % 7  # on the device: no host copy of S
    return (col.to(b.device)[index].to(b.dtype),
            4 * torch.finfo(b.dtype).eps if rounded else 0.0)


def workload(count: int, b: Bench) -> tuple[torch.Tensor, torch.Tensor, int, float]:
    """(this rank's input, the output it must get, output length, tolerance) for a
    collective over ``count`` elements in all (a multiple of the world size for the
    block collectives)."""
    rank, n, kind = b.launch.rank, b.launch.world_size, b.args.collective
    if kind == "all_reduce":
        want, tol = expected(count, b)
        return inputs(count, rank, b), want, count, tol
    block = count // n
    if kind == "reduce_scatter":
        want, tol = expected(count, b)
        return inputs(count, rank, b), want[rank * block:(rank + 1) * block], block, tol
    gathered = torch.cat([inputs(block, r, b) for r in range(n)])
    return inputs(block, rank, b), gathered, count, 0.0


def ringreduce_fn(b: Bench) -> Reduce:
    """One synchronous call, or K async calls all issued before the first wait."""
    call = {"all_reduce": lambda i, o, a: b.comm.all_reduce(o, op=b.op, async_op=a),
            "reduce_scatter": lambda i, o, a: b.comm.reduce_scatter(o, i, op=b.op, async_op=a),
            "all_gather": lambda i, o, a: b.comm.all_gather(o, i, async_op=a)}[b.args.collective]

    def run(bufs: list[Pair]) -> None:
        futures = [call(i, o, len(bufs) > 1) for i, o in bufs]
        for future in futures:
            if future is not None:
                future.wait()
    return run


def reference_fn(b: Bench) -> Reduce:
    """The same collective through torch.distributed on the same group. gloo has no
    AVG, so on gloo the reference is SUM then a divide (trunc for ints, as NCCL
    does): a documented stand-in."""
    emulate_avg = b.args.op == "avg" and b.backend != "nccl"
    op = dist.ReduceOp.SUM if emulate_avg else b.op
    call = {"all_reduce": lambda i, o, a: dist.all_reduce(o, op=op, async_op=a),
            "reduce_scatter": lambda i, o, a: dist.reduce_scatter_tensor(o, i, op=op,
                                                                         async_op=a),
            "all_gather": lambda i, o, a: dist.all_gather_into_tensor(o, i, async_op=a),
            }[b.args.collective]

    def run(bufs: list[Pair]) -> None:
        works = [call(i, o, len(bufs) > 1) for i, o in bufs]
        for work in works:
            if work is not None:
                work.wait()
        if emulate_avg and b.args.collective != "all_gather":
            n = b.launch.world_size
            for _, t in bufs:
                t.div_(n, rounding_mode=None if t.is_floating_point() else "trunc")
    return run


def time_loop(reduce: Reduce, bufs: list[Pair], iters: int,
              cuda: bool) -> tuple[float, float]:
    """Seconds per iteration of ``iters`` back-to-back calls: (device time, host time
    to issue). CUDA events time the device work; the host clock times how long the
    calls kept the CPU busy (target T6). The barrier keeps a late rank out of it."""
    dist.barrier()
    if not cuda:
        start = time.perf_counter()
        for _ in range(iters):
            reduce(bufs)
        host = (time.perf_counter() - start) / iters
        return host, host
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    start = time.perf_counter()
    for _ in range(iters):
        reduce(bufs)
    host = (time.perf_counter() - start) / iters
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / iters, host


def check_loop(reduce: Reduce, bufs: list[Pair], pattern: torch.Tensor,
               want: torch.Tensor, iters: int, tol: float) -> int:
    """Wrong elements over ``iters`` calls, re-initialising the inputs (and clearing
    the outputs) each time: the all-reduce is in place."""
    wrong = 0
    for _ in range(iters):
        for i, o in bufs:
            o.fill_(99)
            i.copy_(pattern)
        reduce(bufs)
        for _, t in bufs:
            ok = t == want if tol == 0 else torch.isclose(t.double(), want.double(),
                                                          rtol=tol, atol=tol)
            wrong += int((~ok).sum())
    return wrong


def measure(b: Bench, size: int) -> dict[str, Any]:
    """One row: both implementations, interleaved over rounds."""
    a, cuda, n = b.args, b.device.type == "cuda", b.launch.world_size
    count = size // b.dtype.itemsize
    if a.collective != "all_reduce":
        count -= count % n  # whole blocks
    pattern, want, out_count, tol = workload(count, b)
    bufs = []
    for _ in range(a.buckets):
        data = pattern.clone()
        bufs.append((data, data if a.collective == "all_reduce"
                     else torch.empty(out_count, dtype=b.dtype, device=b.device)))
    impls = (ringreduce_fn(b), reference_fn(b))
    for reduce in impls:
        for _ in range(a.warmup_iters):
            reduce(bufs)
    times = torch.zeros(2, a.rounds, dtype=torch.float64)
    host = torch.zeros(2, a.rounds, dtype=torch.float64)
    wrong = torch.zeros(2, dtype=torch.int64)
    for r in range(a.rounds):
        for i, reduce in enumerate(impls):
            wrong[i] += check_loop(reduce, bufs, pattern, want, a.check, tol)
            for t, _ in bufs:
                t.copy_(pattern)  # keep SUM from overflowing to inf/NaN while timed
            times[i, r], host[i, r] = time_loop(reduce, bufs, a.iters, cuda)
    times, host, wrong = times.to(b.device), host.to(b.device), wrong.to(b.device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(host, op=dist.ReduceOp.MAX)
    dist.all_reduce(wrong, op=dist.ReduceOp.SUM)
    row = make_row(b, count, times.cpu().median(dim=1).values.tolist(), wrong.tolist())
    for name, value in zip(("rr", "ref"), host.cpu().median(dim=1).values.tolist(), strict=True):
        row[f"{name}_host_us"] = value * 1e6 / a.buckets  # per call
    return row


def make_row(b: Bench, count: int, seconds: list[float], wrong: list[int]) -> dict[str, Any]:
    """nccl-tests figures; with --buckets K, one iteration moves K * size bytes."""
    a, n, size = b.args, b.launch.world_size, count * b.dtype.itemsize
    row: dict[str, Any] = {"size": size, "count": count, "type": a.datatype,
                           "redop": "-" if a.collective == "all_gather" else a.op,
                           "buckets": a.buckets, "collective": a.collective}
    # nccl-tests' bus factors; a block collective is half an all-reduce on every link.
    passes = 2 if a.collective == "all_reduce" else 1
    t_min = link_bound(size * a.buckets, b.comm.topology.machines, a.link_gbit, passes)
    for name, sec, bad in zip(("rr", "ref"), seconds, wrong, strict=True):
        algbw = size * a.buckets / sec / 1e9
        row |= {f"{name}_time_us": sec * 1e6, f"{name}_algbw": algbw,
                f"{name}_busbw": algbw * passes * (n - 1) / n, f"{name}_wrong": bad}
        if a.link_gbit:
            row[f"{name}_link_eff"] = t_min / sec if t_min else None
    row["ratio"] = seconds[1] / seconds[0]
    return row


def link_bound(total_bytes: int, machines: int, link_gbit: float | None,
               passes: int = 2) -> float | None:
    """T_min = 2S(M-1)/(M*B) for an all-reduce: each machine must send (and receive)
    2S(M-1)/M bytes over its own link of B bytes/s; S(M-1)/M for a reduce-scatter or
    all-gather of S bytes in all (``passes`` = 1). None without --link-gbit or with
    one machine."""
    if not link_gbit or machines < 2:
        return None
    return passes * total_bytes * (machines - 1) / (machines * link_gbit * 1e9 / 8)


def run_sweep(b: Bench) -> list[dict[str, Any]]:
    """Measure every size; rank 0 prints each row as soon as it exists."""
    leader = b.launch.rank == 0
    if leader:
        print(header(b), flush=True)
    rows = []
    for size in sweep(b.args, b.device.type == "cuda"):
        if size < b.dtype.itemsize:
            continue  # no element fits (nccl-tests skips these too)
        rows.append(measure(b, size))
        if leader:
            print(format_row(rows[-1]), flush=True)
    if leader:
        write_outputs(b, rows)
    return rows


def host_profile(b: Bench, size: int) -> None:
    """Target T6: host time of one call when nothing else is queued (so no NCCL
    back-pressure is counted), median of 20 after 3 warm-up calls, three ways: the
    same tensor again and again (ringreduce replays it as a CUDA graph, graphs.py),
    a new tensor every call (the slow path: every call is issued from Python), and
    NCCL's own all-reduce. Then where one slow-path call's time goes (cProfile)."""
    n = size // b.dtype.itemsize
    same = inputs(n, b.launch.rank, b)
    fresh = [inputs(n, b.launch.rank, b) for _ in range(23)]  # 23 addresses: seen once
    ways = {"same tensor": lambda i: b.comm.all_reduce(same, op=b.op),
            "new tensor": lambda i: b.comm.all_reduce(fresh[i], op=b.op),
            "nccl": lambda i: dist.all_reduce(same, op=b.op)}
    medians = {name: _host_samples(b, call) for name, call in ways.items()}
    profiles = {"new tensor": _profiled(b, [inputs(n, b.launch.rank, b)
                                            for _ in range(_PROFILED)])}
    if b.comm.config.graphs:  # ``same`` is captured by now: its calls are replays
        profiles["same tensor"] = _profiled(b, [same] * _PROFILED)
    if b.launch.rank == 0:
        for name, (median, low) in medians.items():
            print(f"# host time per call, {size} bytes, idle pipeline, {name}: median "
                  f"{median * 1e6:.1f} us (min {low * 1e6:.1f})")
        for name, profile in profiles.items():
            print(f"# {name}:")
            print_profile(profile, _PROFILED)


def _profiled(b: Bench, tensors: list[torch.Tensor]) -> cProfile.Profile:
    """cProfile of one all_reduce per tensor, each on an idle pipeline."""
    profile = cProfile.Profile()
    for t in tensors:
        _sync(b)
        dist.barrier()
        profile.enable()
        b.comm.all_reduce(t, op=b.op)
        profile.disable()
    _sync(b)
    return profile


_PROFILED = 10


def print_profile(profile: cProfile.Profile, calls: int, top: int = 22) -> None:
    """Where a call's host time goes: functions by own time, in microseconds per call
    (pstats prints milliseconds as 0.000). cProfile inflates Python-heavy lines; the
    ranking, not the sum, is the point."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    total = sum(v[2] for v in stats.values())
    print(f"# profile of {calls} calls: {total / calls * 1e6:.0f} us/call under cProfile; "
          "own us/call, cumulative us/call, calls/call, function")
    for (path, line, name), (_, ncalls, own, cum, _) in rows:
        where = f"{path.rsplit('/', 2)[-1]}:{line}" if line else "~"
        print(f"#   {own / calls * 1e6:8.1f} {cum / calls * 1e6:8.1f} {ncalls / calls:6.1f}  "
              f"{where}({name})")


def _sync(b: Bench) -> None:
    if b.device.type == "cuda":
        torch.cuda.synchronize()


def _host_samples(b: Bench, call: Callable[[int], object]) -> tuple[float, float]:
    """(median, min) seconds of host time of calls 3..22, each on an idle pipeline."""
    samples = []
    for i in range(23):
        _sync(b)
        dist.barrier()
        start = time.perf_counter()
        call(i)
        if i >= 3:  # the first calls allocate, connect and (same tensor) capture
            samples.append(time.perf_counter() - start)
    _sync(b)
    return statistics.median(samples), min(samples)


def bench_rank(args: argparse.Namespace, launch: Launch,
               device: torch.device) -> list[dict[str, Any]]:
    """One rank, inside its process group: build the Communicator, run the sweep."""
    comm = ringreduce.Communicator(None, machines=args.machines, slice_bytes=args.slice_bytes,
                                   staging_bytes=args.staging_bytes, min_bytes=args.min_bytes)
    try:
        b = Bench(args, comm, launch, dist.get_backend(), device, DTYPES[args.datatype],
                  OPS[args.op])
        rows = run_sweep(b)
        if args.host_profile:
            host_profile(b, args.host_profile)
        return rows
    finally:
        comm.close()


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Parse flags, start or join the ranks; returns rank 0's rows (own rows when launched)."""
    args = build_parser().parse_args(argv)
    validate(args)
    standalone = detect().launcher == "standalone"
    if standalone and args.machines is None and not torch.cuda.is_available():
        # Without GPUs, the default run emulates 2 machines x 2 devices (the smallest
        # case with both hierarchy levels); an odd rank count cannot split in two.
        args.machines = 2 if (args.nprocs or default_nprocs()) % 2 == 0 else 1
    return run_ranks(functools.partial(bench_rank, args), args.nprocs)


if __name__ == "__main__":
    main()
