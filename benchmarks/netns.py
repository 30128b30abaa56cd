"""Network namespaces for the capped emulation: one per virtual machine (rrvm<m>),
each joined by a veth pair to a bridge (rrbr0), ``tc tbf`` on both ends of each veth
(what the machine sends and what it receives: a full-duplex NIC of fixed capacity).

The GPU machines have no ``ip``/``tc``: benchmarks/fetch_iproute.sh downloads Debian's
iproute2 .debs into .iproute/ (carry it); :func:`find_iproute` unpacks them with
``dpkg -x`` into .iproute/root and runs ip/tc with LD_LIBRARY_PATH on the unpacked
libraries only.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

BRIDGE = "rrbr0"
SUBNET = "10.77.0"  # private, unlikely to clash with a cluster's own addresses
BRIDGE_ADDR = f"{SUBNET}.254"
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
