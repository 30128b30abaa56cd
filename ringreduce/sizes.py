"""Sizes as the command lines take them (the bench's ``-b``/``-e``, the model's ``--sizes``).

Stdlib only: the model (ringreduce.model) imports it and must not pull torch in.
"""

from __future__ import annotations

import argparse
import re

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}  # nccl-tests: powers of 1024
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)B?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size as the command lines take it: ``64M`` -> 67108864, ``1.5G``, ``4096``
    (powers of 1024, like nccl-tests' -b/-e); for argparse's ``type=``."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: expected a number with an optional K, M or G suffix, e.g. 64M")
    return int(float(match[1]) * _SIZE_UNITS[match[2].upper()])
