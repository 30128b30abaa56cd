"""The language-model benchmark's (benchmarks/text_lm.py) modes and its final table: per
run, whether its train and validation losses fall inside fp32's seed spread (and by how
much outside), and its samples/s against fp32 and torch's bf16 hook.

Modes. DDP: ``fp32`` (DDP's own all-reduce: NCCL, gloo on the CPU), ``bf16-hook``
(torch's ``bf16_compress_hook`` on the same group: the strongest compression a DDP user
already has), or a ringreduce wire (config.WIRES: its DDP hook with
``Communicator(wire=...)``). FSDP2 on every rank (``fsdp-*``) or HSDP (``hsdp-*``,
replicas = machines): ``-nccl`` is torch's own collectives (plain FSDP2; native HSDP on a
2-D mesh); ``-exact`` or ``-<wire>`` goes through ``ringreduce.fsdp.apply`` (fsdp_modes.py:
the reduce-scatter, or custom HSDP's replicate all-reduce, with that rail format).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ringreduce.config import WIRES

from .fsdp_modes import Mode

REFERENCE = "fp32"
"""The mode whose seeds make the spread every mode's losses are held against."""
BF16_HOOK = "bf16-hook"
SHARDED = {"fsdp": False, "hsdp": True}
"""Sharded mode prefixes, and whether each is HSDP."""


@dataclasses.dataclass(frozen=True)
class LmMode:
    """``name`` as given; ``fsdp``: None for DDP, else how FSDP shards and routes."""

    name: str
    fsdp: Mode | None = None
    wire: str | None = None  # DDP through ringreduce's hook with this wire

    @property
    def baseline(self) -> str:
        """The mode on torch's own collectives of the same parallelism (speed ratios)."""
        if self.fsdp is None:
            return REFERENCE
        return f"{'hsdp' if self.fsdp.hsdp else 'fsdp'}-nccl"


def parse_mode(name: str) -> LmMode:
    """A mode name (module docstring); ValueError naming the accepted ones."""
    if name in (REFERENCE, BF16_HOOK):
        return LmMode(name)
    if name in WIRES:
        return LmMode(name, wire=name)
    prefix, _, rest = name.partition("-")
    if prefix in SHARDED and (rest in ("nccl", "exact") or rest in WIRES):
        return LmMode(name, Mode(hsdp=SHARDED[prefix], ringreduce=rest != "nccl",
                                 wire=None if rest in ("nccl", "exact") else rest))
    raise ValueError(f"mode {name!r}: use {REFERENCE}, {BF16_HOOK}, a ringreduce wire "
                     f"({', '.join(WIRES)}), or fsdp-/hsdp- followed by nccl, exact or a wire")


def parse_modes(names: str) -> list[LmMode]:
    modes = [parse_mode(n) for n in names.split(",") if n]
    if not modes:
        raise ValueError(f"--wire {names!r}: name at least one mode")
    return modes


def spread(runs: Sequence[dict[str, Any]], key: str) -> tuple[float, float] | None:
    """fp32's [min, max] of ``key`` over its runs (seeds); None without any."""
    values = [r[key] for r in runs if r["mode"] == REFERENCE]
    return (min(values), max(values)) if values else None


def placed(value: float, bounds: tuple[float, float] | None) -> str:
    """'inside', or how far above or below fp32's [min, max]."""
    if bounds is None:
        return "no fp32"
    lo, hi = bounds
    if value > hi:
        return f"+{_distance(value - hi)} above"
    if value < lo:
        return f"-{_distance(lo - value)} below"
    return "inside"


def _distance(d: float) -> str:
    """Five decimals; below 1e-5 (an fp32 rounding away) in full, never as 0.00000."""
    return f"{d:.5f}" if d >= 1e-5 else f"{d:.1e}"


def mean_speed(runs: Sequence[dict[str, Any]], mode: str) -> float | None:
    speeds = [r["samples_per_s"] for r in runs if r["mode"] == mode]
    return sum(speeds) / len(speeds) if speeds else None


def ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}x" if base else "-"


def table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The final table's lines: header lines that say what each column compares, then
    one row per run."""
    train, valid = spread(runs, "train_last"), spread(runs, "valid")
    seeds = sum(r["mode"] == REFERENCE for r in runs)
    lines = [f"# reference: {REFERENCE} = DDP on the group's own all-reduce (NCCL), "
             f"{seeds} seed(s): train-last-100 {_bounds(train)}, valid {_bounds(valid)}",
             "# 'vs fp32' columns: inside fp32's [min, max] over its seeds, or the distance "
             "outside; x fp32 / x bf16-hook: samples/s over their seeds' mean; x own: over "
             "fsdp-nccl (fsdp-*) or hsdp-nccl (hsdp-*)",
             f"{'mode':>12} {'seed':>4} {'train100':>8} {'vs fp32':>14} {'valid':>7} "
             f"{'vs fp32':>14} {'samples/s':>9} {'x fp32':>6} {'x bf16h':>7} {'x own':>6} "
             f"{'identical':>9}"]
    fp32, bf16 = mean_speed(runs, REFERENCE), mean_speed(runs, BF16_HOOK)
    for r in runs:
        own = _own_speed(runs, r["mode"])
        ident = "n/a" if r["identical"] is None else str(r["identical"])
        lines.append(
            f"{r['mode']:>12} {r['seed']:>4} {r['train_last']:>8.4f} "
            f"{placed(r['train_last'], train):>14} {r['valid']:>7.4f} "
            f"{placed(r['valid'], valid):>14} {r['samples_per_s']:>9.0f} "
            f"{ratio(r['samples_per_s'], fp32):>6} {ratio(r['samples_per_s'], bf16):>7} "
            f"{ratio(r['samples_per_s'], own):>6} {ident:>9}")
    return lines


def _own_speed(runs: Sequence[dict[str, Any]], name: str) -> float | None:
    """The mean samples/s of ``name``'s baseline (FSDP2/HSDP modes); None for the others,
    and for a mode of an older run that is no mode any more (a deleted wire's: its row
    still shows in a merged table)."""
    try:
        mode = parse_mode(name)
    except ValueError:
        return None
    return mean_speed(runs, mode.baseline) if mode.fsdp is not None else None


def _bounds(b: tuple[float, float] | None) -> str:
    return "-" if b is None else f"[{b[0]:.4f}, {b[1]:.4f}] (width {b[1] - b[0]:.4f})"
