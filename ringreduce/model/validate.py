"""Calibrate every setting found in the results and print predictions beside measurements.

    python -m ringreduce.model --validate                # benchmarks/results, all folders

Per setting (results.setting_key): fit the costs on half the rows (calibrate.split),
predict every row, and report the relative error of ringreduce's and NCCL's predicted
times, apart for fit rows (F) and validation rows (V). The headline is the median over
validation rows; tests/test_model.py fails when it passes 20%. Then the faithful rows
(:mod:`.faithful`), priced from the nominal cluster without a fit, each with its error.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import calibrate, faithful, results
from .calibrate import Costs
from .results import Sample

#: The repository's results (this file is ringreduce/model/validate.py in a checkout).
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@dataclass(frozen=True)
class Line:
    sample: Sample
    role: str
    """"F": in the fit set; "V": validation only."""
    rr_us: float
    ref_us: float

    def errors(self) -> tuple[float, float]:
        return self.rr_us / self.sample.rr_us - 1, self.ref_us / self.sample.ref_us - 1


@dataclass(frozen=True)
class Report:
    lines: list[Line]
    costs: dict[str, Costs]
    excluded: list[tuple[Sample, str]]

    def median_error(self, role: str) -> float:
        return calibrate.median([abs(e) for ln in self.lines if ln.role == role
                                 for e in ln.errors()])


def run(samples: Sequence[Sample]) -> Report:
    """Exclude by rule, fit each setting on its fit rows, predict every kept row."""
    kept: dict[str, list[Sample]] = defaultdict(list)
    excluded = []
    for s in samples:
        reason = results.exclusion(s)
        if reason is None:
            kept[s.setting_key].append(s)
        else:
            excluded.append((s, reason))
    lines, costs = [], {}
    for key, group in sorted(kept.items()):
        fit_rows, check_rows = calibrate.split(group)
        costs[key] = calibrate.fit(fit_rows)
        for role, rows in (("F", fit_rows), ("V", check_rows)):
            for s in rows:
                lines.append(Line(s, role, *calibrate.predict(s, costs[key])))
    return Report(lines, costs, excluded)


def _mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"


def table(report: Report) -> str:
    """Markdown: one row per measured row, errors signed (predicted / measured - 1)."""
    out = ["| setting | file | M x D | size | buckets | role | ringreduce ms (model) | err "
           "| NCCL ms (model) | err |", "|---|---|---|---|---|---|---|---|---|---|"]
    for ln in sorted(report.lines, key=lambda x: (x.sample.setting_key, x.sample.source,
                                                 x.sample.buckets, x.sample.size)):
        s, (e_rr, e_ref) = ln.sample, ln.errors()
        out.append(f"| {s.setting_key} | {s.source} | {s.machines}x{s.gpus} | "
                   f"{_mib(s.size)} | {s.buckets} | {ln.role} | {s.rr_us / 1e3:.2f} "
                   f"({ln.rr_us / 1e3:.2f}) | {e_rr:+.0%} | {s.ref_us / 1e3:.2f} "
                   f"({ln.ref_us / 1e3:.2f}) | {e_ref:+.0%} |")
    return "\n".join(out)


def summary(report: Report) -> str:
    v = [ln for ln in report.lines if ln.role == "V"]
    reasons: dict[str, int] = defaultdict(int)
    for _, why in report.excluded:
        reasons[why] += 1
    lines = [f"median |error| on validation rows (V, not fitted): "
             f"{report.median_error('V'):.1%} over {2 * len(v)} predictions "
             f"(ringreduce and NCCL); on fit rows (F): {report.median_error('F'):.1%}",
             "excluded rows: " + (", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
                                  or "none")]
    for key, c in report.costs.items():
        multi = any(ln.sample.gpus > 1 for ln in report.lines if ln.sample.setting_key == key)
        intra = (f"{c.intra_gbps:.0f} Gbit/s, {c.intra_lat_us:.0f} us" if multi
                 else "unused (one GPU per machine)")
        lines.append(f"costs [{key}]: net {c.net_gbps:.1f} Gbit/s/machine, "
                     f"{c.net_lat_us:.0f} us; intra {intra}; host {c.host_call_us:.0f} us/call"
                     f" + {c.host_slice_us:.0f} us/slice; NCCL at {c.nccl_eff:.2f} of the link")
    return "\n".join(lines)


def main(root: Path = DEFAULT_ROOT) -> Report:
    samples = results.load(root)
    if not samples:
        raise SystemExit(f"--validate {root}: no benchmark JSON (python -m ringreduce.bench "
                         "--json) in it or its subfolders; pass the results folder")
    report = run(samples)
    print(table(report))
    print()
    print(summary(report))
    preds = faithful.predictions()
    print()
    print(faithful.table(preds))
    print()
    print(faithful.summary(preds))
    return report
