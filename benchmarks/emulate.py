"""Run ``python -m ringreduce.bench`` on one host as M virtual machines x D devices.

    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 -- -b 1M -e 256M
    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 --mode loopback \\
        --nccl-tuned -- -b 1M -e 256M
    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 \\
        --script benchmarks/dlrm.py -- --modes nccl,hook,backend

``--script`` runs another script in the bench's place, with the same per-rank
environment and ``--machines M`` in front of its arguments (no ``--link-gbit``).

Rank (m, d) = m * D + d gets torchrun's variables (LOCAL_RANK = d, so it uses GPU d;
with ``--physical-gpus P``, GPU (m * D + d) % P), ``RINGREDUCE_MACHINES=M`` and an NCCL
host id: NCCL then treats virtual machines as separate hosts and sends their traffic
over its socket transport, even when they share GPUs.

  faithful  (P >= D) a virtual machine's ranks sit on different GPUs and share the host
            id ``vm<m>``: NCCL sees M hosts and uses NVLink inside each.
  shared    (P < D) ranks of a virtual machine share a GPU, and NCCL refuses two ranks
            of one host id on one GPU, so each rank is a host of its own
            (``vm<m>r<d>``); they still share the machine's network namespace, so their
            traffic goes over loopback sockets (standing in for NVLink), never over the
            capped link; ringreduce is told M (host ids no longer tell machines apart).
With more ranks than GPUs, a private CUDA MPS daemon runs the ranks of a GPU side by
side instead of time-slicing it (``--mps auto``): pipe and log folders under
/tmp/rr-mps-<pid>, started before the ranks, stopped after them, also on failure and
on SIGINT/SIGTERM; a daemon left by a killed run (its pid gone) is stopped at start.
No GPU setting is changed. ``--mps-only -- CMD`` runs any command under such a daemon
(the GPU tests do). Every process gets NCCL_NVLS_ENABLE=0
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1.

The bench gets ``--fidelity``: what carries intra-machine traffic, what NCCL sees as
hosts, link cap, tbf burst, MTU, MPS and CPU cores per rank, for its table header.

Modes (DESIGN.md, "Measuring performance"):
  capped    one network namespace per virtual machine (rrvm<m>), joined by veth pairs
            to a bridge (rrbr0); ``tc tbf`` on both ends of each veth caps what the
            machine sends and what it receives, like a NIC of fixed capacity.
  loopback  everything on ``lo``; --nccl-tuned adds NCCL's multi-socket settings.
The namespaces, veths and the bridge are removed on exit, on SIGINT/SIGTERM, and
(leftovers of a killed run) at start. ``--cut-link M:SECONDS`` (capped) sets virtual
machine M's link down that many seconds after the ranks start, and waits for every
rank to end on its own (the fault test of a cut network).

The namespaces, tc and the iproute2 carried to GPU machines: benchmarks/netns.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mps  # benchmarks/mps.py, netns.py, rank_processes.py: this script's folder is on sys.path
from netns import BRIDGE, SUBNET, Iproute, cleanup, find_iproute, namespace, rate_gbit, setup, veths
from rank_processes import stop, wait_all, wait_with_cut

REPO = Path(__file__).resolve().parent.parent
#: NVLink multicast (NVLS) must stay off on the lent machines (FINDINGS.md).
ALWAYS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
          "NVSHMEM_DISABLE_NVLS": "1"}
#: FINDINGS.md: 4 threads x 4 sockets took NCCL from 4.9 to 14.8 GB/s busbw on lo.
NCCL_TUNED = {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"}
def free_port() -> int:
    """A port the OS just handed out (no fixed ports that a second run would hit)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def shares_gpu(args: argparse.Namespace) -> bool:
    """Whether ranks of one virtual machine share a GPU (then each is its own NCCL host)."""
    return 0 < args.physical_gpus < args.gpus_per_machine


def gpus_in_use(args: argparse.Namespace) -> int:
    return args.physical_gpus or args.gpus_per_machine


def use_mps(args: argparse.Namespace) -> bool:
    """--mps on; or auto with more ranks than GPUs, on a machine that has MPS."""
    more_ranks = args.machines * args.gpus_per_machine > gpus_in_use(args)
    return args.mps == "on" or (args.mps == "auto" and more_ranks
                                and (args.mps_control or mps.control_binary()) is not None)


def host_id(args: argparse.Namespace, m: int, d: int) -> str:
    """vm<m> (one NCCL host per virtual machine), or vm<m>r<d> when the machine's ranks
    share a GPU: NCCL refuses two ranks of one host id on one GPU."""
    return f"vm{m}r{d}" if shares_gpu(args) else f"vm{m}"


def rank_env(args: argparse.Namespace, m: int, d: int, port: int) -> dict[str, str]:
    """torchrun's variables for rank (m, d), plus this machine's NCCL identity."""
    capped = args.mode == "capped"
    ifname = veths(m)[1] if capped else "lo"
    rank = m * args.gpus_per_machine + d
    env = {"RANK": str(rank),
           "WORLD_SIZE": str(args.machines * args.gpus_per_machine),
           "LOCAL_RANK": str(d), "LOCAL_WORLD_SIZE": str(args.gpus_per_machine),
           "MASTER_ADDR": f"{SUBNET}.1" if capped else "127.0.0.1", "MASTER_PORT": str(port),
           "NCCL_HOSTID": host_id(args, m, d), "NCCL_SOCKET_IFNAME": ifname,
           # Host ids no longer tell machines apart when every rank has its own.
           "RINGREDUCE_MACHINES": str(args.machines),
           # gloo (the CPU path) otherwise binds to the host name's address, which
           # does not exist inside a namespace.
           "GLOO_SOCKET_IFNAME": ifname, "PYTHONUNBUFFERED": "1", **ALWAYS}
    if args.physical_gpus:
        # Spread ranks over the GPUs there are: D consecutive ranks land on D different
        # GPUs whenever D <= P (the faithful layout), else they share (MPS).
        env |= {"CUDA_VISIBLE_DEVICES": str(rank % args.physical_gpus), "LOCAL_RANK": "0"}
    return env | (NCCL_TUNED if args.nccl_tuned else {})


def fidelity(args: argparse.Namespace, mps_on: bool) -> str:
    """What this emulation stands for, for the bench's header (one line)."""
    ranks = args.machines * args.gpus_per_machine
    gpu = args.physical_gpus > 0 or shutil.which("nvidia-smi") is not None
    if not gpu:
        intra = "gloo TCP over loopback" + (" in the machine's namespace" * (args.mode == "capped"))
    elif shares_gpu(args):
        intra = ("loopback sockets in the machine's namespace (its ranks share a GPU"
                 f"{' under MPS' if mps_on else ', time-sliced'})")
    else:
        intra = "NVLink/PCIe (NCCL P2P: a machine's ranks on different GPUs)"
    hosts = ranks if shares_gpu(args) else args.machines
    if args.mode == "capped":
        link = (f"link cap {args.link_cap} each way per machine (tc tbf), burst {args.burst}, "
                f"MTU {args.mtu}")
    else:
        link = "no link cap (all on lo" + (", NCCL tuned sockets)" if args.nccl_tuned else ")")
    return (f"emulated {args.machines}x{args.gpus_per_machine} on one host; intra-machine "
            f"traffic: {intra}; " + (f"NCCL sees {hosts} hosts; " if gpu else "") + f"{link}; GPUs "
            f"{gpus_in_use(args) if gpu else 0}, MPS {'on' if mps_on else 'off'}; CPU cores "
            f"per rank {len(os.sched_getaffinity(0)) / ranks:.1f}")


def rank_command(args: argparse.Namespace, iproute: Iproute | None, m: int,
                 bench_args: list[str]) -> list[str]:
    """The bench (or --script) for virtual machine m; in capped mode inside its namespace.
    ``ip netns exec`` looks its command up on PATH and passes ip's LD_LIBRARY_PATH
    on, so the command is full paths and ``env -u`` restores the caller's."""
    program = ["-m", "ringreduce.bench"] if args.script is None else [str(args.script)]
    bench = [sys.executable, *program, "--machines", str(args.machines), *bench_args]
    if iproute is None:
        return bench
    restore = ["-u", "LD_LIBRARY_PATH"]
    if "LD_LIBRARY_PATH" in os.environ:
        restore.append(f"LD_LIBRARY_PATH={os.environ['LD_LIBRARY_PATH']}")
    return [iproute.ip, "netns", "exec", namespace(m), shutil.which("env") or "/usr/bin/env",
            *restore, *bench]


def launch(args: argparse.Namespace, iproute: Iproute | None, bench_args: list[str],
           extra_env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    procs = []
    for m in range(args.machines):
        for d in range(args.gpus_per_machine):
            env = {**os.environ, **(iproute.env if iproute else {}), **extra_env,
                   **rank_env(args, m, d, port)}
            procs.append(subprocess.Popen(rank_command(args, iproute, m, bench_args),
                                          env=env, cwd=REPO))
    return procs


def _raise_exit(signum: int, _frame: object) -> None:
    # SIGTERM would end Python without running `finally`; turn it into SystemExit so
    # the namespaces, the bridge and the MPS daemon are removed.
    raise SystemExit(128 + signum)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, bench = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--machines", type=int)
    p.add_argument("--gpus-per-machine", type=int)
    p.add_argument("--mode", choices=("capped", "loopback"), default="capped")
    p.add_argument("--physical-gpus", type=int, default=0,
                   help="pin rank r to GPU r %% N (CUDA_VISIBLE_DEVICES); 0: LOCAL_RANK = d")
    p.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                   help="private CUDA MPS daemon; auto: when ranks outnumber the GPUs")
    p.add_argument("--mps-control", help="nvidia-cuda-mps-control to use (default: "
                   f"{mps.CONTROL}, else PATH)")
    p.add_argument("--mps-only", action="store_true",
                   help="run the command after `--` under a private MPS daemon, nothing else")
    p.add_argument("--link-cap", default="20gbit", help="tc rate per machine, each way")
    p.add_argument("--burst", default="1mb",
                   help="tbf bucket; small against the bytes timed, so the cap holds")
    p.add_argument("--mtu", type=int, default=9000, help="jumbo frames, like datacenter NICs")
    p.add_argument("--nccl-tuned", action="store_true", help=" ".join(NCCL_TUNED))
    p.add_argument("--iproute-dir", type=Path, default=REPO / ".iproute")
    p.add_argument("--script", type=Path,
                   help="run this Python script per rank instead of ringreduce.bench")
    p.add_argument("--cut-link", metavar="M:SECONDS",
                   help="capped: set machine M's link down SECONDS after the start")
    p.add_argument("--cut-grace", type=float, default=120.0,
                   help="seconds every rank has to end after --cut-link")
    args = p.parse_args(own)
    if args.mps_only:
        if not bench:
            raise SystemExit("--mps-only needs a command after `--`")
        return args, bench
    if args.machines is None or args.gpus_per_machine is None:
        raise SystemExit("--machines and --gpus-per-machine are required (or --mps-only)")
    if args.script is not None:
        args.script = args.script.resolve()  # the ranks run from the repository root
    if any(a == "--machines" or a.startswith("--machines=") for a in bench):
        raise SystemExit("pass --machines before `--`: emulate.py gives it to the bench")
    if not 1 <= args.machines <= 253 or args.gpus_per_machine < 1:
        raise SystemExit(f"--machines {args.machines} --gpus-per-machine "
                         f"{args.gpus_per_machine}: need 1..253 machines (one /24) and >= 1")
    args.cut = _cut(args)
    if args.mode == "capped" and args.script is None \
            and not any(a.startswith("--link-gbit") for a in bench):
        bench += ["--link-gbit", str(rate_gbit(args.link_cap))]
    return args, bench


def _cut(args: argparse.Namespace) -> tuple[int, float] | None:
    if args.cut_link is None:
        return None
    match = re.fullmatch(r"(\d+):(\d+(?:\.\d+)?)", args.cut_link)
    if args.mode != "capped" or not match or int(match[1]) >= args.machines:
        raise SystemExit(f"--cut-link {args.cut_link}: needs --mode capped and M:SECONDS with "
                         f"M < {args.machines}, e.g. --cut-link 1:20")
    return int(match[1]), float(match[2])


def describe(args: argparse.Namespace) -> str:
    extra = " ".join(f"{k}={v}" for k, v in NCCL_TUNED.items()) if args.nccl_tuned else ""
    if args.mode == "loopback":
        return (f"# emulate: {args.machines} machines x {args.gpus_per_machine} devices on lo "
                f"{extra}")
    return (f"# emulate: {args.machines} machines x {args.gpus_per_machine} devices, link cap "
            f"{args.link_cap} each way per machine, tbf burst {args.burst}, MTU {args.mtu}, "
            f"namespaces rrvm0..{args.machines - 1} on bridge {BRIDGE} {extra}")


def run_under_mps(command: list[str], control: str | None) -> int:
    """--mps-only: the command (e.g. pytest) with the daemon's variables and ALWAYS."""
    with mps.mps_daemon(control) as env:
        return subprocess.run(command, env={**os.environ, **env, **ALWAYS}, cwd=REPO,
                              check=False).returncode


def main(argv: list[str] | None = None) -> int:
    args, bench_args = parse(sys.argv[1:] if argv is None else argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_exit)
    if args.mps_only:
        return run_under_mps(bench_args, args.mps_control)
    if args.script is None:
        bench_args = [*bench_args, "--fidelity", fidelity(args, use_mps(args))]
    iproute = find_iproute(args.iproute_dir) if args.mode == "capped" else None
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        try:
            mps_env = stack.enter_context(mps.mps_daemon(args.mps_control)) if use_mps(args) else {}
            if iproute:
                cleanup(iproute)  # a killed earlier run may have left its namespaces
                setup(iproute, args.machines, args.link_cap, args.burst, args.mtu)
            print(describe(args), flush=True)
            print(f"# emulate: {fidelity(args, bool(mps_env))}", flush=True)
            procs = launch(args, iproute, bench_args, mps_env)
            if args.cut and iproute:
                return wait_with_cut(procs, iproute, *args.cut, args.cut_grace)
            return wait_all(procs)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not skip cleanup
            stop(procs)  # before MPS quits (ExitStack): its servers wait for clients
            if iproute:
                cleanup(iproute)
    return 1


if __name__ == "__main__":
    sys.exit(main())
