"""The DDP benchmark's workloads (dlrm.py ``--model``): what training needs of each model,
and each one's default batch and learning rate."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import dlrm_model, transformer_model
from .dlrm_model import Spec
from .transformer_model import TransformerSpec

MODELS = ("dlrm", "transformer")
# Per-rank batch (samples or sequences) and SGD learning rate where Options gets 0.
# DLRM: 2048 samples keep the step's arithmetic small next to its 128 MB all-reduce; lr
# 0.1 barely moves its loss in 60 steps. Transformer: 8 x 128 tokens keep a 24 x 512
# step's arithmetic short, so its 100+ all-reduce calls are a visible share of the step;
# lr 0.5 (measured on CPU, 24 x 512, 32 x 128 tokens a step, 12 steps) takes the loss
# from 8.41 to 8.20 where 0.1 reaches 8.27; 2.0 diverges.
DEFAULT_BATCH = {"dlrm": 2048, "transformer": 8}
DEFAULT_LR = {"dlrm": 0.5, "transformer": 0.5}


@dataclasses.dataclass(frozen=True)
class Workload:
    """What training needs of a model: a fresh one from a seed, this rank's batches
    (made before timing), and one batch's loss through the DDP-wrapped model."""

    build: Callable[[int], nn.Module]  # seed -> the model, on the CPU
    # (steps, batch, seed, rank, device) -> every step's batch
    batches: Callable[[int, int, int, int, torch.device], list[Any]]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    grad_bytes: int  # fp32 gradient bytes per step
    shape: str  # for describe()


def dlrm_loss(model: nn.Module, batch: dlrm_model.Batch) -> torch.Tensor:
    """Mean binary cross-entropy of the click logits."""
    dense, ids, labels = batch
    return nn.functional.binary_cross_entropy_with_logits(model(dense, ids), labels)


def workload(model: str, dlrm: Spec, transformer: TransformerSpec) -> Workload:
    """``model``'s model, batches and loss, shaped by its spec."""
    if model == "transformer":
        t = transformer
        return Workload(functools.partial(transformer_model.build_model, t),
                        functools.partial(transformer_model.make_batches, t),
                        transformer_model.loss, transformer_model.grad_bytes(t),
                        f"transformer: {t.layers} layers x width {t.width}, {t.heads} heads, "
                        f"mlp {t.ffn}x, vocab {t.vocab}, seq {t.seq}")
    s = dlrm
    return Workload(functools.partial(dlrm_model.build_model, s),
                    functools.partial(dlrm_model.make_batches, s), dlrm_loss,
                    dlrm_model.grad_bytes(s),
                    f"dlrm: {s.tables} tables x {s.rows} rows x {s.dim}, bag {s.bag}")
