"""The benchmark's launcher mapping and rendezvous, its flag checks, the README's
benchmark command end to end, and its references: NCCL in the wire dtype, NCCL under each
algorithm (--only-references) and benchmark.summary's NCCL best."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize("collective", [
    "reduce_scatter", pytest.param("all_gather", marks=pytest.mark.slow)])  # one bench run each
def test_benchmark_block_collectives_check_exactly(collective: str) -> None:
    """--collective: both sides of the comparison checked element by element; 4M takes
    the hierarchical route at 2 x 2 (above the CPU default min_bytes), 64K the flat one."""
    from ringreduce import bench

    rows = bench.main(["--collective", collective, "-b", "64K", "-e", "4M", "-f", "64",
                       "-n", "1", "-w", "0", "-r", "1", "-c", "1", "-o", "max"])
    assert [r["size"] for r in rows] == [64 << 10, 4 << 20]
    for row in rows:
        assert row["collective"] == collective and row["rr_wrong"] == row["ref_wrong"] == 0, row


@pytest.mark.slow  # two bench runs; test_summary_* check the merge on recorded rows
def test_wire_reference_and_nccl_best_merge_across_runs(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """--wire bfloat16 adds NCCL (here gloo) in bf16, checked exactly; a second process set
    under NCCL_ALGO with --only-references gives only references; benchmark.summary merges
    both into NCCL best and the headline, naming the algorithm."""
    from ringreduce import bench
    from ringreduce.benchmark import summary

    flags = ["-b", "4M", "-e", "4M", "-n", "1", "-w", "0", "-r", "1", "-c", "1",
             "--wire", "bfloat16", "--link-gbit", "10"]
    (row,) = bench.main([*flags, "--json", str(tmp_path / "main.json")])
    assert row["route"] == "hierarchical" and row["wire_ref_wrong"] == 0, row
    assert row["wire_ref_ratio"] == pytest.approx(row["wire_ref_time_us"] / row["rr_time_us"])
    assert row["nccl_best_algo"] == "default" and row["nccl_best_time_us"] == row["ref_time_us"]
    assert row["best_ref_ratio"] == pytest.approx(
        min(row[f"{k}_time_us"] for k in ("ref", "two_level", "wire_ref")) / row["rr_time_us"])
    monkeypatch.setenv("NCCL_ALGO", "allreduce:tree")
    (refs,) = bench.main([*flags, "--only-references", "--json", str(tmp_path / "tree.json")])
    assert refs["rr_time_us"] is None and refs["two_level_time_us"] is None
    assert refs["ref_wrong"] == refs["wire_ref_wrong"] == 0 and refs["nccl_algo"] == "tree"
    runs = summary.load([tmp_path / "main.json", tmp_path / "tree.json"])
    summary.merge(runs)
    merged = runs["main"]["rows"][0]
    fastest = min((row["ref_time_us"], "default"), (refs["ref_time_us"], "tree"))
    assert (merged["nccl_best_time_us"], merged["nccl_best_algo"]) == fastest
    assert merged["best_ref"] is not None and merged["best_ref_ratio"] > 0
    text = summary.table(runs)
    assert "references only, 1 rows, 0 wrong" in text and "wire bfloat16" in text


def test_gloo_rows_name_gloo_not_nccl() -> None:
    """A CPU run's flat reference is gloo's all-reduce: its row is not "NCCL default"."""
    from ringreduce.benchmark.report import headline

    row = {"flat_backend": "gloo", "nccl_best_algo": "default", "nccl_best_time_us": 1.0,
           "two_level_time_us": 3.0, "wire": "bfloat16", "wire_ref_best_algo": "default",
           "wire_ref_best_time_us": 2.0, "rr_time_us": 4.0}
    assert headline(row) == {"best_ref": "gloo", "best_ref_ratio": 0.25}
    assert headline(row | {"nccl_best_time_us": 5.0})["best_ref"] == "gloo bfloat16"
    assert headline(row | {"flat_backend": "nccl"})["best_ref"] == "NCCL default"


def _run(algo: str | None, **times: float | None) -> dict[str, Any]:
    row = {"size": 16 << 20, "buckets": 1, "collective": "all_reduce", "type": "float",
           "redop": "sum", "route": "hierarchical", "wire": "bfloat16", "rr_time_us": None,
           "ref_time_us": None, "two_level_time_us": None, "wire_ref_time_us": None} | times
    return {"meta": {"machines": 2, "devices": 2, "options": {"link_gbit": 10.0},
                     "fidelity": "faithful", "nccl_env": {"NCCL_ALGO": algo} if algo else {}},
            "rows": [row]}


def test_summary_takes_the_fastest_nccl_per_row_and_the_best_reference() -> None:
    """NCCL best is the fastest algorithm over runs of the same setting (the row's own run
    for its own algorithm); the headline is the fastest of NCCL best, two-level and NCCL in
    the wire dtype; a run of another fidelity does not count."""
    from ringreduce.benchmark import summary

    runs = {"main": _run(None, rr_time_us=100.0, ref_time_us=150.0, two_level_time_us=120.0,
                         wire_ref_time_us=70.0),
            "tree": _run("allreduce:tree", ref_time_us=105.0, wire_ref_time_us=60.0),
            "ring": _run("ring", ref_time_us=140.0, wire_ref_time_us=80.0),
            "default_elsewhere": _run(None, ref_time_us=50.0)}
    other = _run("allreduce:tree", ref_time_us=10.0)
    other["meta"]["fidelity"] = "one GPU"
    runs["one_gpu_tree"] = other
    summary.merge(runs)
    row = runs["main"]["rows"][0]
    assert (row["nccl_best_time_us"], row["nccl_best_algo"]) == (105.0, "tree")
    assert (row["wire_ref_best_time_us"], row["wire_ref_best_algo"]) == (60.0, "tree")
    assert (row["best_ref"], row["best_ref_ratio"]) == ("NCCL bfloat16 (tree)", 0.6)
    runs["main"]["rows"][0]["wire_ref_time_us"] = None
    runs["main"]["rows"][0]["wire"] = "-"
    summary.merge(runs)
    assert (row["best_ref"], row["best_ref_ratio"]) == ("NCCL tree", 1.05)


def test_quantized_wire_rows_print_their_route() -> None:
    from ringreduce.benchmark.options import build_parser
    from ringreduce.benchmark.references import nccl_algo_label
    from ringreduce.benchmark.report import route_label

    assert build_parser("").parse_args(["--wire", "int4"]).wire == "int4"
    assert [route_label(r) for r in ("hierarchical", "flat", "compressed int8", "-")] == \
        ["hier", "flat", "int8", "-"]
    assert [nccl_algo_label(v) for v in (None, "allreduce:tree;broadcast:ring", "Ring")] == \
        ["default", "tree", "ring"]


def test_summary_gives_a_flat_rows_ratios() -> None:
    """A row on the flat route (the probe may choose NCCL's own call above min_bytes) is
    still measured against NCCL's other algorithms and two-level: never slower covers it."""
    from ringreduce.benchmark import summary

    runs = {"main": _run(None, route="flat", wire="-", rr_time_us=100.0, ref_time_us=101.0,
                         two_level_time_us=95.0, ratio=1.01, two_level_ratio=0.95),
            "tree": _run("allreduce:tree", wire="-", ref_time_us=90.0)}
    summary.merge(runs)
    (line,) = [x for x in summary.table(runs).splitlines() if x.startswith("main")]
    assert " flat " in line and "0.90 tree" in line and "0.90 NCCL tree" in line, line
    assert "same library" not in line
