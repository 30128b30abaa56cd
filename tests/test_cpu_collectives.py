"""Hierarchical reduce_scatter and all_gather on the CPU path (gloo), bit-exact, on
contiguous and interleaved machine layouts, with the route each size takes."""

from __future__ import annotations

import pytest
import torch

import ringreduce

from .cases import block_sweep
from .multiproc import run_test_ranks

CPU = torch.device("cpu")


def _routes(comm: ringreduce.Communicator) -> list[str]:
    return [r.route for r in comm._res.guard.recorder._records]


def _sweep_worker(rank: int, world: int, machines: int | None) -> None:
    with ringreduce.Communicator(machines=machines, min_bytes=0) as comm:
        assert block_sweep(comm, [0, 1, 3, 1000], CPU) > 0
        hierarchical = comm.topology.machines > 1 and comm.topology.devices_per_machine > 1
        assert set(_routes(comm)) == {"hierarchical" if hierarchical else "flat"}
    with ringreduce.Communicator(machines=machines, min_bytes=4096) as comm:
        block_sweep(comm, [10, 1000], CPU, dtypes=(torch.float32,))
        # 4 x 10 x 4 bytes stays flat; 4 x 1000 x 4 goes hierarchical when it can.
        assert _routes(comm)[:2] == ["flat", "flat"]
        if hierarchical:
            assert _routes(comm)[-2:] == ["hierarchical", "hierarchical"]


@pytest.mark.parametrize("machines,world", [
    pytest.param(2, 4, id="2x2"), pytest.param(3, 6, id="3x2", marks=pytest.mark.slow),
    pytest.param(1, 4, id="1x4"), pytest.param(4, 4, id="4x1")])
def test_block_collectives_are_exact(machines: int, world: int) -> None:
    run_test_ranks(_sweep_worker, world, machines)


def test_interleaved_machines_keep_rank_order() -> None:
    """Hosts alternate by rank (0,2 on one machine, 1,3 on the other): blocks must
    still land in group-rank order."""
    env = [{"NCCL_HOSTID": f"host{r % 2}"} for r in range(4)]
    run_test_ranks(_sweep_worker, 4, None, env=env)


def _bad_input_worker(rank: int, world: int) -> None:
    with ringreduce.Communicator(machines=2, min_bytes=0) as comm:
        with pytest.raises(ValueError, match=r"input has 7 elements, it must have world_size "
                                             r"x 2 = 8"):
            comm.reduce_scatter(torch.zeros(2), torch.zeros(7))
        with pytest.raises(ValueError, match=r"output has 9 elements, it must have world_size "
                                             r"x 2 = 8"):
            comm.all_gather(torch.zeros(9), torch.zeros(2))
        with pytest.raises(TypeError, match=r"output is torch.float64 but input is torch.float32"):
            comm.reduce_scatter(torch.zeros(2, dtype=torch.float64), torch.zeros(8))
        with pytest.raises(ValueError, match="contiguous"):
            comm.all_gather(torch.zeros(8, 2).t(), torch.zeros(4))
        out = torch.zeros(3)
        comm.reduce_scatter(out, torch.ones(12))  # still usable: nothing was sent
        assert torch.equal(out, torch.full((3,), 4.0))
    with pytest.raises(ringreduce.RingReduceError, match="closed"):
        comm.all_gather(torch.zeros(8), torch.zeros(2))


def test_bad_block_shapes_raise_before_communicating() -> None:
    run_test_ranks(_bad_input_worker, 4)
