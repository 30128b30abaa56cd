"""The transformer language model and data of the DDP benchmark (dlrm.py, ``--model
transformer``): the same weights and batches in every mode, from a seed, so the modes'
loss curves must agree.

Its purpose is many gradient buckets per step: every block holds six weight matrices
(separate q, k, v and output projections, the MLP's up and down), each its own
gradient, so at small bucket caps DDP calls the comm hook several times per block and
the all-reduce's per-call host time shows. The model: a pre-norm decoder-only
transformer of torch.nn parts (token embedding + learned positions; ``layers`` blocks
of causal self-attention and a GELU MLP, each behind a LayerNorm on a residual; a final
LayerNorm; an output projection not tied to the embedding, so every parameter is its
own dense gradient); no dropout. The data: per rank and step, sequences of a fixed
random "teacher", a sparse bigram Markov chain (each token has a few likely successors,
the same on every rank), so the loss really decreases; the targets are the tokens
shifted by one.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass(frozen=True)
class TransformerSpec:
    """Model shape. Gradient bytes: about 4 * (12 * layers * width**2 + 2 * vocab * width)
    (the default 24 x 512, vocab 4096: 320 MB)."""

    vocab: int = 4096
    width: int = 512
    layers: int = 24
    heads: int = 8
    seq: int = 128  # tokens per sequence (also the number of learned positions)
    ffn: int = 4  # the MLP's hidden width, as a multiple of ``width``

    def __post_init__(self) -> None:
        small = {k: v for k, v in dataclasses.asdict(self).items() if v < 1}
        if small:
            raise ValueError(f"TransformerSpec: {small} must be at least 1")
        if self.width % self.heads:
            raise ValueError(f"TransformerSpec: width {self.width} is not a multiple of heads "
                             f"{self.heads}; choose heads that divide the width")


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)): pre-norm, causal."""

    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        w, self.heads = spec.width, spec.heads
        self.attn_norm = nn.LayerNorm(w)
        # Four projections rather than one fused qkv: more, smaller gradients, so more
        # buckets at a given cap (the point of this workload).
        self.q, self.k, self.v, self.out = (nn.Linear(w, w) for _ in range(4))
        self.mlp_norm = nn.LayerNorm(w)
        self.up = nn.Linear(w, spec.ffn * w)
        self.down = nn.Linear(spec.ffn * w, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.out(self.attention(self.attn_norm(x)))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Causal multi-head attention, written out rather than through
        F.scaled_dot_product_attention: in fp32 on CUDA that runs the memory-efficient
        kernel, whose backward is non-deterministic, and the modes' loss curves must
        differ by the all-reduce's rounding alone."""
        b, s, w = x.shape
        q, k, v = (p(x).view(b, s, self.heads, w // self.heads).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        scores = q @ k.transpose(2, 3) * (w // self.heads) ** -0.5
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        mixed = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return mixed.transpose(1, 2).reshape(b, s, w)


class Transformer(nn.Module):
    """forward(tokens (B, S), S <= spec.seq) -> logits (B, S, vocab)."""

    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.tokens = nn.Embedding(spec.vocab, spec.width)
        self.positions = nn.Embedding(spec.seq, spec.width)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.layers))
        self.norm = nn.LayerNorm(spec.width)
        self.head = nn.Linear(spec.width, spec.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1],
                                                               device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model(spec: TransformerSpec, seed: int) -> Transformer:
    """GPT-2's initialisation from a private generator (the same weights in every mode,
    whatever else drew from torch's global generator): weights N(0, 0.02), biases 0,
    LayerNorms 1 and 0; the projections into the residual stream (out, down) get
    0.02 / sqrt(2 * layers), so the stream's variance does not grow with depth."""
    model, g = Transformer(spec), torch.Generator().manual_seed(seed)
    residual = 0.02 * (2 * spec.layers) ** -0.5
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Embedding | nn.Linear):
                std = residual if name.endswith((".out", ".down")) else 0.02
                module.weight.normal_(0.0, std, generator=g)
            if isinstance(module, nn.Linear):
                module.bias.zero_()
    return model


Batch = tuple[torch.Tensor, torch.Tensor]

SUCCESSORS = 4  # likely next tokens per token: few enough that the chain can be learnt


def make_batches(spec: TransformerSpec, steps: int, batch: int, seed: int, rank: int,
                 device: torch.device) -> list[Batch]:
    """Every step's (tokens, targets), each (batch, seq), of this rank, made before any
    timing: walks of the teacher chain from uniform first tokens."""
    teacher = torch.Generator().manual_seed(seed + 1)  # the same on every rank
    successors = torch.randint(spec.vocab, (spec.vocab, SUCCESSORS), generator=teacher)
    odds = torch.rand(spec.vocab, SUCCESSORS, generator=teacher) + 0.1  # none near 0
    g = torch.Generator().manual_seed(seed * 100_003 + 1 + rank)
    batches = []
    for _ in range(steps):
        walk = torch.empty(batch, spec.seq + 1, dtype=torch.long)
        walk[:, 0] = torch.randint(spec.vocab, (batch,), generator=g)
        for t in range(spec.seq):
            prev = walk[:, t]
            pick = torch.multinomial(odds[prev], 1, generator=g).squeeze(1)
            walk[:, t + 1] = successors[prev, pick]
        batches.append((walk[:, :-1].to(device), walk[:, 1:].to(device)))
    return batches


def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy of the next token over every position of the batch."""
    tokens, targets = batch
    return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


def grad_bytes(spec: TransformerSpec) -> int:
    """fp32 gradient bytes per step: every parameter (all are dense and replicated),
    counted on the meta device, so nothing of the model's size is allocated."""
    with torch.device("meta"):
        model = Transformer(spec)
    return 4 * sum(p.numel() for p in model.parameters())
