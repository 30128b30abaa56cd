"""Fit the model per setting on the committed results and print predictions beside them.

Every ``benchmarks/results/*/*.json`` the bench wrote is read (ringreduce.model.results);
per setting (results.setting_key) the costs are fitted on half the rows (calibrate.split),
every row is predicted, and the relative error of ringreduce's and NCCL's predicted times
is reported apart for fit rows (F) and validation rows (V). The headline is the median
over validation rows; tests/test_model_validation.py fails when it passes 20%. Then the
faithful rows and the four-H200 rows (:mod:`.faithful`), priced from the nominal cluster
without a fit.
"""

from __future__ import annotations

from pathlib import Path

from ringreduce.model import calibrate, results
from ringreduce.model.calibrate import Report
from ringreduce.model.results import Sample, Setting

from . import faithful

#: The repository's results (this file is benchmarks/model_validation/validate.py).
DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "results"

#: Folders whose JSON meta does not say how ranks sat on GPUs (each folder's README.md).
FOLDER_SETTINGS: dict[str, Setting] = {
    # two H200s, one rank per GPU: "2 x 1 on two GPUs"
    "2026-11-23-h200x2-core": Setting(1, False, "none", "machines"),
    # one H200, "both ranks on the one GPU", no MPS: the GPU time-slices between them
    "2026-11-23-h200-graphs": Setting(2, False, "none", "machines"),
    "2026-11-23-h200-host": Setting(2, False, "none", "machines"),
    "2026-11-23-h200-overlap": Setting(2, False, "none", "machines"),
}


def load(root: Path = DEFAULT_ROOT) -> list[Sample]:
    """Every benchmark row under ``root`` (a results folder, or a folder of them)."""
    files = sorted(root.glob("*.json")) + sorted(root.glob("*/*.json"))
    return [s for f in files for s in results.load_file(f, FOLDER_SETTINGS)]


def run(root: Path = DEFAULT_ROOT) -> Report:
    """The fit and check over every results folder under ``root``."""
    samples = load(root)
    if not samples:
        raise SystemExit(f"{root}: no benchmark JSON (python -m ringreduce.bench --json) in "
                         "it or its subfolders; pass the results folder")
    return calibrate.run(samples)


def main(root: Path = DEFAULT_ROOT) -> Report:
    """Print the validation table, its summary and the faithful rows."""
    report = run(root)
    print(calibrate.table(report))
    print()
    print(calibrate.summary(report))
    preds = faithful.predictions()
    print()
    print(faithful.table(preds))
    print()
    print(faithful.summary(preds))
    print()
    print_four_gpu()
    return report


def print_four_gpu() -> None:
    """The four-H200 rows (D = 2 and D = 4) with nominal costs: table and summary."""
    preds = faithful.four_gpu_predictions()
    print(faithful.table(preds))
    print()
    print(faithful.summary(preds, faithful.FOUR_TITLE, faithful.FOUR_MISSES))
