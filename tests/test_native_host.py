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
    # DDP's hooks against torch's allreduce_hook
    assert reference("hook:native/auto+int8 async") == reference("hook:torch async") == \
        "hook:torch async"


def test_report_puts_each_measure_in_its_column(monkeypatch: Any, capsys: Any) -> None:
    """measure()'s row layout (idle, own, vs_nccl, stream host, CPU, cores, wall, by
    thread kind) as report() prints it; speed is NCCL's wall over the way's."""
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "GPU")
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    rows = {"nccl sync": (100.0, 90.0, 1.0, 40.0, 10.0, 2.0, 5.0, {"caller": 5.0}),
            "p:x sync": (150.0, 140.0, 1.5, 50.0, 7.0, 2.0, 3.5, {"caller": 3.5})}
    _native_host()["report"](rows, {}, 1 << 20, 64, torch.device("cpu"))
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("way "))
    assert header.split()[1:] == ["host_idle_us", "own_cpu_us", "vs_nccl", "stream_host_us",
                                  "cpu_ms_call", "busy_cores", "wall_ms_call", "speed"]
    # "p:x sync" is two words: its values start at the third
    values = next(line for line in lines if line.startswith("p:x sync")).split()[2:]
    assert values == ["150.0", "140.0", "1.50", "50.0", "7.00", "2.00", "3.50", "1.43"], lines
