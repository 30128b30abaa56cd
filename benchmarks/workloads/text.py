"""Natural text that every machine with Python has without a download, read as bytes (a
byte-level vocabulary of 256) for a small decoder (transformer_model.Transformer). Two
corpora (``CORPORA``):

- ``stdlib`` (the default): the English that CPython's standard library is written in,
  one document per module (the ``.py`` files under ``sysconfig``'s ``stdlib``, sorted by
  path): its module, class and function docstrings (``ast``) and its comment blocks
  (full-line ``#`` comments, consecutive lines joined), in source order; then the
  Python documentation's topics (``pydoc_data/topics.py``), one document each. Left out:
  the test suites (``test``, ``tests``, ``idle_test``), installed packages
  (``site-packages``), ``pydoc_data`` (its topics come in whole) and ``encodings``
  (~100 generated codec tables with the same boilerplate each). About 3.2 MB in CPython
  3.11-3.13 (docstrings ~1.7 MB, comments ~1.0 MB, topics ~0.5 MB); built in ~2 s.
- ``topics``: the topics alone (79 documents, ~500 KB), the corpus of earlier results.
  Its bytes and checksum are as they were.

Documents, not a cut of one stream, are held out: every ``HELD_OUT``-th document in
corpus order (the first included) is validation, the rest is training, so validation
text was never trained on. Training batches are windows of ``seq + 1`` bytes at random
offsets of the training documents joined by blank lines (per rank and step, from the
rank's own generator); validation is the mean next-byte cross-entropy over the held-out
stream cut into consecutive windows. Another CPython (or a distribution that splits off
``idlelib`` or ``tkinter``) gives other text: ``describe`` names the corpus, the Python
version, the sizes and the checksum, so runs that compare say so.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import re
import sys
import sysconfig
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from . import transformer_model
from .transformer_model import TransformerSpec

HELD_OUT = 8
"""Every 8th document (in corpus order, the first included) is validation: ~8 % of
the bytes."""
SEPARATOR = b"\n\n"
CORPORA = ("stdlib", "topics")
DEFAULT = "stdlib"
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages",
                          "__pycache__", "pydoc_data", "encodings"})
"""Directories of the standard library whose text is no corpus (module docstring)."""
_DEFS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")
_CODING = re.compile(r"^[ \t\f]*#.*?coding[:=]")


@dataclass(frozen=True)
class Corpus:
    name: str
    train: torch.Tensor
    """uint8: the training documents, joined by SEPARATOR."""
    valid: torch.Tensor
    """uint8: the held-out documents, joined alike."""
    documents: int
    checksum: str

    def describe(self) -> str:
        source = ("pydoc_data/topics.py" if self.name == "topics" else
                  "stdlib docstrings, comments and pydoc topics")
        return (f"{source} of Python {sys.version.split()[0]}: {self.documents} documents, "
                f"{self.train.numel():,} training bytes, {self.valid.numel():,} held-out bytes "
                f"(every {HELD_OUT}th document), sha256 {self.checksum[:12]}")


def corpus(name: str = DEFAULT) -> Corpus:
    """The training and held-out bytes of corpus ``name`` (module docstring)."""
    if name not in CORPORA:
        raise ValueError(f"corpus {name!r}: choose one of {', '.join(CORPORA)}")
    docs = topic_documents() if name == "topics" else stdlib_documents() + topic_documents()
    train = SEPARATOR.join(d for i, d in enumerate(docs) if i % HELD_OUT)
    valid = SEPARATOR.join(d for i, d in enumerate(docs) if i % HELD_OUT == 0)
    checksum = hashlib.sha256(train + b"\0" + valid).hexdigest()
    return Corpus(name, _bytes(train), _bytes(valid), len(docs), checksum)


def topic_documents() -> list[bytes]:
    """The Python documentation's topics, sorted by name."""
    from pydoc_data.topics import topics

    return [topics[name].encode("utf-8") for name in sorted(topics)]


def stdlib_documents() -> list[bytes]:
    """One document per module of the standard library with any docstring or comment,
    sorted by path (module docstring)."""
    docs = (module_text(path.read_bytes()) for path in stdlib_sources())
    return [d for d in docs if d]


def stdlib_sources() -> list[Path]:
    """The standard library's ``.py`` files outside SKIPPED_DIRS, sorted by their path
    below the library (the same order on every file system)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        found += [Path(top, f) for f in files if f.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def module_text(source: bytes) -> bytes:
    """A module's docstrings and comment blocks in source order, joined by blank lines;
    empty for a file this Python cannot parse (none in its own library)."""
    try:
        tree = ast.parse(source)
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except (SyntaxError, ValueError):
        return b""
    docstrings = dict(_docstrings(tree))
    inside = {n for first, (last, _) in docstrings.items() for n in range(first, last + 1)}
    lines = source.decode(encoding).splitlines()
    parts = {first: text for first, (_, text) in docstrings.items()}
    parts.update(_comment_blocks(lines, inside))
    return SEPARATOR.join(parts[n].encode("utf-8") for n in sorted(parts))


def _docstrings(node: ast.AST) -> Iterator[tuple[int, tuple[int, str]]]:
    """(first line, (last line, cleaned docstring)) of every module, class and function
    in ``node``, nested ones included. Walks statement bodies only: a docstring is a
    body's first statement, and skipping expressions keeps the walk ~10x faster."""
    if isinstance(node, _DEFS):
        text = ast.get_docstring(node)
        if text:
            expr = node.body[0]
            yield expr.lineno, (expr.end_lineno or expr.lineno, text)
    for field in _BODIES:
        for child in getattr(node, field, None) or ():
            if isinstance(child, ast.AST):
                yield from _docstrings(child)


def _comment_blocks(lines: list[str], skip: set[int]) -> Iterator[tuple[int, str]]:
    """(first line, text) of each run of consecutive full-line comments, ``#`` and the
    indentation stripped; left out: lines in ``skip`` (a docstring's examples), the
    ``#!`` and coding lines and lines without a letter (rulers, bare ``#``)."""
    block: list[str] = []
    first = 0
    for number, line in enumerate(lines, 1):
        text = line.strip()
        comment = text.startswith("#") and number not in skip and not (
            number <= 2 and (text.startswith("#!") or _CODING.match(line)))
        if comment and any(c.isalpha() for c in text):
            if not block:
                first = number
            block.append(text.lstrip("#").strip())
        elif block and not (comment or text.startswith("#")):
            yield first, "\n".join(block)
            block = []
    if block:
        yield first, "\n".join(block)


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
