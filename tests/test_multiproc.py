"""tests/multiproc.py's rank pool: cases share processes, are cleaned up after, and a
case that fails, hangs or kills a rank fails alone, naming itself."""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.distributed as dist

import ringreduce
from tests.multiproc import run_test_ranks

_left: list[object] = []
"""What a case leaves behind in its rank processes, for the next case to inspect."""


def _leave_things(rank: int, world: int) -> None:
    os.environ["RR_TEST_LEFT_BEHIND"] = "1"
    group = dist.new_group([0, 1])
    comm = ringreduce.Communicator()
    t = torch.ones(8)
    ringreduce.all_reduce(t)
    _left.extend([comm, group, torch.rand(())])


def _find_them_cleaned(rank: int, world: int) -> None:
    # The same processes (the pool), with nothing of the previous case left running.
    comm, _, first_random = _left
    assert comm._closed, "the previous case's Communicator was left open"
    assert list(dist.distributed_c10d._world.pg_map) == [dist.group.WORLD]
    assert not ringreduce.integrations.api._communicators
    assert "RR_TEST_LEFT_BEHIND" not in os.environ
    assert os.environ.get("RR_TEST_CASE_ONLY") == str(rank)
    assert torch.equal(torch.rand(()), first_random), "torch's seed was not reset"
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(sum(range(world)))))
    _left.clear()


def test_cases_share_processes_and_are_cleaned_up_after() -> None:
    run_test_ranks(_leave_things, 2)
    run_test_ranks(_find_them_cleaned, 2, env=[{"RR_TEST_CASE_ONLY": str(r)} for r in range(2)])


def _sees_parent_env(rank: int, world: int) -> None:
    assert os.environ.get("RR_TEST_FROM_PARENT") == "yes"


def test_the_parents_environment_reaches_running_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh ranks inherited what the test had set; pooled ones get it with each case."""
    run_test_ranks(_find_nothing, 2)  # the pool exists before the variable does
    monkeypatch.setenv("RR_TEST_FROM_PARENT", "yes")
    run_test_ranks(_sees_parent_env, 2)


def _find_nothing(rank: int, world: int) -> None:
    pass


def _describe_backend(rank: int, world: int, want: str) -> None:
    comm = dist.group.WORLD.communicator(torch.device("cpu"))  # type: ignore[union-attr]
    assert want in comm.describe(), comm.describe()


def test_the_ringreduce_backend_is_rebuilt_under_each_cases_env() -> None:
    """Config reads the environment when the backend builds its engine."""
    for machines in ("2", "1"):
        run_test_ranks(_describe_backend, 4, f"{machines} machine", backend="ringreduce",
                       env={"RINGREDUCE_MACHINES": machines})


def _hang_on_rank_one(rank: int, world: int) -> None:
    if rank == 1:
        import time

        time.sleep(60)


def _die_on_rank_one(rank: int, world: int) -> None:
    if rank == 1:
        os._exit(7)


def test_a_hung_or_dead_rank_fails_its_case_alone(request: pytest.FixtureRequest) -> None:
    name = re.escape(request.node.nodeid)
    with pytest.raises(AssertionError, match=rf"^ranks \[1\] did not finish within 8.*\n"
                                             rf"\(in {name}; its rank pool was stopped"):
        run_test_ranks(_hang_on_rank_one, 2, timeout=8)
    died = r"exited abnormally \(rank, exit code\): \[\(1, 7\)\]"
    with pytest.raises(AssertionError, match=rf"{died}\n\(in {name};"):
        run_test_ranks(_die_on_rank_one, 2)
    run_test_ranks(_find_nothing, 2)  # a fresh pool


def test_a_function_that_does_not_pickle_fails_and_leaves_no_half_sent_case() -> None:
    with pytest.raises(Exception, match="pickle"):
        run_test_ranks(lambda rank, world: None, 2)
    run_test_ranks(_find_nothing, 2)
