"""ringreduce.fsdp on CPU: FSDP2 (fully_shard) over gloo, its gradient reduce-scatter
through ringreduce's hierarchical engine, against plain FSDP2 from the same init and data.

Bit for bit: the model rounds its activations in forward and its gradients in backward
(``_Round``), so every rank's gradient is a small integer and any summation order gives
the same fp32 sum; AVG's one division by N is correctly rounded on both sides. Without
the rounding, ringreduce's sum order (machine, then rail) differs from gloo's and fp32
would differ by an ulp or so per step. Uneven layer sizes (11, 7 and 3 rows over 4 or 6
ranks) make FSDP pad, and the 3-row layer leaves some ranks an empty shard.

One process group per topology runs every case (spawning ranks is the slow part).

The same comparison covers FSDP2 on the "ringreduce" torch.distributed backend (no hook:
its reduce-scatter and all-gather reach the backend's engine), and HSDP's replicate
all-reduce: native HSDP on a mesh of that backend, and ``apply(model, replicate=...)``
for a model sharded on ``mesh["shard"]`` alone, against native HSDP on gloo.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ringreduce
from ringreduce.integrations.backend import RingReduceGroup

from .fsdp import (
    LAYERS,
    STEPS,
    check_identical,
    flight,
    routes,
    sharded,
    tanh_net,
    train,
    worker,
)
from .multiproc import run_test_ranks


def test_fsdp_2x2() -> None:
    """2 machines x 2: every case."""
    run_test_ranks(worker, 4, 2, ("exact", "given", "compressed", "training"), timeout=120)


@pytest.mark.slow  # the 2 x 2 case runs these cases and more in the quick run
def test_fsdp_3x2() -> None:
    """3 machines x 2: the exact cases (AVG divides by 6: one correctly rounded division)."""
    run_test_ranks(worker, 6, 3, ("exact",), timeout=120)


CPU = torch.device("cpu")
BACKEND_ENV = {"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"}
"""Every group of the "ringreduce" backend as 2 machines, every call on the engine's
hierarchical route: the world 2 x 2, a 2-rank HSDP dimension 2 x 1."""


def gathers(reshard: bool) -> int:
    """All-gathers per step: every layer in forward, and again in backward after
    resharding in forward."""
    return LAYERS * (2 if reshard else 1)


def hsdp_mesh(backend: str | None = None) -> Any:
    """2 replicas x 2 shards: (replicate, shard) on ranks [[0, 1], [2, 3]], on the
    default group's backend or ``backend``."""
    from torch.distributed.device_mesh import init_device_mesh
    override = None if backend is None else {"replicate": backend, "shard": backend}
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"),
                            backend_override=override)


def _backend_worker(rank: int, world: int) -> None:
    """FSDP2 and native HSDP on the "ringreduce" backend (the default group) against the
    same on gloo groups: bit-identical, with every reduce-scatter and all-gather (and
    HSDP's replicate all-reduce) on the backend's engines, hierarchical at 2 x 2."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    ours = init_device_mesh("cpu", (world,))
    group = ours.get_group()
    assert isinstance(group, RingReduceGroup) and dist.get_backend(group) == "ringreduce"
    gloo = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")
    assert dist.get_backend(gloo.get_group()) == "gloo"
    engine = group.communicator(CPU)  # built here, collectively, on every rank
    assert (engine.topology.machines, engine.topology.devices_per_machine) == (2, 2)
    for reshard, mixed in ((True, False), (False, False), (True, True)):
        case = f"backend reshard_after_forward={reshard} mixed={mixed}"
        want = train(sharded(gloo, reshard, mixed), rank)
        before = engine.op_number
        got = train(sharded(ours, reshard, mixed), rank)
        calls = flight(engine, before, ("kind", "route", "dtype"))
        check_identical(got, want, case)
        gathered = "torch.bfloat16" if mixed else "torch.float32"
        assert sorted(calls) == sorted(
            [("all_gather", "hierarchical", gathered)] * (STEPS * gathers(reshard))
            + [("reduce_scatter", "hierarchical", "torch.float32")] * (STEPS * LAYERS)), \
            (case, calls)
    # Native HSDP: each dimension's group a RingReduceGroup with an engine of its own
    # (2 x 1: the reduce-scatter and all-gather take the flat route, NCCL's or gloo's
    # own, and the replicate all-reduce the hierarchical one); FSDP's replicate
    # all-reduce is a dist.all_reduce, AVG, on the replicate group: that engine's.
    reference = hsdp_mesh("gloo")
    assert {dist.get_backend(reference.get_group(d)) for d in ("replicate", "shard")} == \
        {"gloo"}
    want = train(sharded(reference, True, False), rank)
    mesh = hsdp_mesh()
    replicate, shard = mesh.get_group("replicate"), mesh.get_group("shard")
    assert isinstance(replicate, RingReduceGroup) and isinstance(shard, RingReduceGroup)
    world_calls = engine.op_number
    got = train(sharded(mesh, True, False), rank)
    assert engine.op_number == world_calls  # the world's engine took none of them
    assert flight(replicate.communicator(CPU), 0, ("kind", "route", "op")) == \
        [("all_reduce", "hierarchical", "avg")] * (STEPS * LAYERS)
    assert sorted(flight(shard.communicator(CPU), 0, ("kind", "route", "op"))) == sorted(
        [("all_gather", "flat", "-")] * (STEPS * gathers(True))
        + [("reduce_scatter", "flat", "avg")] * (STEPS * LAYERS))
    check_identical(got, want, "native HSDP on the backend")


def test_fsdp_on_the_backend_uses_the_engine() -> None:
    run_test_ranks(_backend_worker, 4, backend="ringreduce", env=BACKEND_ENV, timeout=120)


def fsdp_modules(net: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule
    return [m for m in net.modules() if isinstance(m, FSDPModule)]


def _replicate_worker(rank: int, world: int) -> None:
    """Custom HSDP (FSDP on mesh["shard"], ``apply(model, replicate=...)``) against native
    HSDP (the 2-D mesh), both on gloo; the replicate communicator 2 x 1, so its
    all-reduce takes ringreduce's hierarchical route."""
    mesh = hsdp_mesh()
    replicate = mesh.get_group("replicate")
    # Exact: bit-identical, AVG; and SUM under set_gradient_divide_factor (2, the shard
    # group's size: FSDP then reduce-scatters with AVG, which gloo has, not PREMUL_SUM;
    # the gradients are twice the average, so an AVG would not match).
    for factor in (None, 2.0):
        case = f"custom HSDP, gradient divide factor {factor}"
        native = sharded(mesh, True, False)
        net = sharded(mesh["shard"], True, False)
        hooks = ringreduce.fsdp.apply(net, replicate=replicate, machines=2, min_bytes=0)
        assert len(hooks) == LAYERS + 1
        if factor is not None:  # after apply: the hook reads it per call
            for m in fsdp_modules(native) + fsdp_modules(net):
                m.set_gradient_divide_factor(factor)
        want = train(native, rank)
        got = train(net, rank)
        check_identical(got, want, case)
        comm = hooks[0].comms.replicate
        assert comm is not None and comm.topology.world_size == 2
        assert hooks[0].comms.communicators()["replicate"] is comm
        assert all(h.replicate is not None and h.replicate.comm is comm for h in hooks)
        op = "avg" if factor is None else "sum"
        assert flight(comm, 0, ("kind", "route", "op")) == \
            [("all_reduce", "hierarchical", op)] * (STEPS * LAYERS), case
        assert routes(hooks) == [("reduce_scatter", "flat")] * (STEPS * LAYERS), case
        hooks[0].comms.close()
        assert comm._closed  # built by apply: closed with the hooks' communicators
    # int8 on the replicate rail (a Communicator of the user's, 2 x 1; the shard group
    # one machine, so its reduce-scatter stays exact): within 1% of native HSDP after a
    # step, and one gradient on both replicas.
    rep = ringreduce.Communicator(replicate, machines=2, min_bytes=0, wire_block=32)
    net = tanh_net(mesh["shard"])
    hooks = ringreduce.fsdp.apply(net, wire="int8", replicate=rep, machines=1, min_bytes=0)
    got, want = train(net, rank, steps=1), train(tanh_net(mesh), rank, steps=1)
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert (g - w).norm() <= 0.01 * w.norm() + 1e-6, ((g - w).norm(), w.norm())
        pair = [torch.empty_like(g) for _ in range(2)]
        dist.all_gather(pair, g, group=replicate)
        assert torch.equal(pair[0], pair[1]), "the replicas' gradients differ"
    assert not all(torch.equal(g, w) for (_, g), (_, w) in zip(got, want, strict=True)), \
        "int8: nothing was rounded, so nothing was tested"
    assert flight(rep) == [("all_reduce", "compressed int8")] * 2  # 2 layers, one step
    assert routes(hooks) == [("reduce_scatter", "flat")] * 2
    used = hooks[0].comms.communicators()
    assert set(used) == {mesh["shard"].get_group().group_name, "replicate"}
    assert used["replicate"] is rep
    hooks[0].comms.close()
    assert not rep._closed  # the user's
    rep.close()
    # A model on the 2-D mesh: FSDP all-reduces across replicas itself.
    with pytest.raises(ValueError, match="2-D mesh"):
        ringreduce.fsdp.apply(sharded(mesh, True, False), replicate=replicate)


def test_hsdp_replicate_all_reduce_through_ringreduce() -> None:
    run_test_ranks(_replicate_worker, 4, timeout=120)


FEEDBACK_CALLS = 8


def _repeated(call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
              exact: torch.Tensor) -> tuple[list[torch.Tensor], float]:
    """FEEDBACK_CALLS calls on the same input; the outputs, and the relative L2 error
    of their mean against ``exact`` (feedback carries each call's rounding into the
    next, so the errors cancel in the mean; without it every call rounds alike)."""
    outs = [call(x.clone()) for _ in range(FEEDBACK_CALLS)]
    mean = torch.stack(outs).double().mean(0)
    return outs, float((mean - exact).norm() / exact.norm())


def _wire_feedback(comm: ringreduce.Communicator, kind: str,
                   call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                   exact: torch.Tensor, reset: Callable[[], None]) -> None:
    """One of ringreduce.fsdp's quantized hooks (``call``), FEEDBACK_CALLS times on the
    same input through ``comm``: error-feedback memory, the saved state and the results
    follow ``comm.config.hook_feedback``; ``reset`` (the hook's reset_feedback) forgets
    it, so the next call is the first call's again, bit for bit."""
    outs, err = _repeated(call, x, exact)
    saved = comm.state_dict()[f"rank {comm.topology.rank}"]["feedback"]
    if not comm.config.hook_feedback:
        assert comm._feedback.nbytes() == 0 and saved == {}, (kind, sorted(saved))
        assert all(torch.equal(o, outs[0]) for o in outs), f"{kind}: a call carried feedback"
        reset()  # nothing kept: still callable
        return
    assert comm._feedback.nbytes() > 0 and sorted(saved) == [f"{kind} 0"], (kind, sorted(saved))
    assert not torch.equal(outs[1], outs[0]), f"{kind}: the second call carried no feedback"
    plain = float((outs[0].double() - exact).norm() / exact.norm())
    assert err < plain / 2, f"{kind}: mean error {err:.3g} with feedback, {plain:.3g} without"
    reset()
    assert comm._feedback.nbytes() == 0
    assert torch.equal(call(x.clone()), outs[0]), f"{kind}: reset_feedback kept some feedback"


def _feedback_worker(rank: int, world: int, hook_feedback: bool | None) -> None:
    """FSDP's quantized wire keeps error feedback only where the Communicator it reduces
    through has ``hook_feedback=True``, the knob the DDP hook follows (None: the
    default, off): FSDP2's reduce-scatter at 2 x 2 and custom HSDP's replicate
    all-reduce (2 x 1), each against the exact sum of known inputs."""
    from torch.distributed.device_mesh import init_device_mesh
    settings = {} if hook_feedback is None else {"hook_feedback": hook_feedback}
    g = torch.Generator().manual_seed(rank)
    n = 40  # not a multiple of the 32-element wire block
    # FSDP2's reduce-scatter (RingReduceScatter), SUM of every rank's block `rank`
    mesh = init_device_mesh("cpu", (world,))
    hook = ringreduce.fsdp.RingReduceScatter(wire="int8", machines=2, min_bytes=0,
                                             wire_block=32, **settings)
    x = torch.randn(world * n, generator=g)
    every = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(every, x)
    exact = torch.stack(every).double().view(world, world, n)[:, rank].sum(0)

    def scatter(inp: torch.Tensor) -> torch.Tensor:
        out = torch.empty(n)
        hook(out, inp, mesh.get_group(), dist.ReduceOp.SUM)
        return out

    comm = hook.comms.get(mesh.get_group())
    assert comm.config.hook_feedback is bool(hook_feedback)
    _wire_feedback(comm, "fsdp reduce_scatter", scatter, x, exact, hook.reset_feedback)
    hook.comms.close()
    # custom HSDP's replicate all-reduce (ReplicaAllReduce), AVG over the 2 replicas
    hsdp = hsdp_mesh()
    rep = ringreduce.Communicator(hsdp.get_group("replicate"), machines=2, min_bytes=0,
                                  wire_block=32, **settings)
    hooks = ringreduce.fsdp.apply(tanh_net(hsdp["shard"]), wire="int8", replicate=rep,
                                  machines=1, min_bytes=0)
    replica = hooks[0].replicate
    assert replica is not None
    y = torch.randn(3 * n, generator=g)
    pair = [torch.empty_like(y) for _ in range(2)]
    dist.all_gather(pair, y, group=hsdp.get_group("replicate"))

    def average(t: torch.Tensor) -> torch.Tensor:
        replica(t)
        return t

    _wire_feedback(rep, "fsdp all_reduce", average, y,
                   torch.stack(pair).double().mean(0), hooks[0].reset_feedback)
    hooks[0].comms.close()
    rep.close()


@pytest.mark.parametrize("hook_feedback", [None, True, False])
def test_fsdp_wire_feedback_follows_hook_feedback(hook_feedback: bool | None) -> None:
    run_test_ranks(_feedback_worker, 4, hook_feedback, timeout=120)


def test_apply_refuses_a_model_without_fsdp_modules() -> None:
    with pytest.raises(ValueError, match="no FSDP module"):
        ringreduce.fsdp.apply(nn.Linear(2, 2))


def test_unknown_wire_is_refused() -> None:
    with pytest.raises(ValueError, match="int8"):
        ringreduce.fsdp.RingReduceScatter(wire="int7")
