"""ringreduce: hierarchical (Fairring-style) all-reduce for PyTorch data parallelism.

Nothing here touches CUDA at import time.
"""

from __future__ import annotations

from . import backend as _backend
from .api import all_reduce, release_cached
from .config import Config
from .engine import Communicator
from .errors import RingReduceError
from .hook import ddp_hook
from .topology import Topology

_backend.register()  # torch.distributed backend "ringreduce"; touches no GPU

__all__ = ["Communicator", "Config", "RingReduceError", "Topology", "all_reduce", "ddp_hook",
           "release_cached"]
