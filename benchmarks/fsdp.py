"""FSDP2 training of the transformer: plain FSDP2 and native HSDP against ringreduce's
reduce-scatter and replicate all-reduce (exact and int8), same seed, same batches.

The modes and their checks live in ``benchmarks.workloads.fsdp_train``, the command
line, report and ``--merge`` in ``benchmarks.workloads.fsdp_cli``; this script runs
that, e.g. under ``benchmarks/emulate.py --script``:

    python3 benchmarks/emulate.py --physical-gpus 2 --machines 2 --gpus-per-machine 2 \\
        --link-cap 10gbit --script benchmarks/fsdp.py -- --json out.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workloads.fsdp_cli import main

if __name__ == "__main__":
    main()
