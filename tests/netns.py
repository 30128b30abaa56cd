"""Two virtual machines joined by one cable: a network namespace each and a veth pair.

The rail of a 2-machine test then really crosses a link that a test can cut in the
middle of a call (``ip link set ... down``: packets stop, no reset is sent, both ends
see silence, as when a switch port or cable dies). Intra-machine traffic stays inside
one namespace (its loopback). Needs root and ``ip``; GPU machines without ``ip`` get
it from the repository's ``.iproute/`` folder (benchmarks/fetch_iproute.sh).

Names start with ``rrft`` and carry the test process's id, so they never collide with
benchmarks/emulate.py's ``rrvm*`` namespaces or with another test run. The addresses
(a private /30) exist only inside these two namespaces.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.213.7"
_REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Link:
    """Namespaces ``ns[m]`` and their veth ends ``dev[m]`` (picklable: ranks get it)."""

    ip: str
    env: dict[str, str] = field(default_factory=dict)
    ns: tuple[str, str] = ("", "")
    dev: tuple[str, str] = ("", "")

    def run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run([self.ip, *args], env={**os.environ, **self.env},
                              capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
        return done.stdout

    def set(self, state: str) -> None:
        """Cut (``down``) or mend (``up``) the cable: machine 0's end of it. Mending
        also forgets neighbours that failed to answer during the cut (their entries
        would answer "No route to host" for a while)."""
        self.run("-n", self.ns[0], "link", "set", "dev", self.dev[0], state)
        if state == "up":
            for ns, dev in zip(self.ns, self.dev, strict=True):
                self.run("-n", ns, "neigh", "flush", "dev", dev, check=False)

    def rank_env(self, machine: int) -> dict[str, str]:
        """What a rank of ``machine`` needs: its namespace, and gloo and NCCL told to
        use its end of the cable (the only interface there besides loopback)."""
        return {"RR_TEST_NETNS": self.ns[machine], "GLOO_SOCKET_IFNAME": self.dev[machine],
                "NCCL_SOCKET_IFNAME": self.dev[machine]}


def find_ip() -> tuple[str, dict[str, str]] | None:
    """``ip`` on PATH, else the one unpacked from .iproute/ (with its libraries)."""
    ip = shutil.which("ip")
    if ip:
        return ip, {}
    root = _REPO / ".iproute" / "root"
    debs = sorted(root.parent.glob("*.deb"))
    if debs and not root.is_dir() and shutil.which("dpkg"):
        for deb in debs:  # as benchmarks/emulate.py does: unpacked beside them, not into /
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    for sub in ("sbin", "usr/sbin", "bin", "usr/bin"):
        if (root / sub / "ip").is_file():
            libs = [str(d) for pattern in ("lib/*-linux-gnu", "usr/lib/*-linux-gnu")
                    for d in sorted(root.glob(pattern)) if d.is_dir()]
            return str(root / sub / "ip"), {"LD_LIBRARY_PATH": ":".join(libs)}
    return None


def make_link() -> Link | str:
    """Build the two namespaces and the cable; a string says why it cannot be done."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    found = find_ip()
    if found is None:
        return "no `ip` on PATH nor in .iproute/ (benchmarks/fetch_iproute.sh)"
    tag = f"rrft{os.getpid() % 100000}"
    link = Link(found[0], found[1], (f"{tag}m0", f"{tag}m1"), (f"{tag}a", f"{tag}b"))
    try:
        for ns in link.ns:
            link.run("netns", "add", ns)
            link.run("-n", ns, "link", "set", "lo", "up")
        link.run("link", "add", link.dev[0], "netns", link.ns[0], "type", "veth", "peer",
                 "name", link.dev[1], "netns", link.ns[1])
        for m in (0, 1):
            link.run("-n", link.ns[m], "addr", "add", f"{SUBNET}.{m + 1}/30", "dev", link.dev[m])
            link.run("-n", link.ns[m], "link", "set", link.dev[m], "up")
    except (RuntimeError, OSError) as exc:
        remove(link)
        return f"could not build network namespaces: {exc}"
    return link


def remove(link: Link) -> None:
    """Deleting a namespace deletes its veth end, and with it the other end."""
    for ns in link.ns:
        link.run("netns", "del", ns, check=False)
