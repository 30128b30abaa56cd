"""Error feedback's keys for the DDP buckets (and FSDP modules) one Communicator serves.

A key must (1) differ between two models that share a Communicator (a GAN's generator
and discriminator: both have a bucket 0), (2) change when DDP rebuilds a bucket with
other parameters or another order (the errors kept for the old layout belong to other
elements), and (3) be the same in every process of a job and in the process that
resumes it, so a saved state (Communicator.state_dict) finds its buckets again.

The GradBucket that DDP hands the hook names neither its model nor its parameters'
names, only the parameter tensors. Each parameter gets an *ordinal*: the number of
parameters this Communicator's hook saw before it. Ranks run the same backward, and a
resumed process its first backward as the first process did, so the ordinals agree
across ranks and restarts without any id(). A bucket's key is its parameters' ordinals
in order with their shapes and dtypes: the buckets of two models hold disjoint
parameters, so their keys differ, and a rebuilt bucket has another key. A key whose
parameters a newer key holds is let go (the old layout's errors), and so is one whose
model was freed. (Parameter ids serve only to find a bucket seen before in this
process, the hook's per-step cost; they are never part of a key.) What the ordinals
assume: a resumed process builds the same models and runs their first backward in the
same order as the saved one; a parameter of another shape at an ordinal is refused
(ValueError), one of the same shape cannot be told apart.

FSDP's hooks take a name from ``Names`` at their first call on a Communicator: the
n-th hook to reduce through it, in the order every process follows."""

from __future__ import annotations

import hashlib
import operator
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

Shape = tuple[tuple[int, ...], str]
"""A parameter's shape and dtype (by name), as a saved state keeps them."""


class BucketKeys:
    """The feedback keys of the DDP buckets of every model a Communicator's hook
    serves. ``drop``: forgets a key's errors."""

    def __init__(self, drop: Callable[[str], None]) -> None:
        self._ordinal: Any = WeakIdKeyDictionary()
        """parameter -> ordinal (weak: a model let go takes its entries along)."""
        self.shapes: list[Shape] = []
        """By ordinal: each parameter's shape and dtype."""
        self._refs: list[weakref.ref[Any]] = []
        """By ordinal: the parameter, weakly."""
        self.saved_shapes: list[Shape] = []
        """The loaded state's, checked against this process's parameters."""
        self.layouts: dict[str, tuple[int, ...]] = {}
        """Live key -> its parameters' ordinals, in bucket order."""
        self._holder: dict[int, str] = {}
        """Ordinal -> the live key whose bucket holds it."""
        self.pending: dict[str, tuple[int, ...]] = {}
        """Loaded layouts DDP has not (yet) formed in this process: their buckets are
        regrouped into them (execution/regroup.py)."""
        self._drop = drop
        self._seen: dict[tuple[int, ...], tuple[tuple[int, ...], list[weakref.ref[Any]]]] = {}
        """Buckets seen: their parameters' ids -> (ordinals, weak references to them)."""
        self._key_of: dict[tuple[int, ...], str] = {}
        """Ordinals -> key (``key``'s digest, once)."""

    def ordinals(self, params: list[torch.Tensor]) -> tuple[int, ...]:
        """The ordinals of ``params``, numbering those seen first now (in order), each
        checked against the loaded state's shape for it. A bucket seen before is looked
        up by its parameters' ids (the hook runs every step: the host's time counts),
        confirmed by weak references, so a parameter freed and its id reused is not
        taken for the old one."""
        ids = tuple(map(id, params))
        seen = self._seen.get(ids)
        if seen is not None and all(map(operator.is_, (r() for r in seen[1]), params)):
            return seen[0]
        self._let_go_of_freed_models()
        ordinals = self._number(params)
        self._seen[ids] = (ordinals, [weakref.ref(p) for p in params])
        return ordinals

    def _let_go_of_freed_models(self) -> None:
        """A bucket whose parameters are gone (its model freed: a Communicator kept for
        one model after another) lets its feedback memory go. Checked when a bucket
        first appears, never on the steps that follow."""
        for key in [k for k, ords in self.layouts.items() if self._refs[ords[0]]() is None]:
            self._forget(key)
        self._seen = {ids: seen for ids, seen in self._seen.items() if seen[1][0]() is not None}

    def _number(self, params: Iterable[torch.Tensor]) -> tuple[int, ...]:
        out = []
        for p in params:
            ordinal = self._ordinal.get(p)
            if ordinal is None:
                ordinal = self._ordinal[p] = len(self.shapes)
                self.shapes.append((tuple(p.shape), str(p.dtype)))
                self._refs.append(weakref.ref(p))
                self._check_saved(ordinal)
            out.append(ordinal)
        return tuple(out)

    def _check_saved(self, ordinal: int) -> None:
        if ordinal < len(self.saved_shapes) and self.saved_shapes[ordinal] != self.shapes[ordinal]:
            raise ValueError(f"the loaded ringreduce state was saved for another model layout: "
                             f"its DDP parameter {ordinal} is {self.saved_shapes[ordinal]}, "
                             f"this process's is {self.shapes[ordinal]}; load a state saved by "
                             "the same models, in the same order, or none")

    def key(self, ordinals: tuple[int, ...]) -> str | None:
        """The bucket's key (module docstring), made live, keys it displaces let go; None
        while it must be regrouped: some of its parameters are in a loaded layout that
        DDP has not formed (and this bucket is not that layout)."""
        key = self._key_of.get(ordinals)
        if key is None:
            digest = hashlib.sha1(repr([(o, self.shapes[o]) for o in ordinals]).encode())
            key = self._key_of[ordinals] = \
                f"ddp bucket {ordinals[0]}+{len(ordinals)} {digest.hexdigest()[:12]}"
        if key not in self.pending and self._regrouped(ordinals):
            return None
        if key not in self.layouts:
            self.pending.pop(key, None)
            for old in sorted({self._holder[o] for o in ordinals if o in self._holder}):
                self._forget(old)
            self.layouts[key] = ordinals
            self._holder.update(dict.fromkeys(ordinals, key))
        return key

    def _forget(self, key: str) -> None:
        for o in self.layouts.pop(key):
            if self._holder.get(o) == key:
                del self._holder[o]
        self._drop(key)

    def _regrouped(self, ordinals: tuple[int, ...]) -> bool:
        """Whether some of ``ordinals`` belong to a layout loaded but not formed here yet."""
        if not self.pending:
            return False
        held = {o for layout in self.pending.values() for o in layout}
        return any(o in held for o in ordinals)

    def state(self) -> dict[str, Any]:
        """The layouts to save: the live and pending keys' ordinals, every shape."""
        layouts = {**self.pending, **self.layouts}
        return {"shapes": [[list(s), d] for s, d in self.shapes],
                "layouts": {k: list(v) for k, v in layouts.items()}}

    def load(self, state: dict[str, Any]) -> None:
        """Take a saved state's layouts as pending: the first buckets after a restart
        are DDP's initial ones, reduced in the saved layouts until DDP rebuilds to them."""
        self.saved_shapes = [(tuple(s), d) for s, d in state.get("shapes", [])]
        for ordinal in range(min(len(self.shapes), len(self.saved_shapes))):
            self._check_saved(ordinal)
        for key in list(self.layouts):
            self._forget(key)
        self.pending = {k: tuple(v) for k, v in state.get("layouts", {}).items()}


class Names:
    """Stable names for the FSDP hooks that keep feedback in one Communicator: the
    n-th hook of a kind to call it (every process calls in the same order)."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}

    def claim(self, kind: str) -> str:
        n = self._count.get(kind, 0)
        self._count[kind] = n + 1
        return f"{kind} {n}"
