"""benchmarks/workloads/text.py: the natural-text corpus every CPython ships, split by
document, its batches and its validation loss (CPU, no processes); the language-model
benchmark's modes and table (workloads/text_report.py), and benchmarks/text_lm.py end to
end in every kind of mode on 4 gloo ranks."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.workloads import text, text_report
from benchmarks.workloads.fsdp_modes import Mode
from benchmarks.workloads.text_report import LmMode

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parent.parent
LOSS_TOL = 1e-5


def test_held_out_documents_are_whole_and_never_trained_on() -> None:
    from pydoc_data.topics import topics

    corpus = text.corpus()
    names = sorted(topics)
    held = [topics[n].encode() for i, n in enumerate(names) if i % text.HELD_OUT == 0]
    train = bytes(corpus.train.numpy())
    assert bytes(corpus.valid.numpy()) == text.SEPARATOR.join(held)
    for doc in held:
        assert doc not in train
    total = sum(len(d.encode()) for d in topics.values())
    sep = len(text.SEPARATOR) * (len(names) - 2)
    assert corpus.train.numel() + corpus.valid.numel() == total + sep
    assert 0.05 < corpus.valid.numel() / total < 0.2


def test_batches_are_windows_of_the_text_per_seed_and_rank() -> None:
    data = text.corpus().train
    a, b, c = (text.batches(data, 16, 3, 4, seed, rank, CPU)
               for seed, rank in ((0, 1), (0, 1), (0, 2)))
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0][0], c[0][0])
    tokens, targets = a[0]
    assert tokens.shape == targets.shape == (4, 16)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    raw = bytes(data.numpy())
    assert bytes(tokens[0].tolist()) + bytes([int(targets[0, -1])]) in raw


def test_an_untrained_model_predicts_bytes_uniformly() -> None:
    spec = text.spec(width=32, layers=1, heads=2, seq=32)
    model = text.build(spec, 0)
    loss = text.validation_loss(model, text.corpus().valid[:2000], spec.seq, CPU)
    assert abs(loss - math.log(256)) < 0.05, loss


def test_modes_parse_to_ddp_hooks_and_fsdp_routes() -> None:
    """text_lm.py's mode names: DDP's fp32 and bf16 hook, a ringreduce wire, and FSDP2 /
    HSDP on torch's collectives or through ringreduce.fsdp.apply; anything else refused
    with the names that work."""
    assert text_report.parse_mode("fp32") == LmMode("fp32")
    assert text_report.parse_mode("bf16-hook") == LmMode("bf16-hook")
    assert text_report.parse_mode("int4") == LmMode("int4", wire="int4")
    assert text_report.parse_mode("fsdp-nccl").fsdp == Mode(hsdp=False, ringreduce=False)
    assert text_report.parse_mode("hsdp-exact").fsdp == Mode(hsdp=True, ringreduce=True)
    hsdp4 = text_report.parse_mode("hsdp-int4")
    assert hsdp4.fsdp == Mode(hsdp=True, ringreduce=True, wire="int4")
    assert hsdp4.baseline == "hsdp-nccl"
    assert text_report.parse_mode("fsdp-int8").baseline == "fsdp-nccl"
    assert text_report.parse_mode("int8").baseline == "fp32"
    for bad in ("int3", "fsdp", "fsdp-int3", "ddp-int8", "bf16hook", "int4-plain", "int8-rot",
                "hsdp-int8-rot"):
        with pytest.raises(ValueError, match="fsdp-/hsdp-"):
            text_report.parse_mode(bad)


def run(mode: str, seed: int, train: float, valid: float, speed: float,
        identical: bool | None = True) -> dict[str, Any]:
    return {"mode": mode, "seed": seed, "train_last": train, "valid": valid,
            "samples_per_s": speed, "identical": identical}


def test_table_places_each_run_against_fp32s_seed_spread() -> None:
    """The final table: fp32's [min, max] over its seeds per loss, each run inside it or
    its distance outside; samples/s over fp32's and bf16-hook's means and, for sharded
    modes, over the same parallelism on torch's collectives."""
    runs = [run("fp32", 0, 1.00, 1.30, 100), run("fp32", 1, 1.02, 1.28, 120),
            run("fp32", 2, 1.01, 1.29, 110), run("bf16-hook", 0, 1.005, 1.31, 165),
            run("int4", 0, 1.03, 1.27, 330), run("hsdp-nccl", 0, 1.01, 1.29, 90),
            run("hsdp-int4", 0, 0.99, 1.30, 270), run("fsdp-nccl", 0, 1.0, 1.3, 50, None)]
    lines = text_report.table(runs)
    assert "[1.0000, 1.0200] (width 0.0200)" in lines[0]
    assert "[1.2800, 1.3000] (width 0.0200)" in lines[0]
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in lines[3:]}
    assert len(rows) == len(runs)
    # columns: train, placed (1 or 3 words), valid, placed, samples/s, x fp32, x bf16h,
    # x own, identical
    assert rows["fp32", "1"] == ["1.0200", "inside", "1.2800", "inside", "120", "1.09x",
                                 "0.73x", "-", "True"]
    assert rows["bf16-hook", "0"][:6] == ["1.0050", "inside", "1.3100", "+0.01000", "above",
                                          "165"]
    assert rows["int4", "0"] == ["1.0300", "+0.01000", "above", "1.2700", "-0.01000", "below",
                                 "330", "3.00x", "2.00x", "-", "True"]
    assert rows["hsdp-int4", "0"] == ["0.9900", "-0.01000", "below", "1.3000", "inside",
                                      "270", "2.45x", "1.64x", "3.00x", "True"]
    assert rows["fsdp-nccl", "0"][-2:] == ["1.00x", "n/a"]
    barely = text_report.table([*runs[:3], run("int8", 0, 1.02 + 3e-7, 1.28 - 2e-6, 1)])
    assert barely[-1].split()[2:8] == ["1.0200", "+3.0e-07", "above", "1.2800", "-2.0e-06",
                                       "below"]
    assert text_report.table(runs[3:])[0].endswith("train-last-100 -, valid -")
    # an older run's mode that is no mode any more (a deleted wire) still gets its row
    merged = text_report.table([*runs[:3], run("int4-plain", 0, 1.0, 1.3, 330)])
    assert merged[-1].split()[:3] == ["int4-plain", "0", "1.0000"], merged


@pytest.mark.slow  # seven trainings in 4 spawned gloo ranks: ~20 s on 2 busy cores
def test_command_line_trains_every_kind_of_mode(tmp_path: Path) -> None:
    """`python benchmarks/text_lm.py --nprocs 4 --machines 2` on CPU: DDP fp32 at two
    seeds, then the bf16 hook, a ringreduce wire, FSDP2 and HSDP on gloo and through
    ringreduce, each at the first seed; the JSON holds every run and the table is last.
    fp32, fsdp-nccl and hsdp-nccl train the same weights on the same batches and differ
    only in the order gloo sums the 4 gradients (tests/test_cpu_fsdp_bench.py: ulps),
    so their train losses agree to LOSS_TOL; the compressed modes do not match fp32 to
    the bit (int8, int4 round), but stay near it. DDP and HSDP replicas end bit-identical."""
    out = tmp_path / "lm.json"
    modes = "fp32,bf16-hook,int8,fsdp-nccl,fsdp-int4,hsdp-nccl,hsdp-int8"
    cmd = [sys.executable, "benchmarks/text_lm.py", "--nprocs", "4", "--machines", "2",
           "--device", "cpu", "--steps", "12", "--warmup", "2", "--width", "16", "--layers",
           "1", "--heads", "2", "--seq", "16", "--batch", "2", "--wire", modes, "--seed", "0,1",
           "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {(r["mode"], r["seed"]): r for r in json.loads(out.read_text())}
    assert list(runs) == [("fp32", 0), ("fp32", 1)] + [(m, 0) for m in modes.split(",")[1:]]
    fp32 = runs["fp32", 0]
    for mode in ("fsdp-nccl", "hsdp-nccl"):
        assert abs(runs[mode, 0]["train_last"] - fp32["train_last"]) < LOSS_TOL
        assert abs(runs[mode, 0]["valid"] - fp32["valid"]) < LOSS_TOL
    # Adam's first steps move each weight by about lr x sign(gradient), which bf16's
    # rounding rarely flips: the bf16 hook may match fp32 to the bit over 12 steps.
    for mode in ("bf16-hook", "int8", "fsdp-int4", "hsdp-int8"):
        r = runs[mode, 0]
        assert mode == "bf16-hook" or r["train_last"] != fp32["train_last"], mode
        assert abs(r["train_last"] - fp32["train_last"]) < 0.05, (mode, r, fp32)
    assert [runs[m, 0]["identical"] for m in modes.split(",")] == \
        [True, True, True, None, None, True, True]
    assert all(math.isfinite(r["samples_per_s"]) and r["samples_per_s"] > 0
               for r in runs.values())
    last = done.stdout.strip().splitlines()
    assert last[-1].split()[:2] == ["hsdp-int8", "0"]
    assert last[-len(runs) - 1].split()[:2] == ["mode", "seed"]
