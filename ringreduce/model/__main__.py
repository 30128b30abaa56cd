"""``python -m ringreduce.model``: see :mod:`ringreduce.model.cli`."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
