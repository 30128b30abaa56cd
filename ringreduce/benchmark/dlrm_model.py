"""The DLRM-style model and data of the DDP benchmark (dlrm.py): the same weights and
batches in every mode, from a seed, so the modes' loss curves must agree.

The model: dense features through a bottom MLP; several dense (not sparse-gradient),
replicated nn.EmbeddingBag tables (mode sum, a fixed number of ids per bag); a
dot-product interaction of the bottom output with every pooled embedding; a top MLP to
one click logit. The data: per rank and step, dense features N(0, 1); ids skewed
towards low rows (u**3 of the table), so hot rows recur and can be learnt; labels from a
fixed random teacher (a linear function of the dense features plus a random score per
row), so the loss really decreases.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn


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


def make_batches(spec: Spec, steps: int, batch: int, seed: int, rank: int,
                 device: torch.device) -> list[Batch]:
    """Every step's (dense, ids, labels) of this rank, made before any timing."""
    teacher = torch.Generator().manual_seed(seed + 1)  # the same on every rank
    w_dense = torch.randn(spec.dense, generator=teacher) / spec.dense ** 0.5
    row_score = torch.randn(spec.tables, spec.rows, generator=teacher)
    g = torch.Generator().manual_seed(seed * 100_003 + 1 + rank)
    batches = []
    for _ in range(steps):
        dense = torch.randn(batch, spec.dense, generator=g)
        skew = torch.rand(spec.tables, batch, spec.bag, generator=g) ** 3
        ids = (skew * spec.rows).long()
        pooled = torch.stack([row_score[t][ids[t]].mean(1) for t in range(spec.tables)])
        logit = dense @ w_dense + pooled.sum(0) / spec.tables ** 0.5
        labels = (logit > 0).float()
        batches.append((dense.to(device), ids.to(device), labels.to(device)))
    return batches


def grad_bytes(spec: Spec) -> int:
    """fp32 gradient bytes per step: every parameter (all are dense and replicated)."""
    small = DLRM(dataclasses.replace(spec, rows=1))  # the MLPs, without allocating tables
    mlps = sum(p.numel() for name, p in small.named_parameters()
               if not name.startswith("tables."))
    return 4 * (mlps + spec.tables * spec.rows * spec.dim)
