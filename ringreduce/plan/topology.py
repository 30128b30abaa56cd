"""Pure topology: which (machine, device) every rank is. No torch, no CUDA.

A machine is a set of ranks that share fast links (NVLink); a *rail* is the set of
ranks with the same device index on every machine. The hierarchy needs every machine
to run the same number of the group's ranks, so that rails are complete; a group spread
unevenly over machines (a pipeline stage of 3 ranks on 2 hosts, say) is one *flat*
group: every call takes the flat all-reduce, as gloo and NCCL would run it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

INTRA_STAGES = ("reduce_scatter", "all_gather")
RAIL_STAGES = ("collect", "add", "diffuse")


@dataclass(frozen=True)
class Topology:
    """Where this rank sits. ``ranks[m][d]`` is the group rank of (machine m, device d)."""

    machines: int
    devices_per_machine: int
    machine_index: int
    device_index: int
    ranks: tuple[tuple[int, ...], ...]
    flat_reason: str = ""
    """Why a group of several machines is treated as one (machines spread unevenly);
    "" when the topology is what the machines are."""

    @property
    def world_size(self) -> int:
        return self.machines * self.devices_per_machine

    @property
    def rank(self) -> int:
        return self.ranks[self.machine_index][self.device_index]

    def intra_ranks(self) -> tuple[int, ...]:
        """Ranks of this machine, ordered by device index."""
        return self.ranks[self.machine_index]

    def rail_ranks(self) -> tuple[int, ...]:
        """Ranks with this device index, ordered by machine index."""
        return tuple(row[self.device_index] for row in self.ranks)

    def peers(self, stage: str) -> tuple[int, ...]:
        """Whom a stage's work waits for (named in its errors): the machine for
        reduce_scatter and all_gather, the rail for collect, add and diffuse, and
        every rank for anything else (the flat route)."""
        if stage in INTRA_STAGES:
            return self.intra_ranks()
        if stage in RAIL_STAGES:
            return self.rail_ranks()
        return tuple(range(self.world_size))

    def all_intra(self) -> tuple[tuple[int, ...], ...]:
        return self.ranks

    def all_rails(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(row[d] for row in self.ranks) for d in range(self.devices_per_machine))


def from_host_ids(host_ids: Sequence[str], rank: int) -> Topology:
    """Group ranks by host identity; machines are numbered by first appearance and
    devices by rank order within a machine. Machines that differ in rank count give
    one flat machine of every rank, its ``flat_reason`` naming every host and count."""
    members: dict[str, list[int]] = {}
    for r, host in enumerate(host_ids):
        members.setdefault(host, []).append(r)
    counts = {host: len(rs) for host, rs in members.items()}
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"{host!r}: {n}" for host, n in counts.items())
        return Topology(1, len(host_ids), 0, rank, (tuple(range(len(host_ids))),),
                        f"the group's ranks are spread unevenly over machines ({listing}); "
                        "the hierarchy needs the same number on every machine")
    return _locate(tuple(tuple(rs) for rs in members.values()), rank)


def virtual_host(rank: int, world_size: int, machines: int) -> str:
    """The host identity of ``rank`` when ``world_size`` ranks are split into
    ``machines`` virtual machines of contiguous ranks (machines are then found from
    identities, as for real hosts)."""
    if machines < 1 or world_size % machines:
        raise ValueError(
            f"machines={machines} must divide the world size {world_size}; choose a "
            f"divisor of {world_size}: {_divisor_list(world_size)}")
    return f"virtual-machine-{rank // (world_size // machines)}"


def _divisor_list(n: int) -> str:
    """Every valid machines= for ``n`` ranks, as a sentence: "machines=1, 2 or 4"."""
    divisors = [str(d) for d in range(1, n + 1) if n % d == 0]
    if len(divisors) == 1:
        return f"machines={divisors[0]}"
    return f"machines={', '.join(divisors[:-1])} or {divisors[-1]}"


def from_virtual(world_size: int, machines: int, rank: int) -> Topology:
    """Split ranks 0..world_size-1 into ``machines`` virtual machines of contiguous ranks."""
    hosts = [virtual_host(r, world_size, machines) for r in range(world_size)]
    return from_host_ids(hosts, rank)


def _locate(rows: tuple[tuple[int, ...], ...], rank: int) -> Topology:
    for m, row in enumerate(rows):
        if rank in row:
            return Topology(len(rows), len(row), m, row.index(rank), rows)
    raise AssertionError(f"rank {rank} is in no machine of {rows}")
