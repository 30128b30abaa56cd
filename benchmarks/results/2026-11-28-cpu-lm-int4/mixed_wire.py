"""A study, not a wire: text_lm.py's training with int4's collect under an 8-bit diffuse.

The library has no such wire. This script replaces ``compressed.all_reduce`` in every
rank (spawned ranks import this module as their ``__main__``, so the replacement runs
there too) with the same steps, except that the owner's fp32 sum of the rotated rows is
requantized as rotated int8 (the same signs: they depend on the block only) and the
rows are dequantized and rotated back from that. Error feedback as the library keeps
it: the collect's residual in int4, the diffuse's in int8. CPU only (quant.py's torch
ops; no kernel implements the mix), so ``--device cpu``.

    python benchmarks/results/2026-11-28-cpu-lm-int4/mixed_wire.py --device cpu \
        --nprocs 4 --machines 2 --width 128 --layers 2 --seq 64 --steps 600 \
        --wire int4 --spread int4 --seed 0,1,2 --json mixed.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import text_lm
from ringreduce.execution import compressed, quant
from ringreduce.execution.context import CallContext
from ringreduce.execution.feedback import Errors

DIFFUSE = quant.Format("int8-rot", 127.0, 8, "int8", rotated=True)
"""Rotated int8 (the study's ``int8-rot``): what the diffuse sends under int4's collect."""


def mixed_all_reduce(t: torch.Tensor, op: str, fmt: quant.Format, block: int,
                     errors: Errors | None, ctx: CallContext, on: compressed.On) -> None:
    """compressed.all_reduce with the add's requantization and the unpack in DIFFUSE."""
    if t.is_cuda or fmt.name != "int4":
        raise ValueError(f"mixed_wire.py studies int4 on the CPU only, got {fmt.name} on "
                         f"{t.device}")
    n, topo = t.numel(), ctx.topo
    if n == 0:
        return
    k = compressed.padded_row(n, topo.devices_per_machine, topo.machines, block)
    collect = compressed.Codec(fmt, block, None, t.device, on)
    diffuse = compressed.Codec(DIFFUSE, block, None, t.device, on)
    part = compressed._machine_part(t, k, collect, ctx, on)
    got, mine = compressed._collect(part, collect, errors, ctx, on.stream)
    m, machines = topo.machine_index, got.shape[0]
    got[m].copy_(mine[m])
    values = torch.empty((machines, k), dtype=torch.float32, device=t.device)
    quant.dequantize(got, fmt, block, values)
    reduced = values[0].clone()
    for j in range(1, machines):
        reduced.add_(values[j])
    sent = diffuse.packed(1, k)
    residual = None if errors is None else errors.diffuse.view(1, k)
    diffuse.quantize(reduced.view(1, k), sent, residual, rotate=False)
    rows = compressed._diffuse(sent, ctx, on)
    compressed._unpack_into(t, rows, diffuse, op, ctx, on)


compressed.all_reduce = mixed_all_reduce  # type: ignore[assignment]

if __name__ == "__main__":
    text_lm.main()
