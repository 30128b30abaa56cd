"""One row of the benchmark: ringreduce and its references (references.py) on the
same buffers, interleaved per round, so drift in the network or clocks hits all alike.

A round's time is the slowest rank's (the collective ends when its last rank does);
the row shows the median over rounds. Per implementation a row carries device time,
host time (how long the calls kept the caller), CPU time per call (process CPU time
over the timed loop, every thread, so NCCL's proxy threads and gloo's count; mean over
ranks) and the wrong elements of the checked iterations, which run outside the timed
loops.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import torch
import torch.distributed as dist

import ringreduce

from ..execution.quant import FORMATS
from . import references
from .launch import Launch
from .loops import check_loop, time_loop
from .options import WIRES
from .references import Pair, Reduce
from .report import headline

#: Row key prefixes, in table order: ringreduce, the flat reference, the two-level one,
#: the flat one in a 16-bit wire dtype (--wire bfloat16/float16 only).
IMPLS = ("rr", "ref", "two_level", "wire_ref")


@dataclasses.dataclass(frozen=True)
class Bench:
    """What every measurement needs; built once per process."""

    args: argparse.Namespace
    comm: ringreduce.Communicator
    launch: Launch
    backend: str
    device: torch.device
    dtype: torch.dtype
    op: dist.ReduceOp.RedOpType
    groups: references.Groups | None
    """Machine and rail groups of the two-level reference (all-reduce only)."""
    nccl_algo: str = "default"
    """NCCL_ALGO's all-reduce algorithm in this process (references.nccl_algo_label)."""


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


def implementations(b: Bench, bufs: list[Pair]) -> dict[str, Reduce | None]:
    """ringreduce, the flat reference, the two-level one and the wire-dtype one (None
    where it does not apply: two-level and wire_ref to all-reduces only, wire_ref to a
    16-bit --wire; with --only-references the flat ones alone)."""
    a, n = b.args, b.launch.world_size
    avg_by_division = a.op == "avg" and b.backend != "nccl"
    all_reduce = a.collective == "all_reduce"
    two = None if b.groups is None or not all_reduce or a.only_references \
        else references.two_level(b.groups, b.op, n, bufs)
    wire = None if a.wire not in WIRES or not all_reduce or b.dtype != torch.float32 \
        else references.wire_flat(WIRES[a.wire], b.op, avg_by_division, n, bufs)
    return {"rr": None if a.only_references else ringreduce_fn(b),
            "ref": references.flat(a.collective, b.op, avg_by_division, n),
            "two_level": two, "wire_ref": wire}


def route_of(comm: ringreduce.Communicator) -> str:
    """The route of ringreduce's latest call, from its flight record: "hierarchical",
    "one-slice", "two-level" or "flat", without the issuer (the engine's routing decides; this
    only reads what it decided)."""
    record = comm._res.guard.recorder.last()  # the engine's own record of the call
    if record is None:
        return "unknown (no flight record)"
    return record.route.split(" (")[0]


def measure(b: Bench, size: int, buckets: int) -> dict[str, Any]:
    """One row: every implementation, interleaved over rounds."""
    a, cuda, n = b.args, b.device.type == "cuda", b.launch.world_size
    count = size // b.dtype.itemsize
    if a.collective != "all_reduce":
        count -= count % n  # whole blocks
    pattern, want, out_count, tol = workload(count, b)
    bufs = []
    for _ in range(buckets):
        data = pattern.clone()
        bufs.append((data, data if a.collective == "all_reduce"
                     else torch.empty(out_count, dtype=b.dtype, device=b.device)))
    impls = implementations(b, bufs)
    live = [(k, f) for k, f in impls.items() if f is not None]
    for _, reduce in live:
        for _ in range(a.warmup_iters):
            reduce(bufs)
    # (implementation, round, [device, host, cpu]); wrong per implementation
    stats = torch.zeros(len(live), a.rounds, 3, dtype=torch.float64)
    wrong = torch.zeros(len(live), dtype=torch.int64)
    route = "-" if a.only_references else "unknown"
    tols = {"rr": max(tol, quantized_tolerance(b)), "wire_ref": wire_tolerance(b, tol)}
    for r in range(a.rounds):
        for i, (name, reduce) in enumerate(live):
            wrong[i] += check_loop(reduce, bufs, pattern, want, a.check, tols.get(name, tol))
            for t, _ in bufs:
                t.copy_(pattern)  # keep SUM from overflowing to inf/NaN while timed
            stats[i, r] = torch.tensor(time_loop(reduce, bufs, a.iters, cuda))
            if name == "rr":
                route = route_of(b.comm)
    return make_row(b, count, buckets, route, [k for k, _ in live], *_gather(b, stats, wrong))


def _gather(b: Bench, stats: torch.Tensor,
            wrong: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Across ranks: device and host time are the slowest rank's, CPU time the mean;
    then the median over rounds. Returns (device s, host s, cpu s) per implementation
    and the wrong elements summed over ranks."""
    times = stats[:, :, :2].contiguous().to(b.device)
    cpu = stats[:, :, 2].contiguous().to(b.device)
    wrong = wrong.to(b.device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
    dist.all_reduce(wrong, op=dist.ReduceOp.SUM)
    times = times.cpu().median(dim=1).values
    cpu = (cpu.cpu() / b.launch.world_size).median(dim=1).values
    return times, cpu, wrong.cpu().tolist()


def make_row(b: Bench, count: int, buckets: int, route: str, names: list[str],
             times: torch.Tensor, cpu: torch.Tensor, wrong: list[int]) -> dict[str, Any]:
    """nccl-tests figures per implementation; with K buckets one iteration moves K *
    size bytes, and host and CPU time are per call (per bucket)."""
    a, n, size = b.args, b.launch.world_size, count * b.dtype.itemsize
    row: dict[str, Any] = {"size": size, "count": count, "type": a.datatype,
                           "redop": "-" if a.collective == "all_gather" else a.op,
                           "buckets": buckets, "collective": a.collective, "route": route,
                           "wire": a.wire or "-"}
    # nccl-tests' bus factors; a block collective is half an all-reduce on every link.
    passes = 2 if a.collective == "all_reduce" else 1
    t_min = link_bound(size * buckets, b.comm.topology.machines, a.link_gbit, passes)
    # ringreduce's own bound counts the bytes it puts on the link: a 16-bit wire halves
    # them, so its efficiency stays <= 1 and says how close it runs to its own floor.
    rr_min = t_min * wire_fraction(b, route) if t_min else 0.0
    # The wire-dtype reference puts the wire dtype's bytes on the link: its own floor too.
    floors = {"rr": rr_min, "wire_ref": t_min * WIRES[a.wire].itemsize / b.dtype.itemsize
              if t_min and a.wire in WIRES else 0.0}
    for name in IMPLS:
        row |= {f"{name}_{k}": None for k in ("time_us", "host_us", "cpu_us", "algbw",
                                              "busbw", "wrong", "link_eff")}
    for i, name in enumerate(names):
        sec = float(times[i, 0])
        algbw = size * buckets / sec / 1e9
        row |= {f"{name}_time_us": sec * 1e6, f"{name}_host_us": float(times[i, 1]) * 1e6 /
                buckets, f"{name}_cpu_us": float(cpu[i]) * 1e6 / buckets,
                f"{name}_algbw": algbw, f"{name}_busbw": algbw * passes * (n - 1) / n,
                f"{name}_wrong": wrong[i],
                f"{name}_link_eff": floors.get(name, t_min) / sec
                if t_min else None}
    rr = row["rr_time_us"]
    for key, ref in (("ratio", "ref"), ("two_level_ratio", "two_level"),
                     ("wire_ref_ratio", "wire_ref")):
        row[key] = None if rr is None or row[f"{ref}_time_us"] is None \
            else row[f"{ref}_time_us"] / rr
    # This process's NCCL under its own NCCL_ALGO; benchmark.summary merges the runs
    # under the other algorithms into these keys.
    row |= {"flat_backend": b.backend, "nccl_algo": b.nccl_algo,
            "nccl_best_time_us": row["ref_time_us"],
            "nccl_best_algo": b.nccl_algo, "wire_ref_best_time_us": row["wire_ref_time_us"],
            "wire_ref_best_algo": b.nccl_algo if row["wire_ref_time_us"] else None}
    return row | headline(row)


def wire_fraction(b: Bench, route: str) -> float:
    """Bytes on the network per byte of tensor: the wire format's share for float32 on
    the hierarchical route with --wire (a quantized one: payload and scales), else 1."""
    if b.args.wire in FORMATS and route.startswith("compressed"):
        fmt, block = FORMATS[b.args.wire], b.comm.config.wire_block
        return fmt.row_bytes(block, block) / block / b.dtype.itemsize
    if b.args.wire in WIRES and route == "hierarchical" and b.dtype == torch.float32:
        return WIRES[b.args.wire].itemsize / b.dtype.itemsize
    return 1.0


def wire_tolerance(b: Bench, tol: float) -> float:
    """The wire-dtype reference's: exact for SUM, MAX, MIN of small integers (the sums stay
    within 3N, exact in bf16 and fp16 for the worlds inputs() allows); AVG's x / N rounds
    once in the wire dtype."""
    if b.args.wire not in WIRES or b.args.op != "avg":
        return tol
    return max(tol, 4 * torch.finfo(WIRES[b.args.wire]).eps)


def quantized_tolerance(b: Bench) -> float:
    """What ringreduce's result may differ by with an 8- or 4-bit wire (0 without): each
    machine's partial (|x| <= 3D, inputs() is within [-3, 3]) and the reduced sum
    (<= 3N) are quantized once each, off by at most worst_error of their block's
    max-abs: worst_error * (M * 3D + 3N) = worst_error * 6N for SUM, / N for AVG."""
    if b.args.wire not in FORMATS or b.args.collective != "all_reduce":
        return 0.0
    n = b.launch.world_size
    worst = FORMATS[b.args.wire].worst_error_in(b.comm.config.wire_block)
    bound = worst * 6 * n * 1.01  # 1%: fp32 rounding of scales
    return bound / n if b.args.op == "avg" else bound


def link_bound(total_bytes: int, machines: int, link_gbit: float | None,
               passes: int = 2) -> float | None:
    """T_min = 2S(M-1)/(M*B) for an all-reduce: each machine must send (and receive)
    2S(M-1)/M bytes over its own link of B bytes/s; S(M-1)/M for a reduce-scatter or
    all-gather of S bytes in all (``passes`` = 1). None without --link-gbit or with
    one machine."""
    if not link_gbit or machines < 2:
        return None
    return passes * total_bytes * (machines - 1) / (machines * link_gbit * 1e9 / 8)


def wrong_elements(rows: list[dict[str, Any]]) -> int:
    """Every wrong element of every implementation in ``rows``."""
    return sum(row[f"{name}_wrong"] or 0 for row in rows for name in IMPLS)
