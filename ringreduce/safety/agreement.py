"""Construction's rendezvous: what every rank is about to build, compared first.

Before a Communicator builds anything, each rank publishes in the store either what it
is about to build (its effective settings and host identity) or why it refused its
arguments, then reads every other rank's entry, all within the deadline. So:
  * a rank that never comes is named after the deadline (RingReduceError), and a rank
    that comes after the others gave up fails at once instead of waiting alone;
  * a rank that refused its arguments (ValueError) makes every other rank fail at once,
    naming it and its reason, instead of leaving them waiting on the store;
  * ranks configured differently (a ``RINGREDUCE_*`` variable a launcher exported on
    some nodes only) fail on every rank naming the field, its values and the ranks,
    before any data moves: a different slice size or wire format on one rank would
    otherwise pair mismatched messages (wrong values or a crash in gloo), a different
    ``min_bytes`` would send ranks down different routes (a hang).
"""

from __future__ import annotations

import dataclasses
import datetime
import json

import torch.distributed as dist

from ringreduce.config import Config, env_name
from ringreduce.errors import stage_error

STAGE = "construction"
"""The stage named by the rendezvous' errors."""

LOCAL_FIELDS = frozenset({"timeout_s", "flight_file"})
"""Settings that may differ between ranks: each rank's own deadline and diagnostics.
Every other field changes which messages a rank sends, so all ranks must agree on it."""

_GAVE_UP = "gave_up"
"""Key a rank sets when its deadline passed with ranks absent: a latecomer reads it and
fails at once rather than wait for ranks that already left."""


def meet(store: dist.Store, rank: int, world: int, config: Config, host: str) -> list[str]:
    """Publish this rank's settings and host, check every rank's against them, and
    return every rank's host identity (index: rank). Raises ValueError on every rank
    when some rank refused or the settings differ, RingReduceError when a rank is
    absent past ``config.timeout_s``."""
    store.set(_key(rank), json.dumps({"host": host, "settings": _settings(config)}))
    arrivals = _read_all(store, rank, world, config.timeout_s)
    _raise_on_refusals(arrivals, rank)
    _raise_on_differences([a.settings for a in arrivals])
    return [a.host for a in arrivals]


def refuse(store: dist.Store, rank: int, reason: str) -> None:
    """Tell the other ranks this rank refused the construction (its caller raises the
    reason itself), so that they fail naming it instead of waiting."""
    store.set(_key(rank), json.dumps({"refused": reason}))


@dataclasses.dataclass(frozen=True)
class _Arrival:
    """One rank's entry: what it builds, or why it refused ("" when it did not)."""

    host: str = ""
    settings: dict[str, str] = dataclasses.field(default_factory=dict)
    refused: str = ""


def _settings(config: Config) -> dict[str, str]:
    return {f.name: repr(getattr(config, f.name)) for f in dataclasses.fields(config)
            if f.name not in LOCAL_FIELDS}


def _key(rank: int) -> str:
    return f"arrival/{rank}"


def _read_all(store: dist.Store, rank: int, world: int, timeout_s: float) -> list[_Arrival]:
    keys = [_key(r) for r in range(world)]
    try:  # the store may be gone too (its server exited): an error, not a hang
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
        late = store.check([_GAVE_UP])
        arrivals = [_Arrival(**json.loads(store.get(key).decode())) for key in keys]
    except Exception as exc:
        absent = _absent(store, keys)
        if absent:
            store.set(_GAVE_UP, str(rank))
        raise stage_error(
            STAGE, rank, f"the construction of a ringreduce communicator of {world} ranks",
            absent or range(world),
            f"ranks {absent} did not arrive within {timeout_s:.0f} s (the deadline: "
            "RINGREDUCE_TIMEOUT, or the process group's timeout for the backend); every "
            "rank of the group must construct it; a rank that fails here can retry"
            if absent else f"the store failed: {exc}") from exc
    if late:
        gave_up = store.get(_GAVE_UP).decode()
        raise stage_error(STAGE, rank,
                          f"the construction of a ringreduce communicator of {world} ranks",
                          range(world),
                          f"rank {gave_up} gave up waiting for this construction at its "
                          "deadline before every rank had arrived; construct again on every "
                          "rank")
    return arrivals


def _absent(store: dist.Store, keys: list[str]) -> list[int]:
    try:
        return [r for r, key in enumerate(keys) if not store.check([key])]
    except Exception:  # the store itself is gone: nobody can be named
        return []


def _raise_on_refusals(arrivals: list[_Arrival], rank: int) -> None:
    refused = {r: a.refused for r, a in enumerate(arrivals) if a.refused}
    if refused:
        first = min(refused)
        raise ValueError(
            f"ringreduce: rank {rank} cannot construct this communicator because ranks "
            f"{sorted(refused)} refused their arguments (rank {first}: {refused[first]}); "
            "construct it with the same valid arguments on every rank")


def _raise_on_differences(settings: list[dict[str, str]]) -> None:
    differences = []
    for field in settings[0]:
        by_value: dict[str, list[int]] = {}
        for r, theirs in enumerate(settings):
            by_value.setdefault(theirs[field], []).append(r)
        if len(by_value) > 1:
            variable = env_name(field)
            values = "; ".join(f"ranks {rs}: {value}" for value, rs in by_value.items())
            differences.append(f"{field}{f' ({variable})' if variable else ''}: {values}")
    if differences:
        raise ValueError(
            "ringreduce: the ranks' settings differ, so their messages would not match: "
            + " | ".join(differences) + ". Pass the same arguments and export the same "
            "RINGREDUCE_* variables on every rank (a launcher that sets a variable on some "
            "nodes only causes this)")

