"""Host time and CPU per call: the native issuer against the Python issuer and NCCL.

    python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 \\
        --mode loopback --script benchmarks/native_host.py -- --size 25M

Every rank builds one Communicator per way (``--ways``; DEFAULT_WAYS says what each name
means: issuer, slice size, plan, end-of-call check, diffuse) over the same process group,
and measures in one run:
  * host time of one call on an idle pipeline (the caller's time until the call
    returns), synchronous and ``async_op=True`` (these round BUCKETS tensors, as DDP's
    buckets: calls on one tensor wait for each other), median of ``--calls`` samples,
    the ways taking turns a call each, and each way's time over NCCL's in the same turn
    (``idle_host_us``);
  * CPU per call (getrusage of the whole process: every thread, NCCL's proxies
    included) and busy cores over ``--calls`` back-to-back calls, the host waiting for
    the device once at the end;
  * exactness: small integers, each way against NCCL's own all-reduce, bit for bit.
Rank 0 prints one table; every rank asserts exactness. At most six ways per run under
MPS: with seven (36 NCCL communicators per process, four ranks on one GPU) the first
call hung in connection setup, twice (results 2026-11-25-h100-engine-v2, runs 7 and 9).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import pstats
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# benchmarks/thread_cpu.py: this script's folder is on sys.path
from thread_cpu import thread_cpu_s, thread_kind

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ringreduce
from ringreduce.benchmark.launch import Launch, run_ranks
from ringreduce.sizes import parse_size

BUCKETS = 8
"""Tensors the asynchronous calls go round (see rank_body)."""


def settle(device: torch.device) -> None:
    """Until every call made so far finished on the device (every call is issued before
    it returns). Timing loops end here, and a way starts only once the last one is done,
    so no way's work overlaps another's clock."""
    torch.cuda.synchronize(device)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


TORCH_HOOK = "hook:torch async"
"""torch's ``allreduce_hook`` (``--hooks``): the reference of every DDP hook way."""


def reference(way: str) -> str:
    """The way a way's paired ratio divides by: NCCL's own call of the same mode; for
    a DDP hook (``hook:...``), torch's ``allreduce_hook``."""
    if way.startswith("hook:"):
        return TORCH_HOOK
    return f"nccl {way.rsplit(' ', 1)[1]}"


def idle_host_us(ways: dict[str, Callable[[], object]], samples: int,
                 before: Callable[[], None]) -> dict[str, tuple[float, float, float]]:
    """Per way, medians over ``samples`` rounds of: the host time of one call with
    nothing queued before it (``before()`` waits for the device and lines the ranks
    up), the calling thread's own CPU time in it (what the call computes, without the
    time it waits for the GIL, a lock or a core), and the call's time over its
    reference's in the same round (``reference``; nan where the reference is not
    measured). The ways take turns, one call each a round, starting one further along
    each round: these hosts drift by tens of µs within a run and by up to 2× between
    runs, and a way measured after another in a block of its own took the drift alone
    (results 2026-11-27-x2-host-ids); in turns it falls on every way alike, and the
    per-round ratio pairs each call with a neighbour in time."""
    names = list(ways)
    times: dict[str, list[float]] = {n: [] for n in names}
    own: dict[str, list[float]] = {n: [] for n in names}
    for r in range(samples):
        for name in names[r % len(names):] + names[:r % len(names)]:
            before()
            start, cpu = time.perf_counter(), time.thread_time()
            ways[name]()
            own[name].append(time.thread_time() - cpu)
            times[name].append(time.perf_counter() - start)
    rows = {}
    for name in names:
        ref = times.get(reference(name))
        ratio = statistics.median(a / b for a, b in zip(times[name], ref, strict=True)) \
            if ref else float("nan")
        rows[name] = (statistics.median(times[name]) * 1e6,
                      statistics.median(own[name]) * 1e6, ratio)
    return rows


def stream_cost(call: Callable[[], object], calls: int,
                device: torch.device) -> tuple[float, float, float, float, dict[str, float]]:
    """(host us per call, CPU ms per call, busy cores, wall ms per call, CPU ms per call
    by thread kind: thread_kinds) over back-to-back calls."""
    settle(device)
    dist.barrier()
    threads, cpu, wall = thread_cpu_s(), _cpu_s(), time.perf_counter()
    host = 0.0
    for _ in range(calls):
        start = time.perf_counter()
        call()
        host += time.perf_counter() - start
    settle(device)
    cpu, wall = _cpu_s() - cpu, time.perf_counter() - wall
    by_kind: dict[str, float] = {}
    python = {t.native_id: t.name for t in threading.enumerate()}
    for tid, (name, seconds) in thread_cpu_s().items():
        kind = thread_kind(tid, name, python)
        by_kind[kind] = by_kind.get(kind, 0.0) + (seconds - threads.get(tid, (name, 0.0))[1])
    return (host / calls * 1e6, cpu / calls * 1e3, cpu / wall, wall / calls * 1e3,
            {k: v / calls * 1e3 for k, v in by_kind.items()})


DEFAULT_WAYS = ("native", "python")
"""Each issuer as configured by default (the pipeline pinned). Also accepted:
``native/8M`` (another slice size), ``native/p2p`` (diffuse as a send and a receive
per other machine, diffuse_gather=False), ``native/nocheck`` (without the
end-of-call check, check_call_end=False), and the plan (plan/slicing.py):
``<issuer>/auto`` (chosen by the construction probe, as by default; ``native/auto``
also replays one-slice calls, which the default issuer leaves to Python),
``<issuer>/one`` (``plan="one-slice"``), ``native/piped`` (``plan="pipelined"``);
variants join with ``+``, e.g. ``native/one+nocheck``. A way without a plan pins the
pipeline, so its issuer is what it measures. ``+int8`` (``+int4``): the
compressed route with that wire, without error feedback (as DDP's hook by default);
checked against NCCL to the format's precision, not bit for bit."""

PLANS = {"auto": None, "one": "one-slice"}
"""Ways whose plan is not the pipeline."""
WIRES = ("int8", "int4")
"""Ways on the compressed route."""


def build_comms(machines: int | None, ways: list[str]) -> dict[str, ringreduce.Communicator]:
    """One Communicator per way (DEFAULT_WAYS says what the names mean)."""
    comms = {}
    for way in ways:
        issuer, _, variant = way.partition("/")
        variants = variant.split("+")  # e.g. one+nocheck
        sizes = [parse_size(v) for v in variants if v[:1].isdigit()]
        plans = [PLANS[v] for v in variants if v in PLANS]
        # issuer, check_call_end, diffuse_gather: Config's internal settings (config.py)
        wires = [v for v in variants if v in WIRES]
        comms[way] = ringreduce.Communicator(machines=machines,
                                             wire=wires[0] if wires else None,
                                             slice_bytes=sizes[0] if sizes else None,
                                             plan=plans[0] if plans else "pipelined",
                                             issuer=issuer,
                                             check_call_end="nocheck" not in variants,
                                             diffuse_gather="p2p" not in variants)
        described = comms[way].describe()
        assert described.endswith(f"issuer={issuer}"), described
    return comms


Say = Callable[..., None]


def check_exact(comms: dict[str, ringreduce.Communicator], base: torch.Tensor,
                device: torch.device, say: Say) -> None:
    """Every way, sync and async, twice (programs replayed), bit for bit against NCCL."""
    reference = base.clone()
    dist.all_reduce(reference)
    for name, comm in comms.items():
        for async_op in (False, True, False, True):
            t = base.clone()
            fut = comm.all_reduce(t, async_op=async_op)
            if fut is not None:
                fut.wait()
            settle(device)
            if comm.config.wire in WIRES:  # within a few of the format's steps: one
                # rounding per machine's partial (collect) and one of the sum (diffuse)
                step = reference.abs().max() / (7 if comm.config.wire == "int4" else 127)
                assert (t - reference).abs().max() <= 4 * step, f"{name} async={async_op}"
                continue
            assert torch.equal(t, reference), f"{name} async={async_op}: wrong result"
        say(f"# exact: {name} ({comm.describe()})", flush=True)


def measure(ways: dict[str, Callable[[], object]], calls: int, device: torch.device,
            say: Say) -> dict[str, tuple[Any, ...]]:
    """Warm every way (its first call goes through Python, the second traces its
    program, a few more settle caches and clocks), then per way:
    (host idle us, caller's own CPU us in it, idle host time over NCCL's in the same
    round, stream host us, CPU ms per call, busy cores, wall ms per call, CPU ms per
    call by thread kind)."""
    for name, call in ways.items():
        for _ in range(5):
            call()
        settle(device)  # one communicator's work at a time across ranks
        say(f"# warm: {name}", flush=True)
    def before() -> None:
        settle(device)
        dist.barrier()

    idle = idle_host_us(ways, calls, before)
    say("# measured: idle host time, every way in turn", flush=True)
    rows = {}
    for name, call in ways.items():
        rows[name] = (*idle[name], *stream_cost(call, calls, device))
        say(f"# measured: {name}", flush=True)
    return rows


def profile_native(ways: dict[str, Callable[[], object]], calls: int, device: torch.device,
                   names: list[str]) -> dict[str, cProfile.Profile]:
    """Where the host time of the ways ``names`` goes, on an idle pipeline."""
    profiles = {}
    for name in [w for w in names if w in ways]:
        profile = cProfile.Profile()
        for _ in range(calls):
            settle(device)
            dist.barrier()
            profile.enable()
            ways[name]()
            profile.disable()
        profiles[name] = profile
    return profiles


def report(rows: dict[str, tuple[Any, ...]], profiles: dict[str, cProfile.Profile],
           size: int, calls: int, device: torch.device) -> None:
    for name, profile in profiles.items():
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
        print(f"# cProfile, {calls} {name} calls (cumulative: with callees, all calls):")
        print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))
    print(f"# {torch.cuda.get_device_name(device)}, {dist.get_world_size()} ranks, {size} "
          f"bytes fp32, {calls} samples; host_idle: median host time on an idle pipeline "
          f"(every way in turn), own_cpu: the calling thread's CPU time in it (median), "
          f"vs_nccl: median of host_idle over NCCL's of the same round and mode (hook:... "
          f"rows: over torch's allreduce_hook's, {TORCH_HOOK!r}); "
          f"stream: {calls} back-to-back calls (host per call, CPU per call, busy cores, "
          f"wall per call; speed = NCCL's wall / this way's, same mode)")
    print(f"{'way':<20} {'host_idle_us':>13} {'own_cpu_us':>11} {'vs_nccl':>8} "
          f"{'stream_host_us':>15} {'cpu_ms_call':>12} {'busy_cores':>11} "
          f"{'wall_ms_call':>13} {'speed':>6}")
    for name, (idle, own, ratio, host, cpu, cores, wall, _) in rows.items():
        speed = rows[reference(name)][6] / wall
        print(f"{name:<20} {idle:>13.1f} {own:>11.1f} {ratio:>8.2f} {host:>15.1f} "
              f"{cpu:>12.2f} {cores:>11.2f} {wall:>13.2f} {speed:>6.2f}")
    print("# where the back-to-back CPU goes: ms per call by thread kind (cores = ms per "
          "call / wall ms per call; NCCL's threads named with NCCL_SET_THREAD_NAME=1)")
    for name, row in rows.items():
        wall, kinds = row[6], row[7]
        parts = [f"{k} {v:.2f} ({v / wall:.2f})"
                 for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v >= 0.005]
        print(f"#   {name:<20} " + ", ".join(parts))


def pieces(comm: ringreduce.Communicator, base: torch.Tensor,
           device: torch.device) -> dict[str, Callable[[], object]]:
    """What a one-slice call and DDP's hook are made of, each timed alone (``--pieces``),
    on ``comm`` (one slice, native issuer): our NCCL binding's own all-reduce (one
    launch) and the one-slice plan's three collectives issued from Python without
    events or check (the floor of any issuer of three groups), then each of the three
    alone (which launch costs what: the rail's goes to the network); the native replay of
    the traced program alone, then with what the native issuer adds to it for a
    synchronous and an asynchronous call (``native.issue``), and the replay followed by
    what an asynchronous call adds, at once or after 150 µs, or by a tiny kernel's
    launch (p:r+...: whether CUDA calls cost more right after a job); a CUDA-aware Future,
    made and completed on a stream;
    torch's ``allreduce_hook`` body (divide, all-reduce, ``then``) against ours. Values
    are not checked here (they grow): only host time. The 16 MiB probe and two calls
    have traced the program of this size."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from ringreduce.execution import streams
    from ringreduce.plan.slicing import ONE_SLICE
    from ringreduce.safety.flight import Record

    res = comm._res
    native, transport, topo = res.native, res.transport, res.topo
    assert native is not None and res.plan.one_slice, comm.describe()
    junk = base.clone()
    devices = topo.devices_per_machine
    k = junk.numel() // devices
    body = junk[:k * devices]
    chunk = body.view(devices, k)[topo.device_index]
    for _ in range(2):
        comm.all_reduce(junk)
    program = native.program(junk, "sum", lambda: None, ONE_SLICE)
    assert program is not None, "the one-slice program of this size was not traced"

    def caller() -> int:
        return torch.cuda.current_stream(device).cuda_stream

    def three_groups() -> None:
        s = caller()
        transport.reduce_scatter_into("reduce_scatter", body, chunk, "sum", s)
        transport.all_reduce_on("collect", chunk, "sum", s)
        transport.all_gather_into("all_gather", chunk, body, s)

    def replay() -> None:
        s = caller()
        native.worker.stream_wait(s, native.worker.run(program, junk.data_ptr(), s, 0))

    def replay_then(*after: Callable[[], object]) -> Callable[[], None]:
        """The replay, then ``after``: what a CUDA call costs right after a job was
        issued, against the same call alone."""
        def run() -> None:
            replay()
            for part in after:
                part()
        return run

    def future_on_last() -> object:
        """What an asynchronous call adds to the replay: a Future completed on the
        stream the job ends on (native.issue)."""
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[device])
        streams.complete_on(native.last, fut, junk)
        return fut

    def spin(seconds: float = 150e-6) -> None:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass

    ring = itertools.cycle([base.clone() for _ in range(BUCKETS)])  # as rank_body's

    def issue(async_op: bool) -> object:
        """native.issue alone: what the native issuer adds to the replay for a
        synchronous or an asynchronous call (its Future, on the stream the job ends on),
        without the Communicator's and issue.py's layers above it."""
        record = Record(0, junk.numel(), str(junk.dtype), "sum", ONE_SLICE)
        return native.issue(next(ring) if async_op else junk, program, async_op, record, 0,
                            ONE_SLICE)[0]

    return {
        "p:nccl1 sync": lambda: transport.all_reduce_on("world", junk, "sum", caller()),
        "p:nccl3 sync": three_groups,
        "p:rs sync": lambda: transport.reduce_scatter_into("reduce_scatter", body, chunk, "sum",
                                                           caller()),
        "p:rail sync": lambda: transport.all_reduce_on("collect", chunk, "sum", caller()),
        "p:ag sync": lambda: transport.all_gather_into("all_gather", chunk, body, caller()),
        "p:replay sync": replay,
        "p:issue sync": lambda: issue(False),
        "p:r+fut sync": replay_then(future_on_last),
        "p:r+spin+fut sync": replay_then(spin, future_on_last),
        "p:r+spin sync": replay_then(spin),
        "p:r+launch sync": replay_then(lambda: junk[:1].zero_()),
        "p:launch sync": lambda: junk[:1].zero_(),
        "p:issue async": lambda: issue(True),
        "p:future async": lambda: torch.futures.Future(devices=[device]),
        "p:fut+set async": future_on_last,
        "p:torchhook async": lambda: default_hooks._allreduce_fut(None, junk),
        "p:ourhook async": lambda: comm._hook_all_reduce(junk),
    }


def hooks(comms: dict[str, ringreduce.Communicator],
          ring: Iterator[torch.Tensor]) -> dict[str, Callable[[], object]]:
    """DDP's hook on a bucket (``--hooks``), in turns with the other ways: torch's
    ``allreduce_hook`` (its body: divide, NCCL's all-reduce, ``then``) and ringreduce's
    (``ringreduce.ddp_hook``'s body, Communicator._hook_all_reduce) on each way's
    communicator: with an 8-bit wire the compressed route where the communicator takes
    it, without error feedback (that needs DDP's GradBucket)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    out: dict[str, Callable[[], object]] = {
        TORCH_HOOK: lambda: default_hooks._allreduce_fut(None, next(ring))}  # type: ignore[arg-type]
    for name, comm in comms.items():
        out[f"hook:{name} async"] = lambda c=comm: c._hook_all_reduce(next(ring))
    return out


def rank_body(launch: Launch, device: torch.device, size: int, calls: int,
              machines: int | None, names: list[str], profile: list[str],
              with_pieces: bool = False, with_hooks: bool = False) -> None:
    say: Say = print if launch.rank == 0 else (lambda *a, **k: None)
    comms = build_comms(machines, names)
    say(f"# built {len(comms)} communicators", flush=True)
    n = size // 4
    base = ((torch.arange(n, device=device) * 7 + launch.rank * 3) % 11 - 5).float()
    check_exact(comms, base, device, say)
    x = base.clone()
    # Asynchronous calls go round BUCKETS tensors, as DDP's buckets do: calls on one tensor
    # run in issue order (each waits for the one before on the device), a ring overlaps.
    ring = itertools.cycle([base.clone() for _ in range(BUCKETS)])
    ways: dict[str, Callable[[], object]] = {
        "nccl sync": lambda: dist.all_reduce(x),
        "nccl async": lambda: dist.all_reduce(next(ring), async_op=True),
    }
    for name, comm in comms.items():
        key = "bench" if comm.config.hook_feedback and comm.config.wire in WIRES else None
        ways[f"{name} sync"] = lambda c=comm, k=key: c.all_reduce(x, feedback=k)
        ways[f"{name} async"] = lambda c=comm, k=key: c.all_reduce(next(ring), async_op=True,
                                                                   feedback=k)
    if with_pieces:
        ways |= pieces(comms["native/one"], base, device)
    if with_hooks:
        ways |= hooks(comms, ring)
    rows = measure(ways, calls, device, say)
    profiles = profile_native(ways, calls, device, profile)
    settle(device)
    for comm in comms.values():
        comm.wait_idle()
        comm.close()
    if launch.rank == 0:
        report(rows, profiles, size, calls, device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--machines", type=int, default=None, help="(emulate.py passes it)")
    p.add_argument("--size", type=parse_size, default=25 * 2**20)
    p.add_argument("--calls", type=int, default=32)
    p.add_argument("--slices", type=lambda v: [x for x in v.split(",") if x], default=[],
                   help="also the native issuer at these slice sizes, e.g. 8M,16M")
    p.add_argument("--ways", type=lambda v: [x for x in v.split(",") if x],
                   default=list(DEFAULT_WAYS), help="comma-separated; see DEFAULT_WAYS")
    p.add_argument("--profile", type=lambda v: [x for x in v.split(",") if x],
                   default=["native sync", "native async"],
                   help="ways profiled with cProfile on an idle pipeline, e.g. "
                        "'python sync'")
    p.add_argument("--hooks", action="store_true",
                   help="also DDP's hook: torch's allreduce_hook against ringreduce's on each "
                        "way's communicator, in turns (vs_nccl: over torch's hook)")
    p.add_argument("--pieces", action="store_true",
                   help="also time a one-slice call's and DDP's hook's parts alone (pieces(); "
                        "needs the way native/one)")
    args = p.parse_args()
    # NCCL_HOSTID is emulate.py's (emulate.host_id): one host per virtual machine, so
    # that a machine's ranks reach each other over NVLink as on real machines; a host
    # per rank only where a machine's ranks share a GPU. Never a host per rank here:
    # that moved the intra-machine stages onto sockets.
    run_ranks(lambda launch, device: rank_body(launch, device, args.size, args.calls,
                                               args.machines,
                                               args.ways + [f"native/{x}" for x in args.slices],
                                               args.profile, args.pieces, args.hooks))


if __name__ == "__main__":
    main()
