"""Benchmark results, read as samples the model can predict (``--calibrate``).

A JSON file written by ``python -m ringreduce.bench --json`` (a ``{"meta", "rows"}``
object). The meta states machines, devices per machine, the link (``options.link_gbit``;
none means loopback), NCCL's environment and the config, and how the ranks sat on GPUs
(``fidelity``); files too old to say it take a ``known`` table of folder settings (the
repository's validation has one: benchmarks/model_validation/validate.py).

Rows the model cannot time are excluded by stated rules (:func:`exclusion`), never silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..defaults import DEFAULT_MIN_BYTES, DEFAULT_STAGING_BYTES
from ..plan.slicing import PIPELINED, UNSLICED

DTYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int32": 4, "int64": 8}


@dataclass(frozen=True)
class Setting:
    """How an emulated run placed its ranks (what a JSON meta may not say)."""

    ranks_per_gpu: int = 1
    """Above 1, ranks share a GPU."""
    mps: bool = False
    """Shared GPUs run under CUDA MPS (concurrent), not time-sliced."""
    intra: str = "nvlink"
    """What carries intra-machine traffic: nvlink, sockets (loopback under MPS) or none."""
    nccl_hosts: str = "machines"
    """What NCCL sees as hosts: one per virtual machine, or one per rank."""



@dataclass(frozen=True)
class Sample:
    """One measured row: where it came from, what ran, and the two measured times."""

    source: str
    machines: int
    gpus: int
    size: int
    buckets: int
    iters: int
    itemsize: int
    slice_bytes: int | None
    staging_bytes: int
    min_bytes: int
    wire_factor: float
    link_gbit: float | None
    setting_key: str
    setting: Setting
    rr_us: float
    ref_us: float
    row: dict[str, Any]
    meta: dict[str, Any]
    plan: str = PIPELINED
    """The plan the engine took (the row's ``route``: "one-slice" since the construction
    probe, else the pipeline)."""


def setting_of(folder: str, meta: dict[str, Any],
               known: Mapping[str, Setting] | None = None) -> Setting:
    """``known[folder]`` first (files whose meta does not say it); else what the meta
    says: a ``fidelity`` dict of Setting's fields, or benchmarks/emulate.py's fidelity
    sentence ("intra-machine traffic: loopback sockets ... under MPS; NCCL sees 8 hosts;
    ...; GPUs 1, MPS on; CPU cores per rank 2.0"), or NCCL host ids with a rank suffix
    (``vm0r1``)."""
    if known and folder in known:
        return known[folder]
    stated = meta.get("fidelity")
    if isinstance(stated, dict):
        fields = {k: stated[k] for k in Setting.__dataclass_fields__ if k in stated}
        return Setting(**fields)
    text = stated if isinstance(stated, str) else json.dumps(meta)
    world = int(meta.get("world_size") or meta.get("world") or 0)
    hosts = re.search(r"sees (\d+) hosts?", text)
    host_id = str(meta.get("nccl_env", {}).get("NCCL_HOSTID", ""))
    per_rank = (re.fullmatch(r"vm\d+r\d+", host_id) is not None
                or (hosts is not None and world > 1 and int(hosts[1]) == world))
    mps = re.search(r"under MPS|MPS on", text) is not None
    gpus = re.search(r"GPUs (\d+)", text)
    shared = -(-world // int(gpus[1])) if gpus and int(gpus[1]) and world else 1
    if shared == 1 and (mps or per_rank or "share a GPU" in text):
        shared = 2  # stated as shared, count unknown
    d = int(meta.get("devices_per_machine") or 1)
    sockets = per_rank or re.search(r"intra[^;]*(socket|loopback)", text, re.I)
    intra = "none" if d == 1 else "sockets" if sockets else "nvlink"
    return Setting(shared, mps, intra, "ranks" if per_rank else "machines")


def nccl_algo_of(meta: dict[str, Any]) -> str:
    """The all-reduce algorithm NCCL_ALGO forced on the run's NCCL ("tree", "ring"), or
    "default" (unset, or a form this does not read)."""
    value = str(meta.get("nccl_env", {}).get("NCCL_ALGO", "")).lower()
    for part in value.split(";"):
        name, sep, algo = part.partition(":")
        if sep and name.strip() == "allreduce":
            return algo.strip()
        if not sep and part.strip():  # one algorithm for every collective
            return part.strip()
    return "default"


def cores_per_rank(meta: dict[str, Any]) -> float | None:
    """CPU cores each rank had, when the header states it ("CPU cores per rank 4.0")."""
    found = re.search(r"CPU cores per rank:?\s*([\d.]+)", json.dumps(meta))
    return float(found[1]) if found else None


def link_gbit_of(meta: dict[str, Any]) -> float | None:
    """The capped link's Gbit/s per machine: ``--link-gbit``, else the fidelity line's
    "link cap 10gbit"; None: not capped (loopback)."""
    given = meta.get("options", {}).get("link_gbit")
    if given:
        return float(given)
    found = re.search(r"link cap ([\d.]+)\s*gbit", str(meta.get("fidelity", "")), re.I)
    return float(found[1]) if found else None


def setting_key(meta: dict[str, Any], s: Setting) -> str:
    """Runs that share this key share calibrated costs (one link, one intra carrier)."""
    gbit = link_gbit_of(meta)
    env = meta.get("nccl_env", {})
    link = f"capped {gbit:g} Gbit/s" if gbit else "loopback"
    if "NCCL_SOCKET_NTHREADS" in env or "NCCL_NSOCKS_PERTHREAD" in env:
        link += ", tuned sockets"
    share = ("1 rank/GPU" if s.ranks_per_gpu == 1 else
             "ranks share a GPU (MPS)" if s.mps else "ranks time-slice a GPU")
    return f"{link}; intra {s.intra}; {share}; {engine_of(meta)}"


def engine_of(meta: dict[str, Any]) -> str:
    """The card and the issuer: host costs differ between them (an H100's native issuer
    with waves against an H200's Python issuer), so their runs are fitted apart. Runs
    from before the engine line named its issuer used the Python issuer."""
    device = str(meta.get("device", ""))
    card = next((c for c in ("H100", "H200", "A100") if c in device), device or "unknown card")
    issuer = re.search(r"issuer=([\w-]+)", str(meta.get("engine", "")))
    return f"{card}, {issuer[1] if issuer else 'python'} issuer"


def exclusion(sample: Sample) -> str | None:
    """Why the model does not time this row, or None. The rules, each stated:

    - not an all-reduce: the block collectives are two-stage, not this pipeline;
    - replayed CUDA graphs (``config.graphs`` > 0): the model times eager issue, and
      replays change host cost and overlap;
    - a wrong element: the measurement is not of a correct run;
    - an 8- or 4-bit wire (route ``compressed ...``): an unpipelined route of quantize,
      exchange and dequantize kernels the model does not replay;
    - CPU-bound emulation: a side's CPU time per iteration (``*_cpu_us`` x buckets) used
      at least :data:`CPU_BOUND` of the cores each rank had (when the header states
      them). Then the emulation's CPU, not the links the model prices, set the time.

    Ranks that time-slice one GPU are *not* excluded: their setting gets its own costs,
    which absorb the contention as slower links (its errors are shown apart).
    """
    row, config = sample.row, sample.meta.get("config", {})
    if row.get("collective", "all_reduce") != "all_reduce":
        return "not an all-reduce"
    if config.get("graphs"):
        return "replayed CUDA graphs"
    if row.get("rr_wrong") or row.get("ref_wrong"):
        return "wrong elements"
    if str(row.get("route", "")).startswith("compressed"):
        return "quantized wire (compressed route)"
    cores = cores_per_rank(sample.meta)
    if not cores:
        return None
    for side in ("rr", "ref"):
        cpu, time = row.get(f"{side}_cpu_us"), row.get(f"{side}_time_us")
        if cpu and time and cpu * sample.buckets / time >= CPU_BOUND * cores:
            return f"CPU-bound emulation ({side}: {cpu * sample.buckets / time:.1f} of " \
                   f"{cores:g} cores per rank busy)"
    return None


#: Busy cores per rank, as a fraction of the cores it had, from which a run is CPU-bound.
CPU_BOUND = 0.9


def _sample(path: Path, meta: dict[str, Any], row: dict[str, Any],
            known: Mapping[str, Setting] | None) -> Sample | None:
    if not (row.get("rr_time_us") and row.get("ref_time_us") and meta.get("machines")):
        return None  # not a timed benchmark row (or a side that did not run)
    options, config = meta.get("options", {}), meta.get("config", {})
    setting = setting_of(path.parent.name, meta, known)
    itemsize = DTYPE_BYTES.get(row.get("type", "float"), 4)
    wire = 0.5 if config.get("wire_dtype") and itemsize == 4 else 1.0
    min_bytes = config.get("min_bytes")
    # The row's own route wins over the routing rule: it is what the engine did.
    route = row.get("route")
    if route in ("flat", "hierarchical"):
        min_bytes = 2**62 if route == "flat" else 0
    return Sample(
        source=f"{path.parent.name}/{path.name}", machines=int(meta["machines"]),
        gpus=int(meta["devices_per_machine"]), size=int(row["size"]),
        buckets=int(row.get("buckets", 1)), iters=int(options.get("iters") or 20),
        itemsize=itemsize, slice_bytes=_slice_bytes(config, meta),
        staging_bytes=int(config.get("staging_bytes") or DEFAULT_STAGING_BYTES),
        min_bytes=DEFAULT_MIN_BYTES if min_bytes is None else int(min_bytes),
        wire_factor=wire, link_gbit=link_gbit_of(meta),
        setting_key=setting_key(meta, setting), setting=setting,
        rr_us=float(row["rr_time_us"]), ref_us=float(row["ref_time_us"]), row=row, meta=meta,
        plan=route if route in UNSLICED else PIPELINED)


def _slice_bytes(config: dict[str, Any], meta: dict[str, Any]) -> int | None:
    """The run's slice size: its configured one; else, for runs from before the default
    followed the call size (their engine line reads ``slice_bytes=4194304``, not
    ``slice_bytes=1048576..4194304``), the one fixed size they used; else None (the rule)."""
    if config.get("slice_bytes") is not None:
        return int(config["slice_bytes"])
    fixed = re.search(r"slice_bytes=(\d+)(?![.\d])", str(meta.get("engine", "")))
    return int(fixed[1]) if fixed else None


def load_file(path: Path, known: Mapping[str, Setting] | None = None) -> list[Sample]:
    """The benchmark rows of one JSON file (other JSON files give none); ``known``: the
    settings of folders whose files' meta does not state them (:func:`setting_of`)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        return []
    meta = data.get("meta") or {}
    return [s for row in data["rows"] if (s := _sample(path, meta, row, known)) is not None]
