"""The earlier study's feedback_noise.py (2026-11-28-cpu-lm-int4: the same gradients,
the same Stream and Adam side by side) over this study's variants: int4's collect under
an int4 (the library's) or rotated int8 diffuse, with no error memory, the library's
(LoCo beta 0) or LoCo's moving average at each ``--betas`` value (study_wire.LocoCodec
on both memories). Per variant: each step's relative L2 error of the delivered sum
(mean over the steps; without memory that is one call's error), the error of the sum
over all steps, Adam's last update against the exact stream's, its norm ratio, the
median of v's ratio; and the bytes a value the collect and the diffuse send.

    python benchmarks/results/2026-11-29-cpu-lm-int4-feedback/feedback_noise_loco.py \\
        --warm 300 --samples 40
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # study_wire

from study_wire import DIFFUSE, LocoCodec

from benchmarks import wire_study
from benchmarks.workloads import text
from benchmarks.workloads import transformer_model as tm

HERE = Path(__file__).resolve().parent
CPU = torch.device("cpu")
BLOCK = 256


def _earlier() -> object:
    """The earlier folder's feedback_noise.py (its folder name is no package name)."""
    path = HERE.parent / "2026-11-28-cpu-lm-int4" / "feedback_noise.py"
    spec = importlib.util.spec_from_file_location("feedback_noise", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warm", type=int, default=300)
    p.add_argument("--samples", type=int, default=40, help="consecutive steps")
    p.add_argument("--betas", default="0,0.5,0.8,0.9", help="LoCo betas (0: the library's)")
    args = p.parse_args(argv)
    fn = _earlier()
    machines, devices = 2, 2
    torch.manual_seed(0)
    spec = text.spec(128, 2, 8, 64)
    data = text.corpus("stdlib")
    model = text.build(spec, 0)
    ranks = machines * devices
    n = sum(q.numel() for q in model.parameters())
    train = text.batches(data.train, spec.seq, args.warm, 8, 0, 0, CPU)
    per_rank = [text.batches(data.train, spec.seq, args.samples, 8, 1, r, CPU)
                for r in range(ranks)]
    feedbacks: list[float | None] = [None] + [float(b) for b in args.betas.split(",")]
    variants = [(d, fb) for d in DIFFUSE for fb in feedbacks]
    streams = {}
    for d, fb in variants:
        s = fn.Stream(DIFFUSE["int4"], BLOCK, machines, n, ranks, fb is not None,  # type: ignore[attr-defined]
                      diffuse=None if d == "int4" else DIFFUSE[d])
        beta = 0.0 if fb is None else fb
        s.codec = LocoCodec(DIFFUSE["int4"], BLOCK, beta, CPU)
        if s.diffuse_codec is not None:
            s.diffuse_codec = LocoCodec(DIFFUSE[d], BLOCK, beta, CPU)
        streams[d, fb] = s
    adams = {v: fn.Adam(n) for v in variants}  # type: ignore[attr-defined]
    exact_adam = fn.Adam(n)  # type: ignore[attr-defined]
    step_err: dict[tuple[str, float | None], list[float]] = {v: [] for v in variants}
    total_err = {v: torch.zeros(n, dtype=torch.float64) for v in variants}
    total = torch.zeros(n, dtype=torch.float64)
    updates: dict[tuple[str, float | None], torch.Tensor] = {}
    exact_update = torch.zeros(n, dtype=torch.float64)
    for grads in wire_study._gradients(model, tm.loss, train, per_rank, args.samples):
        exact = torch.stack(grads).double().sum(0)
        parts = torch.stack([sum(grads[m * devices + i] for i in range(1, devices))
                             + grads[m * devices] for m in range(machines)])  # as earlier
        total += exact
        exact_update = exact_adam.step(exact)
        for v in variants:
            got = streams[v].call(parts)
            step_err[v].append(float((got - exact).norm() / exact.norm()))
            total_err[v] += got - exact
            updates[v] = adams[v].step(got)
    print(f"# {spec.layers} x {spec.width}, {machines} x {devices} ranks, batch 8, "
          f"{args.warm} Adam steps first, then {args.samples} consecutive compressed sums "
          f"(one bucket of {n} values), blocks of {BLOCK}")
    print(f"{'diffuse':>7} {'feedback':>9} {'B collect':>9} {'B diffuse':>9} {'step err':>8} "
          f"{'sum err':>8} {'u diff':>7} {'|u|/|u*|':>8} {'v/v* med':>8}")
    for d, fb in variants:
        u = updates[d, fb]
        ratio_v = (adams[d, fb].v / exact_adam.v.clamp_min(1e-300)).median()
        name = "off" if fb is None else "lib" if fb == 0 else f"loco {fb:g}"
        print(f"{d:>7} {name:>9} {wire_study.bytes_per_value('int4', BLOCK):>9.4f} "
              f"{DIFFUSE[d].row_bytes(BLOCK, BLOCK) / BLOCK:>9.4f} "
              f"{sum(step_err[d, fb]) / len(step_err[d, fb]):>8.4f} "
              f"{float(total_err[d, fb].norm() / total.norm()):>8.4f} "
              f"{float((u - exact_update).norm() / exact_update.norm()):>7.4f} "
              f"{float(u.norm() / exact_update.norm()):>8.4f} {float(ratio_v):>8.4f}")


if __name__ == "__main__":
    main()
