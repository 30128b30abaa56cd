"""The benchmark's launcher mapping, and the README's benchmark command end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ringreduce.launch import detect


def test_launchers_are_read_from_their_own_variables() -> None:
    torchrun = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                "MASTER_ADDR": "node0", "MASTER_PORT": "29400"}
    got = detect(torchrun)
    assert (got.launcher, got.rank, got.world_size, got.local_rank, got.local_size) == \
        ("torchrun", 3, 8, 1, 4)
    assert (got.master_addr, got.master_port) == ("node0", 29400)
    ompi = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16",
            "OMPI_COMM_WORLD_LOCAL_RANK": "5", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    assert detect(ompi).launcher == "openmpi" and detect(ompi).local_size == 8
    mpich = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    assert (detect(mpich).launcher, detect(mpich).rank) == ("mpich", 2)
    # torchrun inside an MPI allocation is still torchrun (first match wins).
    assert detect({**ompi, **torchrun}).launcher == "torchrun"


def test_slurm_counts_only_under_srun() -> None:
    shell = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0",
             "SLURM_NTASKS_PER_NODE": "4"}
    assert detect(shell).launcher == "standalone"  # sbatch/salloc shell: no step id
    srun = detect({**shell, "SLURM_STEP_ID": "0"})
    assert (srun.launcher, srun.world_size, srun.local_size) == ("slurm", 8, 4)
    assert detect({**shell, "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}).launcher == "standalone"


def test_readme_benchmark_command_runs_and_checks() -> None:
    """`python -m ringreduce.bench` standalone on CPU: 2 x 2 gloo ranks, exact results."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "ringreduce.bench", "-b", "64K", "-e", "4M", "-f", "64",
               "-n", "1", "-w", "0", "-r", "1", "-c", "1", "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(out.read_text())
    assert "2 machines x 2 devices" in done.stdout
    assert [r["size"] for r in report["rows"]] == [64 << 10, 4 << 20]
    for row in report["rows"]:
        assert row["rr_wrong"] == 0 and row["ref_wrong"] == 0, row
        assert row["rr_time_us"] > 0 and row["ref_time_us"] > 0


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_benchmark_block_collectives_check_exactly(collective: str) -> None:
    """--collective: both sides of the comparison checked element by element; 4M takes
    the hierarchical route at 2 x 2 (above the CPU default min_bytes), 64K the flat one."""
    from ringreduce import bench

    rows = bench.main(["--collective", collective, "-b", "64K", "-e", "4M", "-f", "64",
                       "-n", "1", "-w", "0", "-r", "1", "-c", "1", "-o", "max"])
    assert [r["size"] for r in rows] == [64 << 10, 4 << 20]
    for row in rows:
        assert row["collective"] == collective and row["rr_wrong"] == row["ref_wrong"] == 0, row
