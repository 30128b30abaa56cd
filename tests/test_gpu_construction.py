"""GPU: the backend's construction paths on CUDA (NCCL communicators built after the
settings are compared): a subgroup the machine count does not divide takes NCCL's flat
all-reduce, exactly; settings that differ fail on every rank before NCCL is touched and
a corrected retry works; the group's timeout is the engine's deadline; a strided tensor
is refused and nothing is written. Skipped without CUDA or nccl4py."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist

from ringreduce.integrations.backend import RingReduceGroup

from .gpu import GPU_MARKS, SMALL, gpu_env
from .multiproc import run_test_ranks

pytestmark = GPU_MARKS


def _construction_worker(rank: int, world: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    three = dist.new_group(list(range(world - 1)))
    if rank < world - 1:
        t = torch.full((5000,), float(rank + 1), device=dev)
        dist.all_reduce(t, group=three)
        assert torch.equal(t, torch.full_like(t, float(sum(range(1, world)))))
        assert isinstance(three, RingReduceGroup)
        engine = three.communicator(dev)
        assert engine.topology.machines == 1
        assert {r.route for r in engine._res.guard.recorder._records} == {"flat"}
    buf = torch.arange(1001, dtype=torch.float32, device=dev)
    before = buf.clone()
    with pytest.raises(ValueError, match="needs a contiguous tensor"):
        dist.all_reduce(buf[::2])
    assert torch.equal(buf, before)
    # A setting on one rank only: every rank fails before any NCCL communicator exists.
    odd = dist.new_group(timeout=datetime.timedelta(seconds=30))
    os.environ["RINGREDUCE_SLICE_BYTES"] = "8192" if rank == 1 else "4096"
    with pytest.raises(ValueError, match=r"slice_bytes \(RINGREDUCE_SLICE_BYTES\): ranks "):
        dist.all_reduce(torch.ones(8, device=dev), group=odd)
    os.environ["RINGREDUCE_SLICE_BYTES"] = "4096"
    t = torch.full((1 << 16,), float(rank), device=dev)
    dist.all_reduce(t, group=odd)  # the corrected retry, hierarchical
    assert torch.equal(t, torch.full_like(t, float(sum(range(world)))))
    assert isinstance(odd, RingReduceGroup)
    engine = odd.communicator(dev)
    assert engine.config.timeout_s == 30.0 and engine.topology.machines == SMALL[0]
    routes = {r.route.split(" (")[0] for r in engine._res.guard.recorder._records}
    plan = engine._res.plan.at(t.numel() * t.element_size())  # the probe's, at this size
    assert routes == {plan.plan if plan.unsliced else "flat" if plan.flat
                      else "hierarchical"}, routes
    torch.cuda.synchronize()


def test_gpu_backend_construction_subgroups_settings_and_strided_tensors() -> None:
    env = [{**e, "RINGREDUCE_MIN_BYTES": "0"} for e in gpu_env(*SMALL)]
    run_test_ranks(_construction_worker, SMALL[0] * SMALL[1], backend="ringreduce", env=env,
                   timeout=240)
