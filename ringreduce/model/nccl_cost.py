"""NCCL's all-reduce time by NCCL's own cost model, and the link bound.

NCCL picks an algorithm by ``ncclTopoGetAlgoTime`` (src/graph/tuning.cc, NVIDIA/nccl
master 5067397): ``time = latency + bytes / (1000 * algBw)``. We use its Simple-protocol
terms (the protocol NCCL runs for the MiB-and-up messages this model is for):

- latency, ring: ``baseLat 8.4 + (nsteps - nInterSteps) * intraLat + nInterSteps * interLat``
  with ``nsteps = 2(nRanks-1)``, ``nInterSteps = 2(nNodes-1)``, ``intraLat`` raised to the
  network post overhead (1 us x 3 for Simple) across nodes, and the ring "plateau"
  factor 1.4 (compute capability >= 8.0) across nodes;
- latency, tree: ``baseLat 8.4 + 2 * ((ppn-1) * intraLat + log2i(nNodes) * interLat)``;
- bandwidth, ring: ``algBw = busBw * nRanks / nsteps``; tree: ``algBw = busBw * 0.92 * 0.5``
  times ``treeCorrectionFactor`` (Simple row) by message size.

``intraLat`` and ``interLat`` are the cluster's latencies (the presets use NCCL's own
``hwLatencies``: 3.4 us NVLink, 14 us network). NCCL gets ``busBw`` from its topology
search; here it comes from the links. A ring: every GPU sends ``2S(N-1)/N`` bytes to its
ring neighbour; each ring (channel) crosses each machine boundary once, and NCCL spreads
its channels over all D NICs, so a machine sends ``2S(N-1)/N`` across its NICs together
(``2S(N-1)/(N*D)`` per NIC) and a GPU ``2S(N-1)/N`` over NVLink: busBw is the slower of
the GPU's NVLink and the machine's network. A double binary tree moves ``2S`` per machine
(``S`` at two nodes, where NCCL itself uses the intra bandwidth) and ``2S`` per GPU in the
intra-machine chain. ringreduce, for comparison, moves ``2S(M-1)/M`` per machine over D
rails.

Two tree figures, because NCCL's tuner and NCCL's kernels disagree. The tuner *chooses* by
its estimate (:func:`tree_estimate_us`, with ``treeCorrectionFactor``, 0.5-0.9 at 1 KiB-256
MiB); the tree then *runs* at its links' speed over 0.92 (:func:`tree_time_us`, no
correction). On the faithful 2 x 2 capped at 10 Gbit/s (issue 35; benchmarks/compressed.py)
NCCL's forced tree ran at 0.90-1.0 of the link bound at 4-256 MiB, where the corrected
estimate says 0.64-0.83, and at 4 x 2 at 0.87-0.91 of ``2S/B`` (the busiest node of a
double binary tree of 4 nodes is inner in one tree, leaf in the other: 1.5S + 0.5S). The
correction factors are NCCL's calibration on its own clusters (InfiniBand), not measured
here; taking the uncorrected tree prices NCCL's tree at its strongest, so ringreduce's
predicted speedup over it errs low there.
:func:`nccl_time_us` is NCCL's default (the tuner's pick, at the picked algorithm's running
time); :func:`nccl_best_us` the faster of the two (what ``NCCL_ALGO`` gives a user).
"""

from __future__ import annotations

from .cluster import Cluster, gbps_to_bytes_per_us

BASE_LAT_US = 8.4
NET_OVERHEAD_US = 3.0
RING_PLATEAU = 1.4
TREE_BW_FACTOR = 0.92
#: treeCorrectionFactor[Simple], indexed by log2(bytes / 64), 64 B .. 256 MiB.
TREE_CORRECTION = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8,
                   .7, .7, .8, .9, .9, .9)


def _log2i(n: int) -> int:
    return max(0, n.bit_length() - 1)


def _nodes(c: Cluster) -> int:
    return c.nccl_hosts or c.machines


def ring_time_us(size: int, c: Cluster) -> float:
    """NCCL ring all-reduce of ``size`` bytes, microseconds."""
    n, nodes = c.ranks, _nodes(c)
    if n == 1:
        return 0.0
    intra_lat = max(c.intra_lat_us, NET_OVERHEAD_US) if nodes > 1 else c.intra_lat_us
    steps, inter = 2 * (n - 1), 2 * (nodes - 1)
    lat = BASE_LAT_US + (steps - inter) * intra_lat + inter * c.net_lat_us
    if nodes > 1:
        lat *= RING_PLATEAU
    moved = 2 * size * (n - 1) / n
    return lat + moved / _bus_bytes_per_us(c)


def _bus_bytes_per_us(c: Cluster) -> float:
    """Ring busBw: the slower of a GPU's NVLink and its machine's network share."""
    intra = gbps_to_bytes_per_us(c.intra_gbps) if c.gpus > 1 else float("inf")
    net = gbps_to_bytes_per_us(c.net_gbps) if c.machines > 1 else float("inf")
    return min(intra, net) * c.nccl_eff


def tree_time_us(size: int, c: Cluster) -> float:
    """NCCL (double binary) tree all-reduce of ``size`` bytes as it runs, microseconds:
    its latency, then its busiest link over 0.92 (NCCL's own tree factor); no size
    correction (the module's docstring says why)."""
    return _tree_us(size, c, 1.0)


def tree_estimate_us(size: int, c: Cluster) -> float:
    """NCCL's tuner's estimate of its tree (``ncclTopoGetAlgoTime``: the running figure
    over ``treeCorrectionFactor``), what it compares with the ring to choose."""
    log_size = _log2i(size >> 6)
    corr = TREE_CORRECTION[log_size] if log_size < len(TREE_CORRECTION) - 1 else 1.0
    return _tree_us(size, c, corr)


def _tree_us(size: int, c: Cluster, corr: float) -> float:
    nodes = _nodes(c)
    ppn = c.ranks // nodes
    if c.ranks == 1:
        return 0.0
    lat = BASE_LAT_US + 2 * ((ppn - 1) * c.intra_lat_us + _log2i(nodes) * c.net_lat_us)
    intra = 2 * size / gbps_to_bytes_per_us(c.intra_gbps) if c.gpus > 1 else 0.0
    net_bytes = 0 if c.machines == 1 else size if nodes == 2 else 2 * size
    net = net_bytes / gbps_to_bytes_per_us(c.net_gbps)
    return lat + max(intra, net) / (TREE_BW_FACTOR * corr * c.nccl_eff)


def nccl_algo(size: int, c: Cluster) -> str:
    """The algorithm NCCL's tuner picks by its own estimates: "ring" or "tree"."""
    return "tree" if tree_estimate_us(size, c) < ring_time_us(size, c) else "ring"


def nccl_time_us(size: int, c: Cluster) -> float:
    """NCCL's default: the algorithm its tuner picks, at that algorithm's running time."""
    return tree_time_us(size, c) if nccl_algo(size, c) == "tree" else ring_time_us(size, c)


def nccl_best_us(size: int, c: Cluster) -> float:
    """The faster of ring and tree as they run: NCCL under the best ``NCCL_ALGO``."""
    return min(ring_time_us(size, c), tree_time_us(size, c))


def link_bound_us(size: int, c: Cluster) -> float:
    """T_min = 2S(M-1)/(M*B): each machine sends and receives 2S(M-1)/M bytes over its
    NICs (B = the machine's network bandwidth). 0 on one machine."""
    m = c.machines
    return 2 * size * (m - 1) / (m * gbps_to_bytes_per_us(c.net_gbps))
