"""The DDP benchmark's workloads (dlrm.py ``--model``): what training needs of each model,
and each one's default batch and learning rate."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LinearLR, LRScheduler

from . import dlrm_model, transformer_model
from .dlrm_model import Spec
from .transformer_model import TransformerSpec

MODELS = ("dlrm", "transformer")
# Per-rank batch (samples or sequences), Adam's learning rate where Options gets 0, and
# its warm-up. DLRM: 2048 samples keep the step's arithmetic small next to its 128 MB
# all-reduce. Transformer: 8 x 128 tokens keep a 24 x 512 step's arithmetic short, so
# its 100+ all-reduce calls are a visible share of the step.
# Adam for both, as transformers are trained. Measured on an H100 at 4 ranks' batch, 60
# steps, on the teachers' data: plain SGD takes DLRM from 0.72 to 0.58 at lr 0.5 (2.0
# oscillates, 8.0 diverges), Adam at 1e-3 to 0.54 (floor 0.37; 3e-3 and 1e-2 no better).
# The transformer's rate is ramped up from a tenth over its first 10 steps: over the
# 32-token source a 48 x 512 model then reaches 1.6 (floor 1.21) at 3e-4, where without
# the ramp 2e-4 stalls at 3.2 and 1e-4 crawls to 1.9 (over 64 tokens, 3e-4 without it
# stalls at 4.0). SGD was tried on the whole-vocabulary source only (lr 0.5: 8.1 after
# 60 steps, no better than Adam there).
DEFAULT_BATCH = {"dlrm": 2048, "transformer": 8}
DEFAULT_LR = {"dlrm": 1e-3, "transformer": 3e-4}
LR_WARMUP = {"dlrm": 0, "transformer": 10}
LR_WARMUP_START = 0.1  # the first step's fraction of the learning rate, ramped up linearly
# The default target loss: this fraction of the way from the first step's loss to the
# floor, which fp32 NCCL reaches within the first third of the default 60 steps, so a
# mode that learns slower shows as more steps rather than as "never". Measured on 2
# H100s, 2 ranks, seeds 0-2: DLRM reaches a third at steps 7-15 and half at 37, 48 and
# never (it learns the dense features fast, the 125,000-row tables slowly); the
# transformer reaches half at step 9 (before the timed steps) and 0.8 at 19-21
# (PowerSGD rank 4: 23).
TARGET_FRACTION = {"dlrm": 1 / 3, "transformer": 0.8}


@dataclasses.dataclass(frozen=True)
class Workload:
    """What training needs of a model: a fresh one from a seed, this rank's batches
    (made before timing), one batch's loss through the DDP-wrapped model, its
    learning-rate warm-up, and the loss floor of the batches' source."""

    build: Callable[[int], nn.Module]  # seed -> the model, on the CPU
    # (steps, batch, seed, rank, device) -> every step's batch
    batches: Callable[[int, int, int, int, torch.device], list[Any]]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    # batches -> the expected loss of a model that has learnt the source (the teacher's)
    floor: Callable[[list[Any]], float]
    grad_bytes: int  # fp32 gradient bytes per step
    shape: str  # for describe()
    lr_warmup: int = 0  # steps over which Adam's rate ramps up from LR_WARMUP_START

    def optimizer(self, params: Iterable[nn.Parameter],
                  lr: float) -> tuple[torch.optim.Adam, LRScheduler | None]:
        """Adam, and the scheduler to step after it every step (None: a constant rate)."""
        adam = torch.optim.Adam(params, lr=lr)
        if not self.lr_warmup:
            return adam, None
        return adam, LinearLR(adam, LR_WARMUP_START, 1.0, total_iters=self.lr_warmup)

    def step(self, model: nn.Module, batch: Any, optimizer: torch.optim.Optimizer,
             schedule: LRScheduler | None) -> torch.Tensor:
        """One training step on ``batch``; its loss back, detached and left on the device
        (reading it would synchronise inside the timed steps)."""
        optimizer.zero_grad()
        loss = self.loss(model, batch)
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
        return loss.detach()


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
                        transformer_model.loss, functools.partial(transformer_model.floor, t),
                        transformer_model.grad_bytes(t),
                        f"transformer: {t.layers} layers x width {t.width}, {t.heads} heads, "
                        f"mlp {t.ffn}x, vocab {t.vocab} ({transformer_model.SOURCE_TOKENS} "
                        f"in the source), seq {t.seq}", LR_WARMUP[model])
    s = dlrm
    return Workload(functools.partial(dlrm_model.build_model, s),
                    functools.partial(dlrm_model.make_batches, s), dlrm_loss,
                    functools.partial(dlrm_model.floor, s), dlrm_model.grad_bytes(s),
                    f"dlrm: {s.tables} tables x {s.rows} rows x {s.dim}, bag {s.bag}",
                    LR_WARMUP[model])
