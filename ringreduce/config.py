"""Configuration: one frozen dataclass, and the only place that reads the environment.

User knobs: Communicator's arguments, each with a ``RINGREDUCE_*`` variable (:data:`_ENV`,
read by :meth:`Config.from_env`; an argument wins). :data:`INTERNAL` fields have no
variable: keywords for the tests and measurements (docs/engineering.md). A set variable
that is not read is named once. The host identity (``NCCL_HOSTID``, host name, boot id)
is read here too, so that no other module touches ``os.environ``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ringreduce.defaults import (
    DEFAULT_MIN_BYTES,
    DEFAULT_STAGING_BYTES,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WIRE_BLOCK,
    MIN_CALL_SHARD_BYTES,
    MIN_SHARD_BYTES,
    MIN_SLICE_BYTES,
)

PLANS = ("one-slice", "two-level", "pipelined")
"""Config.plan's values (plan/slicing.py says what each does)."""


log = logging.getLogger("ringreduce")

#: The user knobs: Communicator's arguments and their variables (README's table).
#: slice_bytes and staging_bytes are in DESIGN.md's API contract, so they stay knobs.
_ENV = {
    "machines": "RINGREDUCE_MACHINES",
    "slice_bytes": "RINGREDUCE_SLICE_BYTES",
    "staging_bytes": "RINGREDUCE_STAGING_BYTES",
    "min_bytes": "RINGREDUCE_MIN_BYTES",
    "timeout_s": "RINGREDUCE_TIMEOUT",
    "wire": "RINGREDUCE_WIRE",
    "wire_block": "RINGREDUCE_WIRE_BLOCK",
    "hook_feedback": "RINGREDUCE_HOOK_FEEDBACK",
    "plan": "RINGREDUCE_PLAN",
    "debug": "RINGREDUCE_DEBUG",
    "flight_file": "RINGREDUCE_FLIGHT_FILE",
}

#: Fields without a variable, Communicator keywords for the tests and measurements that
#: compare the engine's alternatives (docs/engineering.md, "Internal settings").
INTERNAL = ("issuer", "diffuse_gather", "check_new_calls", "check_call_end")

#: Variables earlier versions read and this one does not: Config.from_env names any set.
_NOT_READ = {"RINGREDUCE_WIRE_DTYPE": "set RINGREDUCE_WIRE=bf16 or fp16 instead",
             "RINGREDUCE_RAIL_CHANNELS": "removed", "RINGREDUCE_FLIGHT_RECORDS": "removed",
             **{f"RINGREDUCE_{f.upper()}": f"internal now: Communicator({f}=...)"
                for f in INTERNAL}}
#: RINGREDUCE_* variables that are not the library's: the GPU tests' (tests/gpu.py).
_OTHERS = frozenset({"RINGREDUCE_GPU_TOPOLOGIES"})

#: Who issues a CUDA call's hierarchical work (Config.issuer).
ISSUERS = ("native", "python")

#: 16-bit formats float32 tensors may take on the network hop (collect, diffuse).
WIRE_DTYPES = ("bfloat16", "float16")
#: Every wire format (Config.wire): the 16-bit ones by their short names, then the
#: block-quantized ones (execution/quant.py).
WIRES = ("bf16", "fp16", "int8", "fp8", "int4")
#: The quantized wires that rotate each block (execution/quant.py): their wire_block
#: must be a power of two.
ROTATED_WIRES = ("int4",)
#: wire_dtype's names -> wire's (wire_dtype is wire's older spelling for 16 bits).
WIRE_OF_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}



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
    """Internal. Compare across ranks, through the store, the first call of every (kind,
    numel, dtype, op) a rank has not made before: NCCL's send/recv do not compare sizes,
    so a peer calling with a dtype of another width returned wrong values as success."""

    check_call_end: bool = True
    """Internal. End every hierarchical all_reduce with an all-reduce of its signature
    (numel, dtype, op) over every rank (safety/signature.py): ranks that swap two calls
    each has made before fail there, naming both, instead of returning wrong values."""

    flight_file: str | None = None
    """Also write the flight recorder's dump (the last operations, written to the log
    when one fails), as JSON, to this path (``RINGREDUCE_FLIGHT_FILE``; ``{rank}`` in it
    is replaced by the rank)."""

    wire_dtype: str | None = None
    """``"bfloat16"`` or ``"float16"``: ``wire``'s older spelling for 16 bits, a
    constructor alias without a variable of its own (``RINGREDUCE_WIRE=bf16``)."""

    wire: str | None = None
    """The network hop's format (``RINGREDUCE_WIRE``): ``"bf16"``/``"fp16"`` (float32
    tensors, pipelined: collect and diffuse in 16 bits, every reduced element rounded once
    alike on every machine), or ``"int8"``, ``"fp8"`` (e4m3), ``"int4"`` (each block
    rotated by a randomized Hadamard transform, then 4-bit codes at Gaussian levels;
    benchmarks/wire_study.py's one-call error and training picked these two): float32
    and 16-bit tensors of SUM and AVG calls cross the rail quantized in blocks of
    ``wire_block`` elements (execution/compressed.py, quant.py), fp32 elsewhere; every
    rank ends with identical values. MAX/MIN, other dtypes and the flat route keep the
    tensor's format. ``None``: the tensor's dtype. A call may override it (``wire=``). The
    "ringreduce" backend's engine takes none (its all-reduces stay exact: a user's
    metrics reach it too; integrations/backend.py); compress DDP's gradients with
    ``ringreduce.ddp.apply(model, wire=...)``."""

    wire_block: int = DEFAULT_WIRE_BLOCK
    """Elements per quantization block of the 8- and 4-bit wires (``RINGREDUCE_WIRE_BLOCK``;
    a multiple of 8, a power of two for the wire that rotates each block, ``"int4"``);
    DEFAULT_WIRE_BLOCK says why 256."""

    hook_feedback: bool = False
    """Whether the hooks keep error feedback for the 8- and 4-bit wires
    (``RINGREDUCE_HOOK_FEEDBACK=1``): the DDP hook per bucket, ``ringreduce.fsdp``'s hooks
    (FSDP2's reduce-scatter, custom HSDP's replicate all-reduce) per FSDP module and
    Communicator they reduce through; the quantization error of a bucket or module is
    added to the same one next step (compressed.py, about numel/D fp32 values per rank
    and key).
    Off by default, as training measured it: feedback keeps the sum over steps right but
    each step then delivers this step's error and last step's, twice the noise, and Adam
    on a language model pays for that (int4 trained it 0.03 above fp32's loss with
    feedback, 0.003 without; int8 0.004 and 0.000), while DLRM stays in fp32's spread
    either way (docs/engineering.md, "Error feedback"). One knob for every hook; a
    call's own ``feedback=`` key keeps it regardless."""

    issuer: str | None = None
    """Internal, CUDA only: who issues a hierarchical call's work (either plan).
    ``"python"``: the step loop or one_slice.run; ``"native"``: the calls recorded once
    and replayed from C++ without the GIL
    (execution/native.py). ``None``: native where it can run, else python (logged once);
    an explicit native that cannot run is an error. ``ringreduce.info`` says which."""

    diffuse_gather: bool = True
    """Internal. Without a wire format, diffuse is one all-gather on the rail
    communicator instead of a send and a receive per other machine (False)."""

    plan: str | None = None
    """How a hierarchical all-reduce is issued (``RINGREDUCE_PLAN``; plan/slicing.py):
    ``"one-slice"``, three collectives (reduce-scatter inside the machine, all-reduce
    along the rail, all-gather inside), ``"two-level"``, the same three alone in their
    NCCL groups as torch.distributed's two-level composition issues them (the
    end-of-call check in groups after them), or ``"pipelined"``, the sliced five-stage
    pipeline. ``None`` (the default): on CUDA a probe at construction times 4 and
    16 MiB calls on NCCL's flat all-reduce, one slice, two-level and the pipeline (and an 8- or
    4-bit wire against them) and takes the fastest per size, a route with fewer
    collectives within the probe's noise (plan/slicing.py, execution/probe.py); on
    the CPU (gloo) the pipeline. A given plan is always taken (no probe; an 8- or
    4-bit wire then always taken too).
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
        for name in ("machines", "slice_bytes"):
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
        if self.wire in ROTATED_WIRES and self.wire_block & (self.wire_block - 1):
            raise ValueError(f"wire={self.wire!r} rotates blocks with a Hadamard transform, so "
                             f"wire_block={self.wire_block!r} must be a power of two; use "
                             f"{1 << (self.wire_block - 1).bit_length()} or the default "
                             f"{DEFAULT_WIRE_BLOCK}")
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
        non-None ``overrides``. Set variables that are not read are named once."""
        values: dict[str, object] = dict(defaults or {})
        kinds = {f.name: f.default for f in dataclasses.fields(cls)}
        _warn_not_read(frozenset(k for k in os.environ if k.startswith("RINGREDUCE_")))
        for field, var in _ENV.items():
            raw = os.environ.get(var)
            if raw is not None and raw.strip():
                values[field] = _parse(var, raw.strip(), kinds[field])
        given = {k: v for k, v in overrides.items() if v is not None}
        if "wire_dtype" in given and "wire" not in given:
            values.pop("wire", None)  # an explicit format wins over RINGREDUCE_WIRE
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


def internal_settings(given: Mapping[str, Any]) -> dict[str, Any]:
    """``given``, checked to name only :data:`INTERNAL` fields (Communicator's keywords)."""
    unknown = sorted(set(given) - set(INTERNAL))
    if unknown:
        raise TypeError(f"Communicator got unexpected keyword arguments {unknown}; besides "
                        f"its documented ones it takes only the internal {list(INTERNAL)}")
    return dict(given)


def env_name(field: str) -> str:
    """The ``RINGREDUCE_*`` variable of a Config field (for messages); "" if it has none."""
    return _ENV.get(field, "")


@functools.cache  # once per set of variables: a process constructs many Configs
def _warn_not_read(names: frozenset[str]) -> None:
    """Warn about set ``RINGREDUCE_*`` variables the library does not read: a variable
    from an older version (it would otherwise change nothing, silently) or a typo."""
    for name in sorted(names - set(_ENV.values()) - _OTHERS):
        if name in _NOT_READ:
            log.warning("ringreduce: %s is set but no longer read (%s)", name, _NOT_READ[name])
        else:
            log.warning("ringreduce: %s is set but is not a ringreduce variable (those read: "
                        "%s)", name, ", ".join(_ENV.values()))


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
                "RINGREDUCE_FLIGHT_FILE", "RINGREDUCE_WIRE", "RINGREDUCE_PLAN"):
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
