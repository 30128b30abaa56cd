"""benchmarks/workloads/text.py: the natural-text corpora every CPython ships (its
standard library's docstrings and comments, its documentation topics), split by document,
their batches and the validation loss (CPU, no processes); the language-model benchmark's
modes and table (workloads/text_report.py), and benchmarks/text_lm.py end to end in every
kind of mode on 4 gloo ranks."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import math
import subprocess
import sys
import tokenize
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


STEPS_BYTES = 1000 * 4 * 8 * 129
"""What text_lm.py's default run reads: 1000 steps, 4 ranks, 8 windows of 129 bytes."""


@pytest.fixture(scope="module")
def stdlib() -> text.Corpus:
    return text.corpus("stdlib")


@pytest.fixture(scope="module")
def stdlib_docs() -> list[bytes]:
    """A second build of the stdlib corpus' documents, from the files again."""
    return text.stdlib_documents() + text.topic_documents()


def _split(docs: list[bytes]) -> tuple[bytes, bytes]:
    held = [d for i, d in enumerate(docs) if i % text.HELD_OUT == 0]
    kept = [d for i, d in enumerate(docs) if i % text.HELD_OUT]
    return text.SEPARATOR.join(kept), text.SEPARATOR.join(held)


def test_topics_corpus_is_the_pydoc_topics_as_before() -> None:
    """The corpus of earlier results: the topics sorted by name, every 8th held out, the
    checksum over training, NUL, held-out bytes, as when those results were made."""
    from pydoc_data.topics import topics

    corpus = text.corpus("topics")
    names = sorted(topics)
    docs = [topics[n].encode() for n in names]
    train, valid = _split(docs)
    assert bytes(corpus.train.numpy()) == train and bytes(corpus.valid.numpy()) == valid
    assert corpus.checksum == hashlib.sha256(train + b"\0" + valid).hexdigest()
    assert corpus.documents == len(names)
    for doc in docs[::text.HELD_OUT]:
        assert doc not in train


def test_stdlib_held_out_documents_are_whole_and_never_trained_on(
        stdlib: text.Corpus, stdlib_docs: list[bytes]) -> None:
    """Modules (sorted by path) then topics, every 8th held out whole; a held-out
    document is in the training text only where another module has the same text (one
    line such as 'This directory is a Python package.'), never a long one."""
    docs = stdlib_docs
    train, valid = _split(docs)
    assert bytes(stdlib.train.numpy()) == train and bytes(stdlib.valid.numpy()) == valid
    assert stdlib.documents == len(docs) > 500
    for doc in docs[::text.HELD_OUT]:
        assert len(doc) < 100 or doc not in train, doc[:200]
    assert 0.05 < len(valid) / (len(train) + len(valid)) < 0.2
    assert text.topic_documents()[0] in docs


def test_stdlib_corpus_is_big_enough_and_mostly_prose(stdlib: text.Corpus) -> None:
    """The floor: text_lm.py's default 1000 steps read the training text less than twice
    (9.6 times for the topics alone), and most of it is letters and spaces."""
    assert STEPS_BYTES / stdlib.train.numel() < 2.0, stdlib.describe()
    assert STEPS_BYTES / text.corpus("topics").train.numel() > 5
    raw = bytes(stdlib.train.numpy())
    prose = sum(c.isalpha() or c == " " for c in raw.decode("utf-8", "replace"))
    assert prose / len(raw) > 0.75


def test_stdlib_corpus_is_the_same_on_a_second_build(stdlib: text.Corpus,
                                                     stdlib_docs: list[bytes]) -> None:
    train, valid = _split(stdlib_docs)
    assert stdlib.checksum == hashlib.sha256(train + b"\0" + valid).hexdigest()
    assert torch.equal(stdlib.train, torch.tensor(list(train), dtype=torch.uint8))
    assert stdlib.checksum != text.corpus("topics").checksum
    with pytest.raises(ValueError, match="stdlib, topics"):
        text.corpus("wikipedia")


def test_module_text_has_every_docstring_and_comment_in_source_order() -> None:
    """Against references that walk everything: ast.walk's docstrings (every node, not
    only statement bodies) and tokenize's full-line comments, on every 25th module."""
    for path in text.stdlib_sources()[::25]:
        source = path.read_bytes()
        got = text.module_text(source).decode()
        tree = ast.parse(source)
        docs = [(n.body[0].lineno, ast.get_docstring(n)) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                  ast.AsyncFunctionDef)) and ast.get_docstring(n)]
        lines = source.decode("utf-8").splitlines()
        comments = [(t.start[0], t.string.lstrip("#").strip())
                    for t in tokenize.tokenize(io.BytesIO(source).readline)
                    if t.type == tokenize.COMMENT and lines[t.start[0] - 1].strip() == t.string
                    and t.start[0] > 2 and any(c.isalpha() for c in t.string)]
        at = -1
        for _, piece in sorted(docs + comments):
            found = got.find(piece, at + 1 if piece else 0)
            assert found > at, (path, piece)
            at = found


def test_batches_are_windows_of_the_text_per_seed_and_rank(stdlib: text.Corpus) -> None:
    data = stdlib.train
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
    loss = text.validation_loss(model, text.corpus("topics").valid[:2000], spec.seq, CPU)
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
           "1", "--heads", "2", "--seq", "16", "--batch", "2", "--corpus", "topics", "--wire",
           modes, "--seed", "0,1", "--json", str(out)]
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
    # every step's loss (mean over ranks) is kept: train_last is their mean here (12 steps)
    for r in runs.values():
        assert len(r["losses"]) == 12 and all(map(math.isfinite, r["losses"]))
        assert abs(sum(r["losses"]) / 12 - r["train_last"]) < 1e-5, r
    last = done.stdout.strip().splitlines()
    assert last[-1].split()[:2] == ["hsdp-int8", "0"]
    assert last[-len(runs) - 1].split()[:2] == ["mode", "seed"]


def test_wire_options_are_checked_before_any_process_starts() -> None:
    """--wire-block and --hook-feedback: a block the wire refuses, or --wire-block beside
    a sharded mode (whose Communicators take the library's block), is refused by plan(),
    which main() calls before spawning; --hook-feedback reaches the sharded modes too."""
    from benchmarks import text_lm
    parse = text_lm.build_parser().parse_args
    assert len(text_lm.plan(parse(["--wire", "fp32,int4", "--wire-block", "64"]))) == 2
    with pytest.raises(ValueError, match="power of two"):
        text_lm.plan(parse(["--wire", "int4", "--wire-block", "96"]))
    with pytest.raises(ValueError, match="multiple of 8"):
        text_lm.plan(parse(["--wire", "int8", "--wire-block", "100"]))
    with pytest.raises(ValueError, match="DDP's wire modes only"):
        text_lm.plan(parse(["--wire", "int4,hsdp-int4", "--wire-block", "64"]))
    for flag in ("on", "off"):
        assert len(text_lm.plan(parse(["--wire", "int4,hsdp-int4,fsdp-int8",
                                       "--hook-feedback", flag]))) == 3


def test_spread_modes_run_seed_by_seed() -> None:
    """The --spread modes alternate at each seed before the next seed starts, so a process
    set cut short by its limit keeps whole pairs (fp32 and the wire at the same seed)."""
    from benchmarks import text_lm
    args = text_lm.build_parser().parse_args(
        ["--wire", "fp32,int4,int8", "--spread", "fp32,int4", "--seed", "5,6"])
    assert [(m.name, s) for m, s in text_lm.plan(args)] == \
        [("fp32", 5), ("int4", 5), ("fp32", 6), ("int4", 6), ("int8", 5)]


@pytest.mark.slow  # six short trainings in 4 spawned gloo ranks: ~1 min on 2 busy cores
def test_wire_options_reach_the_ddp_hooks_communicator(tmp_path: Path) -> None:
    """`--wire-block 64` and `--hook-feedback on` change what int4 trains (its blocks'
    rounding, the error carried to the next step): losses other than the default's, each
    JSON naming its options, replicas still bit-identical; fp32 takes no options.
    `--hook-feedback on` reaches HSDP's replicate Communicator too (ringreduce.fsdp's
    hooks follow the same knob): hsdp-int4 trains otherwise than without."""
    runs = {}
    wires = {"default": "fp32,int4,hsdp-int4", "block64": "int4",
             "feedback": "int4,hsdp-int4"}
    for name, extra in (("default", []), ("block64", ["--wire-block", "64"]),
                        ("feedback", ["--hook-feedback", "on"])):
        out = tmp_path / f"{name}.json"
        cmd = [sys.executable, "benchmarks/text_lm.py", "--nprocs", "4", "--machines", "2",
               "--device", "cpu", "--steps", "8", "--warmup", "2", "--width", "16",
               "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "2", "--corpus",
               "topics", "--wire", wires[name],
               "--plan", "pipelined", "--json", str(out), *extra]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.update({(name, r["mode"]): r for r in json.loads(out.read_text())})
    assert "wire_options" not in runs["default", "fp32"]
    assert runs["default", "int4"]["wire_options"] == {}
    assert runs["block64", "int4"]["wire_options"] == {"wire_block": 64}
    assert runs["feedback", "int4"]["wire_options"] == {"hook_feedback": True}
    losses = {name: runs[name, "int4"]["train_last"] for name in ("default", "block64",
                                                                    "feedback")}
    assert len(set(losses.values())) == 3, losses
    assert all(runs[key]["identical"] for key in runs)
    assert runs["default", "hsdp-int4"]["wire_options"] == {}
    assert runs["feedback", "hsdp-int4"]["wire_options"] == {"hook_feedback": True}
    assert runs["default", "hsdp-int4"]["train_last"] != \
        runs["feedback", "hsdp-int4"]["train_last"], "HSDP's wire ignored --hook-feedback"
