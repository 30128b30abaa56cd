"""Training jobs as people run them (issue 49), on CPU: 4 gloo processes as 2 machines
x 2 (RINGREDUCE_MACHINES=2, RINGREDUCE_MIN_BYTES=0). tests/jobs.py has the jobs and
says what each shows; test_gpu_jobs.py runs them under NCCL."""

from __future__ import annotations

from pathlib import Path

from . import jobs
from .multiproc import run_test_ranks

ENV = jobs.ENV


def test_two_ddp_models_on_one_communicator_keep_their_own_feedback() -> None:
    run_test_ranks(jobs.two_models, 4, env=ENV)


def test_a_resumed_int8_ddp_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    run_test_ranks(jobs.ddp_first_half, 4, str(tmp_path), env=ENV)
    run_test_ranks(jobs.ddp_resume, 4, str(tmp_path), env=ENV)


def test_a_resumed_int8_fsdp_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    run_test_ranks(jobs.fsdp_job, 4, str(tmp_path), "first", env=ENV)
    run_test_ranks(jobs.fsdp_job, 4, str(tmp_path), "resume", env=ENV)


def test_a_state_of_another_wire_rank_or_model_is_refused() -> None:
    run_test_ranks(jobs.refused_loads, 4, env=ENV)


def test_the_backend_stays_exact_under_a_lossy_ringreduce_wire() -> None:
    run_test_ranks(jobs.backend_is_exact, 4, backend="ringreduce",
                   env={**ENV, "RINGREDUCE_WIRE": "int8"})


def test_ddp_apply_checks_the_group_and_the_hook_state() -> None:
    run_test_ranks(jobs.apply_checks, 4, env=ENV)
