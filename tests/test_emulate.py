"""benchmarks/emulate.py end to end on CPU (loopback: no root needed): the ranks get
their machine count and host ids, the bench's header states the fidelity, and every
implementation is exact."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_emulated_2x2_states_its_fidelity_and_runs_the_hierarchy_exactly() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, str(REPO / "benchmarks" / "emulate.py"), "--machines", "2",
               "--gpus-per-machine", "2", "--mode", "loopback", "--", "-b", "2M", "-e", "2M",
               "-n", "1", "-w", "0", "-r", "1", "-c", "1", "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        report = json.loads(out.read_text())
    fidelity = report["meta"]["fidelity"]
    assert fidelity.startswith("emulated 2x2 on one host"), fidelity
    assert "no link cap" in fidelity and "CPU cores per rank" in fidelity, fidelity
    assert "# fidelity: emulated 2x2" in done.stdout
    # The ranks were told the machine count: ringreduce ran 2 machines x 2 devices.
    assert (report["meta"]["machines"], report["meta"]["devices"]) == (2, 2)
    assert "NCCL_HOSTID=vm0" in done.stdout and "NCCL_NVLS_ENABLE=0" in done.stdout
    [row] = report["rows"]
    assert row["route"] == "hierarchical", row
    assert row["rr_wrong"] == row["ref_wrong"] == row["two_level_wrong"] == 0, row
