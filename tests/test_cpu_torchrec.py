"""TorchRec's ``DistributedModelParallel`` (issue 49) with data-parallel embedding tables
and dense layers, their gradients all-reduced by ringreduce's DDP hook, on CPU (gloo,
4 ranks as 2 machines x 2).

TorchRec builds more than one DDP: ``DefaultDataParallelWrapper`` wraps the dense part,
and each data-parallel sharding of an ``EmbeddingBagCollection`` wraps its tables in a
DDP of its own, kept in the sharded module's ``_lookups``, a plain list: neither
``named_modules()`` nor ``children()`` reaches it (TorchRec's own walks read
``_lookups``). The hook goes on every one of them, or the tables' gradients stay on gloo
or NCCL.

The fp32 comparison is bit for bit: every gradient is rounded to a grid of 2**-10 before
DDP reduces it (a tensor hook, in the reference run too), so any order of summing four
of them is exact and the reference and ringreduce may sum in different orders."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

from .cases import count_stage_calls
from .compressed import same_on_every_rank
from .multiproc import run_test_ranks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchrec") is None,
    reason="torchrec is not installed (pip install -e '.[torchrec]' and torchrec itself with "
           "--no-deps: .ci/run says why)")

ENV = {"RINGREDUCE_MACHINES": "2", "RINGREDUCE_MIN_BYTES": "0"}
STEPS = 4
BATCH = 8
FEATURES = ("f0", "f1")
ROWS, DIM, OUT = 64, 16, 4
GRID = 2.0 ** -10
"""A gradient on this grid below 2**10 in magnitude spans at most 20 bits; a sum of four
spans at most 22, inside fp32's 24: exact in any order."""
INT8_DRIFT = 5e-2
"""int8's parameters against fp32's after STEPS steps, relative to how far fp32's moved
from the start (L2 over all parameters). Measured: 2.7e-2 with error feedback, 3.4e-2
without (one int8 all-reduce is about 1e-2 from exact: tests/compressed.py's BOUNDS)."""
CPU = torch.device("cpu")


class _Net(nn.Module):
    """Two pooled embedding tables (sum) and a two-layer MLP over their concatenation."""

    def __init__(self) -> None:
        super().__init__()
        import torchrec

        self.sparse = torchrec.EmbeddingBagCollection(
            tables=[torchrec.EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM,
                                                num_embeddings=ROWS, feature_names=[f])
                    for i, f in enumerate(FEATURES)],
            device=torch.device("meta"))
        self.dense = nn.Sequential(nn.Linear(DIM * len(FEATURES), 32), nn.ReLU(),
                                   nn.Linear(32, OUT))

    def forward(self, kjt: object) -> torch.Tensor:
        return self.dense(self.sparse(kjt).values())


def _build(world: int) -> nn.Module:
    """The same DMP on every call: both tables data-parallel, the dense part in
    TorchRec's default DDP, cut into several buckets."""
    from torchrec.distributed.model_parallel import (
        DefaultDataParallelWrapper,
        DistributedModelParallel,
    )
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, data_parallel
    from torchrec.distributed.types import ShardingPlan

    torch.manual_seed(0)
    net = _Net()
    plan = ShardingPlan({"sparse": construct_module_sharding_plan(
        net.sparse, {f"t{i}": data_parallel() for i in range(len(FEATURES))},
        local_size=2, world_size=world, device_type="cpu")})
    # 1/1000 MB: the 1,200 dense parameters come in several buckets
    wrapper = DefaultDataParallelWrapper(bucket_cap_mb=0.001)
    return DistributedModelParallel(net, device=CPU, plan=plan, data_parallel_wrapper=wrapper)


def ddp_modules(module: nn.Module) -> list[DDP]:
    """Every DDP inside ``module``, nested ones too (the tables' DDP sits inside the
    dense part's, in a sharded collection's ``_lookups``)."""
    found = [module] if isinstance(module, DDP) else []
    for child in [*module.children(), *getattr(module, "_lookups", [])]:
        found += ddp_modules(child)
    return found


def _to_grid(g: torch.Tensor) -> torch.Tensor:
    assert g.abs().max() < 2.0 ** 10, "the grid's premise (GRID) no longer holds"
    return torch.round(g / GRID) * GRID


def _exact_gradients(dmp: nn.Module) -> None:
    """Round every gradient DDP reduces, before DDP sees it (see the module docstring)."""
    seen: set[int] = set()
    for ddp in ddp_modules(dmp):
        for name, p in ddp.module.named_parameters():
            if name not in ddp.parameters_to_ignore and id(p) not in seen:
                seen.add(id(p))
                p.register_hook(_to_grid)


def _batch(rank: int, step: int) -> tuple[object, torch.Tensor]:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1000 * rank + step)
    lengths = torch.randint(0, 4, (len(FEATURES) * BATCH,), generator=g)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=list(FEATURES), values=values,
                                              lengths=lengths)
    return kjt, torch.randn(BATCH, OUT, generator=g)


def _parameters(dmp: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in dmp.named_parameters()}


def _train(dmp: nn.Module, rank: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """STEPS steps of SGD on this rank's batches; the losses and the parameters after."""
    _exact_gradients(dmp)
    opt = torch.optim.SGD(dmp.parameters(), lr=0.5)
    losses = []
    for step in range(STEPS):
        kjt, target = _batch(rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(dmp(kjt), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, _parameters(dmp)


def _hooked(dmp: nn.Module, **settings: object) -> list[ringreduce.Communicator]:
    """One Communicator per DDP of the DMP, each registered as that DDP's hook."""
    comms = []
    for ddp in ddp_modules(dmp):
        comm = ringreduce.Communicator(ddp.process_group, **settings)  # type: ignore[arg-type]
        ddp.register_comm_hook(comm, ringreduce.ddp_hook)
        comms.append(comm)
    return comms


def _flat(params: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.flatten() for p in params.values()])


def _dmp_worker(rank: int, world: int) -> None:
    reference = _build(world)
    ddps = ddp_modules(reference)
    assert len(ddps) == 2, f"expected the dense part's DDP and the tables' DDP, got {len(ddps)}"
    start = _parameters(reference)
    plain_losses, plain = _train(reference, rank)

    # fp32: bit for bit TorchRec's own reduction, every DDP through ringreduce
    dmp = _build(world)
    comms = _hooked(dmp)
    counts = [count_stage_calls(c) for c in comms]
    losses, ours = _train(dmp, rank)
    for c in counts:  # each DDP's buckets went the hierarchical route, every step
        assert c.get("collect", 0) >= STEPS and "flat_all_reduce" not in c, counts
    assert losses == plain_losses, (losses, plain_losses)
    for name, p in plain.items():
        assert not torch.equal(p, start[name]), f"{name} did not train"
        assert torch.equal(ours[name], p), f"{name}: ringreduce differs from TorchRec's DDP"

    # the README's recipe: one Communicator, registered on every DDP
    dmp = _build(world)
    shared = ringreduce.Communicator()
    for ddp in ddp_modules(dmp):
        ddp.register_comm_hook(shared, ringreduce.ddp_hook)
    _, together = _train(dmp, rank)
    for name, p in plain.items():
        assert torch.equal(together[name], p), f"{name}: a shared Communicator differs"
    shared.close()

    # int8 with error feedback: the same replica everywhere, close to fp32
    runs = {}
    for fed in (True, False):
        dmp = _build(world)
        int8 = _hooked(dmp, wire="int8", hook_feedback=fed)
        _, runs[fed] = _train(dmp, rank)
        for comm in int8:
            assert (comm._feedback.nbytes() > 0) == fed, (fed, comm._feedback.nbytes())
            comm.close()
    for name, p in runs[True].items():
        same_on_every_rank(p, f"int8 {name}")
    moved = (_flat(plain) - _flat(start)).norm()
    drift = ((_flat(runs[True]) - _flat(plain)).norm() / moved).item()
    assert 0 < drift < INT8_DRIFT, drift
    assert not torch.equal(_flat(runs[True]), _flat(runs[False])), "feedback changed nothing"
    for comm in comms:
        comm.close()


def test_dmp_data_parallel_tables_and_dense_layers_through_the_hook() -> None:
    run_test_ranks(_dmp_worker, 4, env=ENV, timeout=240)


def _shared_worker(rank: int, world: int) -> None:
    """One Communicator for both of the DMP's DDPs (a plain ``register_comm_hook(comm,
    ...)`` on each) gives, bit for bit, what one Communicator per DDP gives."""
    dmp = _build(world)
    per_ddp = _hooked(dmp, wire="int8")
    _, separate = _train(dmp, rank)
    dmp = _build(world)
    shared = ringreduce.Communicator(wire="int8")
    for ddp in ddp_modules(dmp):
        ddp.register_comm_hook(shared, ringreduce.ddp_hook)
    _, together = _train(dmp, rank)
    for name, p in separate.items():
        assert torch.equal(together[name], p), f"{name}: a shared Communicator differs"
    for comm in [*per_ddp, shared]:
        comm.close()


def test_dmp_one_communicator_for_both_ddps_keeps_each_ones_feedback() -> None:
    run_test_ranks(_shared_worker, 4, env=ENV, timeout=240)
