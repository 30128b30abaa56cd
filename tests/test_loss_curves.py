"""benchmarks/loss_curves.py: trailing means, the fp32 envelope, gaps and the target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import loss_curves


def _run(mode: str, seed: int, losses: list[float], seconds: float = 2.0) -> dict[str, object]:
    return {"mode": mode, "seed": seed, "losses": losses, "seconds": seconds,
            "timed_steps": len(losses), "samples_per_s": 1000.0}


def test_trailing_means_are_exact_and_the_window_is_checked() -> None:
    assert loss_curves.trailing([1.0, 2.0, 3.0, 4.0], 2) == [1.5, 2.5, 3.5]
    assert loss_curves.trailing([4.0, 2.0], 1) == [4.0, 2.0]
    with pytest.raises(ValueError, match=r"window 5 must be in 1\.\.4"):
        loss_curves.trailing([1.0] * 4, 5)


def test_report_compares_each_mode_with_its_seed_and_the_spread(tmp_path: Path) -> None:
    """Seeds 0-2 of fp32 lie 0.01 apart; a mode at seed 0 that is 0.001 worse stays
    inside the spread but above the envelope's top (seed 0's curve is it); one that is
    0.05 worse leaves the spread at every step. The target is the worst final fp32
    mean; the better mode reaches it first, at its own seconds per step."""
    base = [1.0 - 0.01 * i for i in range(20)]
    fp32 = [_run("nccl", s, [v - 0.01 * s for v in base]) for s in range(3)]
    close = _run("hook", 0, [v + 0.001 for v in base], seconds=1.0)
    far = _run("far", 0, [v + 0.05 for v in base])
    (tmp_path / "a.json").write_text(json.dumps({"runs": [fp32[0], close, far]}))
    (tmp_path / "b.json").write_text(json.dumps({"runs": fp32[1:]}))
    runs = loss_curves.load([tmp_path / "a.json", tmp_path / "b.json"])
    text = loss_curves.report(runs, window=2)
    rows = {line.split()[1]: line.split() for line in text.splitlines()[2:]}
    target = 1.0 - 0.01 * 19 + 0.005  # seed 0's last trailing mean over 2 steps
    assert f"target {target:.5f}" in text
    # hook: gap 0.001 <= spread 0.02 everywhere; above the envelope at every step
    assert rows["hook"][5:9] == ["0.00100", "0", "19", "0.00100"], rows["hook"]
    assert rows["far"][5:7] == ["0.05000", "19"], rows["far"]
    assert rows["hook"][9:] == ["-", "-"]  # 0.001 worse never reaches seed 0's final
    given = loss_curves.report(runs, window=2, target=0.8205)
    nccl2 = next(line.split() for line in given.splitlines() if line.split()[1:3] == ["nccl", "2"])
    assert nccl2[9] == "17" and nccl2[10] == "1.70"  # 0.985 - 0.01 i <= 0.8205; 0.1 s a step
    with pytest.raises(ValueError, match="no nccl run"):
        loss_curves.report([r for r in runs if r.mode != "nccl"], window=2)
