"""The benchmark's launcher mapping and rendezvous, its flag checks, and the README's
benchmark command end to end."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ringreduce.benchmark.launch import detect, init_method


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
    assert "prove the plumbing" in done.stdout and "same library (flat route)" in done.stdout
    rows = report["rows"]
    assert [r["size"] for r in rows] == [64 << 10, 4 << 20]
    # 64K is below the default min_bytes (2M): ringreduce took gloo's own all-reduce.
    assert [r["route"] for r in rows] == ["flat", "hierarchical"]
    for row in rows:
        for name in ("rr", "ref", "two_level"):
            assert row[f"{name}_wrong"] == 0, row
            assert row[f"{name}_time_us"] > 0 and row[f"{name}_cpu_us"] > 0, row
        assert row["two_level_ratio"] == pytest.approx(
            row["two_level_time_us"] / row["rr_time_us"])


def test_mpi_job_on_one_host_meets_in_a_file_named_after_the_job() -> None:
    """Plain `mpirun -np N` on one host, no MASTER_*, no mpi4py: every rank of a job
    gets the same FileStore path, another job another; over several hosts the error
    names both fixes (mpi4py, or exporting MASTER_ADDR/MASTER_PORT)."""
    if importlib.util.find_spec("mpi4py") is not None:
        pytest.skip("mpi4py installed: the rendezvous goes through it")
    job = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_MCA_ess_base_jobid": "1277624321"}
    urls = {init_method(detect({**job, "OMPI_COMM_WORLD_RANK": str(r)})) for r in range(4)}
    assert len(urls) == 1 and next(iter(urls)).startswith("file://"), urls
    other = init_method(detect({**job, "OMPI_COMM_WORLD_RANK": "0",
                                "OMPI_MCA_ess_base_jobid": "99"}))
    assert other not in urls
    spread = {**job, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(RuntimeError, match=r"mpi4py.*MASTER_ADDR"):
        init_method(detect(spread))


def test_flag_errors_stop_before_any_process_starts() -> None:
    """--machines 3 with 4 ranks: one line naming the valid counts, no traceback, and
    no rank started (the run ends in far less time than spawning gloo ranks takes)."""
    cmd = [sys.executable, "-m", "ringreduce.bench", "--machines", "3"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--machines 3 with 4 ranks" in done.stderr and "[1, 2, 4]" in done.stderr, \
        done.stderr
    assert "Traceback" not in done.stderr and "ringreduce.bench  world" not in done.stdout


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
