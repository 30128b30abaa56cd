"""benchmarks/native_host.py's sampling, on the CPU: the ways take turns, and each way's
ratio pairs its calls with NCCL's of the same round (the GPU runs are the only place the
script does its work; this is the part that decides what its host-time table means)."""

from __future__ import annotations

import math
import runpy
import sys
import time
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _native_host() -> dict[str, Any]:
    sys.path.insert(0, str(BENCHMARKS))  # as when run as a script (thread_cpu)
    try:
        return runpy.run_path(str(BENCHMARKS / "native_host.py"), run_name="native_host")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _sleeper(seconds: float, log: list[str], name: str) -> Any:
    def call() -> None:
        log.append(name)
        time.sleep(seconds)
    return call


def test_ways_take_turns_and_ratios_pair_each_round() -> None:
    host = _native_host()
    log: list[str] = []
    ways = {"nccl sync": _sleeper(0.002, log, "nccl sync"),
            "ours sync": _sleeper(0.006, log, "ours sync"),
            "ours async": _sleeper(0.001, log, "ours async")}
    befores: list[int] = []
    rows = host["idle_host_us"](ways, 4, lambda: befores.append(len(log)))
    # one call of each way a round, each after before(), the first way one further along
    assert log == ["nccl sync", "ours sync", "ours async",
                   "ours sync", "ours async", "nccl sync",
                   "ours async", "nccl sync", "ours sync",
                   "nccl sync", "ours sync", "ours async"], log
    assert befores == list(range(12))
    idle, own, ratio = rows["ours sync"]
    assert 6000 <= idle < 60000 and 0 <= own < idle  # µs; sleeping costs no CPU
    assert 1.2 < ratio < 4, rows  # 6 ms over 2 ms (plus what sleep overshoots), paired
    assert rows["nccl sync"][2] == 1.0
    assert math.isnan(rows["ours async"][2]), "no NCCL async way to pair with"


def test_reference_is_nccl_of_the_same_mode() -> None:
    reference = _native_host()["reference"]
    assert reference("p:issue async") == "nccl async"
    assert reference("native/one sync") == "nccl sync"
