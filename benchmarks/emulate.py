"""Run ``python -m ringreduce.bench`` on one host as M virtual machines x D devices.

    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 -- -b 1M -e 256M
    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 --mode loopback \\
        --nccl-tuned -- -b 1M -e 256M
    python benchmarks/emulate.py --machines 2 --gpus-per-machine 2 \\
        --script benchmarks/dlrm.py -- --modes nccl,hook,backend

``--script`` runs another script in the bench's place, with the same per-rank
environment and ``--machines M`` in front of its arguments (no ``--link-gbit``).

Rank (m, d) = m * D + d gets torchrun's variables (LOCAL_RANK = d, so it uses GPU d)
and ``NCCL_HOSTID=vm<m>``: NCCL then treats virtual machines as separate hosts and
sends their traffic over its socket transport, even when they share GPUs.

Modes (DESIGN.md, "Measuring performance"):
  capped    one network namespace per virtual machine (rrvm<m>), joined by veth pairs
            to a bridge (rrbr0); ``tc tbf`` on both ends of each veth caps what the
            machine sends and what it receives, like a NIC of fixed capacity.
  loopback  everything on ``lo``; --nccl-tuned adds NCCL's multi-socket settings.
The namespaces, veths and the bridge are removed on exit, on SIGINT/SIGTERM, and
(leftovers of a killed run) at start.

The GPU machines have no ``ip``/``tc``: benchmarks/fetch_iproute.sh downloads Debian's
iproute2 .debs into .iproute/ (carry it), and this script unpacks them with ``dpkg -x``
into .iproute/root and runs ip/tc with LD_LIBRARY_PATH on the unpacked libraries only.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BRIDGE = "rrbr0"
SUBNET = "10.77.0"  # private, unlikely to clash with a cluster's own addresses
BRIDGE_ADDR = f"{SUBNET}.254"
#: NVLink multicast (NVLS) must stay off on the lent machines (FINDINGS.md).
ALWAYS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
          "NVSHMEM_DISABLE_NVLS": "1"}
#: FINDINGS.md: 4 threads x 4 sockets took NCCL from 4.9 to 14.8 GB/s busbw on lo.
NCCL_TUNED = {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"}
#: tc rate units in bits per second; "bps" units are bytes per second in tc.
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}


@dataclass(frozen=True)
class Iproute:
    """Where ip and tc are, and the environment they (and only they) run with."""

    ip: str
    tc: str
    env: dict[str, str] = field(default_factory=dict)

    def run(self, tool: str, *args: str, check: bool = True) -> str:
        cmd = [self.ip if tool == "ip" else self.tc, *args]
        done = subprocess.run(cmd, env={**os.environ, **self.env}, capture_output=True,
                              text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"`{tool} {' '.join(args)}` failed ({done.returncode}): "
                               f"{done.stderr.strip()}; it needs root (CAP_NET_ADMIN) and "
                               "a kernel with network namespaces, veth, bridge and tbf")
        return done.stdout


def find_iproute(folder: Path) -> Iproute:
    """ip/tc from ``folder`` (unpacking its .debs first when needed), else from PATH."""
    folder = folder.resolve()  # the ranks run from the repository root, not from here
    for root in (folder, folder / "root"):
        found = _binaries(root)
        if found:
            return Iproute(*found, env=_library_env(root))
    debs = sorted(folder.glob("*.deb"))
    if debs and shutil.which("dpkg") is None:
        raise SystemExit(f"{len(debs)} .deb files in {folder} but no dpkg to unpack them; "
                         f"unpack them elsewhere into {folder / 'root'}")
    for deb in debs:
        subprocess.run(["dpkg", "-x", str(deb), str(folder / "root")], check=True)
    found = _binaries(folder / "root") if debs else None
    if found:
        return Iproute(*found, env=_library_env(folder / "root"))
    ip, tc = shutil.which("ip"), shutil.which("tc")
    if ip and tc:
        return Iproute(ip, tc)
    raise SystemExit(f"no ip/tc in {folder} nor on PATH: run benchmarks/fetch_iproute.sh on a "
                     f"machine with apt and carry its {folder.name}/ folder here")


def _binaries(root: Path) -> tuple[str, str] | None:
    subdirs = ("sbin", "usr/sbin", "bin", "usr/bin")
    ips = [root / d / "ip" for d in subdirs if (root / d / "ip").is_file()]
    tcs = [root / d / "tc" for d in subdirs if (root / d / "tc").is_file()]
    return (str(ips[0]), str(tcs[0])) if ips and tcs else None


def _library_env(root: Path) -> dict[str, str]:
    """The unpacked libraries, ahead of the host's (the host may have none of them)."""
    dirs = [str(d) for pattern in ("lib/*-linux-gnu", "usr/lib/*-linux-gnu")
            for d in sorted(root.glob(pattern)) if d.is_dir()]
    return {"LD_LIBRARY_PATH": ":".join(dirs)} if dirs else {}


def namespace(m: int) -> str:
    return f"rrvm{m}"


def veths(m: int) -> tuple[str, str]:
    """(bridge side, machine side) of virtual machine m's link."""
    return f"rrvm{m}h", f"rrvm{m}n"


def cleanup(iproute: Iproute) -> None:
    """Remove every rrvm* namespace and rr* link; deleting a namespace deletes its
    veth end, and with it the peer on the bridge. Safe to call at any point."""
    for line in iproute.run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("rrvm"):
            iproute.run("ip", "netns", "del", name, check=False)
    for line in iproute.run("ip", "-o", "link", "show", check=False).splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        if name == BRIDGE or name.startswith("rrvm"):
            iproute.run("ip", "link", "del", name, check=False)


def setup(iproute: Iproute, machines: int, cap: str, burst: str, mtu: int) -> None:
    """Bridge rrbr0 in the root namespace; per machine a namespace, a veth pair and a
    tbf on both ends. tbf on the machine end shapes what it sends, on the bridge end
    what it receives: together a full-duplex NIC of ``cap`` each way."""
    ip = functools.partial(iproute.run, "ip")
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("link", "set", BRIDGE, "mtu", str(mtu), "up")
    ip("addr", "add", f"{BRIDGE_ADDR}/24", "dev", BRIDGE)
    tbf = ("root", "tbf", "rate", cap, "burst", burst, "latency", "100ms")
    for m in range(machines):
        ns, (outer, inner) = namespace(m), veths(m)
        ip("netns", "add", ns)
        ip("link", "add", outer, "mtu", str(mtu), "type", "veth", "peer", "name", inner,
           "mtu", str(mtu), "netns", ns)
        ip("link", "set", outer, "master", BRIDGE, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "addr", "add", f"{SUBNET}.{m + 1}/24", "dev", inner)
        ip("-n", ns, "link", "set", inner, "up")
        iproute.run("tc", "qdisc", "add", "dev", outer, *tbf)
        iproute.run("tc", "-n", ns, "qdisc", "add", "dev", inner, *tbf)


def rate_gbit(cap: str) -> float:
    """tc's rate syntax in Gbit/s, for the bench's link efficiency (20gbit -> 20.0)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", cap.strip().lower())
    if not match or (match[2] or "bit") not in _RATE_UNITS:
        raise SystemExit(f"--link-cap {cap!r}: expected a tc rate such as 20gbit or 800mbit")
    return float(match[1]) * _RATE_UNITS[match[2] or "bit"] / 1e9


def free_port() -> int:
    """A port the OS just handed out (no fixed ports that a second run would hit)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def rank_env(args: argparse.Namespace, m: int, d: int, port: int) -> dict[str, str]:
    """torchrun's variables for rank (m, d), plus this machine's NCCL identity."""
    capped = args.mode == "capped"
    ifname = veths(m)[1] if capped else "lo"
    rank = m * args.gpus_per_machine + d
    env = {"RANK": str(rank),
           "WORLD_SIZE": str(args.machines * args.gpus_per_machine),
           "LOCAL_RANK": str(d), "LOCAL_WORLD_SIZE": str(args.gpus_per_machine),
           "MASTER_ADDR": f"{SUBNET}.1" if capped else "127.0.0.1", "MASTER_PORT": str(port),
           "NCCL_HOSTID": f"vm{m}", "NCCL_SOCKET_IFNAME": ifname,
           # gloo (the CPU path) otherwise binds to the host name's address, which
           # does not exist inside a namespace.
           "GLOO_SOCKET_IFNAME": ifname, "PYTHONUNBUFFERED": "1", **ALWAYS}
    if args.physical_gpus:
        # Spread ranks over the GPUs there are; with fewer GPUs than ranks, virtual
        # machines share GPUs (NCCL accepts that because their host ids differ).
        env |= {"CUDA_VISIBLE_DEVICES": str(rank % args.physical_gpus), "LOCAL_RANK": "0"}
    return env | (NCCL_TUNED if args.nccl_tuned else {})


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


def launch(args: argparse.Namespace, iproute: Iproute | None,
           bench_args: list[str]) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    procs = []
    for m in range(args.machines):
        for d in range(args.gpus_per_machine):
            env = {**os.environ, **(iproute.env if iproute else {}),
                   **rank_env(args, m, d, port)}
            procs.append(subprocess.Popen(rank_command(args, iproute, m, bench_args),
                                          env=env, cwd=REPO))
    return procs


def wait_all(procs: list[subprocess.Popen[bytes]]) -> int:
    """0 when every rank succeeds; on the first failure stop the others (they would
    wait for the dead rank until their timeout) and return its exit code."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _raise_exit(signum: int, _frame: object) -> None:
    # SIGTERM would end Python without running `finally`; turn it into SystemExit so
    # the namespaces and the bridge are removed.
    raise SystemExit(128 + signum)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, bench = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--machines", type=int, required=True)
    p.add_argument("--gpus-per-machine", type=int, required=True)
    p.add_argument("--mode", choices=("capped", "loopback"), default="capped")
    p.add_argument("--physical-gpus", type=int, default=0,
                   help="pin rank r to GPU r %% N (CUDA_VISIBLE_DEVICES); 0: LOCAL_RANK = d")
    p.add_argument("--link-cap", default="20gbit", help="tc rate per machine, each way")
    p.add_argument("--burst", default="1mb",
                   help="tbf bucket; small against the bytes timed, so the cap holds")
    p.add_argument("--mtu", type=int, default=9000, help="jumbo frames, like datacenter NICs")
    p.add_argument("--nccl-tuned", action="store_true", help=" ".join(NCCL_TUNED))
    p.add_argument("--iproute-dir", type=Path, default=REPO / ".iproute")
    p.add_argument("--script", type=Path,
                   help="run this Python script per rank instead of ringreduce.bench")
    args = p.parse_args(own)
    if args.script is not None:
        args.script = args.script.resolve()  # the ranks run from the repository root
    if any(a == "--machines" or a.startswith("--machines=") for a in bench):
        raise SystemExit("pass --machines before `--`: emulate.py gives it to the bench")
    if not 1 <= args.machines <= 253 or args.gpus_per_machine < 1:
        raise SystemExit(f"--machines {args.machines} --gpus-per-machine "
                         f"{args.gpus_per_machine}: need 1..253 machines (one /24) and >= 1")
    if args.mode == "capped" and args.script is None \
            and not any(a.startswith("--link-gbit") for a in bench):
        bench += ["--link-gbit", str(rate_gbit(args.link_cap))]
    return args, bench


def describe(args: argparse.Namespace) -> str:
    extra = " ".join(f"{k}={v}" for k, v in NCCL_TUNED.items()) if args.nccl_tuned else ""
    if args.mode == "loopback":
        return (f"# emulate: {args.machines} machines x {args.gpus_per_machine} devices on lo "
                f"{extra}")
    return (f"# emulate: {args.machines} machines x {args.gpus_per_machine} devices, link cap "
            f"{args.link_cap} each way per machine, tbf burst {args.burst}, MTU {args.mtu}, "
            f"namespaces rrvm0..{args.machines - 1} on bridge {BRIDGE} {extra}")


def main(argv: list[str] | None = None) -> int:
    args, bench_args = parse(sys.argv[1:] if argv is None else argv)
    iproute = find_iproute(args.iproute_dir) if args.mode == "capped" else None
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_exit)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if iproute:
            cleanup(iproute)  # a killed earlier run may have left its namespaces
            setup(iproute, args.machines, args.link_cap, args.burst, args.mtu)
        print(describe(args), flush=True)
        procs = launch(args, iproute, bench_args)
        return wait_all(procs)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not skip the cleanup
        stop(procs)
        if iproute:
            cleanup(iproute)


if __name__ == "__main__":
    sys.exit(main())
