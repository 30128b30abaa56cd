"""Every module in benchmarks/ imports: the names it takes from ringreduce and tests exist.

GPU runs are the only place most of these scripts do their work, and a device call
spent on an ImportError (a module moved, a name renamed) is a tenth of a session's GPU
time; this catches it on the CPU, in CI. Each runs in a fresh interpreter under another
name than ``__main__``, so nothing runs but its top level.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((REPO / "benchmarks").glob("*.py"))
IMPORT = """
import os, runpy, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # as when run as a script
runpy.run_path(sys.argv[1], run_name="benchmark_under_test")
print("imported")
"""
NEEDS_A_GPU = ("No module named 'cupy'", "Torch not compiled with CUDA enabled")


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_module_imports(script: Path) -> None:
    done = subprocess.run([sys.executable, "-c", IMPORT, str(script)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    if done.returncode and any(why in done.stderr for why in NEEDS_A_GPU):
        pytest.skip(f"{script.name} needs CUDA at import time")
    assert done.returncode == 0 and done.stdout.strip().endswith("imported"), \
        f"importing {script.name} failed ({done.returncode}):\n{done.stderr[-2000:]}"
