"""``python -m ringreduce.bench``: the benchmark's entry point (ringreduce/benchmark/)."""

from __future__ import annotations

from ringreduce.benchmark.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
