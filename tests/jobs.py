"""Training jobs as people run them (issue 49), shared by the CPU tests
(test_cpu_jobs.py: gloo, 4 ranks as 2 machines x 2) and the GPU ones (test_gpu_jobs.py:
NCCL): two DDP models on one int8 Communicator against one Communicator each, a run
checkpointed and resumed in new processes against the uninterrupted one (DDP across a
bucket rebuild, and FSDP2), the "ringreduce" backend's all-reduces under
RINGREDUCE_WIRE, and ``ringreduce.ddp.apply``'s checks. Communicators take machines and
min_bytes from RINGREDUCE_MACHINES and RINGREDUCE_MIN_BYTES (ENV); the int8 ones keep
the hook's error feedback (hook_feedback=True): the state a resumed job must carry."""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from ringreduce.integrations.resume import dcp_template

from .cases import world_group
from .compressed import here as _backend_device
from .compressed import same_on_every_rank

ENV = {"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"}
WIDTH = 24
STEPS = 4
"""Steps before the checkpoint, and after it."""


class Crossed(nn.Module):
    """Four layers registered a, b, c, d and run d, c, b, a: DDP's first buckets (reverse
    registration order) hold a's end of the model, its rebuilt ones (the order gradients
    become ready) the other end, so a rebuild changes which parameters share a bucket."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.a, self.b, self.c, self.d = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(torch.tanh(self.b(torch.tanh(self.c(torch.tanh(self.d(x)))))))


def here() -> torch.device:
    """This rank's device: its GPU in a GPU test (RR_TEST_DEVICE; the "ringreduce"
    backend too, whose CUDA tensors go to its engine), else the backend's."""
    if "RR_TEST_DEVICE" in os.environ:
        return torch.device("cuda", torch.cuda.current_device())
    return _backend_device()


def ddp(seed: int) -> DDP:
    """A Crossed model in DDP with buckets of about two layers."""
    return DDP(Crossed(seed).to(here()), bucket_cap_mb=0.005)


def batch(rank: int, step: int, what: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * what + 100 * rank + step)
    x, y = torch.randn(16, WIDTH, generator=g), torch.randn(16, WIDTH, generator=g)
    return x.to(here()), y.to(here())


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# --- two models, one Communicator ------------------------------------------------------

def gan_steps(g: DDP, d: DDP, rank: int, steps: int) -> None:
    """A generator and a discriminator: one backward through both (their hooks
    interleave), then one through the discriminator alone."""
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (g, d)]
    for step in range(steps):
        x, y = batch(rank, step)
        for opt in opts:
            opt.zero_grad()
        nn.functional.mse_loss(d(g(x)), y).backward()
        for opt in opts:
            opt.step()
        opts[1].zero_grad()
        nn.functional.mse_loss(d(y), x).backward()
        opts[1].step()


def two_models(rank: int, world: int) -> None:
    """Two DDP models of the same shapes on one int8 Communicator end bit for bit where
    one Communicator per model leaves them (each keeps its own error feedback)."""
    ends = []
    for shared in (True, False):
        g, d = ddp(0), ddp(1)
        comms = [ringreduce.Communicator(wire="int8", hook_feedback=True)]
        if not shared:
            comms.append(ringreduce.Communicator(wire="int8", hook_feedback=True))
        ringreduce.ddp.apply(g, comms[0])
        g_comm = comms[-1]
        d.register_comm_hook(g_comm, ringreduce.ddp_hook)  # the plain spelling, too
        gan_steps(g, d, rank, 6)
        ends.append((flat(g), flat(d)))
        assert all(c._feedback.nbytes() > 0 for c in comms)
        if shared:
            del g, d
            let_go(comms[0], rank)
        for c in comms:
            c.close()
    (g1, d1), (g2, d2) = ends
    assert torch.equal(g1, g2), f"generator differs by {(g1 - g2).abs().max()}"
    assert torch.equal(d1, d2), f"discriminator differs by {(d1 - d2).abs().max()}"
    same_on_every_rank(torch.cat([g1, d1]), "both models")


def let_go(comm: ringreduce.Communicator, rank: int) -> None:
    """Models freed let their feedback go when the next model's buckets appear: a
    Communicator kept for one model after another holds only the live ones'."""
    gc.collect()
    before = len(comm._buckets.shapes)
    model = ddp(2)
    ringreduce.ddp.apply(model, comm)
    ddp_run(rank, model, 0, 2)
    layouts = comm._buckets.layouts
    assert layouts and all(min(o) >= before for o in layouts.values()), layouts
    assert set(comm._feedback._errors) == set(layouts), sorted(comm._feedback._errors)


# --- resuming ---------------------------------------------------------------------------

def ddp_run(rank: int, model: DDP, first: int, steps: int) -> torch.optim.Optimizer:
    """Steps ``first`` .. ``first + steps - 1`` of the DDP job (data by step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return ddp_steps(rank, model, opt, first, steps)


def ddp_steps(rank: int, model: DDP, opt: torch.optim.Optimizer, first: int,
              steps: int) -> torch.optim.Optimizer:
    for step in range(first, first + steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return opt


def ddp_first_half(rank: int, world: int, folder: str) -> None:
    """The uninterrupted run (2 * STEPS), then a new run's first STEPS, checkpointed:
    model, optimizer and the Communicator's state (torch.save, one file per rank)."""
    with ringreduce.Communicator(wire="int8", hook_feedback=True) as comm:
        model = ddp(0)
        ringreduce.ddp.apply(model, comm)
        ddp_run(rank, model, 0, 2 * STEPS)
        torch.save(flat(model).cpu(), os.path.join(folder, f"full{rank}.pt"))
    with ringreduce.Communicator(wire="int8", hook_feedback=True) as comm:
        model = ddp(0)
        ringreduce.ddp.apply(model, comm)
        opt = ddp_run(rank, model, 0, STEPS)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "ringreduce": comm.state_dict()}, os.path.join(folder, f"ckpt{rank}.pt"))


def ddp_resume(rank: int, world: int, folder: str) -> None:
    """A new process loads the checkpoint before its first backward and runs the last
    STEPS: bit for bit the uninterrupted run, though its DDP starts again from the
    initial buckets (reduced in the saved layouts until DDP rebuilds to them). Without
    the Communicator's state it is not (the test's own control)."""
    full = torch.load(os.path.join(folder, f"full{rank}.pt"))
    ckpt = torch.load(os.path.join(folder, f"ckpt{rank}.pt"), map_location=here())
    ends = []
    for load in (True, False):
        with ringreduce.Communicator(wire="int8", hook_feedback=True) as comm:
            model = ddp(7)  # other weights: all of them come from the checkpoint
            model.load_state_dict(ckpt["model"])
            ringreduce.ddp.apply(model, comm)
            if load:
                comm.load_state_dict(ckpt["ringreduce"])
                pending = dict(comm._buckets.pending)
                assert pending, "the saved state has DDP layouts"
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            opt.load_state_dict(ckpt["optimizer"])
            ddp_steps(rank, model, opt, STEPS, 1)
            if load:  # DDP's first buckets were not the saved ones: regrouped
                assert comm._buckets.pending == pending and not comm._buckets.layouts
            ddp_steps(rank, model, opt, STEPS + 1, STEPS - 1)
            if load:  # DDP rebuilt its buckets into the saved layouts
                assert not comm._buckets.pending and set(comm._buckets.layouts) == set(pending), \
                    (pending, comm._buckets.pending, comm._buckets.layouts)
            ends.append(flat(model).cpu())
    assert torch.equal(ends[0], full), f"resumed run differs by {(ends[0] - full).abs().max()}"
    assert not torch.equal(ends[1], full), "the control (no state loaded) should differ"


def fsdp_net(mesh: Any) -> nn.Module:
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(WIDTH, 64), nn.Tanh(), nn.Linear(64, WIDTH))
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def fsdp_steps(rank: int, net: nn.Module, first: int, steps: int) -> None:
    opt = torch.optim.SGD(net.parameters(), lr=0.05)  # no state of its own to save
    for step in range(first, first + steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()


def shards(net: nn.Module) -> list[torch.Tensor]:
    return [p.to_local().detach().clone().cpu() for p in net.parameters()]  # type: ignore[attr-defined]


def fsdp_job(rank: int, world: int, folder: str, phase: str) -> None:
    """FSDP2 with ringreduce.fsdp.apply(wire="int8") on a given Communicator that keeps
    error feedback (hook_feedback=True, as FSDP's wire follows the DDP hook's knob): "first"
    runs the uninterrupted job and a first half, checkpointed (the Communicator's state
    with torch.distributed.checkpoint); "resume" loads it in new processes and must end
    where the uninterrupted job did."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(here().type, (world,))
    path = os.path.join(folder, f"fsdp{rank}.pt")
    if phase == "first":
        with ringreduce.Communicator(hook_feedback=True) as comm:
            net = fsdp_net(mesh)
            ringreduce.fsdp.apply(net, comm, wire="int8")
            fsdp_steps(rank, net, 0, 2 * STEPS)
            full = shards(net)
        with ringreduce.Communicator(hook_feedback=True) as comm:
            net = fsdp_net(mesh)
            ringreduce.fsdp.apply(net, comm, wire="int8")
            fsdp_steps(rank, net, 0, STEPS)
            assert comm._feedback.nbytes() > 0, "no feedback kept: the resume shows nothing"
            torch.save({"full": full, "shards": shards(net)}, path)
            dcp.save({"ringreduce": comm.state_dict()}, checkpoint_id=os.path.join(folder, "dcp"))
        return
    ckpt = torch.load(path, map_location="cpu")  # shards() compares on the CPU
    saved = {"ringreduce": dcp_template(os.path.join(folder, "dcp"), rank, ("ringreduce",))}
    dcp.load(saved, checkpoint_id=os.path.join(folder, "dcp"))
    with ringreduce.Communicator(hook_feedback=True) as comm:
        net = fsdp_net(mesh)
        with torch.no_grad():
            for p, shard in zip(net.parameters(), ckpt["shards"], strict=True):
                p.to_local().copy_(shard)  # type: ignore[attr-defined]
        ringreduce.fsdp.apply(net, comm, wire="int8")
        comm.load_state_dict(saved["ringreduce"])
        fsdp_steps(rank, net, STEPS, STEPS)
        for i, (a, b) in enumerate(zip(shards(net), ckpt["full"], strict=True)):
            assert torch.equal(a, b), f"FSDP parameter {i} differs by {(a - b).abs().max()}"


def refused_loads(rank: int, world: int) -> None:
    """A state of another wire, rank or model layout is refused with a ValueError that
    says what differs, before any communication."""
    with ringreduce.Communicator(wire="int8", hook_feedback=True) as comm:
        model = ddp(0)
        ringreduce.ddp.apply(model, comm)
        ddp_run(rank, model, 0, 1)
        state = comm.state_dict()
    with ringreduce.Communicator(wire="int4", hook_feedback=True) as other, \
            pytest.raises(ValueError, match="wire"):
        other.load_state_dict(state)
    with ringreduce.Communicator(wire="int8", hook_feedback=True) as other:
        with pytest.raises(ValueError, match="this Communicator is rank"):
            other.load_state_dict({f"rank {(rank + 1) % world}": state[f"rank {rank}"]})
        with pytest.raises(ValueError, match="world_size: saved"):
            other.load_state_dict({f"rank {rank}": {**state[f"rank {rank}"], "world_size": 8}})
        with pytest.raises(ValueError, match="load_state_dict takes"):
            other.load_state_dict({"feedback": {}})
        other.load_state_dict(state)
        wider = DDP(nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH)).to(here()), bucket_cap_mb=0.005)
        ringreduce.ddp.apply(wider, other)
        x, _ = batch(rank, 0)
        with pytest.raises(ValueError, match="another model layout"):
            wider(x).sum().backward()


# --- the backend -----------------------------------------------------------------------

def exact_values(rank: int, n: int, what: int) -> torch.Tensor:
    """Multiples of 1/256 below 8 in magnitude: any sum of four is exact in fp32, in any
    order, so the reference is the sum itself."""
    g = torch.Generator().manual_seed(1000 * what + rank)
    return torch.randint(-2048, 2048, (n,), generator=g).float() / 256


def backend_is_exact(rank: int, world: int) -> None:
    """Under RINGREDUCE_WIRE (int8 here), a user's own dist.all_reduce on the
    "ringreduce" backend comes back exact: a metric vector, a SyncBatchNorm-style
    statistic, a large tensor; the env's wire reaches only Communicators built by the
    user, and the hook."""
    assert os.environ.get("RINGREDUCE_WIRE"), "run with RINGREDUCE_WIRE set"
    metric = torch.tensor([2.828125 + rank, 12074.0 + rank, 16384.0], device=here())
    dist.all_reduce(metric)
    want = torch.tensor([4 * 2.828125 + 6, 4 * 12074.0 + 6, 4 * 16384.0], device=here())
    assert torch.equal(metric, want), metric.tolist()
    for what, n in enumerate((129, 1000, 1 << 20)):
        t = exact_values(rank, n, what).to(here())
        dist.all_reduce(t)
        exact = sum(exact_values(r, n, what) for r in range(world))
        assert torch.equal(t.cpu(), exact), f"{n} elements: {(t.cpu() - exact).abs().max()}"
    engine = world_group().communicator(here())
    assert engine.config.wire is None
    with ringreduce.Communicator() as comm:  # the user's own: the env's wire applies
        assert comm.config.wire == os.environ["RINGREDUCE_WIRE"]


# --- ringreduce.ddp.apply -------------------------------------------------------------

def apply_checks(rank: int, world: int) -> None:
    """apply builds the Communicator over DDP's own group, refuses one over another
    group (both groups' ranks named) or with settings, and a hook state that is not a
    Communicator is a TypeError saying what to pass."""
    pair, _ = dist.new_subgroups(2)
    pair_ranks = dist.get_process_group_ranks(pair)
    model = DDP(Crossed(0).to(here()), process_group=pair, bucket_cap_mb=0.005)
    comm = ringreduce.ddp.apply(model, wire="int8")
    assert comm._global_ranks == tuple(pair_ranks) and comm.topology.world_size == 2
    ddp_run(rank, model, 0, 3)
    end = flat(model)
    partner = end.clone()
    dist.all_reduce(partner, group=pair)  # replicas identical within the pair
    assert torch.equal(partner, 2 * end)
    comm.close()
    everyone_ranks, pair_ranks_text = (", ".join(map(str, r)) for r in (range(world), pair_ranks))
    with ringreduce.Communicator() as everyone:
        with pytest.raises(ValueError, match=rf"\[{everyone_ranks}\].*\[{pair_ranks_text}\]"):
            ringreduce.ddp.apply(DDP(Crossed(0).to(here()), process_group=pair), everyone)
        with pytest.raises(ValueError, match="wire"):
            ringreduce.ddp.apply(DDP(Crossed(0).to(here())), everyone, wire="int8")
    with ringreduce.Communicator(pair) as pairs, \
            pytest.raises(ValueError, match=rf"\[{pair_ranks_text}\].*\[{everyone_ranks}\]"):
        ringreduce.ddp.apply(DDP(Crossed(0).to(here())), pairs)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        ringreduce.ddp.apply(Crossed(0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"ringreduce\.ddp\.apply"):
        ringreduce.ddp.apply(DDP(Crossed(0).to(here())), "comm")  # type: ignore[arg-type]
    model = DDP(Crossed(0).to(here()))
    model.register_comm_hook(None, ringreduce.ddp_hook)
    x, y = batch(rank, 0)
    with pytest.raises(Exception, match=r"not a ringreduce\.Communicator") as raised:
        nn.functional.mse_loss(model(x), y).backward()
    assert "ringreduce.ddp.apply(model)" in str(raised.value)
