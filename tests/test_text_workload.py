"""benchmarks/workloads/text.py: the natural-text corpus every CPython ships, split by
document, its batches and its validation loss (CPU, no processes)."""

from __future__ import annotations

import math

import torch

from benchmarks.workloads import text

CPU = torch.device("cpu")


def test_held_out_documents_are_whole_and_never_trained_on() -> None:
    from pydoc_data.topics import topics

    corpus = text.corpus()
    names = sorted(topics)
    held = [topics[n].encode() for i, n in enumerate(names) if i % text.HELD_OUT == 0]
    train = bytes(corpus.train.numpy())
    assert bytes(corpus.valid.numpy()) == text.SEPARATOR.join(held)
    for doc in held:
        assert doc not in train
    total = sum(len(d.encode()) for d in topics.values())
    sep = len(text.SEPARATOR) * (len(names) - 2)
    assert corpus.train.numel() + corpus.valid.numel() == total + sep
    assert 0.05 < corpus.valid.numel() / total < 0.2


def test_batches_are_windows_of_the_text_per_seed_and_rank() -> None:
    data = text.corpus().train
    a, b, c = (text.batches(data, 16, 3, 4, seed, rank, CPU)
               for seed, rank in ((0, 1), (0, 1), (0, 2)))
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0][0], c[0][0])
    tokens, targets = a[0]
    assert tokens.shape == targets.shape == (4, 16)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    raw = bytes(data.numpy())
    assert bytes(tokens[0].tolist()) + bytes([int(targets[0, -1])]) in raw


def test_an_untrained_model_predicts_bytes_uniformly() -> None:
    spec = text.spec(width=32, layers=1, heads=2, seq=32)
    model = text.build(spec, 0)
    loss = text.validation_loss(model, text.corpus().valid[:2000], spec.seq, CPU)
    assert abs(loss - math.log(256)) < 0.05, loss
