"""Bad input, the DDP hook and the communicator lifecycle, on CPU (gloo)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

from .multiproc import run_test_ranks
from .training import model, train


def _bad_input_worker(rank: int, world: int) -> None:
    comm = ringreduce.Communicator(machines=2, min_bytes=0)
    good = torch.arange(10, dtype=torch.float32)
    cases = [
        ([1.0, 2.0], {}, TypeError, "expects a torch.Tensor, got list"),
        (torch.ones(4, 4).t(), {}, ValueError, r"contiguous.*\.contiguous\(\)"),
        (torch.ones(4).to_sparse(), {}, ValueError, r"dense.*to_dense"),
        (torch.ones(4, device="meta"), {}, ValueError, r"on meta.*\.to\('cpu'\)"),
        (torch.ones(4, dtype=torch.bool), {}, TypeError, r"torch.bool is not supported"),
        (torch.ones(4, dtype=torch.complex64), {}, TypeError, r"complex64 is not supported"),
        (good.clone(), {"op": dist.ReduceOp.BAND}, TypeError,
         r"op .*BAND is not supported; use .*SUM, AVG, MAX or MIN"),
        (good.clone(), {"op": dist.ReduceOp.PRODUCT}, TypeError, r"PRODUCT"),
    ]
    for t, kwargs, exc, pattern in cases:
        before = t.clone() if isinstance(t, torch.Tensor) and t.device.type == "cpu" \
            and not t.is_sparse else None
        with pytest.raises(exc, match=pattern):
            comm.all_reduce(t, **kwargs)
        if before is not None:
            assert torch.equal(t, before), "a rejected tensor must be left untouched"
    assert comm.op_number == 0, "rejected calls must not count as operations"
    t = torch.full((10,), float(rank))
    comm.all_reduce(t)  # still usable, and the ranks are still in step
    assert torch.equal(t, torch.full((10,), float(sum(range(world)))))
    comm.close()
    comm.close()  # idempotent
    with pytest.raises(ringreduce.RingReduceError, match="closed"):
        comm.all_reduce(good)


def test_bad_input_raises_before_communicating() -> None:
    run_test_ranks(_bad_input_worker, 4)


def _ddp_worker(rank: int, world: int) -> None:
    reference = train(DDP(model(), bucket_cap_mb=0.01), rank, steps=6)
    comm = ringreduce.Communicator(machines=2, min_bytes=0, slice_bytes=1024)
    hooked = DDP(model(), bucket_cap_mb=0.01)  # small buckets: several hook calls a step
    hooked.register_comm_hook(comm, ringreduce.ddp_hook)
    got = train(hooked, rank, steps=6)
    # torch's hook divides before summing, ours after: fp32 rounding differs by an ulp
    # or so per step, so compare with fp32 tolerances rather than bit for bit.
    for a, b in zip(got, reference, strict=False):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert comm.op_number >= 6, f"the hook ran {comm.op_number} times in 6 steps"
    comm.close()


def test_ddp_hook_matches_plain_ddp() -> None:
    run_test_ranks(_ddp_worker, 4)


def _raises_on_rank_one(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("planted in rank 1")


def test_the_harness_reports_a_failing_rank_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    """tests/multiproc.py: a rank's exception fails the test with its traceback, and the
    reason is on stderr before pytest's summary (a GPU run cut by its limit keeps it)."""
    with pytest.raises(AssertionError, match=r"rank 1 failed:\n(.|\n)*planted in rank 1"):
        run_test_ranks(_raises_on_rank_one, 2, timeout=60)
    assert "[run_test_ranks] FAILED: rank 1 failed" in capsys.readouterr().err
