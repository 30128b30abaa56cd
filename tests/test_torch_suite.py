"""The conformance driver's verdict (tests/torch_suite): which outcomes fail the CI run.
Fed recorded outcomes through ``--load``; running torch's suite is the driver's own job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.torch_suite.__main__ import NOT_REPORTED, main
from tests.torch_suite.selection import NOT_PASSED, select

PASSED = {"outcome": "passed", "seconds": 1.0, "detail": "", "engine_ops": [1, 1, 1, 1]}
ERROR = {"outcome": "error", "seconds": 1.0, "detail": "RuntimeError: boom", "engine_ops": None}
SKIPPED = {"outcome": "skipped", "seconds": 0.0, "detail": "CUDA", "engine_ops": None}


def _run(tmp_path: Path, gloo: dict[str, Any], ringreduce: dict[str, Any]) -> int:
    recorded = tmp_path / "recorded.json"
    recorded.write_text(json.dumps({"cases": {"gloo": gloo, "ringreduce": ringreduce}}))
    return main(["--load", str(recorded), "--json", str(tmp_path / "out.json")])


def test_same_outcomes_pass(tmp_path: Path) -> None:
    cases = {"test_a": PASSED, "test_b": SKIPPED}
    assert _run(tmp_path, cases, cases) == 0
    summary = json.loads((tmp_path / "out.json").read_text())
    assert summary["counts"]["ringreduce"] == {"passed": 1, "skipped": 1}
    assert summary["not_passed"] == []


def test_a_case_gloo_passes_and_ringreduce_not_fails_the_run(tmp_path: Path) -> None:
    gloo = {"test_a": PASSED, "test_b": PASSED}
    assert _run(tmp_path, gloo, {"test_a": PASSED, "test_b": ERROR}) == 1
    assert _run(tmp_path, gloo, {"test_a": PASSED, "test_b": SKIPPED}) == 1
    assert json.loads((tmp_path / "out.json").read_text())["not_listed"] == ["test_b"]


def test_a_listed_case_does_not_fail_the_run(tmp_path: Path) -> None:
    listed = next(iter(NOT_PASSED["cpu"]))
    assert _run(tmp_path, {listed: PASSED}, {listed: ERROR}) == 0


def test_failing_on_both_backends_is_not_ringreduces(tmp_path: Path) -> None:
    assert _run(tmp_path, {"test_a": ERROR}, {"test_a": ERROR}) == 0


def test_a_case_no_worker_reported_fails_the_run(tmp_path: Path) -> None:
    lost = {**ERROR, "detail": f"{NOT_REPORTED}: not finished within --time-limit"}
    assert _run(tmp_path, {"test_a": lost}, {"test_a": PASSED}) == 1


def test_selection_by_name_patterns() -> None:
    names = ["test_all_reduce_sum", "test_broadcast", "test_ddp_create_graph", "test_get_future",
             "test_accumulate_gradients_no_sync", "test_gather", "test_ddp_hook_parity_powerSGD"]
    assert select(names) == ["test_all_reduce_sum", "test_ddp_create_graph", "test_get_future",
                             "test_accumulate_gradients_no_sync",
                             "test_ddp_hook_parity_powerSGD"]
    assert select(names, "gather") == ["test_gather"]
