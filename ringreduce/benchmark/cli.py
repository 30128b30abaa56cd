"""Bandwidth of ringreduce against its references in the same run, nccl-tests style:
the process group's own collective (NCCL on GPUs, gloo on CPU), the two-level
composition a user writes with torch.distributed, and with a 16-bit ``--wire`` the
tensor all-reduced in that dtype (torch's bf16_compress_hook). All-reduce by default, or
``--collective reduce_scatter|all_gather`` (size = the whole tensor: the input of a
reduce-scatter, the output of an all-gather, as in nccl-tests; flat reference only).

    python -m ringreduce.bench                           # no launcher: 4 CPU processes,
                                                         # 2 virtual machines x 2 devices
    torchrun --nproc-per-node 8 -m ringreduce.bench -b 1M -e 256M
    mpirun -np 16 python -m ringreduce.bench --link-gbit 100 --json out.json

Per size and round, ringreduce's timed loop runs, then each reference's, on the same
buffers. The process exits with status 1 when any implementation got any element
wrong. On one host, ``--machines K`` splits the ranks into K virtual machines; for
separate NCCL hosts and capped links use benchmarks/emulate.py. NCCL reads NCCL_ALGO once
per process: run again under ``NCCL_ALGO=allreduce:tree`` (and ``ring``) with
``--only-references`` and merge the JSON files with ``python -m ringreduce.benchmark.summary``,
which takes the fastest NCCL per row as "NCCL best" (benchmarks/gpu.sh perf does).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from typing import Any

import torch
import torch.distributed as dist

import ringreduce

from ..config import WIRE_OF_DTYPE, host_identity
from . import options, references
from .launch import Launch, detect, nccl_variables, run_ranks
from .measure import Bench, measure, wrong_elements
from .profile import host_profile
from .report import RunInfo, format_row, header, write_outputs


def run_sweep(b: Bench, info: RunInfo) -> list[dict[str, Any]]:
    """Measure every size (then the --extra-buckets row); rank 0 prints each row as
    soon as it exists."""
    a, leader = b.args, b.launch.rank == 0
    if leader:
        print(header(info, a), flush=True)
    cases = [(size, a.buckets) for size in options.sizes(a)]
    if a.extra_buckets:
        cases.append((a.bucket_bytes, a.extra_buckets))
    rows = []
    for size, buckets in cases:
        if size < b.dtype.itemsize:
            continue  # no element fits (nccl-tests skips these too)
        rows.append(measure(b, size, buckets))
        if leader:
            print(format_row(rows[-1]), flush=True)
    if leader:
        write_outputs(info, a, rows, torch.__version__)
    return rows


def run_info(b: Bench, hosts: int) -> RunInfo:
    topo, cuda = b.comm.topology, b.device.type == "cuda"
    notes = []
    if not cuda:
        notes.append("CPU run: every side runs over gloo on shared cores; these numbers "
                     "prove the plumbing (routes, exact results), not speed. Speed is "
                     "measured on GPUs.")
    if b.args.only_references:
        notes.append(f"references only (--only-references): ringreduce and the two-level "
                     f"reference not run; these rows give {b.backend} under NCCL_ALGO "
                     f"{b.nccl_algo!r} to benchmark.summary's NCCL best")
    if topo.machines == 1:
        notes.append("one machine detected: the hierarchy cannot run, so every row "
                     f"compares {b.backend} with {b.backend} (ringreduce's flat route). "
                     "To emulate machines on this host pass --machines K (virtual machines "
                     "of contiguous ranks), or run benchmarks/emulate.py --machines M "
                     "--gpus-per-machine D (separate NCCL hosts, capped links).")
    return RunInfo(
        world=b.launch.world_size, machines=topo.machines, devices=topo.devices_per_machine,
        launcher=b.launch.launcher, backend=b.backend,
        device=torch.cuda.get_device_name(b.device) if cuda else "cpu",
        engine=b.comm.describe(), fidelity=b.args.fidelity or default_fidelity(b, hosts),
        nccl_env=nccl_variables(), config=dataclasses.asdict(b.comm.config), notes=notes)


def default_fidelity(b: Bench, hosts: int) -> str:
    """What this run stands for when emulate.py did not say: who carries traffic
    inside a machine, how many hosts NCCL (gloo) sees, what caps the link, and the
    CPU cores each rank has."""
    topo, cuda = b.comm.topology, b.device.type == "cuda"
    intra = "NCCL P2P (NVLink/PCIe)" if cuda else "gloo TCP over loopback"
    virtual = topo.machines > hosts
    return (f"intra-machine traffic: {intra}; {b.backend} sees {hosts} "
            f"host{'s' * (hosts != 1)}" + (" (virtual machines on one host share it: "
                                           "their 'network' is the same path)"
                                           if virtual else "")
            + f"; link cap: none set by the benchmark; CPU cores per rank: "
            f"{options.cores_per_rank(b.launch.local_size):.1f}")


def bench_rank(args: argparse.Namespace, launch: Launch,
               device: torch.device) -> list[dict[str, Any]]:
    """One rank, inside its process group: build the Communicator, run the sweep."""
    wire = WIRE_OF_DTYPE.get(args.wire, args.wire) if args.wire else None  # config's names
    comm = ringreduce.Communicator(None, machines=args.machines, slice_bytes=args.slice_bytes,
                                   staging_bytes=args.staging_bytes, min_bytes=args.min_bytes,
                                   wire=wire)
    try:
        hosts: list[str] = [""] * launch.world_size
        dist.all_gather_object(hosts, host_identity())
        groups = references.make_groups(comm.topology) if args.collective == "all_reduce" \
            else None
        algo = references.nccl_algo_label(nccl_variables().get("NCCL_ALGO"))
        b = Bench(args, comm, launch, dist.get_backend(), device,
                  options.DTYPES[args.datatype], options.OPS[args.op], groups, algo)
        rows = run_sweep(b, run_info(b, len(set(hosts))))
        if args.host_profile:
            host_profile(b, args.host_profile)
        return rows
    finally:
        comm.close()


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Parse and check flags, start or join the ranks; returns rank 0's rows (own rows
    when launched). Exits with status 1 when any element was wrong."""
    args = options.build_parser(__doc__ or "").parse_args(argv)
    launch = detect()
    cuda = torch.cuda.is_available()
    options.complete(args, cuda)
    standalone = launch.launcher == "standalone"
    if standalone and args.machines is None and not cuda:
        # Without GPUs, the default run emulates 2 machines x 2 devices (the smallest
        # case with both hierarchy levels); an odd rank count cannot split in two.
        args.machines = 2 if (args.nprocs or 4) % 2 == 0 else 1
    options.validate(args, launch, cuda)
    rows = run_ranks(functools.partial(bench_rank, args), args.nprocs)
    bad = wrong_elements(rows)
    if bad:
        print(f"ringreduce.bench: {bad} wrong elements (see #wrong): failing", file=sys.stderr)
        raise SystemExit(1)
    return rows
