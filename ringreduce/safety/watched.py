"""What the watchdog (watchdog.py) is handed: an issued operation's stage completions
(Op, each a Completion) and the call being issued right now (Issue)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol


class Completion(Protocol):
    """A torch.cuda.Event (or a test double): ``query()`` is True once the work
    recorded before it has finished."""

    def query(self) -> bool: ...


class Issue(NamedTuple):
    """A call the engine is issuing right now."""

    op_number: int
    what: str
    stage: str
    peers: tuple[int, ...]
    since: float
    """time.monotonic() when issuing began."""


@dataclass
class Op:
    """An issued operation under watch: its stages' completions, in pipeline order."""

    op_number: int
    what: str
    stages: tuple[tuple[str, Completion, tuple[int, ...]], ...]
    oldest_since: float | None
    """When it became the oldest pending operation (time.monotonic()); its deadline
    runs from then, so a queue of slow but healthy operations does not expire its tail."""
    done: int = 0
    """Stages known to have finished; an operation's stages finish in pipeline order."""

    def finished(self) -> bool:
        return self.done == len(self.stages)
