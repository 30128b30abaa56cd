"""A cluster as the model sees it, and presets whose numbers are cited.

Units: bandwidths in Gbit/s per direction (network convention: a "400 Gb/s NIC"), latencies
and host costs in microseconds. ``net_gbps`` is per *machine* (all its NICs together); the
CLI also takes it per GPU (``--net-gbps``) and multiplies by the GPU count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

#: NCCL's own hardware latencies for the Simple protocol (src/graph/tuning.cc,
#: ``hwLatencies``, NVIDIA/nccl master 5067397): NVLink ring step 3.4 us, network step
#: 14 us. Presets use them as the per-step latency of the intra and network hops.
NCCL_NVLINK_LAT_US = 3.4
NCCL_NET_LAT_US = 14.0

#: ringreduce's measured host cost of an eager call with the default engine (native issuer,
#: waves, paired communicators): 580 us for a 25 MiB call of 7 slices at 2 x 2 on an H100
#: under MPS, of which a wave group's ncclGroupEnd is 32 us and a call has slices + 4 of
#: them. Per slice: a group, the add launch (6 us), events and enqueues (~10 us) = 48 us;
#: per call: four groups, the flag and the Python around the call (106 us) = 240 us; the
#: end-of-call check (on by default) adds a group and two kernel launches: +43 us back to
#: back, so 280 us. (The Python issuer cost "about 500 us per call plus 100 us per
#: slice".) The add now goes out in its collect's wave, so a call has slices + 3 wave
#: groups, one fewer; not recalibrated, because the host figures measured with that
#: change varied up to 2x between machines.
MEASURED_HOST_CALL_US = 280.0
MEASURED_HOST_SLICE_US = 48.0

#: Host cost per peer per slice: collect posts one send and one receive per peer (2 NCCL
#: calls); diffuse is one all-gather whatever the machine count (Config.diffuse_gather),
#: inside the per-slice cost. An assumption (~1.5 us per ncclSend/ncclRecv call, not
#: measured here); it only matters at large machine counts.
HOST_PEER_US = 3.0

#: NCCL's per-message network post overhead for the Simple protocol: getNetOverhead()
#: (1 us on x86) times 3 (src/graph/tuning.cc). Charged per peer in collect/diffuse.
NCCL_PEER_US = 3.0


#: GPUs a machine (D) of the emulated runs the model is checked against with nominal costs
#: (benchmarks/model_validation, from a checkout): D = 2 (two H100s; four H200s, 2 x 2 one
#: rank a GPU) and D = 4 (four H200s, 2 x 4 and 4 x 4, two and four ranks a GPU under MPS).
MEASURED_GPUS = {2: "one rank a GPU", 4: "two or four ranks a GPU under MPS"}
#: The capped links (Gbit/s a machine) of those runs.
MEASURED_NET_GBPS = (10.0, 25.0)


def measured_note(c: Cluster) -> str:
    """How far ``c`` rests on measurement: its D against :data:`MEASURED_GPUS`, its
    network against :data:`MEASURED_NET_GBPS` (the presets: D = 8, 100-3200 Gbit/s)."""
    most_d, most_net = max(MEASURED_GPUS), max(MEASURED_NET_GBPS)
    gpus = (f"D = {c.gpus} measured ({MEASURED_GPUS[c.gpus]})" if c.gpus in MEASURED_GPUS else
            f"D = {c.gpus} not measured ({c.gpus / most_d:g}x the largest measured D: the "
            f"terms that grow with D, the intra-machine reduce-scatter and all-gather over D "
            f"GPUs, D rails sharing the machine's NICs, NCCL's ring over M x D ranks, are "
            f"extrapolated)")
    net = ("" if c.net_gbps <= most_net else
           f"; network {c.net_gbps / most_net:g}x the fastest measured link ({most_net:g} "
           f"Gbit/s), where the CPU cost per call and NVLink, not the link, decide more rows")
    return (f"validated at D = {' and '.join(map(str, MEASURED_GPUS))} on emulated "
            f"{'-'.join(f'{g:g}' for g in MEASURED_NET_GBPS)} Gbit/s links (median |error| "
            f"under 5%, python -m benchmarks.model_validation); {gpus}{net}")


@dataclass(frozen=True)
class Cluster:
    """Machines of GPUs joined by a network; every field a cost the model uses."""

    name: str
    machines: int
    gpus: int
    """GPUs (ranks) per machine."""
    intra_gbps: float
    """Per GPU and direction, inside a machine (NVLink, or loopback sockets when emulated)."""
    intra_lat_us: float
    net_gbps: float
    """Per machine and direction: all its NICs together (D rails share them evenly)."""
    net_lat_us: float
    mem_gbps: float = 16000.0
    """Device memory bandwidth, for the add stage (reads M rows, writes one)."""
    host_call_us: float = MEASURED_HOST_CALL_US
    host_slice_us: float = MEASURED_HOST_SLICE_US
    host_peer_us: float = HOST_PEER_US
    peer_us: float = NCCL_PEER_US
    nccl_hosts: int | None = None
    """Hosts NCCL sees (``None``: ``machines``). One-GPU emulation gives every rank its
    own host id, so NCCL's ring crosses the capped links N times, not M."""
    nccl_eff: float = 1.0
    """Fraction of the link bandwidth NCCL's kernels reach (1: the links; calibration
    fits it, because socket transports do not reach the cap)."""
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("machines", "gpus"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("intra_gbps", "net_gbps", "mem_gbps", "nccl_eff"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0 (Gbit/s)")

    @property
    def ranks(self) -> int:
        return self.machines * self.gpus

    def with_(self, **changes: object) -> Cluster:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def gbps_to_bytes_per_us(gbps: float) -> float:
    """Gbit/s -> bytes per microsecond (1 Gbit/s = 125 bytes/us)."""
    return gbps * 125.0


PRESETS: dict[str, Cluster] = {
    "dgx-h100": Cluster(
        "dgx-h100", 2, 8, intra_gbps=450 * 8, intra_lat_us=NCCL_NVLINK_LAT_US,
        net_gbps=8 * 400, net_lat_us=NCCL_NET_LAT_US, mem_gbps=3350 * 8,
        source="DGX H100 datasheet: 8 x H100 SXM, NVLink 4 at 900 GB/s per GPU "
               "(450 GB/s each way), 8 x ConnectX-7 400 Gb/s compute NICs; H100 SXM "
               "HBM3 3.35 TB/s (H100 datasheet)"),
    "dgx-a100": Cluster(
        "dgx-a100", 2, 8, intra_gbps=300 * 8, intra_lat_us=NCCL_NVLINK_LAT_US,
        net_gbps=8 * 200, net_lat_us=NCCL_NET_LAT_US, mem_gbps=2039 * 8,
        source="DGX A100 datasheet: 8 x A100 SXM 80GB, NVLink 3 at 600 GB/s per GPU "
               "(300 GB/s each way), 8 x ConnectX-6 200 Gb/s HDR compute NICs; A100 "
               "80GB SXM HBM2e 2,039 GB/s (A100 datasheet)"),
    "a100-4x200": Cluster(
        "a100-4x200", 2, 8, intra_gbps=300 * 8, intra_lat_us=NCCL_NVLINK_LAT_US,
        net_gbps=4 * 200, net_lat_us=NCCL_NET_LAT_US, mem_gbps=2039 * 8,
        source="8 x A100 SXM (NVLink 600 GB/s per GPU, A100 datasheet) with 4 x 200 Gb/s "
               "HDR NICs (two GPUs per NIC), as in HGX A100 servers with half the rails"),
    "eth-100g": Cluster(
        "eth-100g", 2, 8, intra_gbps=300 * 8, intra_lat_us=NCCL_NVLINK_LAT_US,
        net_gbps=100, net_lat_us=30.0, mem_gbps=2039 * 8,
        source="8 x A100 SXM (NVLink 600 GB/s per GPU) on one 100 Gb/s Ethernet NIC per "
               "machine, NCCL socket transport; 30 us per network step is an assumption "
               "(TCP, about twice NCCL's 14 us IB figure)"),
}

DEFAULT_PRESET = "dgx-h100"
