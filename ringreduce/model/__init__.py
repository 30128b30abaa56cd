"""A performance model: will ringreduce be faster than NCCL on a given cluster?

Pure planning-side code (stdlib only; matplotlib for ``--plot``): it replays the plan the
engine runs (layout, schedule, the slice-size rule) against alpha-beta stage costs and a
host cost per call and per slice (:mod:`.simulate`), on the plan (one slice or the
pipeline) the engine's construction probe would take (:mod:`.probe`), prices NCCL's ring
and tree with NCCL's own cost model (:mod:`.nccl_cost`: the tuner's pick, the tree as it
runs), and can fit its costs to a benchmark JSON of the user's own (:mod:`.calibrate`,
:mod:`.results`).
``python -m ringreduce.model --help``. Its validation against the repository's committed
measurements is not part of the package: ``python -m benchmarks.model_validation`` from a
checkout (benchmarks/model_validation/).
"""

from __future__ import annotations

from .cluster import PRESETS, Cluster
from .nccl_cost import link_bound_us, nccl_best_us, nccl_time_us, ring_time_us, tree_time_us
from .simulate import Options, ringreduce_time_us

__all__ = ["PRESETS", "Cluster", "Options", "link_bound_us", "nccl_best_us", "nccl_time_us",
           "ring_time_us", "ringreduce_time_us", "tree_time_us"]
