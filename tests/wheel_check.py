"""The wheel as a user gets it: run with the python of a fresh venv in which the built wheel
is installed non-editable (.ci/run does this), never from the checkout.

A wheel once shipped no native/*.cu, so a non-editable install failed at the first kernel
on a GPU; the sources are now copied into ``ringreduce/native/`` by setup.py's build_py.
This checks the installed package finds every kernel source inside itself, that the
native issuer's extension was built into the wheel where a C++ compiler exists, and that
the wheel holds the library only (issue 39): the benchmark workloads live in benchmarks/,
and so does the model's validation against the committed results
(benchmarks/model_validation/: the results reader's folder table, the fit-and-check over
benchmarks/results/, the faithful rows measured in an issue's table).
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import ringreduce
from ringreduce.execution import kernels

KERNEL_SOURCES = ("add.cu", "wire.cu", "check.cu", "quant.cu", "numeric.cuh", "quant.cuh")
BENCH_MODULES = {"__init__.py", "cli.py", "launch.py", "loops.py", "measure.py", "options.py",
                 "profile.py", "references.py", "report.py", "summary.py"}
"""ringreduce/benchmark/: what ``python -m ringreduce.bench`` runs, nothing else."""
MODEL_MODULES = {"__init__.py", "__main__.py", "calibrate.py", "cli.py", "cluster.py",
                 "nccl_cost.py", "plot.py", "probe.py", "results.py", "simulate.py"}
"""ringreduce/model/: the prediction CLI and the calibration to a user's own benchmark JSON;
the validation against our measurements (validate.py, faithful.py) is not shipped."""


def main() -> int:
    package = Path(ringreduce.__file__).resolve().parent
    if "site-packages" not in package.parts:
        print(f"wheel check: ringreduce imported from {package}, not an installed wheel",
              file=sys.stderr)
        return 1
    source = kernels.source_dir().resolve()
    missing = [name for name in KERNEL_SOURCES if not (source / name).is_file()]
    if missing or not source.is_relative_to(package):
        print(f"wheel check: kernel sources {missing or KERNEL_SOURCES} not in the package "
              f"(source_dir() = {source})", file=sys.stderr)
        return 1
    refused = _not_library(package)
    if refused:
        print(f"wheel check: {refused}", file=sys.stderr)
        return 1
    if shutil.which("g++"):
        importlib.import_module("ringreduce._native")  # raises if the wheel lacks it
    print(f"wheel check: {package} has {', '.join(KERNEL_SOURCES)}"
          + (" and ringreduce._native" if shutil.which("g++") else ""))
    return 0


def _not_library(package: Path) -> str | None:
    """What the installed wheel holds beyond the library, or None."""
    for folder, allowed, why in (
            ("benchmark", BENCH_MODULES, "which the bench does not run (workloads belong in "
             "benchmarks/)"),
            ("model", MODEL_MODULES, "which the model's prediction does not need (validation "
             "against our results belongs in benchmarks/model_validation/)")):
        extra = sorted(p.name for p in (package / folder).glob("*.py") if p.name not in allowed)
        if extra:
            return f"ringreduce/{folder}/ ships {extra}, {why}"
    shipped = sorted(p.name for p in package.parent.glob("benchmarks*"))
    if shipped:
        return f"the wheel installs {shipped}: benchmarks/ is not part of the library"
    return None


if __name__ == "__main__":
    sys.exit(main())
