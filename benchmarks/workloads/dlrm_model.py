"""The DLRM-style model and data of the DDP benchmark (dlrm.py): the same weights and
batches in every mode, from a seed, so the modes' loss curves must agree.

The model: dense features through a bottom MLP; several dense (not sparse-gradient),
replicated nn.EmbeddingBag tables (mode sum, a fixed number of ids per bag); a
dot-product interaction of the bottom output with every pooled embedding; a top MLP to
one click logit. The data: per rank and step, dense features N(0, 1); ids skewed
towards low rows (u**3 of the table), so hot rows recur and can be learnt; clicks drawn
from a hidden :class:`Teacher` (a fixed-seed logistic model of the dense features and a
score per row), so the loss falls towards a known floor: the teacher's own loss on the
same samples, the mean entropy of its click probabilities (:func:`floor`).
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass(frozen=True)
class Spec:
    """Model shape. Gradient bytes: about tables * rows * dim * 4 (the MLPs add ~1 MB)."""

    tables: int = 8
    rows: int = 125_000
    dim: int = 32
    bag: int = 4  # ids per bag (DLRM's pooling factor)
    dense: int = 13  # Criteo's dense feature count
    bottom: tuple[int, ...] = (512, 256)
    top: tuple[int, ...] = (512, 256)


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])  # the caller decides what follows the last layer


class DLRM(nn.Module):
    """forward(dense (B, F), ids (T, B, bag)) -> click logits (B,)."""

    pairs: torch.Tensor
    """The (i, j) index pairs of the feature interactions, i < j (a buffer)."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.bottom = mlp([spec.dense, *spec.bottom, spec.dim])
        self.tables = nn.ModuleList(nn.EmbeddingBag(spec.rows, spec.dim, mode="sum")
                                    for _ in range(spec.tables))
        pairs = torch.triu_indices(spec.tables + 1, spec.tables + 1, offset=1)
        self.register_buffer("pairs", pairs, persistent=False)
        self.top = mlp([spec.dim + pairs.shape[1], *spec.top, 1])

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bottom(dense))
        z = torch.stack([x, *(table(ids[t]) for t, table in enumerate(self.tables))], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def build_model(spec: Spec, seed: int) -> DLRM:
    """DLRM's initialisation from a private generator: the same weights in every mode,
    whatever else drew from torch's global generator."""
    model, g = DLRM(spec), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.EmbeddingBag):
                bound = module.num_embeddings ** -0.5
                module.weight.uniform_(-bound, bound, generator=g)
            elif isinstance(module, nn.Linear):
                fan_out, fan_in = module.weight.shape
                module.weight.normal_(0.0, (2.0 / (fan_in + fan_out)) ** 0.5, generator=g)
                module.bias.normal_(0.0, fan_out ** -0.5, generator=g)
    return model


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


TEACHER_SEED = 7
"""One teacher for every run seed, so seeds differ in weights and samples only."""
TEACHER_SCALE = 3.0
"""The teacher's logit is this times a unit-variance score: its clicks are neither coin
flips nor certain; the floor is E H(sigmoid(3 z)) = 0.36 for z ~ N(0, 1), measured 0.37
on the default model's batches."""


@dataclasses.dataclass(frozen=True)
class Teacher:
    """logit = TEACHER_SCALE * (dense . w + sum over tables of the bag's mean row score
    * sqrt(bag / tables)) / sqrt(2): the dense and the row parts have unit variance each
    (a bag's mean of ``bag`` N(0, 1) scores has variance 1 / bag), so half of what
    decides a click is in the embeddings and half in the bottom MLP's input."""

    w_dense: torch.Tensor  # (dense,), N(0, 1 / dense)
    row_score: torch.Tensor  # (tables, rows), N(0, 1)

    def logits(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """dense (B, F), ids (T, B, bag) -> (B,)"""
        tables, _, bag = ids.shape
        table = torch.arange(tables, device=ids.device)[:, None, None]
        rows = self.row_score.to(ids.device)[table, ids].mean(2).sum(0) * (bag / tables) ** 0.5
        return TEACHER_SCALE * (dense @ self.w_dense.to(dense.device) + rows) / 2 ** 0.5

    def to(self, device: torch.device) -> Teacher:
        return Teacher(self.w_dense.to(device), self.row_score.to(device))


def teacher(spec: Spec) -> Teacher:
    g = torch.Generator().manual_seed(TEACHER_SEED)
    return Teacher(torch.randn(spec.dense, generator=g) / spec.dense ** 0.5,
                   torch.randn(spec.tables, spec.rows, generator=g))


def make_batches(spec: Spec, steps: int, batch: int, seed: int, rank: int,
                 device: torch.device) -> list[Batch]:
    """Every step's (dense, ids, clicks) of this rank, made before any timing; each
    click is drawn with the teacher's probability. Drawn on ``device`` by its own
    generator: on the host, four ranks drawing 1000 steps of batch 2048 took longer
    than 175 s (every rank's torch threads on the same cores), more than training."""
    hidden = teacher(spec).to(device)
    g = torch.Generator(device=device).manual_seed(seed * 100_003 + 1 + rank)
    batches = []
    for _ in range(steps):
        dense = torch.randn(batch, spec.dense, generator=g, device=device)
        skew = torch.rand(spec.tables, batch, spec.bag, generator=g, device=device) ** 3
        ids = (skew * spec.rows).long()
        clicks = torch.bernoulli(torch.sigmoid(hidden.logits(dense, ids)), generator=g)
        batches.append((dense, ids, clicks))
    return batches


def floor(spec: Spec, batches: list[Batch]) -> float:
    """The teacher's mean binary cross-entropy on these samples' click probabilities
    (their mean entropy): the expected loss of a model that has learnt the teacher."""
    if not batches:
        return 0.0
    hidden = teacher(spec).to(batches[0][0].device)
    total = torch.zeros((), dtype=torch.float64, device=batches[0][0].device)
    for dense, ids, _ in batches:
        logits = hidden.logits(dense, ids).double()
        total += F.binary_cross_entropy_with_logits(logits, torch.sigmoid(logits))
    return float(total) / len(batches)  # one synchronisation, not one a batch


def grad_bytes(spec: Spec) -> int:
    """fp32 gradient bytes per step: every parameter (all are dense and replicated)."""
    small = DLRM(dataclasses.replace(spec, rows=1))  # the MLPs, without allocating tables
    mlps = sum(p.numel() for name, p in small.named_parameters()
               if not name.startswith("tables."))
    return 4 * (mlps + spec.tables * spec.rows * spec.dim)
