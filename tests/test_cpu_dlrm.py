"""The DLRM benchmark (benchmarks/workloads/dlrm.py, run by benchmarks/dlrm.py) on CPU:
a tiny DLRM and a tiny transformer (``--model transformer``) trained on 4 gloo ranks
(2 virtual machines x 2) with plain DDP, with ringreduce's hook and (DLRM) with the
ringreduce backend; the loss curves must agree, and the command line must run end to
end for both models. torch's own hooks (bf16, fp16, PowerSGD; on 2 ranks, which they
need no more than, at half the start-up cost) train from the same start and learn; the
teachers' data can be learnt, towards floors computed right.

Tolerance: the modes differ only in the order the 4 gradients are summed (DDP divides
by 4, a power of two, exactly, before gloo's ring sum and before the backend's engine
sums machine pairs first; the hook sums machine pairs first, then divides by 4), so a
gradient element differs by an ulp or two of float32 per step. Measured with Adam at lr
1e-2, 8 steps, seeds 0-3: at most 6e-8 on the loss (DLRM) and 4.8e-7, one float32 ulp
of a loss near 4 (transformer): inside ``LOSS_TOL``. A rank's gradient left out moves
the loss by 3.2e-3 to 7.9e-3 (DLRM) and 3.5e-3 to 2.8e-2 (transformer). A gradient
summed instead of averaged does not show here (at most 3.6e-7: Adam divides every
element by its own running size); test_cpu_api.py compares the hook with plain DDP under
SGD, which does see it.
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

import pytest
import torch
from torch.nn import functional as F

from benchmarks.workloads import dlrm_cli, dlrm_model
from benchmarks.workloads.dlrm import ModeRun, gloo_refusal, run_modes
from benchmarks.workloads.dlrm_model import Spec
from benchmarks.workloads.dlrm_modes import Options
from benchmarks.workloads.transformer_model import (
    MarkovSource,
    TransformerSpec,
    entropy_floor,
    grad_bytes,
    markov_source,
)

from .multiproc import run_test_ranks

LOSS_TOL = 1e-5
EXACT_MODES = ("nccl", "hook", "backend", "nccl-hook")
"""The modes that reduce in float32: their curves agree with nccl's to LOSS_TOL."""
TINY = Spec(tables=3, rows=50, dim=8, bag=3, bottom=(16,), top=(16,))
TINY_TRANSFORMER = TransformerSpec(vocab=64, width=16, layers=2, heads=2, seq=8)


def check_runs(runs: list[dict[str, Any]], steps: int) -> None:
    """Every mode at the first run's seed: ``steps`` finite losses, a falling curve, the
    float32 modes within LOSS_TOL of nccl; hook and backend: the engine, on 2 x 2, ran
    at least one call a step."""
    runs = [r for r in runs if r["seed"] == runs[0]["seed"]]
    for r in runs:
        if r["mode"] in ("hook", "backend"):
            assert r["engine_calls"] >= steps and "2 machines x 2 devices" in r["engine"], r
    curves = {r["mode"]: r["losses"] for r in runs}
    for mode, losses in curves.items():
        assert len(losses) == steps and all(math.isfinite(x) for x in losses), (mode, losses)
        assert losses[-1] < losses[0], f"{mode}: the loss did not decrease: {losses}"
        if mode in EXACT_MODES:
            worst = max(abs(a - b) for a, b in zip(losses, curves["nccl"], strict=True))
            assert worst <= LOSS_TOL, f"{mode} vs nccl: max |loss diff| {worst:.3g}"


def _dlrm_worker(rank: int, world: int, modes: tuple[str, ...]) -> None:
    opts = Options(modes=modes, spec=TINY, batch=32, steps=8, warmup=2, machines=2, lr=1e-2,
                   min_bytes=0, bucket_mb=0.002)  # ~7 KB of gradients: several buckets
    runs = run_modes(opts, torch.device("cpu"))
    assert [r.mode for r in runs] == list(modes)
    check_runs([dataclasses.asdict(r) for r in runs], opts.steps)


def test_dlrm_hook_matches_plain_gloo() -> None:
    run_test_ranks(_dlrm_worker, 4, ("nccl", "hook"))


def _transformer_worker(rank: int, world: int, modes: tuple[str, ...]) -> None:
    opts = Options(modes=modes, model="transformer", transformer=TINY_TRANSFORMER, batch=4,
                   steps=8, warmup=2, machines=2, min_bytes=0, lr=1e-2,
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
                   min_bytes=0, bucket_mb=0.002, lr=1e-2)
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
    """`python benchmarks/dlrm.py --device cpu ...`: spawns 4 ranks, runs the three
    modes (the default group on the ringreduce backend), torch's bf16 hook and the hook
    with its own wire (hook-int8), nccl at a second seed, the host reading each step's
    loss (--read-loss), prints the table with the floor, the target and nccl's spread
    over the seeds, writes them to the JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dlrm.json"
        cmd = [sys.executable, "benchmarks/dlrm.py", "--device", "cpu",
               "--modes", "nccl,hook,backend,bf16-hook,hook-int8", "--tables", "3", "--rows", "50",
               "--dim", "8", "--batch", "32", "--steps", "8", "--warmup", "1", "--lr", "0.01",
               "--min-bytes", "0", "--seeds", "2", "--read-loss", "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parent.parent)
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(out.read_text())
    assert "max|dloss| vs nccl" in done.stdout and "# loss floor " in done.stdout, done.stdout
    assert "# nccl over seeds [0, 1]: final loss " in done.stdout, done.stdout
    assert report["meta"]["world_size"] == 4
    assert report["meta"]["options"]["read_loss"] is True  # the host read each step's loss
    runs = report["runs"]
    assert [(r["mode"], r["seed"]) for r in runs] == [
        ("nccl", 0), ("hook", 0), ("backend", 0), ("bf16-hook", 0), ("hook-int8", 0),
        ("nccl", 1)]
    assert "wire=int8" in runs[4]["engine"] and "wire=int8" not in runs[1]["engine"]
    check_runs(runs, 8)
    spread = report["seed_spread"]
    finals = [runs[0]["final_loss"], runs[5]["final_loss"]]
    assert spread["seeds"] == [0, 1] and spread["final_loss"] == finals, spread
    assert spread["final_loss_spread"] == pytest.approx(abs(finals[0] - finals[1])), spread
    # last_loss: the mean of the last (here all 8) steps; validation: held-out batches,
    # the same for every run, so two runs from one start but other all-reduces differ
    for r in runs:
        assert r["last_loss"] == pytest.approx(sum(r["losses"]) / len(r["losses"])), r
        assert 0 < r["validation"] < r["losses"][0], r
    assert spread["validation"] == [runs[0]["validation"], runs[5]["validation"]], spread
    assert "# hook-int8: last 100 " in done.stdout and "; validation " in done.stdout, done.stdout
    assert 0 < report["meta"]["floor"] < report["meta"]["target_loss"] < runs[0]["losses"][0]


@pytest.mark.slow  # the DLRM command line above takes the same path through the script
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
               str(t.seq), "--batch", "4", "--steps", "8", "--warmup", "1", "--lr", "0.01",
               "--min-bytes", "0",
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
    assert header[-7:] == ["calls/step", "hook", "us", "med/mean", "last", "100", "valid"], \
        done.stdout
    hook = report["runs"][1]
    per_step = hook["timed_engine_calls"] / hook["timed_steps"]
    assert [row[-4] for row in rows] == ["-", f"{per_step:.4g}"], done.stdout
    assert rows[0][-3] == "-" and len(hook["hook_us"]) == hook["timed_engine_calls"], done.stdout
    assert [float(row[-1]) for row in rows] == [
        pytest.approx(r["validation"], abs=6e-6) for r in report["runs"][:2]], done.stdout


POWERSGD_START = 4


def _torch_hooks_worker(rank: int, world: int) -> None:
    # One bucket a step (the model's ~7 KB under a 25 MiB cap): powersgd hangs gloo with
    # two (dlrm.gloo_refusal). Rank 1: TINY's 50 x 8 tables are compressed only when
    # (50 + 8) * rank * 2 < 50 * 8 (torch's min_compression_rate, 2).
    opts = Options(modes=("nccl", "bf16-hook", "fp16-hook", "powersgd"), spec=TINY, batch=64,
                   steps=30, warmup=4, lr=3e-2, powersgd_rank=1,
                   powersgd_start=POWERSGD_START, bucket_mb=25.0)
    runs = {r.mode: r for r in run_modes(opts, torch.device("cpu"))}
    check_runs([dataclasses.asdict(r) for r in runs.values()], opts.steps)
    nccl = runs["nccl"].losses
    for mode, run in runs.items():
        check_learnt(run, drop=0.15)
        assert run.losses[0] == nccl[0], f"{mode}: not the same weights on the same batch"
        if mode != "nccl":
            assert len(run.hook_us) == run.timed_steps, (mode, run.hook_us)
    # Measured on seeds 0-3: over 30 steps bf16 differs from nccl by 4.9e-3 to 2.2e-2,
    # fp16 by 3.2e-4 to 1.4e-2; both stay on nccl's curve as their rounding allows. The
    # losses fall from 0.70-0.93 to 0.48-0.53 (floor 0.38-0.39) in every mode.
    for mode in ("bf16-hook", "fp16-hook"):
        worst = max_diff(runs[mode].losses, nccl)
        assert 1e-4 < worst < 5e-2, f"{mode}: max |loss diff| vs nccl {worst:.3g}"
    # powersgd all-reduces uncompressed for its first POWERSGD_START steps (measured: the
    # same losses to the bit), then compresses (measured: 2.6e-2 to 5.4e-2 apart).
    powersgd = runs["powersgd"].losses
    assert max_diff(powersgd[:POWERSGD_START + 1], nccl[:POWERSGD_START + 1]) <= LOSS_TOL
    assert max_diff(powersgd, nccl) > 1e-2, "powersgd never compressed"


def test_torch_hooks_train_from_the_same_start_and_learn() -> None:
    """bf16-hook, fp16-hook and powersgd (torch's hooks): the first loss is nccl's, each
    hook call of the timed steps is timed, bf16 and fp16 stay near nccl's curve, powersgd
    follows it exactly until it starts compressing, and every mode learns."""
    run_test_ranks(_torch_hooks_worker, 2)


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def check_learnt(run: ModeRun, drop: float) -> None:
    """The final loss is ``drop`` below the first, and above the floor; the target was
    reached (its step timed)."""
    assert run.final_loss < run.losses[0] - drop, (run.mode, run.losses)
    assert run.final_loss > run.floor, f"{run.mode} beat the floor {run.floor}: {run.losses}"
    assert run.steps_to_target is not None and run.seconds_to_target is not None, run
    assert run.floor < run.target_loss < run.losses[0] and run.seconds_to_target >= 0, run


def _transformer_learns_worker(rank: int, world: int) -> None:
    opts = Options(modes=("nccl",), model="transformer", transformer=TINY_TRANSFORMER,
                   batch=8, steps=30, warmup=4, lr=3e-2, seeds=2, target_loss=2.5)
    first, second = run_modes(opts, torch.device("cpu"))
    assert (first.seed, second.seed) == (0, 1)
    assert first.losses[0] != second.losses[0], "seed 1 trained seed 0's weights or batches"
    assert first.target_loss == second.target_loss == 2.5, "one target for every seed"
    assert first.floor == pytest.approx(entropy_floor(markov_source(64), 8), abs=1e-12)
    # Measured on seeds 0-4: from 4.16-4.18 to 1.68-1.95 (floor 1.21) in 30 steps, the
    # target reached at steps 13-15.
    for run in (first, second):
        check_learnt(run, drop=1.5)


def test_transformer_learns_the_markov_source() -> None:
    """The tiny transformer on the Markov source, at two seeds: its loss falls most of
    the way to the source's entropy, and each seed trains its own weights."""
    run_test_ranks(_transformer_learns_worker, 2)


def test_markov_floor_of_a_tiny_source() -> None:
    """Token 0 goes to 0 or 1 evenly (ln 2 nats); token 1 names token 0 twice (0.3 and
    0.7), so it always goes to 0 (0 nats, not the 0.61 of two distinct successors).
    From uniform first tokens the walk is at token 0 with probability 1/2, 3/4, 5/8:
    floors (1/2) ln 2, (5/8) ln 2, (5/8) ln 2 over 1, 2 and 3 positions."""
    source = MarkovSource(torch.tensor([[0, 1], [0, 0]]),
                          torch.tensor([[0.5, 0.5], [0.3, 0.7]], dtype=torch.float64))
    assert source.row_entropy().tolist() == pytest.approx([math.log(2), 0.0], abs=1e-15)
    for seq, share in ((1, 1 / 2), (2, 5 / 8), (3, 5 / 8)):
        assert entropy_floor(source, seq) == pytest.approx(share * math.log(2), rel=1e-12)


def test_markov_floor_is_the_best_models_loss() -> None:
    """On the benchmark's own source, the true next-token probabilities (a dense table
    built here, independently of row_entropy) score the floor on sampled walks: over
    2,000 walks x 8 targets the score's standard deviation is 0.0035 (measured over 200
    seeds), so 0.03 is over 8 sigma; a floor off by one successor's share is not."""
    source = markov_source(64)
    tokens = source.successors.shape[0]
    table = torch.zeros(tokens, tokens, dtype=torch.float64)
    table.index_put_((torch.arange(tokens)[:, None].expand_as(source.successors),
                      source.successors), source.probs, accumulate=True)
    walks = source.sample(2000, 9, torch.Generator().manual_seed(0))
    scored = -table[walks[:, :-1], walks[:, 1:]].log().mean().item()
    assert scored == pytest.approx(entropy_floor(source, 8), abs=0.03)


def test_dlrm_clicks_come_from_the_teacher() -> None:
    """The floor is the teacher's expected loss: scored against the clicks drawn, the
    teacher's own logits give it back (8,000 samples: the score's standard deviation is
    0.006, measured over 100 seeds, so 0.03 is 5 sigma; clicks thresholded rather than
    drawn would score about half the floor), where always guessing 1/2 scores ln 2."""
    spec = dataclasses.replace(TINY, rows=500)
    batches = dlrm_model.make_batches(spec, 25, 320, 0, 0, torch.device("cpu"))
    teacher = dlrm_model.teacher(spec)
    scored = sum(F.binary_cross_entropy_with_logits(teacher.logits(dense, ids), clicks).item()
                 for dense, ids, clicks in batches) / len(batches)
    floor = dlrm_model.floor(spec, batches)
    assert scored == pytest.approx(floor, abs=0.03)
    assert floor < math.log(2) - 0.2, "the clicks should be far from coin flips"


def test_options_refuse_what_cannot_run() -> None:
    """Mistakes are refused before training, each naming its fix."""
    with pytest.raises(ValueError, match="add nccl to the modes"):
        Options(modes=("hook",), seeds=3)
    with pytest.raises(ValueError, match="start >= 2"):
        Options(powersgd_start=1)
    with pytest.raises(ValueError, match="must be positive"):
        Options(target_loss=0.0)
    big = Options(modes=("nccl", "powersgd"), spec=dataclasses.replace(TINY, rows=50_000),
                  bucket_mb=1.0)  # 4.6 MiB of gradients
    refusal = gloo_refusal(big, big.workload())
    assert refusal is not None and "--bucket-mb 5 or more" in refusal, refusal
    assert gloo_refusal(dataclasses.replace(big, bucket_mb=5.0), big.workload()) is None
    args = dlrm_cli.build_parser().parse_args(["--device", "cpu", "--modes", "powersgd"])
    with pytest.raises(SystemExit, match="mode powersgd on gloo needs one DDP bucket"):
        dlrm_cli.options(args, cuda=False)
