"""``python -m benchmarks.model_validation``, from the repository root (a checkout):

    python -m benchmarks.model_validation > benchmarks/results/model/validation.txt
    python -m benchmarks.model_validation --results DIR       # another results folder
    python -m benchmarks.model_validation --plot speedup.png \\
        > benchmarks/results/model/sweep_presets.txt

    python -m benchmarks.model_validation --four-gpu \
        > benchmarks/results/2026-11-28-h200x4-four/model-validation.txt

The first prints the fit and check over every committed results folder and the faithful
rows (validate.py). ``--plot`` writes the predicted speedup of every preset against machine
count for 16 x 25 MiB buckets (``python -m ringreduce.model --all-presets --sizes 25M
--buckets 16 --plot PNG``), titled with the validation's median error, and prints every
preset's table, each row on the plan the engine's construction probe would take.
``--four-gpu`` prints only the four-H200 rows (D = 2 and D = 4) against the model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ringreduce.model import cli

from . import validate


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.model_validation",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=validate.DEFAULT_ROOT, metavar="DIR",
                   help=f"a results folder, or a folder of them (default {validate.DEFAULT_ROOT})")
    p.add_argument("--plot", metavar="PNG", help="write the presets' speedup plot instead")
    p.add_argument("--four-gpu", action="store_true",
                   help="only the four-H200 rows (D = 2 and 4) with nominal costs")
    args = p.parse_args(argv)
    if args.four_gpu:
        validate.print_four_gpu()
        return
    if not args.plot:
        validate.main(args.results)
        return
    report = validate.run(args.results)
    note = f"validation median |error| {report.median_error('V'):.0%} on emulated runs"
    cli.main(["--all-presets", "--sizes", "25M", "--buckets", "16", "--plot", args.plot],
             note=note)


if __name__ == "__main__":
    main()
