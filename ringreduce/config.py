"""Configuration: one frozen dataclass, and the only place that reads the environment.

Every ``RINGREDUCE_*`` variable is read in :meth:`Config.from_env`; explicit
constructor arguments of :class:`ringreduce.Communicator` win over the environment.
The host identity used for machine detection (``NCCL_HOSTID``, host name, boot id)
is read here too, so that no other module touches ``os.environ``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

PLANS = ("one-slice", "pipelined")
"""Config.plan's values (plan/slicing.py says what each does)."""

KiB = 1024
MiB = 1024 * KiB

#: Smallest shard (slice / (devices * machines)) the default slice size allows.
#: Fairring lost to NCCL once shards fell to ~100 KiB and won from ~400 KiB; NCCL's
#: network path moves 128-512 KiB chunks, so smaller messages pay per-message cost.
MIN_SHARD_BYTES = 512 * KiB

#: The default largest slice on small clusters: 4 MiB slices keep a 25 MiB DDP bucket in
#: ~7 pipelined pieces while each network message stays large (smaller calls get smaller
#: slices: MIN_CALL_SHARD_BYTES).
MIN_SLICE_BYTES = 4 * MiB

#: Smallest shard of the slices a small call is cut into (layout.call_slice_bytes): a
#: 4 MiB DDP bucket at 2 x 2 becomes four 1 MiB slices of 256 KiB shards, which ran
#: the hook at 1.14-1.29x NCCL where one 4 MiB slice ran 0.87-1.00x (layout.py says
#: where); Fairring lost to NCCL only once shards fell to ~100 KiB.
MIN_CALL_SHARD_BYTES = 256 * KiB

#: Default staging budget. Staging holds the (M-1) rows a slice receives in
#: `collect`; 64 MiB keeps 16+ slices of 4 MiB in flight, like Fairring's 50 MiB.
DEFAULT_STAGING_BYTES = 64 * MiB

#: Below this size the hierarchical path's launches cost more than they save. Measured on
#: emulated 2 x 1 machines (two H200s): the pipeline ran at 0.66-0.78x NCCL at 1 MiB and
#: 0.75-0.97x at 4 MiB (one slice, nothing to overlap), 1.0-1.24x from 16 MiB; FINDINGS.md
#: saw a two-level scheme win from 4 MiB at 2 x 2. So tensors below 2 MiB take NCCL's own
#: all-reduce (a documented fast path).
DEFAULT_MIN_BYTES = 2 * MiB

_ENV = {
    "machines": "RINGREDUCE_MACHINES",
    "slice_bytes": "RINGREDUCE_SLICE_BYTES",
    "staging_bytes": "RINGREDUCE_STAGING_BYTES",
    "min_bytes": "RINGREDUCE_MIN_BYTES",
    "rail_channels": "RINGREDUCE_RAIL_CHANNELS",
    "timeout_s": "RINGREDUCE_TIMEOUT",
    "debug": "RINGREDUCE_DEBUG",
    "check_new_calls": "RINGREDUCE_CHECK_NEW_CALLS",
    "check_call_end": "RINGREDUCE_CHECK_CALL_END",
    "flight_records": "RINGREDUCE_FLIGHT_RECORDS",
    "flight_file": "RINGREDUCE_FLIGHT_FILE",
    "wire_dtype": "RINGREDUCE_WIRE_DTYPE",
    "wire": "RINGREDUCE_WIRE",
    "wire_block": "RINGREDUCE_WIRE_BLOCK",
    "hook_feedback": "RINGREDUCE_HOOK_FEEDBACK",
    "issuer": "RINGREDUCE_ISSUER",
    "diffuse_gather": "RINGREDUCE_DIFFUSE_GATHER",
    "plan": "RINGREDUCE_PLAN",
}

#: Who issues a CUDA call's hierarchical work (Config.issuer).
ISSUERS = ("native", "python")

#: 16-bit formats float32 tensors may take on the network hop (collect, diffuse).
WIRE_DTYPES = ("bfloat16", "float16")
#: Every wire format (Config.wire): the 16-bit ones by their short names, then the
#: block-quantized ones (execution/quant.py).
WIRES = ("bf16", "fp16", "int8", "fp8", "int4")
#: wire_dtype's names -> wire's (wire_dtype is wire's older spelling for 16 bits).
WIRE_OF_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}

#: Elements per quantization block (one fp32 scale each). 256: the scale costs 4/256 =
#: 1.6% of an int8 row (3.1% of int4), and a block of 256 gradient values still has a
#: max-abs close to the bulk's, so the int8 step stays ~1% of it; ZeRO++ and bitsandbytes
#: use blocks of the same order. A measurement on GPU (benchmarks/compressed.py) is to
#: confirm it. A multiple of 8 keeps every packed row a whole number of fp32 scales.
DEFAULT_WIRE_BLOCK = 256

#: torch's ProcessGroupNCCL watchdog default: long enough for any single all-reduce
#: of a real model, short enough that a dead peer does not hold a job for hours.
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Config:
    """Effective settings of one :class:`ringreduce.Communicator`."""

    machines: int | None = None
    """Split the group's ranks into this many virtual machines of contiguous ranks
    (``RINGREDUCE_MACHINES``); it must divide the group's size (the backend's groups
    that it does not divide take the flat route). ``None``: detect machines from the
    members' host identities."""

    slice_bytes: int | None = None
    """Slice size (``RINGREDUCE_SLICE_BYTES``), the same for every call. ``None``: by
    call size. The largest slice is the larger of ``MIN_SLICE_BYTES`` and
    ``MIN_SHARD_BYTES * devices * machines``, so shards stay large as the cluster grows
    (Fairring's fixed slice over-sharded at 256 GPUs); a call smaller than
    ``layout.SLICES_PER_CALL`` such slices is cut into that many, down to shards of
    ``MIN_CALL_SHARD_BYTES``, so that its stages still overlap."""

    staging_bytes: int = DEFAULT_STAGING_BYTES
    """Memory for received `collect` rows (``RINGREDUCE_STAGING_BYTES``); it bounds
    how many slices are in flight. Allocated once, never grown."""

    min_bytes: int = DEFAULT_MIN_BYTES
    """Tensors smaller than this take the flat all-reduce (``RINGREDUCE_MIN_BYTES``);
    0 forces the hierarchical path at every size."""

    rail_channels: int | None = None
    """NCCL channels per network peer on the rail communicators (``collect``,
    ``diffuse``; ``RINGREDUCE_RAIL_CHANNELS``), set per communicator through
    ``ncclConfig_t.nChannelsPerNetPeer``. ``None``: NCCL's default. Point-to-point
    traffic to one peer uses few channels, hence few sockets, unless raised."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    """Deadline of one operation in seconds (``RINGREDUCE_TIMEOUT``). On CUDA the
    watchdog aborts the NCCL communicators after it (it also bounds NCCL init and
    connection setup); on the CPU path the gloo groups time out after it. The
    operation then raises RingReduceError and the communicator refuses further work."""

    debug: bool = False
    """Check before every call that all ranks issue the same (operation number,
    numel, dtype, op) (``RINGREDUCE_DEBUG=1``); a mismatch raises on every rank
    instead of hanging or corrupting. Costs a store round trip per call."""

    check_new_calls: bool = True
    """Check, the same way, the first call of every (kind, numel, dtype, op) a rank has
    not made before (``RINGREDUCE_CHECK_NEW_CALLS``; 0 turns it off). NCCL's send/recv
    do not compare sizes: a rank whose peer calls with a dtype of another width
    returned wrong values as success (seen on H100).
    One store round trip per new kind of call, none in a steady stream of DDP buckets;
    ranks that swap two calls each has made before are ``check_call_end``'s."""

    check_call_end: bool = True
    """End every hierarchical all_reduce with an all-reduce of its signature (numel,
    dtype, op) over every rank, compared on the device (``RINGREDUCE_CHECK_CALL_END``;
    0 turns it off; safety/signature.py). It catches what the store checks leave:
    ranks that swap calls each has made before. No rank can finish a call before every
    rank reached its end, and ranks that reach it with different calls fail there,
    naming both. CUDA (with cupy) and the CPU path; execution/call_check.py says over
    which communicators."""

    flight_records: int = 64
    """Operations kept by the flight recorder (``RINGREDUCE_FLIGHT_RECORDS``); they
    are dumped to the log when an operation fails."""

    flight_file: str | None = None
    """Also write the flight recorder's dump, as JSON, to this path
    (``RINGREDUCE_FLIGHT_FILE``; ``{rank}`` in it is replaced by the rank)."""

    wire_dtype: str | None = None
    """``"bfloat16"`` or ``"float16"`` (``RINGREDUCE_WIRE_DTYPE``): float32 tensors
    cross the network (collect, diffuse) in this format, halving the bytes on the
    slow link; reduce-scatter, all-gather and the add stay in float32. Each reduced
    element is rounded to the wire format once, on every machine alike, so all
    ranks end with identical values. Other dtypes and the flat route are unaffected."""

    wire: str | None = None
    """The network hop's format (``RINGREDUCE_WIRE``): ``"bf16"``/``"fp16"`` (the same
    as ``wire_dtype``, its older spelling: float32 tensors only, pipelined), or
    ``"int8"``, ``"fp8"`` (e4m3), ``"int4"``: float32, bfloat16 and float16 tensors
    of SUM and AVG calls cross the rail quantized in blocks of ``wire_block`` elements,
    one fp32 scale each, on the unpipelined compressed route (execution/compressed.py):
    fp32 everywhere else, fp32 accumulation, and every rank ends with bit-identical
    values. MAX/MIN and other dtypes keep the tensor's own format, and calls below
    ``min_bytes`` or on one machine take the flat route, exact, as ever. A block holding
    inf or nan comes back non-finite as a whole. ``None``: the tensor's dtype. A call
    may override it (``all_reduce(t, wire="int8", feedback="key")``)."""

    wire_block: int = DEFAULT_WIRE_BLOCK
    """Elements per quantization block of the 8- and 4-bit wires (``RINGREDUCE_WIRE_BLOCK``;
    a multiple of 8); DEFAULT_WIRE_BLOCK says why 256."""

    hook_feedback: bool = True
    """The DDP hook keeps error feedback per bucket for the 8- and 4-bit wires
    (``RINGREDUCE_HOOK_FEEDBACK``; 0 turns it off): the quantization error of a bucket
    is added to the same bucket next step (compressed.py, about numel/D fp32 values per
    rank and bucket)."""

    issuer: str | None = None
    """CUDA only: who issues a pipelined call's work (``RINGREDUCE_ISSUER``).
    ``"python"``: the pipeline's step loop, from Python on the caller's thread.
    ``"native"``: the same calls recorded once per kind of call and replayed from C++
    on the caller's thread without the GIL (ringreduce/execution/native.py,
    native/issuer.cpp): 0.3-0.5 ms of host time per 25 MiB call against 1.3-2.3 ms
    from Python (results 2026-11-26-h100x2-plan-probe). ``None``: native where it can
    run (the extension is built, cupy imports), else python, with the reason logged
    once; an explicit native that cannot run is an error. The one-slice plan, the flat
    route, captures and the block collectives are issued from Python.
    ``python -m ringreduce.info`` says which issuer a CUDA call would use and why."""

    diffuse_gather: bool = True
    """Without a wire format, diffuse is one in-place all-gather on the rail
    communicator (a rail's ranks are its machines, in order, and view[d] is their
    rows) instead of a send and a receive per other machine
    (``RINGREDUCE_DIFFUSE_GATHER``; 0: the sends and receives). The same bytes to the
    same peers in one NCCL operation instead of 2(M-1): measured (H100 under MPS, same
    processes), 6-19% less host time in NCCL's group calls at 4 x 2, no difference at
    2 x 2 (one collective costs about what a send and a receive cost), DDP unchanged.
    With a wire format the rows travel through the staging slot, which has no row of
    this machine's own, so diffuse sends and receives."""

    plan: str | None = None
    """How a hierarchical all-reduce is issued (``RINGREDUCE_PLAN``; plan/slicing.py):
    ``"one-slice"``, three collectives (reduce-scatter inside the machine, all-reduce
    along the rail, all-gather inside), or ``"pipelined"``, the sliced five-stage
    pipeline. ``None`` (the default): on CUDA a probe at construction times a 16 MiB
    call on each plan and takes one slice unless the pipeline is more than 5% faster
    (execution/probe.py); on the CPU (gloo) the pipeline.
    ``ringreduce.info`` and each call's flight record say which plan and why."""

    def __post_init__(self) -> None:
        if self.wire_dtype is not None and self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype={self.wire_dtype!r} is not supported; use one of "
                             f"{WIRE_DTYPES} or None")
        self._resolve_wire()
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s!r} must be positive seconds")
        if self.issuer is not None and self.issuer not in ISSUERS:
            raise ValueError(f"issuer={self.issuer!r} is not supported; use one of {ISSUERS} "
                             "or None (native when built)")
        if self.plan is not None and self.plan not in PLANS:
            raise ValueError(f"plan={self.plan!r} is not supported; use one of "
                             f"{PLANS} or None (chosen by a probe)")
        if self.flight_records < 0:
            raise ValueError(f"flight_records={self.flight_records!r} must be >= 0")
        for name in ("machines", "slice_bytes", "rail_channels"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be a positive int or None")
        for name in ("staging_bytes", "min_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be a non-negative int")

    def _resolve_wire(self) -> None:
        """Check ``wire`` and ``wire_block``, and make ``wire`` and its 16-bit alias
        ``wire_dtype`` name the same format (either may be given)."""
        if self.wire is not None and self.wire not in WIRES:
            raise ValueError(f"wire={self.wire!r} is not supported; use one of {WIRES} or None "
                             "(the tensor's dtype)")
        if not isinstance(self.wire_block, int) or self.wire_block < 8 or self.wire_block % 8:
            raise ValueError(f"wire_block={self.wire_block!r} must be a positive multiple of 8 "
                             f"(elements per fp32 scale); the default is {DEFAULT_WIRE_BLOCK}")
        alias = WIRE_OF_DTYPE.get(self.wire_dtype or "")
        if self.wire is None and alias is not None:
            object.__setattr__(self, "wire", alias)  # frozen: set once, while constructing
        elif self.wire_dtype is None and self.wire in WIRE_OF_DTYPE.values():
            dtype = next(k for k, v in WIRE_OF_DTYPE.items() if v == self.wire)
            object.__setattr__(self, "wire_dtype", dtype)
        elif alias is not None and alias != self.wire:
            raise ValueError(f"wire={self.wire!r} and wire_dtype={self.wire_dtype!r} disagree; "
                             "pass only wire= (wire_dtype is its older alias for 16 bits)")

    @classmethod
    def from_env(cls, defaults: Mapping[str, object] | None = None,
                 **overrides: object) -> Config:
        """The fields' defaults, then ``defaults`` (what the caller's context implies,
        such as the process group's timeout), then ``RINGREDUCE_*`` variables, then
        non-None ``overrides``."""
        values: dict[str, object] = dict(defaults or {})
        kinds = {f.name: f.default for f in dataclasses.fields(cls)}
        for field, var in _ENV.items():
            raw = os.environ.get(var)
            if raw is not None and raw.strip():
                values[field] = _parse(var, raw.strip(), kinds[field])
        given = {k: v for k, v in overrides.items() if v is not None}
        for one, other in (("wire", "wire_dtype"), ("wire_dtype", "wire")):
            if one in given and other not in given:
                values.pop(other, None)  # an explicit format wins over the other spelling's
        values.update(given)
        return dataclasses.replace(cls(), **values)  # type: ignore[arg-type]  # checked by __post_init__

    def resolved_slice_bytes(self, devices: int, machines: int) -> int:
        """The largest slice in use for a (machines x devices) topology."""
        if self.slice_bytes is not None:
            return self.slice_bytes
        return max(MIN_SLICE_BYTES, MIN_SHARD_BYTES * devices * machines)

    def smallest_slice_bytes(self, devices: int, machines: int) -> int:
        """The smallest slice a call is cut into (layout.call_slice_bytes): the largest
        when ``slice_bytes`` is given (one size for every call)."""
        if self.slice_bytes is not None:
            return self.slice_bytes
        return min(self.resolved_slice_bytes(devices, machines),
                   MIN_CALL_SHARD_BYTES * devices * machines)


def env_name(field: str) -> str:
    """The ``RINGREDUCE_*`` variable of a Config field (for messages)."""
    return _ENV.get(field, "")


def _parse(var: str, raw: str, default: object) -> object:
    """Parse by the field's default: bool, float, str, else int (0x... allowed)."""
    if isinstance(default, bool):
        if raw.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return raw.lower() in ("1", "true", "yes", "on")
        raise ValueError(f"{var}={raw!r} is not a boolean; set it to 1 or 0")
    try:
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, str) or var in (  # str or None
                "RINGREDUCE_FLIGHT_FILE", "RINGREDUCE_WIRE_DTYPE", "RINGREDUCE_WIRE",
                "RINGREDUCE_ISSUER", "RINGREDUCE_PLAN"):
            return raw
        return int(raw, 0)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a number; set it to e.g. {var}=4194304") from None


def host_identity() -> str:
    """What makes two ranks the same machine: ``NCCL_HOSTID`` when set (NCCL uses it
    the same way, so emulated machines agree with NCCL), else host name + boot id."""
    explicit = os.environ.get("NCCL_HOSTID")
    if explicit:
        return explicit
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}  # nccl-tests: powers of 1024
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)B?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size as the command lines take it: ``64M`` -> 67108864, ``1.5G``, ``4096``
    (powers of 1024, like nccl-tests' -b/-e); for argparse's ``type=``."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: expected a number with an optional K, M or G suffix, e.g. 64M")
    return int(float(match[1]) * _SIZE_UNITS[match[2].upper()])

