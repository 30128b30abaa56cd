"""Run some of torch's distributed cases in this process (each spawns its ranks) and write
their outcomes as JSON: ``python -m tests.torch_suite.worker OUT.json CASE...``;
``--list`` prints every case name instead.

Started by the driver with the suite's environment (``BACKEND``, ``WORLD_SIZE``,
``TEMP_DIR``, ``RR_SUITE_PG``, ``RR_SUITE_DEVICE``, ``RINGREDUCE_*``) already set, because
torch's module reads it at import, here and in every spawned rank.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
import unittest
from typing import Any

DETAIL_CHARS = 6000
"""Enough for the rank's traceback that torch puts at the end of the error."""


class _Outcomes(unittest.TestResult):
    """unittest's result, kept per case: passed / failed / error / skipped."""

    def __init__(self, out: str) -> None:
        super().__init__()
        self.cases: dict[str, dict[str, Any]] = {}
        self._out = out
        self._started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self._started = time.monotonic()
        print(f"[{time.strftime('%H:%M:%S')}] {_name(test)} ...", flush=True)

    def _record(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        seconds = round(time.monotonic() - self._started, 1)
        self.cases[_name(test)] = {"outcome": outcome, "seconds": seconds,
                                   "detail": detail[-DETAIL_CHARS:],
                                   "engine_ops": getattr(test, "engine_ops", None)}
        print(f"    {outcome} ({seconds} s)", flush=True)
        # After every case, so that a worker stopped at the driver's time limit keeps
        # what it finished; written whole, then renamed, so it is never half a file.
        with open(self._out + ".part", "w") as f:
            json.dump(self.cases, f, indent=1)
        os.replace(self._out + ".part", self._out)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._record(test, "failed", self.failures[-1][1])

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._record(test, "error", self.errors[-1][1])

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._record(test, "skipped", "torch marks it an expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "torch expected it to fail; it passed")


def _name(test: unittest.TestCase) -> str:
    return test.id().rsplit(".", 1)[-1]


def main(argv: list[str]) -> int:
    from .cases import SuiteCase  # after the environment is final (see the docstring)

    if argv == ["--list"]:
        print("\n".join(unittest.TestLoader().getTestCaseNames(SuiteCase)))
        return 0
    out, names = argv[0], argv[1:]

    # Forked ranks come from a server that has imported the suite (cases.py says why).
    multiprocessing.get_context("forkserver").set_forkserver_preload([SuiteCase.__module__])

    suite = unittest.TestSuite(SuiteCase(name) for name in names)
    suite.run(_Outcomes(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
