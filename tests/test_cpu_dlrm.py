"""The DLRM benchmark (ringreduce/benchmark/dlrm.py, run by benchmarks/dlrm.py) on CPU:
a tiny DLRM and a tiny transformer (``--model transformer``) trained on 4 gloo ranks
(2 virtual machines x 2) with plain DDP, with ringreduce's hook and (DLRM) with the
ringreduce backend; the loss curves must agree, and the command line must run end to
end for both models.

Tolerance: the modes differ only in the order the 4 gradients are summed. DDP divides
by 4 (a power of two: exact) before gloo's ring sum, and before the backend's engine
sums machine pairs first; the hook sums machine pairs first, then divides by 4. So a
gradient element differs by at most an ulp or two of float32 per step; training carries
that into the loss, measured at 6e-8 here (8 steps, seeds 0-3) and 4e-6 on a larger
model (4 x 500 x 8, 8 steps): inside ``LOSS_TOL``.
Real mistakes, measured on this model in 8 steps: a rank's gradient left out moves the
loss by up to 3e-3, a summed instead of averaged gradient by up to 1e-1.
The transformer's modes differ the same way (its attention is written out, so nothing
else varies): measured at most 4.8e-7, one float32 ulp of a loss near 4 (tiny
transformer, batch 4, 8 steps, seeds 0-3; the same on 4 x 64, vocab 256, seeds 0-1),
inside ``LOSS_TOL``; there a rank's gradient left out moves the loss by 3e-2 to 5e-2, a
summed gradient by 1e-1.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ringreduce.benchmark.dlrm import Options, Spec, run_modes
from ringreduce.benchmark.transformer_model import TransformerSpec, grad_bytes

from .multiproc import run_test_ranks

LOSS_TOL = 1e-5
TINY = Spec(tables=3, rows=50, dim=8, bag=3, bottom=(16,), top=(16,))
TINY_TRANSFORMER = TransformerSpec(vocab=64, width=16, layers=2, heads=2, seq=8)


def check_runs(runs: list[dict[str, Any]], steps: int) -> None:
    """Every mode: ``steps`` finite losses, a falling curve, within LOSS_TOL of nccl;
    hook and backend: the engine, on 2 x 2, ran at least one call a step."""
    for r in runs:
        if not r["mode"].startswith("nccl"):
            assert r["engine_calls"] >= steps and "2 machines x 2 devices" in r["engine"], r
    curves = {r["mode"]: r["losses"] for r in runs}
    for mode, losses in curves.items():
        assert len(losses) == steps and all(math.isfinite(x) for x in losses), (mode, losses)
        assert losses[-1] < losses[0], f"{mode}: the loss did not decrease: {losses}"
        worst = max(abs(a - b) for a, b in zip(losses, curves["nccl"], strict=True))
        assert worst <= LOSS_TOL, f"{mode} vs nccl: max |loss diff| {worst:.3g}"


def _dlrm_worker(rank: int, world: int, modes: tuple[str, ...]) -> None:
    opts = Options(modes=modes, spec=TINY, batch=32, steps=8, warmup=2, machines=2,
                   min_bytes=0, bucket_mb=0.002)  # ~7 KB of gradients: several buckets
    runs = run_modes(opts, torch.device("cpu"))
    assert [r.mode for r in runs] == list(modes)
    check_runs([dataclasses.asdict(r) for r in runs], opts.steps)


def test_dlrm_hook_matches_plain_gloo() -> None:
    run_test_ranks(_dlrm_worker, 4, ("nccl", "hook"))


def _transformer_worker(rank: int, world: int, modes: tuple[str, ...]) -> None:
    opts = Options(modes=modes, model="transformer", transformer=TINY_TRANSFORMER, batch=4,
                   steps=8, warmup=2, machines=2, min_bytes=0,
                   bucket_mb=0.002)  # ~35 KB of gradients in 1-4 KB tensors: many buckets
    runs = run_modes(opts, torch.device("cpu"))
    assert [r.mode for r in runs] == list(modes)
    check_runs([dataclasses.asdict(r) for r in runs], opts.steps)
    hook = runs[modes.index("hook")]
    # Measured: 10 buckets a step (torch 2.13); "at least 8" leaves DDP's bucketing room.
    assert hook.timed_engine_calls >= 8 * hook.timed_steps, hook


def test_transformer_hook_matches_plain_gloo() -> None:
    """The transformer workload: the hook, called many times a step, trains as DDP."""
    run_test_ranks(_transformer_worker, 4, ("nccl", "hook"))


def _hook_clock_worker(rank: int, world: int) -> None:
    opts = Options(modes=("nccl", "nccl-hook", "hook"), model="transformer",
                   transformer=TINY_TRANSFORMER, batch=4, steps=6, warmup=2, machines=2,
                   min_bytes=0, bucket_mb=0.002)
    runs = {r.mode: r for r in run_modes(opts, torch.device("cpu"))}
    check_runs([dataclasses.asdict(r) for r in runs.values()], opts.steps)
    assert runs["nccl"].hook_us == (), "plain DDP has no Python hook to time"
    hook, plain_hook = runs["hook"], runs["nccl-hook"]
    # Every hook call of the timed steps, and only those: the engine's count of them
    # (DDP buckets the same gradients the same way under either hook).
    assert len(hook.hook_us) == hook.timed_engine_calls, (len(hook.hook_us), hook)
    assert len(plain_hook.hook_us) == len(hook.hook_us), (plain_hook.hook_us, hook.hook_us)
    assert all(0 < t < 10e6 for t in hook.hook_us + plain_hook.hook_us)


def test_hook_modes_time_every_hook_call_of_the_timed_steps() -> None:
    """``nccl-hook`` (torch's allreduce_hook) trains as plain DDP does, and both hook
    modes time exactly the hook calls of the timed steps."""
    run_test_ranks(_hook_clock_worker, 4)


def test_dlrm_command_line_runs() -> None:
    """`python benchmarks/dlrm.py --device cpu ...`: spawns 4 ranks, runs all three
    modes (the default group on the ringreduce backend), prints the table, writes JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dlrm.json"
        cmd = [sys.executable, "benchmarks/dlrm.py", "--device", "cpu",
               "--modes", "nccl,hook,backend", "--tables", "3", "--rows", "50", "--dim", "8",
               "--batch", "32", "--steps", "8", "--warmup", "1", "--min-bytes", "0",
               "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parent.parent)
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(out.read_text())
    assert "max|dloss| vs nccl" in done.stdout
    assert report["meta"]["world_size"] == 4
    check_runs(report["runs"], 8)


def test_transformer_command_line_runs() -> None:
    """`python benchmarks/dlrm.py --device cpu --model transformer ...`: the tiny
    transformer with nccl and hook; the JSON says which model ran, and the table's
    calls/step column gives the hook's calls per timed step ("-" for nccl)."""
    t = TINY_TRANSFORMER
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "transformer.json"
        cmd = [sys.executable, "benchmarks/dlrm.py", "--device", "cpu", "--model",
               "transformer", "--modes", "nccl,hook", "--vocab", str(t.vocab), "--width",
               str(t.width), "--layers", str(t.layers), "--heads", str(t.heads), "--seq",
               str(t.seq), "--batch", "4", "--steps", "8", "--warmup", "1", "--min-bytes", "0",
               "--bucket-mb", "0.002", "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parent.parent)
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(out.read_text())
    options = report["meta"]["options"]
    assert options["model"] == "transformer" and options["transformer"]["layers"] == t.layers
    assert report["meta"]["grad_bytes"] == grad_bytes(t)
    check_runs(report["runs"], 8)
    header, *rows = (line.split() for line in done.stdout.splitlines()
                     if line.startswith(("mode ", "nccl ", "hook ")))
    assert header[-4:] == ["calls/step", "hook", "us", "med/mean"], done.stdout
    hook = report["runs"][1]
    per_step = hook["timed_engine_calls"] / hook["timed_steps"]
    assert [row[-2] for row in rows] == ["-", f"{per_step:.4g}"], done.stdout
    assert rows[0][-1] == "-" and len(hook["hook_us"]) == hook["timed_engine_calls"], done.stdout
