"""What a compressed call was asked for, and the error feedback kept between calls.

The caller's side of the compressed route (compressed.py is the walk): ``call_wire``
checks a call's wire, dtype, op and feedback key before any communication;
``Feedback`` holds each key's memory, ``Spec`` names what a call's work depends on.

Error feedback (opt-in per key, ``Feedback``): what quantization dropped from this
rank's collect rows, and from the rows it owns in diffuse, is added before quantizing
the same key's next call. Memory per key and rank: P/D + P/(D*M) fp32 values, about
numel/D. Non-finite errors are dropped (a step with inf/nan, skipped by AMP's
GradScaler, must not poison every later step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ringreduce.config import WIRES, Config
from ringreduce.execution.quant import FORMATS, Format

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
"""Tensor dtypes a quantized wire carries."""
OPS = ("sum", "avg")
"""Ops a quantized wire carries: a max or min of dequantized values would not be any
rank's value, so MAX/MIN keep the tensor's format."""


def call_wire(config: Config, wire: str | None, feedback: str | None, t: torch.Tensor,
              op: str) -> str | None:
    """The quantized format this call takes (None: the tensor's own route), checking the
    per-call arguments before any communication. ``wire``: the call's override (None:
    the communicator's ``Config.wire``). The communicator's quantized wire skips
    tensors it cannot carry (other dtypes, MAX/MIN: a documented decision); an explicit
    per-call one refuses them."""
    if wire is not None and wire not in FORMATS:
        quantized = tuple(FORMATS)
        hint = " (16-bit wires are set per Communicator)" if wire in WIRES else ""
        raise ValueError(f"wire={wire!r} is not a per-call wire format{hint}; use one of "
                         f"{quantized}, or None for the communicator's ({config.wire})")
    if feedback is not None and not isinstance(feedback, str):
        raise TypeError(f"feedback={feedback!r} must be a str key (or None)")
    chosen = wire if wire is not None else config.wire
    if chosen not in FORMATS:
        if feedback is not None:
            raise ValueError(f"feedback={feedback!r} needs an 8- or 4-bit wire, but this call "
                             f"takes wire={chosen!r}; pass wire='int8' (or 'fp8', 'int4') too")
        return None
    if wire is not None and t.dtype not in FLOATS:
        raise TypeError(f"wire={wire!r} carries {FLOATS}, not {t.dtype}; drop wire= for "
                        "this tensor")
    if wire is not None and op not in OPS:
        raise ValueError(f"wire={wire!r} carries SUM and AVG, not {op.upper()}; drop wire= "
                         "for this call")
    return chosen if t.dtype in FLOATS and op in OPS else None


@dataclass(eq=False)  # by identity: a traced program is keyed by the memory it holds
class Errors:
    """One key's error feedback: what the last call's quantization dropped."""

    numel: int
    wire: str
    collect: torch.Tensor
    """(M, k): this rank's collect rows (its machine's partials) minus what they became."""
    diffuse: torch.Tensor
    """(k,): the reduced row this rank owns minus what every rank received."""


@dataclass(frozen=True)
class Spec:
    """What a compressed call's work depends on besides its tensor: the wire format,
    the block and the error feedback's memory (by identity; None: no feedback). The
    native issuer keys the programs it traces by it (native.NativeIssuer.program)."""

    wire: str
    block: int
    errors: Errors | None

    @property
    def format(self) -> Format:
        return FORMATS[self.wire]


class Feedback:
    """Error feedback of one Communicator, per key (a DDP bucket, a user's name). A key
    starts over when its tensor's size or wire format changes (DDP rebuilds its
    buckets after the first step). ``dropped`` hears of every key's memory let go
    (the native issuer forgets the programs that point into it)."""

    def __init__(self, dropped: Callable[[Errors], None] | None = None) -> None:
        self._errors: dict[str, Errors] = {}
        self._dropped = dropped
        self._loaded: set[str] = set()
        """Keys loaded from a saved state and not used since: a first use of another
        size or format is a state saved for something else, refused."""

    def errors(self, key: str, numel: int, wire: str, rows: int, k: int,
               device: torch.device) -> Errors:
        """The key's errors, zeros when new or when its size or format changed."""
        errors = self._errors.get(key)
        if key in self._loaded:
            self._loaded.discard(key)
            _check_loaded(key, errors, numel, wire, (rows, k))
        if errors is None or (errors.numel, errors.wire, errors.collect.shape) != \
                (numel, wire, (rows, k)) or errors.collect.device != device:
            if errors is not None:
                self._drop(errors)
            errors = self._errors[key] = Errors(
                numel, wire, torch.zeros((rows, k), dtype=torch.float32, device=device),
                torch.zeros(k, dtype=torch.float32, device=device))
        return errors

    def reset(self, key: str | None = None) -> None:
        """Forget ``key``'s errors (every key's when None)."""
        self._loaded = set() if key is None else self._loaded - {key}
        for name in list(self._errors) if key is None else [key]:
            errors = self._errors.pop(name, None)
            if errors is not None:
                self._drop(errors)

    def _drop(self, errors: Errors) -> None:
        if self._dropped is not None:
            self._dropped(errors)

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Every key's errors: copies, and the size and format they are for."""
        return {key: {"numel": e.numel, "wire": e.wire, "collect": e.collect.clone(),
                      "diffuse": e.diffuse.clone()} for key, e in self._errors.items()}

    def load_state_dict(self, state: dict[str, dict[str, Any]], device: torch.device) -> None:
        """Take ``state_dict()``'s keys (after ``reset``), on ``device``; each is checked
        at its first use (``errors``)."""
        for key, e in state.items():
            collect = e["collect"].to(device, torch.float32, copy=True)
            diffuse = e["diffuse"].to(device, torch.float32, copy=True)
            if collect.dim() != 2 or diffuse.shape != (collect.shape[1],):
                raise ValueError(f"the saved error feedback of {key!r} has collect "
                                 f"{tuple(collect.shape)} and diffuse {tuple(diffuse.shape)}; "
                                 "a saved state has (M, k) and (k,)")
            self._errors[key] = Errors(int(e["numel"]), str(e["wire"]), collect, diffuse)
            self._loaded.add(key)

    def nbytes(self) -> int:
        """Memory held for error feedback, over every key."""
        return sum(e.collect.nbytes + e.diffuse.nbytes for e in self._errors.values())


def _check_loaded(key: str, errors: Errors | None, numel: int, wire: str,
                  shape: tuple[int, int]) -> None:
    """A loaded key's first use must be of the size and format it was saved for."""
    if errors is None:
        return
    saved = (errors.numel, errors.wire, tuple(errors.collect.shape))
    if saved != (numel, wire, shape):
        raise ValueError(f"the loaded error feedback of {key!r} is for {errors.numel} "
                         f"elements on wire {errors.wire!r} (rows {tuple(errors.collect.shape)})"
                         f", but this call has {numel} on {wire!r} (rows {shape}): the state "
                         "was saved for another model layout or wire; load a state saved by "
                         "the same models and settings, or none")


def keep_error(error: torch.Tensor) -> None:
    """A non-finite error (the call saw inf or nan) is dropped, not carried."""
    error.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
