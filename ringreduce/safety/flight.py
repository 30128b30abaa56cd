"""Flight recorder: the last N operations and the stages each one entered and left.

Dumped to the log (and to a JSON file when configured) when an operation fails, so a
hang or a crash names what was in flight. On the CPU path the stamps are when each
stage ran; on CUDA they are when the host *issued* it (device progress would need a
device-host synchronisation, which the all-reduce path never does).
"""

from __future__ import annotations

import collections
import json
import logging
import time
from dataclasses import asdict, dataclass, field

log = logging.getLogger("ringreduce")


@dataclass(slots=True)  # one per call: slots make it ~40% cheaper to build
class Record:
    op_number: int
    numel: int
    dtype: str
    op: str
    route: str
    kind: str = "all_reduce"
    started: float = field(default_factory=time.time)
    stages: list[tuple[str, int, str, float]] = field(default_factory=list)
    """(stage, slice, "start" | "end", seconds since ``started``)."""
    finished: float | None = None
    why: str = ""
    """Why the call took its route, where a choice was made (the hierarchical plan)."""


#: Operations the recorder keeps (dumped to the log when one fails): enough to show what
#: a step's buckets were doing, a few KiB per rank.
RECORDS = 64


class FlightRecorder:
    def __init__(self, capacity: int, rank: int, path: str | None) -> None:
        self._records: collections.deque[Record] = collections.deque(maxlen=capacity)
        self.rank = rank
        self.path = path.replace("{rank}", str(rank)) if path else None

    def begin(self, op_number: int, numel: int, dtype: str, op: str, route: str,
              kind: str = "all_reduce") -> Record:
        record = Record(op_number, numel, dtype, op, route, kind)
        if self._records.maxlen:
            self._records.append(record)
        return record

    def forget(self) -> None:
        """Drop the records kept so far (the construction probe's calls: a failure
        among them is dumped while they run, and afterwards they are not the user's)."""
        self._records.clear()

    def last(self) -> Record | None:
        """The newest kept record (None when none is kept): benchmarks read the route
        a call took from it rather than re-deriving the routing rule."""
        return self._records[-1] if self._records else None

    @staticmethod
    def stamp(record: Record | None, stage: str, slice_index: int, edge: str) -> None:
        if record is not None:
            record.stages.append((stage, slice_index, edge, time.time() - record.started))

    def dump(self, reason: str) -> list[dict[str, object]]:
        """Log every kept record (oldest first) and write them to ``path``."""
        rows = [asdict(r) for r in self._records]
        log.error("ringreduce flight recorder, rank %d, %s: last %d operations",
                  self.rank, reason, len(rows))
        for row in rows:
            last = row["stages"][-1] if row["stages"] else None
            log.error("  op #%s %s %s x %s %s via %s%s, finished=%s, last stage event %s",
                      row["op_number"], row["kind"], row["numel"], row["dtype"], row["op"],
                      row["route"], f" ({row['why']})" if row["why"] else "",
                      row["finished"] is not None, last)
        if self.path:
            with open(self.path, "w") as f:
                json.dump({"rank": self.rank, "reason": reason, "operations": rows}, f, indent=1)
        return rows
