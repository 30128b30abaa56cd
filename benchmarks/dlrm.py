"""DLRM-style DDP training: NCCL against the hook and the backend, same seed, same batches.

The workload lives in ``benchmarks.workloads.dlrm`` (the tests import it from there), its
command line in ``benchmarks.workloads.dlrm_cli``; this script runs that, e.g. under
``benchmarks/emulate.py --script``:

    python3 benchmarks/dlrm.py --modes nccl,hook,backend --json out.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workloads.dlrm_cli import main

if __name__ == "__main__":
    main()
