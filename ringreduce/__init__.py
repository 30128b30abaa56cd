"""ringreduce: hierarchical (Fairring-style) all-reduce for PyTorch data parallelism.

Nothing here touches CUDA at import time.
"""

from __future__ import annotations

from ringreduce import ddp, fsdp
from ringreduce.config import Config
from ringreduce.engine import Communicator
from ringreduce.errors import RingReduceError
from ringreduce.integrations import backend as _backend
from ringreduce.integrations.api import all_reduce, release_cached
from ringreduce.integrations.hook import ddp_hook
from ringreduce.plan.topology import Topology

_backend.register()  # torch.distributed backend "ringreduce"; touches no GPU

__all__ = ["Communicator", "Config", "RingReduceError", "Topology", "all_reduce", "ddp",
           "ddp_hook", "fsdp", "release_cached"]
