"""DLRM-style DDP training: NCCL against the hook and the backend, same seed, same batches.

The workload lives in ``benchmarks.workloads.dlrm`` (the tests import it from there), its
command line in ``benchmarks.workloads.dlrm_cli``; this script runs that, e.g. under
``benchmarks/emulate.py --script``:

    python3 benchmarks/dlrm.py --modes nccl,hook,backend --json out.json
"""

from __future__ import annotations

import faulthandler
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workloads.dlrm_cli import main

if __name__ == "__main__":
    # `kill -USR1` prints every thread's stack (gpu.sh's train suite does before a
    # process set's limit), so a run that does not end leaves where it stood.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    main()
