"""benchmarks/emulate.py end to end on CPU (loopback: no root needed): the ranks get
their machine count and host ids, the bench's header states the fidelity, and every
implementation is exact."""

from __future__ import annotations

import json
import signal
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


_STAND_IN = """#!/usr/bin/env bash
# Stands in for nvidia-cuda-mps-control (no GPU here): -d makes the pipe a daemon would;
# a command on stdin is recorded with the pipe folder it was sent to.
if [ "${1:-}" = "-d" ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
read -r command; echo "$command $CUDA_MPS_PIPE_DIRECTORY" >> "$RECORD"
"""


def _tmpdir(tmp_path: Path) -> Path:
    """A private temporary folder for emulate.py (TMPDIR), where its daemon folders go:
    a real run's leftover in the machine's /tmp (e.g. a killed CI run's) must not count
    as this test's (it did, 2026-11-25: one more quit than expected)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    return folder


def test_mps_daemon_lives_exactly_as_long_as_the_command(tmp_path: Path) -> None:
    """--mps-only: the daemon is started before the command (which sees its pipe), told
    to quit after it even when the command fails, and its folder removed; a folder left
    by a killed run (its pid gone) gets its daemon stopped at the next start."""
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(_STAND_IN)
    control.chmod(0o755)
    record = tmp_path / "record.txt"
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is gone: a killed run's folder
    env = {"PATH": "/usr/bin:/bin", "RECORD": str(record), "TMPDIR": str(_tmpdir(tmp_path))}
    leftover = Path(env["TMPDIR"]) / f"rr-mps-{dead.pid}"
    (leftover / "pipe").mkdir(parents=True, exist_ok=True)
    (leftover / "pipe" / "control").touch()
    probe = 'test -e "$CUDA_MPS_PIPE_DIRECTORY/control" && echo "pipe $CUDA_MPS_PIPE_DIRECTORY"'
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "emulate.py"), "--mps-only",
                           "--mps-control", str(control), "--", "bash", "-c", probe + "; exit 3"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 3, done.stdout + done.stderr  # the command's own status
    pipe = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("pipe "))
    quits = record.read_text().splitlines()
    assert quits == [f"quit {leftover / 'pipe'}", f"quit {pipe}"], quits
    assert not leftover.exists() and not Path(pipe).parent.exists()


def test_mps_daemon_is_stopped_when_the_run_is_terminated(tmp_path: Path) -> None:
    """SIGTERM to emulate.py mid-command: the command ends and the daemon is told to quit."""
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(_STAND_IN)
    control.chmod(0o755)
    record = tmp_path / "record.txt"
    env = {"PATH": "/usr/bin:/bin", "RECORD": str(record), "TMPDIR": str(_tmpdir(tmp_path))}
    run = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "emulate.py"),
                            "--mps-only", "--mps-control", str(control), "--", "sleep", "60"],
                           stdout=subprocess.PIPE, text=True, env=env)
    assert run.stdout is not None
    assert "private daemon up" in run.stdout.readline()  # started before the command
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == 128 + signal.SIGTERM
    [line] = record.read_text().splitlines()
    assert line == f"quit {env['TMPDIR']}/rr-mps-{run.pid}/pipe", line
    assert not Path(env["TMPDIR"], f"rr-mps-{run.pid}").exists()
