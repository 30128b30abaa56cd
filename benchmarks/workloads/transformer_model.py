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
own dense gradient); no dropout. The data: per rank and step, walks of a fixed random
Markov source (:class:`MarkovSource`, the same for every seed and rank: each of the
first SOURCE_TOKENS tokens has a few likely successors among them), so the loss falls
towards a known floor, the source's entropy per token (:func:`entropy_floor`), which no
model can beat; the targets are the tokens shifted by one.
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
SOURCE_TOKENS = 32
"""The source emits the first 32 tokens of the vocabulary only, so a deep model learns
it in tens of steps. Measured on an H100, 32 sequences x 128 tokens a step, 60 steps:
over 32 tokens, Adam at 3e-4 with a 10-step warm-up takes 24 x 512 and 48 x 512 models
from 8.4 to 1.4 and 1.6 (floor 1.21); over all 4096, a 24 x 512 model is still near the
unigram's loss (8.1) after 60 steps at every Adam setting tried (1e-3 to 3e-4, with and
without warm-up), at 7.7 at best after 120; over 128 or 256 tokens (Adam 3e-4, no warm-up)
it lingers at the unigram's loss too (4.7, 5.4). The all-reduce is the same either way:
the embedding's and the output layer's gradients are dense, unused rows included."""
SOURCE_SEED = 7
"""The Markov source's seed: one source for every run seed, so seeds differ in weights
and samples only, and their losses share one floor."""


@dataclasses.dataclass(frozen=True)
class MarkovSource:
    """A first-order Markov chain over tokens 0 .. n-1: token i is followed by
    ``successors[i, k]`` with probability ``probs[i, k]`` (rows sum to 1; a successor
    may appear twice in a row, its probabilities then add)."""

    successors: torch.Tensor  # (n, k) int64
    probs: torch.Tensor  # (n, k) float64

    def to(self, device: torch.device) -> MarkovSource:
        return MarkovSource(self.successors.to(device), self.probs.to(device))

    def sample(self, batch: int, length: int, g: torch.Generator) -> torch.Tensor:
        """``batch`` walks of ``length`` tokens from uniform first tokens, (batch, length),
        on the source's device (``g`` must be a generator of that device)."""
        device = self.successors.device
        walk = torch.empty(batch, length, dtype=torch.long, device=device)
        walk[:, 0] = torch.randint(self.successors.shape[0], (batch,), generator=g,
                                   device=device)
        for t in range(1, length):
            prev = walk[:, t - 1]
            pick = torch.multinomial(self.probs[prev], 1, generator=g).squeeze(1)
            walk[:, t] = self.successors[prev, pick]
        return walk

    def row_entropy(self) -> torch.Tensor:
        """Each token's next-token entropy in nats, (n,): -sum_j p_j log q_j, where
        q_j is the total probability of slot j's successor (so repeats count once)."""
        same = self.successors[:, :, None] == self.successors[:, None, :]
        merged = (same * self.probs[:, None, :]).sum(2)
        return -(self.probs * merged.log()).sum(1)


def markov_source(vocab: int, seed: int = SOURCE_SEED) -> MarkovSource:
    """The benchmark's source for a model of ``vocab`` tokens: over the first
    SOURCE_TOKENS of them, SUCCESSORS random successors each, random odds."""
    tokens = min(vocab, SOURCE_TOKENS)
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(tokens, (tokens, SUCCESSORS), generator=g)
    odds = torch.rand(tokens, SUCCESSORS, generator=g, dtype=torch.float64) + 0.1  # none near 0
    return MarkovSource(successors, odds / odds.sum(1, keepdim=True))


def entropy_floor(source: MarkovSource, seq: int) -> float:
    """The cross-entropy, in nats, of the best possible model on ``seq``-token walks
    from uniform first tokens: the mean over positions t < seq of the next token's
    entropy given token t, sum_i P(token t = i) H(row i). A Markov source's future
    depends on the last token alone, so longer contexts cannot do better."""
    tokens = source.successors.shape[0]
    entropy = source.row_entropy()
    state = torch.full((tokens,), 1.0 / tokens, dtype=torch.float64)
    total = 0.0
    for _ in range(seq):
        total += float(state @ entropy)
        state = torch.zeros_like(state).index_add_(
            0, source.successors.flatten(), (state[:, None] * source.probs).flatten())
    return total / seq


def make_batches(spec: TransformerSpec, steps: int, batch: int, seed: int, rank: int,
                 device: torch.device) -> list[Batch]:
    """Every step's (tokens, targets), each (batch, seq), of this rank, made before any
    timing: walks of the Markov source, drawn on ``device`` by its own generator (on the
    host, ranks sharing its cores draw long runs slower than they train: the DLRM
    batches' measurement, dlrm_model.make_batches)."""
    source = markov_source(spec.vocab).to(device)
    g = torch.Generator(device=device).manual_seed(seed * 100_003 + 1 + rank)
    batches = []
    for _ in range(steps):
        walk = source.sample(batch, spec.seq + 1, g)
        batches.append((walk[:, :-1], walk[:, 1:]))
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


def floor(spec: TransformerSpec, batches: list[Batch]) -> float:
    """The source's entropy per token on ``spec.seq``-token walks (the batches are its
    samples, so they need not be read)."""
    return entropy_floor(markov_source(spec.vocab), spec.seq)
