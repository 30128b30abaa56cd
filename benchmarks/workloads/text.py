"""Natural text that every machine has without a download: the Python documentation's
English topics that CPython ships as ``pydoc_data/topics.py`` (79 documents, ~466 KB in
CPython 3.11), read as bytes (a byte-level vocabulary of 256) for a small decoder
(transformer_model.Transformer).

Documents, not a cut of one stream, are held out: every ``HELD_OUT``-th document in
sorted topic order (the first included) is validation, the rest is training, so
validation text was never trained on. Training batches are windows of ``seq + 1``
bytes at random offsets of the training documents joined by blank lines (per rank and
step, from the rank's own generator); validation is the mean next-byte cross-entropy
over the held-out stream cut into consecutive windows. A different CPython may ship a
different text: ``describe`` names the Python version and the corpus' size and checksum,
so runs that compare say so.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from . import transformer_model
from .transformer_model import TransformerSpec

HELD_OUT = 8
"""Every 8th document (sorted by topic name, the first included) is validation: 10 of
79, 37 KB of 466 in CPython 3.11 (8 %)."""
SEPARATOR = b"\n\n"


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor
    """uint8: the training documents, joined by SEPARATOR."""
    valid: torch.Tensor
    """uint8: the held-out documents, joined alike."""
    checksum: str

    def describe(self) -> str:
        return (f"pydoc_data/topics.py of Python {sys.version.split()[0]}: "
                f"{self.train.numel():,} training bytes, {self.valid.numel():,} held-out bytes "
                f"(every {HELD_OUT}th document), sha256 {self.checksum[:12]}")


def corpus() -> Corpus:
    """The training and held-out bytes (module docstring)."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    docs = [topics[name].encode("utf-8") for name in names]
    train = SEPARATOR.join(d for i, d in enumerate(docs) if i % HELD_OUT)
    valid = SEPARATOR.join(d for i, d in enumerate(docs) if i % HELD_OUT == 0)
    checksum = hashlib.sha256(train + b"\0" + valid).hexdigest()
    return Corpus(_bytes(train), _bytes(valid), checksum)


def _bytes(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def spec(width: int = 256, layers: int = 4, heads: int = 4, seq: int = 128) -> TransformerSpec:
    """A byte-level decoder: vocabulary 256."""
    return TransformerSpec(vocab=256, width=width, layers=layers, heads=heads, seq=seq)


def batches(data: torch.Tensor, seq: int, steps: int, batch: int, seed: int, rank: int,
            device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every step's (tokens, targets), each (batch, seq) int64 on ``device``: windows at
    random offsets drawn by this (seed, rank)'s generator, made before any timing."""
    g = torch.Generator().manual_seed(seed * 100_003 + 1 + rank)
    data = data.to(device)
    span = torch.arange(seq + 1, device=device)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - seq - 1, (batch, 1), generator=g).to(device)
        window = data[starts + span].long()
        out.append((window[:, :-1], window[:, 1:]))
    return out


@torch.no_grad()
def validation_loss(model: nn.Module, valid: torch.Tensor, seq: int, device: torch.device,
                    batch: int = 32) -> float:
    """Mean next-byte cross-entropy (nats) over the held-out bytes, in consecutive
    windows of ``seq`` predictions (the tail that fills no window is left out)."""
    windows = (valid.numel() - 1) // seq
    data = valid.to(device)
    tokens = data[:windows * seq].view(windows, seq).long()
    targets = data[1:windows * seq + 1].view(windows, seq).long()
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, windows, batch):
        logits = model(tokens[i:i + batch])
        total += float(F.cross_entropy(logits.flatten(0, 1), targets[i:i + batch].flatten(),
                                       reduction="sum"))
    model.train(was)
    return total / (windows * seq)


def build(spec: TransformerSpec, seed: int) -> nn.Module:
    return transformer_model.build_model(spec, seed)
