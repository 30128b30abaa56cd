"""The driver: torch's own distributed cases on ringreduce and on the reference backend.

    python -m tests.torch_suite --backend ringreduce --backend gloo --json out.json
    python -m tests.torch_suite --device cuda --backend ringreduce --backend nccl

Each backend runs the same selection (``selection.PATTERNS``) with 4 ranks as 2 virtual
machines x 2 (``RINGREDUCE_MACHINES=2``) and the hierarchy forced at every size
(``RINGREDUCE_MIN_BYTES=0``), split over ``--jobs`` worker processes. It prints the counts
per backend and every case the reference passes and ringreduce does not; it exits 1 when
one of those is not in ``selection.NOT_PASSED`` (or a worker died), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .selection import EXCLUDE, NOT_PASSED, PATTERNS, select

ROOT = Path(__file__).resolve().parents[2]
OUTCOMES = ("passed", "failed", "error", "skipped")
REFERENCE = {"cpu": "gloo", "cuda": "nccl"}
"""The backend ringreduce stands on for each device; also what torch's suite is told."""
WORLD_SIZE = 4
NOT_REPORTED = "not reported"
CASE_TIMEOUT_S = 120
RINGREDUCE_TIMEOUT_S = 60
"""As torch's suite's process-group timeout (``default_pg_timeout``), so a hang inside
ringreduce ends as a hang inside gloo would, before the case's own timeout."""
START = {"cpu": "forkserver", "cuda": "spawn"}
"""How ranks start by default (cases.py's ``_spawn_processes`` says why)."""


def suite_env(backend: str, device: str, temp_dir: str, start: str = "spawn",
              gpus: int = 1) -> dict[str, str]:
    """The environment of a worker and (inherited) of its ranks."""
    env = dict(os.environ)
    env.update({
        "BACKEND": REFERENCE[device],  # how torch's suite sees ringreduce: cases.py says why
        "RR_SUITE_PG": backend,
        "RR_SUITE_DEVICE": device,
        "RR_SUITE_START": start,
        "RR_SUITE_GPUS": str(gpus),
        "WORLD_SIZE": str(WORLD_SIZE),
        "TEMP_DIR": temp_dir,
        "RINGREDUCE_MACHINES": "2",
        "RINGREDUCE_MIN_BYTES": "0",
        "RINGREDUCE_TIMEOUT": str(RINGREDUCE_TIMEOUT_S),
        "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(CASE_TIMEOUT_S),
        "PYTORCH_PRINT_REPRO_ON_FAILURE": "0",
        "OMP_NUM_THREADS": "1",  # 4 ranks (8 with both backends at once) on few cores
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    })
    if device == "cuda":
        env.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1",
                    # torch.cuda.is_available() through NVML, not the CUDA driver, so that
                    # importing torch's suite leaves CUDA untouched (needed by --start
                    # forkserver; harmless with spawn).
                    "PYTORCH_NVML_BASED_CUDA_CHECK": "1"})
    return env


def list_cases(device: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-m", "tests.torch_suite.worker", "--list"],
            env=suite_env(REFERENCE[device], device, tmp), cwd=ROOT, check=True,
            capture_output=True, text=True)
    return out.stdout.split()


def run_shard(backend: str, device: str, start: str, gpus: int, cases: list[str],
              log: Path, deadline: float) -> dict[str, Any]:
    """One worker process over ``cases``, stopped at ``deadline`` (``time.monotonic``)
    with every process it started; a case it did not report is an error."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "outcomes.json")
        with open(log, "w") as f:
            worker = subprocess.Popen(
                [sys.executable, "-m", "tests.torch_suite.worker", out, *cases],
                env=suite_env(backend, device, tmp, start, gpus), cwd=ROOT, stdout=f,
                stderr=subprocess.STDOUT, start_new_session=True)
            try:
                worker.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)  # its session: ranks, fork server
                worker.wait()
        outcomes: dict[str, Any] = {}
        if os.path.exists(out):
            with open(out) as f:
                outcomes = json.load(f)
    for case in cases:
        outcomes.setdefault(case, {"outcome": "error", "seconds": 0.0, "detail": (
            f"{NOT_REPORTED}: not finished within --time-limit, or the worker died; "
            f"see {log}")})
    return outcomes


def run_all(backends: list[str], device: str, start: str, gpus: int, cases: list[str],
            jobs: int, log_dir: Path, deadline: float) -> dict[str, dict[str, Any]]:
    """Every backend's cases, in ``jobs`` shards each, ``jobs`` workers at a time. Shards
    interleave the cases so that slow neighbours spread out, and start alternating
    backends so that both progress alike under ``--time-limit``."""
    shards = [(b, cases[i::jobs], log_dir / f"{b}-{i}.log")
              for i in range(jobs) for b in backends if cases[i::jobs]]
    results: dict[str, dict[str, Any]] = {b: {} for b in backends}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [(b, pool.submit(run_shard, b, device, start, gpus, c, log, deadline))
                   for b, c, log in shards]
        for b, fut in futures:
            results[b].update(fut.result())
    return results


def not_passed(results: dict[str, dict[str, Any]], backend: str,
               reference: str) -> list[str]:
    """Cases the reference passes and ``backend`` does not, in selection order."""
    return [c for c, r in results[reference].items()
            if r["outcome"] == "passed" and results[backend][c]["outcome"] != "passed"]


def unreported(results: dict[str, dict[str, Any]]) -> list[str]:
    """Cases some worker did not finish (time limit, crash): never a pass."""
    return sorted({c for outcomes in results.values() for c, r in outcomes.items()
                   if r["detail"].startswith(NOT_REPORTED)})


def print_counts(results: dict[str, dict[str, Any]], device: str, cases: list[str],
                 seconds: float) -> dict[str, dict[str, int]]:
    counts = {b: dict(Counter(r["outcome"] for r in rs.values())) for b, rs in results.items()}
    print(f"\ntorch's distributed cases, {device}, {WORLD_SIZE} ranks as 2 x 2, "
          f"{len(cases)} selected, {seconds:.0f} s")
    print(f"| backend | {' | '.join(OUTCOMES)} |")
    print(f"|---|{'---|' * len(OUTCOMES)}")
    for b, c in counts.items():
        print(f"| {b} | {' | '.join(str(c.get(o, 0)) for o in OUTCOMES)} |")
    if "ringreduce" in results:
        passed = [r for r in results["ringreduce"].values() if r["outcome"] == "passed"]
        engine = [r for r in passed if r.get("engine_ops") and min(r["engine_ops"]) > 0]
        print(f"ringreduce's engine ran all-reduces in every rank in {len(engine)} of the "
              f"{len(passed)} cases passed there (the rest reduced nothing it takes)")
    return counts


def compare(results: dict[str, dict[str, Any]], device: str,
            cases: list[str]) -> dict[str, Any]:
    """Print and return what the reference passes and ringreduce does not, and the
    verdict."""
    reference, known = REFERENCE[device], NOT_PASSED[device]
    diff = not_passed(results, "ringreduce", reference)
    new = [c for c in diff if c not in known]
    stale = [c for c in known if c in results["ringreduce"]
             and results["ringreduce"][c]["outcome"] == "passed"]
    print(f"\n{reference} passes, ringreduce does not: {len(diff)} "
          f"({len(diff) - len(new)} listed in selection.NOT_PASSED, {len(new)} not)")
    for c in diff:
        print(f"  {c}: {results['ringreduce'][c]['outcome']}; " + known.get(c, "NOT LISTED"))
    for c in new:
        print(f"\n--- {c} on ringreduce ({results['ringreduce'][c]['outcome']}) ---\n"
              f"{results['ringreduce'][c]['detail'][-3000:]}")
    if stale:
        print(f"\nlisted in selection.NOT_PASSED but passed now (remove them): {stale}")
    # The verdict in the closing-line form CI logs understand: a case passes when both
    # backends pass it, fails when only the reference does and it is not listed (or a
    # worker never reported it), and is skipped otherwise.
    both = sum(results["ringreduce"][c]["outcome"] == "passed"
               and results[reference][c]["outcome"] == "passed" for c in cases)
    failed = len(set(new) | set(unreported(results)))
    print(f"\nconformance: {both} passed, {failed} failed, {len(cases) - both - failed} skipped")
    return {"reference": reference, "not_passed": diff, "not_listed": new,
            "listed_but_passed": stale}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.torch_suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", action="append", choices=("ringreduce", "gloo", "nccl"),
                   help="repeat for several; default: ringreduce and the reference")
    p.add_argument("--device", choices=tuple(REFERENCE), default="cpu")
    p.add_argument("--gpus", type=int, choices=(1, WORLD_SIZE), default=1,
                   help="cuda: 1 = every rank on cuda:0 (under MPS); 4 = rank r on cuda:r "
                        "(the cases that index devices by rank run too)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes at a time")
    p.add_argument("--start", choices=("forkserver", "spawn"),
                   help="how ranks start (default: forkserver on cpu, spawn on cuda)")
    p.add_argument("--time-limit", type=float, default=1800.0, metavar="S",
                   help="stop every worker S seconds after the start; what finished is "
                        "reported, the rest counts as errors (torch's own limit per case "
                        f"is {CASE_TIMEOUT_S} s)")
    p.add_argument("-k", dest="pattern", help="only cases matching this regex")
    p.add_argument("--json", type=Path, help="write counts and every outcome here")
    p.add_argument("--logs", type=Path, help="keep each worker's log in this folder")
    p.add_argument("--load", action="append", type=Path, default=[],
                   help="also take the outcomes in an earlier run's --json (e.g. one "
                        "backend per run where a run's time is capped)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    loaded: dict[str, dict[str, Any]] = {}
    for path in args.load:
        loaded.update(json.loads(path.read_text())["cases"])
    backends = args.backend or ([] if loaded else ["ringreduce", REFERENCE[args.device]])
    results: dict[str, dict[str, Any]] = {}
    cases: list[str] = []
    started = time.monotonic()
    if backends:
        cases = select(list_cases(args.device), args.pattern)
        with tempfile.TemporaryDirectory() as tmp:
            log_dir = args.logs or Path(tmp)
            log_dir.mkdir(parents=True, exist_ok=True)
            start = args.start or START[args.device]
            results = run_all(backends, args.device, start, args.gpus, cases, args.jobs,
                              log_dir, started + args.time_limit)
    for b, outcomes in loaded.items():
        results.setdefault(b, outcomes)
    order = cases or list(next(iter(loaded.values())))
    cases = [c for c in order if all(c in outcomes for outcomes in results.values())]
    results = {b: {c: outcomes[c] for c in cases} for b, outcomes in results.items()}
    seconds = time.monotonic() - started
    counts = print_counts(results, args.device, cases, seconds)
    summary: dict[str, Any] = {"device": args.device, "seconds": round(seconds),
                               "counts": counts, "patterns": PATTERNS, "excluded": EXCLUDE,
                               "cases": results}
    if "ringreduce" in results and REFERENCE[args.device] in results:
        summary.update(compare(results, args.device, cases))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 1 if summary.get("not_listed") or unreported(results) else 0


if __name__ == "__main__":
    sys.exit(main())
