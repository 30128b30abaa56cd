"""Which 8- and 4-bit wire to default to: one compressed all-reduce's relative L2 error
against an fp64 sum, on real backprop gradients, for each wire and block size, with the
bytes each sends per value (issue 50's study).

One process, no communication: M machines x D devices are emulated as M*D gradients of
the same model on M*D different batches (what DDP's ranks would hold), summed in fp32
over each machine's D devices into the machine's partial (the intra-machine
reduce-scatter), then through compressed.py's own steps: every partial quantized
(collect), dequantized and summed in fp32 in machine order, requantized (diffuse),
dequantized (rotated wires: rotated back), exactly as a rank computes them (``Codec``:
the torch ops, or native/quant.cu's kernels on CUDA with cupy for the wires; study-only
variants always take the torch ops). The reference is the
fp64 sum of the M*D gradients. Error feedback is off: this is one call.

Workloads (benchmarks/workloads): ``dlrm`` (embedding tables and MLPs, its teacher's
clicks), ``transformer`` (the Markov-source decoder) and ``text`` (a byte-level decoder
on the Python documentation: workloads/text.py's ``topics`` corpus, the one the
committed study used). Each model is trained ``--warm`` steps (Adam) on rank 0's batches
first, so the gradients are those of a model that has learnt something; then
``--samples`` gradients a step apart are measured and the median error is reported.
CPU shapes are small (minutes on 2 cores); ``--big`` takes the training runs' shapes
(for a GPU).

    python benchmarks/wire_study.py                       # CPU, 2 x 2
    python benchmarks/wire_study.py --device cuda --big   # GPU: the kernels, full sizes
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workloads import dlrm_model, text, transformer_model
from benchmarks.workloads.workloads import dlrm_loss
from ringreduce.execution import compressed, kernels, quant

VARIANTS = {
    "int8": quant.FORMATS["int8"],
    "int8-rot": quant.Format("int8-rot", 127.0, 8, "int8", rotated=True),
    # Uniform -7..7 (of -8..7: zero exact, equal steps both signs), the 4-bit wire before
    # rotation.
    "int4-plain": quant.Format("int4-plain", 7.0, 4, "int4"),
    "int4-rot": quant.Format("int4-rot", 7.0, 4, "int4", rotated=True),
    "gauss4": quant.Format("gauss4", 1.0, 4, "gauss4"),
    "int4": quant.FORMATS["int4"],  # gauss4 levels on rotated blocks: the default
}
"""Every variant measured, under the study table's names: the wires (quant.FORMATS) and
study-only variants, no wires (benchmarks/results/2026-11-28-cpu-wire-study: the study
and the training runs kept int8 unrotated and int4 rotated at Gaussian levels)."""
WIRES = tuple(VARIANTS)
BLOCKS = (256, 128, 64)

#: name -> (gradient stream factory: (big, device, machines*devices, warm, samples) ->
#: an iterator of samples, each the M*D flat gradients)
Grads = Iterator[list[torch.Tensor]]


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros_like(p).flatten()
                      for p in model.parameters()])


def _gradients(model: nn.Module, loss: Callable[[nn.Module, Any], torch.Tensor],
               train: list[Any], ranks: list[list[Any]], samples: int) -> Grads:
    """Train on ``train`` (Adam), then per sample: each rank's gradient on its batch,
    and one more training step on rank 0's (so samples are a step apart)."""
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    for batch in train:
        adam.zero_grad()
        loss(model, batch).backward()
        adam.step()
    for s in range(samples):
        grads = []
        for batches in ranks:
            model.zero_grad()
            loss(model, batches[s]).backward()
            grads.append(_flat_grad(model).clone())
        yield grads
        adam.zero_grad()
        loss(model, ranks[0][s]).backward()
        adam.step()


def dlrm_grads(big: bool, device: torch.device, ranks: int, warm: int, samples: int) -> Grads:
    spec = dlrm_model.Spec() if big else dlrm_model.Spec(rows=20_000, dim=16,
                                                        bottom=(128, 64), top=(128, 64))
    batch = 2048 if big else 512
    model = dlrm_model.build_model(spec, 0).to(device)
    train = dlrm_model.make_batches(spec, warm, batch, 0, 0, device)
    per_rank = [dlrm_model.make_batches(spec, samples, batch, 1, r, device) for r in range(ranks)]
    return _gradients(model, dlrm_loss, train, per_rank, samples)


def transformer_grads(big: bool, device: torch.device, ranks: int, warm: int,
                      samples: int) -> Grads:
    spec = transformer_model.TransformerSpec(
        **({"layers": 8} if big else {"vocab": 1024, "width": 128, "layers": 2, "seq": 64}))
    batch = 8
    model = transformer_model.build_model(spec, 0).to(device)
    train = transformer_model.make_batches(spec, warm, batch, 0, 0, device)
    per_rank = [transformer_model.make_batches(spec, samples, batch, 1, r, device)
                for r in range(ranks)]
    return _gradients(model, transformer_model.loss, train, per_rank, samples)


def text_grads(big: bool, device: torch.device, ranks: int, warm: int, samples: int) -> Grads:
    spec = text.spec() if big else text.spec(width=128, layers=2, seq=64)
    batch = 16
    data = text.corpus("topics")
    model = text.build(spec, 0).to(device)
    train = text.batches(data.train, spec.seq, warm, batch, 0, 0, device)
    per_rank = [text.batches(data.train, spec.seq, samples, batch, 1, r, device)
                for r in range(ranks)]
    return _gradients(model, transformer_model.loss, train, per_rank, samples)


WORKLOADS = {"dlrm": dlrm_grads, "transformer": transformer_grads, "text": text_grads}


def one_call(parts: torch.Tensor, fmt: quant.Format, block: int, kernels_: Any,
             world: int) -> torch.Tensor:
    """(n,) fp32: what every rank ends with after one compressed SUM of the machines'
    partials ``parts`` (M, n) fp32, through compressed.py's collect quantization, add
    and requantization, and final dequantization."""
    machines, n = parts.shape
    k = -(-n // block) * block
    x = torch.zeros((machines, k), dtype=torch.float32, device=parts.device)
    x[:, :n] = parts
    codec = compressed.Codec(fmt, block, kernels_, parts.device)
    got = codec.packed(machines, k)
    codec.quantize(x, got, None)
    sent = compressed._add(got, got, codec, None, 0)
    ctx = SimpleNamespace(topo=SimpleNamespace(world_size=world), divisors={})
    out = compressed._unpack(sent, codec, "sum", torch.float32, ctx)  # type: ignore[arg-type]
    return out.view(-1)[:n]


def rel_l2(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double() - exact).norm() / exact.norm())


def measure(grads: list[torch.Tensor], machines: int, wires: tuple[str, ...],
            blocks: tuple[int, ...], kernels_: Any) -> dict[tuple[str, int], float]:
    """(wire, block) -> relative L2 error of one call on these M*D gradients."""
    devices = len(grads) // machines
    exact = torch.stack(grads).double().sum(0)
    parts = torch.stack([
        sum(grads[m * devices + d] for d in range(1, devices)) + grads[m * devices]
        if devices > 1 else grads[m * devices] for m in range(machines)])
    return {(wire, block): rel_l2(one_call(parts, VARIANTS[wire], block,
                                           _kernels_for(VARIANTS[wire], kernels_),
                                           len(grads)), exact)
            for wire in wires for block in blocks}


def _kernels_for(fmt: quant.Format, kernels_: Any) -> Any:
    """The kernels for a wire (tests/test_gpu_quant_kernels.py holds them bit-identical
    to the torch ops for quant.FORMATS), None (the torch ops) for a study-only variant,
    which no kernel test covers."""
    return kernels_ if fmt in quant.FORMATS.values() else None


def bytes_per_value(wire: str, block: int) -> float:
    """Bytes on the rail per value per crossing (payload and the block's fp32 scale)."""
    return VARIANTS[wire].row_bytes(block, block) / block


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--machines", type=int, default=2)
    p.add_argument("--devices", type=int, default=2, help="per machine")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--wires", default=",".join(WIRES))
    p.add_argument("--blocks", default=",".join(map(str, BLOCKS)))
    p.add_argument("--warm", type=int, default=20, help="training steps before measuring")
    p.add_argument("--samples", type=int, default=3, help="gradients measured, a step apart")
    p.add_argument("--big", action="store_true", help="the training runs' model sizes")
    p.add_argument("--no-kernels", action="store_true", help="torch ops on CUDA too")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    use = device.type == "cuda" and kernels.available() and not args.no_kernels
    kernels_ = kernels.Kernels(device) if use else None
    wires, blocks = tuple(args.wires.split(",")), tuple(int(b) for b in args.blocks.split(","))
    torch.manual_seed(0)
    ranks = args.machines * args.devices
    print(f"# one compressed all-reduce (SUM, no error feedback) of real gradients, emulated "
          f"{args.machines} x {args.devices}, {args.warm} Adam steps first, median of "
          f"{args.samples} gradients; relative L2 error vs fp64; device {device}"
          f"{' (native/quant.cu kernels)' if kernels_ else ' (quant.py torch ops)'}; "
          f"text: {text.corpus('topics').describe()}")
    table: dict[str, dict[tuple[str, int], float]] = {}
    for name in args.workloads.split(","):
        begin = time.perf_counter()
        runs = [measure(grads, args.machines, wires, blocks, kernels_)
                for grads in WORKLOADS[name](args.big, device, ranks, args.warm, args.samples)]
        table[name] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        print(f"# {name}: {time.perf_counter() - begin:.0f} s", flush=True)
    print(f"{'wire':>10} {'block':>5} {'B/value':>7} " +
          " ".join(f"{name:>11}" for name in table))
    for wire in wires:
        for block in blocks:
            cells = " ".join(f"{table[name][(wire, block)]:>11.3e}" for name in table)
            print(f"{wire:>10} {block:>5} {bytes_per_value(wire, block):>7.4f} {cells}")


if __name__ == "__main__":
    main()
