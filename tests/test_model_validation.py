"""The performance model against this repository's measurements (benchmarks/model_validation/,
run from a checkout, not shipped in the wheel): the fit and check over the committed
results (median error <= 20%) and the faithful rows with nominal costs (median <= 5%,
every row of the faithful results folder priced, the misses above 20% NCCL's at 25 Gbit/s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.model_validation import __main__ as validation_cli
from benchmarks.model_validation import faithful, validate
from ringreduce.model import calibrate, nccl_cost, results
from ringreduce.model.nccl_cost import nccl_time_us, ring_time_us, tree_time_us

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def test_nccl_default_at_the_faithful_2x2_is_ring_then_tree() -> None:
    # The faithful 2 x 2 at 10 Gbit/s: NCCL's default ran its ring at 16 MiB (1.5x slower
    # than its tree, which it would have had to be told to run) and its tree from 64 MiB.
    c = faithful.cluster(2)
    picks = [nccl_cost.nccl_algo(s * MiB, c) for s in (4, 16, 64, 256)]
    assert picks == ["ring", "ring", "tree", "tree"]
    sixteen = 16 * MiB
    assert nccl_time_us(sixteen, c) == ring_time_us(sixteen, c)
    assert nccl_cost.nccl_best_us(sixteen, c) == tree_time_us(sixteen, c) < nccl_time_us(sixteen, c)


@pytest.fixture(scope="module")
def faithful_preds() -> list[faithful.Predicted]:
    return faithful.predictions()


def test_every_row_of_the_faithful_folder_is_priced(
        faithful_preds: list[faithful.Predicted]) -> None:
    """Every row of every run in the folder's JSON is in the validation, bar the runs of
    NCCL under tuned sockets and the loopback runs (left out by stated rules: faithful's
    module doc)."""
    folder = ROOT / "benchmarks" / "results" / faithful.FAITHFUL
    files = sorted(folder.glob("*.json"))
    assert len(files) == 3
    priced = {(p.row.machines, p.row.gbps, p.row.size, p.row.buckets): dict(p.row.times)
              for p in faithful_preds if p.row.source.startswith(faithful.FAITHFUL)}
    left_out = loopback = 0
    for f in files:
        for name, run in json.loads(f.read_text()).items():
            meta = run["meta"]
            if faithful.tuned_sockets(meta):
                assert "sockets" in name
                left_out += 1
                continue
            if not meta["options"]["link_gbit"]:
                assert "loopback" in name
                loopback += 1
                continue
            tree = results.nccl_algo_of(meta) == "tree"
            for r in run["rows"]:
                times = priced[meta["machines"], meta["options"]["link_gbit"], r["size"],
                               r["buckets"]]
                if tree:
                    assert times["NCCL tree"] == r["ref_time_us"], name
                else:
                    assert (times["ringreduce"], times["NCCL default"], times["two-level"]) \
                        == (r["rr_time_us"], r["ref_time_us"], r["two_level_time_us"]), name
    assert (left_out, loopback) == (8, 4)
    assert len(priced) == 16  # 2x2 and 4x2, 10 and 25 Gbit/s, four sizes
    assert len(faithful_preds) == 16 + len(faithful.COMPRESSED_ROWS)
    # ringreduce took one slice in every process of these runs; the model prices that plan
    assert all(p.row.plan == "one-slice" for p in faithful_preds
               if p.row.source.startswith(faithful.FAITHFUL))


def test_faithful_rows_median_error_is_at_most_5_percent(
        faithful_preds: list[faithful.Predicted]) -> None:
    """Issue 35: nominal costs, no fit. 3.9% over 72 predictions when written."""
    assert faithful.median_error(faithful_preds) <= 0.05, faithful.table(faithful_preds)
    errs = [(p, what, e) for p in faithful_preds for what, e in p.errors()]
    # ringreduce and the two-level composition: within 15% everywhere (largest 13%: the
    # 16 x 25 MiB row at 4 x 2, 10 Gbit/s, where ringreduce ran 0.86 of the link bound)
    assert all(abs(e) <= 0.15 for _, what, e in errs if what in ("ringreduce", "two-level"))
    # at 10 Gbit/s every prediction within 15%
    assert all(abs(e) <= 0.15 for p, _, e in errs if p.row.gbps == 10)
    # the misses above 20% are NCCL's at 25 Gbit/s (its default sockets below the link)
    # and the model too fast, never too slow; the output names each of them
    off = [(p, what, e) for p, what, e in errs if abs(e) > faithful.OFF]
    assert off and all(p.row.gbps == 25 and what.startswith("NCCL") and e < 0
                       for p, what, e in off)
    assert max(abs(e) for _, _, e in off) <= 0.35
    text = faithful.summary(faithful_preds)
    assert f"off by more than 20%: {len(off)} of {len(errs)}" in text
    assert all(p.row.label in text for p, _, _ in off)


def test_the_model_ranks_ringreduce_against_nccls_tree_as_measured(
        faithful_preds: list[faithful.Predicted]) -> None:
    """At 10 Gbit/s NCCL's tree ties ringreduce at 2 x 2 (it reaches the link bound at
    two machines) and trails it by ~1.45x at 4 x 2: measured and predicted."""
    for p in faithful_preds:
        if p.row.gbps != 10 or not p.row.source.startswith(faithful.FAITHFUL):
            continue
        got, model = dict(p.row.times), dict(p.model)
        ratios = (got["NCCL tree"] / got["ringreduce"],
                  model["NCCL tree"] / model["ringreduce"])
        lo, hi = (0.95, 1.10) if p.row.machines == 2 else (1.25, 1.55)
        assert all(lo < r < hi for r in ratios), (p.row.label, ratios)


@pytest.fixture(scope="module")
def report() -> calibrate.Report:
    return validate.run(ROOT / "benchmarks" / "results")


def test_validation_median_error_is_at_most_20_percent(report: calibrate.Report) -> None:
    checked = [ln for ln in report.lines if ln.role == "V"]
    assert len(checked) >= 4, "too few validation rows: the check would prove nothing"
    assert report.median_error("V") <= 0.20, calibrate.summary(report)


def test_validation_reads_every_results_folder(report: calibrate.Report) -> None:
    """Every folder with benchmark JSON rows is either predicted or excluded by a rule."""
    seen = {ln.sample.source.split("/")[0] for ln in report.lines}
    seen |= {s.source.split("/")[0] for s, _ in report.excluded}
    with_rows = {p.parent.name for p in (ROOT / "benchmarks" / "results").glob("*/*.json")
                 if results.load_file(p)}
    assert with_rows and seen == with_rows


def test_folder_settings_name_committed_folders() -> None:
    """The table of older folders' settings names folders that exist (a renamed folder
    would silently fall back to what its meta says)."""
    for folder in validate.FOLDER_SETTINGS:
        assert (validate.DEFAULT_ROOT / folder).is_dir(), folder


def test_the_validation_cli_prints_both_tables(capsys: pytest.CaptureFixture[str]) -> None:
    validation_cli.main([])
    out = capsys.readouterr().out
    assert "median |error| on validation rows" in out and "faithful rows" in out


# The four-H200 rows (issue 51 item 4): D = 2 and D = 4 with the same nominal costs.

#: The bound the faithful H100 rows (D = 2) are held to; the four-GPU rows, D = 4
#: included, are held to the same one.
NOMINAL_MEDIAN_BOUND = 0.05


@pytest.fixture(scope="module")
def four_preds() -> list[faithful.Predicted]:
    return faithful.four_gpu_predictions()


def test_every_capped_row_of_the_four_gpu_folder_is_priced(
        four_preds: list[faithful.Predicted]) -> None:
    """Every row of every capped run in the folder's JSON, ringreduce and two-level from
    the default run, NCCL's ring and tree from the forced runs of the same machines,
    devices and link, the plan from the row's route."""
    files = sorted((ROOT / "benchmarks" / "results" / faithful.FOUR).glob("*.json"))
    assert len(files) == 2
    priced = {(p.row.machines, p.row.gpus, p.row.gbps, p.row.size, p.row.buckets): p
              for p in four_preds}
    assert len(priced) == len(four_preds)
    seen = set()
    for f in files:
        for name, run in json.loads(f.read_text()).items():
            meta = run["meta"]
            gbps = meta["options"]["link_gbit"]
            if not gbps:
                assert "loopback" in name
                continue
            algo = results.nccl_algo_of(meta)
            what = {"default": "NCCL default", "ring": "NCCL ring", "tree": "NCCL tree"}[algo]
            for r in run["rows"]:
                key = (meta["machines"], meta["devices_per_machine"], gbps, r["size"],
                       r["buckets"])
                seen.add(key)
                p = priced[key]
                times = dict(p.row.times)
                assert times[what] == r["ref_time_us"], name
                if algo == "default":
                    assert (times["ringreduce"], times["two-level"]) == \
                        (r["rr_time_us"], r["two_level_time_us"]), name
                    route = r["route"]
                    assert p.row.plan == ("pipelined" if route == "hierarchical" else route)
    assert seen == set(priced)
    # both D are there, and D = 4 at two and four machines
    assert {(p.row.machines, p.row.gpus) for p in four_preds} == {(2, 2), (2, 4), (4, 2),
                                                                  (4, 4)}
    assert all(len(p.row.times) == len(faithful.WHAT) for p in four_preds)


def test_a_flat_row_is_priced_as_nccls_default(four_preds: list[faithful.Predicted]) -> None:
    flat = [p for p in four_preds if p.row.plan == "flat"]
    assert flat  # 2 x 4 at 10 Gbit/s: the probe took NCCL's own call
    for p in flat:
        model = dict(p.model)
        assert model["ringreduce"] == model["NCCL default"]


def test_four_gpu_rows_are_priced_on_their_d_and_nv18(
        four_preds: list[faithful.Predicted]) -> None:
    """The model's ring at D = 4 crosses 2(N-1) steps of N = 4M ranks: priced on the
    row's own cluster, not the two-GPU one."""
    for p in four_preds:
        c = faithful.cluster(p.row.machines, p.row.gbps, p.row.gpus, faithful.H200_NV18_GBPS)
        assert c.ranks == p.row.machines * p.row.gpus
        assert dict(p.model)["NCCL ring"] == p.row.buckets * ring_time_us(p.row.size, c)


def test_four_gpu_errors_stay_within_the_d2_bound(
        four_preds: list[faithful.Predicted]) -> None:
    """The median |error| of the D = 4 rows, of the clean D = 2 rows (one rank a GPU) and
    of all within the bound the H100 D = 2 rows are held to; ringreduce and the two-level
    composition within 15% everywhere, as there; the misses above 20% NCCL's at
    25 Gbit/s, the model too fast (NCCL's sockets below the link), each named."""
    d4 = [p for p in four_preds if p.row.gpus == 4]
    clean = faithful.clean(four_preds)
    assert d4 and clean and all(p.row.gpus == 2 for p in clean)
    for preds in (d4, clean, four_preds):
        assert faithful.median_error(preds) <= NOMINAL_MEDIAN_BOUND, faithful.table(preds)
    errs = [(p, what, e) for p in four_preds for what, e in p.errors()]
    assert all(abs(e) <= 0.15 for _, what, e in errs if what in ("ringreduce", "two-level"))
    off = [(p, what, e) for p, what, e in errs if abs(e) > faithful.OFF]
    assert all(p.row.gbps == 25 and what.startswith("NCCL") and e < 0 for p, what, e in off)
    text = faithful.summary(four_preds, faithful.FOUR_TITLE, faithful.FOUR_MISSES)
    assert f"off by more than 20%: {len(off)} of {len(errs)}" in text
    assert "D = 4: median |error|" in text


def test_the_committed_four_gpu_validation_is_the_models_output(
        capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/results/<FOUR>/model-validation.txt is what its first line's command
    prints now (a model change that moves a figure must rewrite it)."""
    committed = (ROOT / "benchmarks" / "results" / faithful.FOUR /
                 "model-validation.txt").read_text()
    validation_cli.main(["--four-gpu"])
    out = capsys.readouterr().out
    assert committed.split("\n", 2)[2] == out
