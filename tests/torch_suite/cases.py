"""torch's ``DistributedTest._DistTestBase`` cases as one unittest class, run on a chosen
process-group backend. Imported by the worker and (spawn, fork server) by every rank.

How ringreduce is presented to torch's suite: the module reads ``BACKEND`` once at import
and uses the string twice, in decorators that gate cases (``BACKEND != "gloo"`` ...) and in
test bodies that pick the device path (``if BACKEND == "gloo": CPU model``, ``if BACKEND ==
"nccl": rank_to_GPU``). ringreduce *is* gloo (CPU tensors) or NCCL (CUDA tensors) with the
all-reduce replaced, so ``BACKEND`` is the backend it stands on, in both runs: the same
cases are selected and the same code paths taken as for the reference. Only the default
process group differs: ``_run`` below (torch's ``TestDistBackend._run`` with that one
change) creates it as ``RR_SUITE_PG`` ("ringreduce", or the reference itself). Groups the
tests make with ``dist.new_group()`` inherit it; a test passing ``backend=BACKEND`` gets a
plain gloo/NCCL group, and a test asserting ``get_backend() == BACKEND`` sees "ringreduce"
(listed in ``selection.NOT_PASSED`` when it happens). The suite's custom-backend hook
(``DistTestCases.backend_feature["plugin"]``) only admits a backend to
``require_backend_is_available``; it would still skip every gloo- and NCCL-gated case, so it
is not used.

CUDA (``RR_SUITE_DEVICE=cuda``), one GPU (``RR_SUITE_GPUS=1``): every rank runs on
``cuda:0`` (4 ranks on one GPU under MPS, one NCCL host id each). The suite maps rank -> GPU
through ``init_multigpu_helper`` and skips on GPU counts through four decorators; they are
replaced *before* torch's module binds them, so that the map says device 0 for every rank
and the decorators ask for one GPU. Cases that index devices by rank themselves
(``.to(rank)``, ``device_ids=[rank]``, ``.cuda(rank)``, as the comm-hook parity tests do)
then fail with an invalid device ordinal on the reference too, and so never count against
ringreduce. With 4 GPUs (``RR_SUITE_GPUS=4``) nothing is replaced: rank r on ``cuda:r``,
one NCCL host id per virtual machine, and those cases run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal import common_distributed

import ringreduce  # noqa: F401  (registers "ringreduce" in every rank before init)
from ringreduce.integrations.backend import RingReduceGroup

GROUP_BACKEND = os.environ["RR_SUITE_PG"]
DEVICE = os.environ["RR_SUITE_DEVICE"]
START_METHOD = os.environ["RR_SUITE_START"]  # "forkserver" or "spawn"
SHARED_GPU = os.environ.get("RR_SUITE_GPUS", "1") == "1"
"""CUDA: every rank on ``cuda:0``; else rank r on ``cuda:r``, as torch's suite has it."""
ONE_GPU = 0
RANKS_PER_MACHINE = 2


def _needs_one_gpu(func: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not torch.cuda.is_available():
            sys.exit(common_distributed.TEST_SKIPS["no_cuda"].exit_code)
        return func(*args, **kwargs)
    return wrapper


def _every_rank_on_one_gpu(world_size: int, backend: str) -> dict[int, list[int]]:
    return {rank: [ONE_GPU] for rank in range(world_size)}


def _share_one_gpu() -> None:
    """Make torch's suite put every rank on ``cuda:0`` (see the module docstring)."""
    common_distributed.init_multigpu_helper = _every_rank_on_one_gpu
    common_distributed.skip_if_no_gpu = _needs_one_gpu
    common_distributed.skip_if_lt_x_gpu = lambda x, **_: _needs_one_gpu
    common_distributed.nccl_skip_if_lt_x_gpu = lambda backend, x: _needs_one_gpu
    common_distributed.require_n_gpus_for_nccl_backend = lambda n, backend: _needs_one_gpu


if DEVICE == "cuda" and SHARED_GPU:
    _share_one_gpu()

from torch.testing._internal.distributed import distributed_test as dt  # noqa: E402


class SuiteCase(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
    """What test_distributed_spawn.py's ``TestDistBackendWithSpawn`` is, with the default
    group created on ``GROUP_BACKEND``."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def _spawn_processes(self) -> None:
        # torch spawns every rank afresh: importing torch, its suite and ringreduce took
        # ~8 s of a case's ~10 on two cores. On CPU a fork server that imported them once
        # (``worker.py`` preloads this module) forks each rank instead: still a new
        # process per rank and case, in a fraction of the time. CUDA keeps spawn (the
        # driver's default there): CUDA does not survive a fork once the forking process
        # has initialised it, and whether importing torch's suite does (the driver asks
        # torch to count devices through NVML) has not been tried on a GPU. A rank has
        # the environment of the process it came from, not ours: setUp's fresh TEMP_DIR
        # (the suite's file barrier) travels as an argument.
        context = torch.multiprocessing.get_context(START_METHOD)
        temp_dir = os.environ["TEMP_DIR"]

        def process(**options: Any) -> Any:
            options["kwargs"] = {**options.get("kwargs", {}), "temp_dir": temp_dir}
            return context.Process(**options)

        self._start_processes(process)

    def tearDown(self) -> None:
        self.engine_ops = _read_engine_ops(os.environ["TEMP_DIR"], int(self.world_size))
        super().tearDown()  # removes TEMP_DIR
        # torch's setUp leaves the ranks' FileStore file behind (delete=False).
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.file_name)

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any,
             temp_dir: str = "", **kwargs: Any) -> None:
        os.environ["TEMP_DIR"] = temp_dir
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        if DEVICE == "cuda" and SHARED_GPU:
            # NCCL refuses two ranks with one host id on one GPU.
            os.environ["NCCL_HOSTID"] = f"suite-rank{rank}"
            torch.cuda.set_device(ONE_GPU)
        elif DEVICE == "cuda":
            # One GPU per rank: NCCL sees the virtual machines as hosts, as
            # RINGREDUCE_MACHINES=2 splits them (contiguous ranks).
            os.environ["NCCL_HOSTID"] = f"suite-vm{rank // RANKS_PER_MACHINE}"
            torch.cuda.set_device(rank)
        seconds = dt.CUSTOM_PG_TIMEOUT.get(test_name, dt.default_pg_timeout)
        dist.init_process_group(init_method=self.init_method, backend=GROUP_BACKEND,
                                world_size=int(self.world_size), rank=rank,
                                timeout=timedelta(seconds=seconds))
        self._barrier()
        self.run_test(test_name, pipe)  # exits the process unless the case passed here
        _write_engine_ops(temp_dir, rank)
        self._barrier()
        dist.destroy_process_group()
        sys.exit(0)


def _write_engine_ops(temp_dir: str, rank: int) -> None:
    """How many all-reduces ringreduce's engines ran in this rank (groups still alive):
    proof that a passed case went through the engine, not only through gloo/NCCL."""
    groups = [g for g in dist.distributed_c10d._world.pg_map if isinstance(g, RingReduceGroup)]
    if groups:
        ops = sum(e.op_number for g in groups for e in g._engines.values())
        with open(os.path.join(temp_dir, f"engine_ops.{rank}"), "w") as f:
            f.write(str(ops))


def _read_engine_ops(temp_dir: str, world_size: int) -> list[int] | None:
    """Per rank, what ``_write_engine_ops`` wrote; None when no rank wrote."""
    paths = [os.path.join(temp_dir, f"engine_ops.{rank}") for rank in range(world_size)]
    if not any(os.path.exists(p) for p in paths):
        return None
    return [int(Path(p).read_text()) if os.path.exists(p) else 0 for p in paths]
