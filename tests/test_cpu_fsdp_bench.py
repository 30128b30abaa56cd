"""The FSDP2 benchmark (benchmarks/fsdp.py; benchmarks/workloads/fsdp_train.py,
fsdp_modes.py and fsdp_cli.py) on CPU: a tiny transformer trained on 4 gloo ranks (2
virtual machines x 2) in every mode, end to end through the command line; the merge of
NCCL runs under two algorithms; the checks that must fail loudly.

Tolerances. Step 0's loss is the same to the bit in every mode: the same weights on the
same batch, and FSDP's all-gathers copy. After it the fp32 modes differ only in the
order the 4 gradients are summed (gloo's reduce-scatter over the world; ringreduce's
machine pairs, then the rail; HSDP's shard pair, then the replica pair), so a loss
moves by float32 ulps: measured at most 2.4e-7 (one ulp of a loss near 4) over 6 steps,
inside ``LOSS_TOL``, as test_cpu_dlrm.py's DDP modes. rr-hsdp equals hsdp-nccl to the
bit: both reduce-scatter on the shard group with gloo's own call (the shard
Communicator is one machine), and a 2-replica AVG is a + b (commutative) halved
(exact) whoever computes it. The int8 modes round the rail hop: measured 1e-4 (rr-int8)
and 5e-4 (rr-hsdp-int8) from fsdp-nccl, inside ``INT8_TOL``, and never 0.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ringreduce
from benchmarks.workloads import fsdp_cli, fsdp_modes, fsdp_train
from benchmarks.workloads.transformer_model import TransformerSpec

from .fsdp import fully_shard_api  # noqa: F401  # skips here without FSDP2's hook
from .multiproc import run_test_ranks

REPO = Path(__file__).resolve().parent.parent
LOSS_TOL = 1e-5
INT8_TOL = 1e-2
LAYERS, STEPS, WARMUP = 2, 6, 2
TINY = ["--layers", str(LAYERS), "--width", "16", "--heads", "2", "--vocab", "64",
        "--seq", "8", "--batch", "4", "--steps", str(STEPS), "--warmup", str(WARMUP),
        "--lr", "0.01", "--min-bytes", "0"]  # min_bytes 0: every call on the hierarchy


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow  # a training per mode, in ranks of its own; the pieces are tested below
def test_fsdp_command_line_runs_every_mode(tmp_path: Path) -> None:
    """`python benchmarks/fsdp.py --device cpu ...`: every mode, fsdp-nccl at a second
    seed; the table printed last; the JSON's curves agree as the docstring says, and the
    ringreduce modes' every call is counted: one reduce-scatter per FSDP module (the
    blocks and the root) and step, and as many replicate all-reduces in custom HSDP."""
    out = tmp_path / "fsdp.json"
    cmd = [sys.executable, "benchmarks/fsdp.py", "--device", "cpu", *TINY, "--seeds", "2",
           "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    rows = done.stdout.strip().splitlines()[-9:]  # floor, header, 6 modes, the spread
    assert rows[1].split()[:3] == ["mode", "steps", "samples/s"], done.stdout
    assert [r.split()[0] for r in rows[2:-1]] == list(fsdp_modes.MODES), done.stdout
    assert rows[-1].startswith("# fsdp-nccl over seeds [0, 1]"), done.stdout
    runs = report["runs"]
    assert [(r["mode"], r["seed"]) for r in runs] == \
        [(m, 0) for m in fsdp_modes.MODES] + [("fsdp-nccl", 1)]
    check_curves({r["mode"]: r["losses"] for r in runs[:-1]})
    check_calls({r["mode"]: r for r in runs[:-1]})
    meta, first = report["meta"], runs[0]["losses"][0]
    assert meta["world_size"] == 4 and meta["options"]["machines"] == 2
    assert meta["target_loss"] == pytest.approx(meta["floor"] + 0.25 * (first - meta["floor"]))
    assert report["seed_spread"]["seeds"] == [0, 1]


def check_curves(curves: dict[str, list[float]]) -> None:
    ref = curves["fsdp-nccl"]
    for mode, losses in curves.items():
        assert len(losses) == STEPS and all(math.isfinite(x) for x in losses), (mode, losses)
        assert losses[0] == ref[0], f"{mode}: not the same weights on the same batch"
        tol = INT8_TOL if fsdp_modes.MODES[mode].wire else LOSS_TOL
        assert max_diff(losses, ref) <= tol, f"{mode} vs fsdp-nccl: {max_diff(losses, ref)}"
    assert curves["rr-hsdp"] == curves["hsdp-nccl"]
    for exact in ("rr", "rr-hsdp"):
        assert curves[f"{exact}-int8"] != curves[exact], "int8: nothing was rounded"


def check_calls(runs: dict[str, dict[str, Any]]) -> None:
    timed = STEPS - WARMUP
    modules = LAYERS + 1  # the root holds the embeddings and the output layer
    for mode, r in runs.items():
        spec = fsdp_modes.MODES[mode]
        if not spec.ringreduce:
            assert (r["engine_calls"], r["engine"]) == (0, ""), r
            continue
        comms = 2 if spec.hsdp else 1
        assert r["engine_calls"] == comms * modules * STEPS, (mode, r["engine_calls"])
        assert r["timed_engine_calls"] == comms * modules * timed, r
        want = ["1 machines x 2 devices", "2 machines x 1 devices"] if spec.hsdp else \
            ["2 machines x 2 devices"]
        assert [e.split(",")[0] for e in r["engine"].split(" | ")] == want, r["engine"]


def run(mode: str, samples_per_s: float, losses: list[float]) -> dict[str, Any]:
    return {"mode": mode, "losses": losses, "timed_steps": 4, "seconds": 32 / samples_per_s,
            "samples_per_s": samples_per_s, "engine_calls": 0, "timed_engine_calls": 0,
            "engine": "", "hook_us": [], "seed": 0, "floor": 1.0}


def report(algo: str | None, runs: list[dict[str, Any]]) -> dict[str, Any]:
    env = {} if algo is None else {"NCCL_ALGO": algo}
    return {"meta": {"nccl_env": env, "target_loss": 2.0, "options": {"seed": 0}},
            "runs": [*runs, {**runs[0], "seed": 1}]}  # another seed: left out


def test_merge_takes_each_nccl_modes_faster_algorithm(tmp_path: Path) -> None:
    """fsdp-nccl faster under the default, hsdp-nccl under the tree: each row the faster
    run, named; every ratio against those; the target step against the first file's
    target (2.0: step 1 of [3, 1.5])."""
    main = report(None, [run("fsdp-nccl", 100.0, [3, 1.5]), run("hsdp-nccl", 200.0, [3, 2.5]),
                         run("rr-hsdp-int8", 600.0, [3, 1.9])])
    tree = report("allreduce:tree", [run("fsdp-nccl", 90.0, [3, 1.5]),
                                     run("hsdp-nccl", 300.0, [3, 1.9])])
    paths = []
    for name, content in (("main", main), ("tree", tree)):
        paths.append(str(tmp_path / f"{name}.json"))
        Path(paths[-1]).write_text(json.dumps(content))
    text = fsdp_cli.merge(paths, str(tmp_path / "merged.json"))
    # label (may hold one space), then steps, samples/s, step ms, vs fsdp, vs hsdp, final
    # loss, target step, s, calls/step
    rows = {label: rest.split() for label, rest in
            (re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in text.splitlines()
             if not line.startswith("#"))}
    assert set(rows) == {"mode", "fsdp-nccl (default)", "hsdp-nccl (allreduce:tree)",
                         "rr-hsdp-int8"}, text
    assert rows["rr-hsdp-int8"][3:5] == ["6.00", "2.00"], text  # vs fsdp 100/s, hsdp 300/s
    assert rows["hsdp-nccl (allreduce:tree)"][6] == "1", text  # reached 1.9 <= 2.0
    assert rows["fsdp-nccl (default)"][6] == "1" and rows["rr-hsdp-int8"][6] == "1", text
    assert "# hsdp-nccl: default 200.0/s, allreduce:tree 300.0/s; best allreduce:tree" in text
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert [r["label"] for r in merged["rows"]] == \
        ["fsdp-nccl (default)", "hsdp-nccl (allreduce:tree)", "rr-hsdp-int8"]


def _checks_worker(rank: int, world: int) -> None:
    """The checks that end a mode with an error: replicas that differ, a Communicator
    that made no calls, a non-finite loss."""
    spec = TransformerSpec(vocab=64, width=16, layers=1, heads=2, seq=8)
    opts = fsdp_modes.Options(transformer=spec, machines=2, steps=3, warmup=1)
    meshes = fsdp_modes.make_meshes(torch.device("cpu"), 2)
    model = fsdp_modes.sharded(opts.workload().build(0), meshes.hsdp, True)
    fsdp_train.check_replicas("hsdp-nccl", model, meshes)  # equal: passes
    if rank == 3:  # machine 1, device 1: replica 1 of device 1's shard
        with torch.no_grad():
            fsdp_train.local(next(iter(model.parameters())))[0] += 1.0
    # every rank raises, those of device 0's replicate group too
    here = r"here replicas \[1\] differ" if rank in (1, 3) else "this rank's replicas agree"
    with pytest.raises(RuntimeError, match=f"hsdp-nccl: the final parameters differ across "
                       fr"replicas \(rank {rank}: {here}"):
        fsdp_train.check_replicas("hsdp-nccl", model, meshes)
    comm = ringreduce.Communicator(meshes.world.get_group(), machines=2)
    idle = fsdp_train.Steps(torch.tensor([1.0, float("nan"), 1.0]), 1.0, [0], [0])
    with pytest.raises(RuntimeError, match="rr: the Communicator over 4 ranks made 0 calls"):
        fsdp_train.check_routed("rr", [comm], idle, 3)
    comm.close()
    with pytest.raises(RuntimeError, match=r"rr: non-finite loss at steps \[1\]"):
        fsdp_train.summarize("rr", 0, idle, "", opts)


def test_checks_fail_loudly() -> None:
    run_test_ranks(_checks_worker, 4, timeout=120)


def test_options_refuse_what_cannot_run() -> None:
    with pytest.raises(ValueError, match=r"unknown \['rr-int4'\]"):
        fsdp_modes.Options(modes=("rr", "rr-int4"))
    with pytest.raises(ValueError, match="add it to the modes"):
        fsdp_modes.Options(modes=("rr",), seeds=2)
    with pytest.raises(ValueError, match="warmup < steps"):
        fsdp_modes.Options(steps=4, warmup=4)
