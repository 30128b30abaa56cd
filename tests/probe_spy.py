"""The construction probe's calls, noted by a spy around a communicator's real
all_reduce (execution/probe.py, plan/slicing.py): shared by the CPU test (gloo, small
sizes) and the GPU one (NCCL, the probe's own sizes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import ringreduce
from ringreduce.execution import probe
from ringreduce.plan import slicing


class _Waited:
    """A call's Future whose ``wait`` the spy notes (the real Future's wait runs)."""

    def __init__(self, future: Any, log: list[tuple[Any, ...]]) -> None:
        self._future, self._log = future, log

    def wait(self) -> Any:
        self._log.append(("wait",))
        return self._future.wait()


def probed_as_training_issues(comm: ringreduce.Communicator,
                              sizes: Sequence[int] | None = None) -> slicing.Choice:
    """Run the probe again on ``comm`` (at ``sizes``, else its own) and check that per
    size and route, in each pass, its warm-up calls come right before its timed ones,
    the timed ones PROBE_ROUNDS asynchronous calls on as many tensors, all issued before
    the first wait, as DDP queues its buckets; each route's calls as many as
    probe_calls_per_route says; then the choice, set and said at every size."""
    lossy = comm.config.wire is not None
    log: list[tuple[Any, ...]] = []

    def spy(t: torch.Tensor, async_op: bool = False) -> Any:
        plan = comm._res.plan
        log.append(("call", t.numel() * t.element_size(), plan.plan, plan.wire, t.dtype,
                    t.data_ptr(), async_op))
        got = comm.all_reduce(t, async_op=async_op)
        return None if got is None else _Waited(got, log)

    before = comm.op_number
    chosen = probe.compare(comm._res, spy, comm.config, sizes)
    sizes = slicing.probe_sizes(comm.config.min_bytes) if sizes is None else sizes
    routes = slicing.probe_routes(lossy)
    assert comm.op_number - before == len(sizes) * len(routes) * \
        slicing.probe_calls_per_route()
    rounds, at = slicing.PROBE_ROUNDS, 0
    for p in range(slicing.PROBE_PASSES):
        warm = slicing.PROBE_WARMUP if p == 0 else slicing.PROBE_REWARM
        for size in sizes:
            for route in routes:
                seen = log[at:at + warm + 2 * rounds]
                at += warm + 2 * rounds
                calls = [e for e in seen if e[0] == "call"]
                assert len(calls) == warm + rounds, seen
                plan = slicing.ONE_SLICE if route == slicing.WIRE else route
                dtype = torch.float32 if route == slicing.WIRE else torch.int32
                assert {c[1:5] for c in calls} == {(size, plan, route == slicing.WIRE,
                                                    dtype)}, calls
                assert [c[6] for c in calls] == [False] * warm + [True] * rounds, calls
                assert len({c[5] for c in calls[warm:]}) == rounds, calls  # own tensors
                assert seen[warm + rounds:] == [("wait",)] * rounds, seen  # after all
    assert at == len(log)
    assert comm._res.plan is chosen and chosen.plan in slicing.ROUTES, chosen
    for size in sizes:
        assert f"probe at {size / (1 << 20):g} MiB" in chosen.at(size).reason, chosen
        assert ("wire" in chosen.at(size).reason) == lossy, chosen
    return chosen
