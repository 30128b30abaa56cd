"""Issue 34 on CUDA, through other people's code: fp16 gradients through the DDP hook
on both routes against plain DDP, and PyTorch Lightning's ``DDPStrategy`` with
``ddp_comm_hook=ringreduce.ddp_hook`` against plain DDP (Lightning registers comm hooks
only on CUDA, so this is the one place the setup can be checked).

At 2 machines x 2 devices (ranks share GPUs where the host has fewer: tests/gpu.py's
``gpu_env``). Run with ``pytest -m gpu``; skipped without CUDA or nccl4py, the Lightning
test also without ``lightning``.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

from .gpu import GPU_MARKS, gpu_env
from .multiproc import run_test_ranks
from .training import check_big_gradients, model, train

pytestmark = GPU_MARKS
MACHINES, DEVICES = 2, 2
"""Two devices per machine: the intra-machine reduce-scatter sums in the bucket's dtype,
where fp16 overflowed; at 2 x 1 that stage is skipped and only the flat route could."""
WORLD = MACHINES * DEVICES
STEPS = 6


def _fp16_hook_worker(rank: int, world: int, min_bytes: int | None, route: str) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    with ringreduce.Communicator(machines=MACHINES, min_bytes=min_bytes) as comm:
        assert comm.topology.devices_per_machine == DEVICES
        check_big_gradients(comm, dev, route)


@pytest.mark.parametrize(("min_bytes", "route"), [(0, "hierarchical"), (None, "flat")],
                         ids=["hierarchical", "flat"])
def test_gpu_ddp_hook_fp16_gradients_match_plain_ddp_where_the_sum_overflows(
        min_bytes: int | None, route: str) -> None:
    run_test_ranks(_fp16_hook_worker, WORLD, min_bytes, route, backend="nccl",
                   env=gpu_env(MACHINES, DEVICES))


def batches(rank: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The inputs training.train draws for ``rank``, one batch per step."""
    out = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x, y = torch.randn(16, 37, generator=g), torch.randn(16, 5, generator=g)
        out.append((x.to(device), y.to(device)))
    return out


def _lightning() -> tuple[Any, Any, Any]:
    """(the trainer package, LightningEnvironment, DDPStrategy) from ``lightning`` or,
    where only the older distribution is installed (the GPU machines' image has
    pytorch-lightning 2.6), ``pytorch_lightning``: the same code under two names."""
    if importlib.util.find_spec("lightning") is not None:
        import lightning.pytorch as pl
        from lightning.fabric.plugins.environments import LightningEnvironment
        from lightning.pytorch.strategies import DDPStrategy
    else:
        import pytorch_lightning as pl  # type: ignore[no-redef]
        from lightning_fabric.plugins.environments import (  # type: ignore[no-redef]
            LightningEnvironment,
        )
        from pytorch_lightning.strategies import DDPStrategy  # type: ignore[no-redef]
    return pl, LightningEnvironment, DDPStrategy


def lightning_module(net: nn.Module) -> Any:
    """training.train's step as a LightningModule (defined here: the module must
    import where lightning is absent)."""
    pl, _, _ = _lightning()

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor],
                          batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    return Module()


def _lightning_worker(rank: int, world: int) -> None:
    """Lightning joins the process group already initialised here (it skips its own
    init then) and runs one process per rank: LOCAL_RANK makes its LightningEnvironment
    take this process as the rank, and ``parallel_devices`` names every rank's GPU."""
    pl, LightningEnvironment, DDPStrategy = _lightning()
    dev = torch.device("cuda", torch.cuda.current_device())
    reference = train(DDP(model().to(dev), bucket_cap_mb=0.01), rank, STEPS, dev)
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0")
    devices = [torch.device("cuda", int(e["RR_TEST_DEVICE"])) for e in gpu_env(MACHINES, DEVICES)]
    with ringreduce.Communicator(machines=MACHINES, min_bytes=0, slice_bytes=4096) as comm, \
            tempfile.TemporaryDirectory() as root:
        strategy = DDPStrategy(ddp_comm_state=comm, ddp_comm_hook=ringreduce.ddp_hook,
                               parallel_devices=devices, cluster_environment=LightningEnvironment(),
                               bucket_cap_mb=0.01)  # small buckets: several hook calls a step
        trainer = pl.Trainer(strategy=strategy, max_steps=STEPS, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, use_distributed_sampler=False,
                             default_root_dir=root)
        module = lightning_module(model())
        loader = torch.utils.data.DataLoader(batches(rank, dev), batch_size=None)
        trainer.fit(module, train_dataloaders=loader)
        assert trainer.global_step == STEPS, trainer.global_step
        assert comm.op_number >= STEPS, f"the hook ran {comm.op_number} times in {STEPS} steps"
    for got, want in zip(module.net.parameters(), reference, strict=True):
        # the hook divides fp32 after the sum, plain DDP before: an ulp or so per step
        torch.testing.assert_close(got.detach().to(dev), want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None
                    and importlib.util.find_spec("pytorch_lightning") is None,
                    reason="needs PyTorch Lightning (pip install lightning)")
def test_gpu_lightning_ddp_strategy_with_the_hook_matches_plain_ddp() -> None:
    run_test_ranks(_lightning_worker, WORLD, backend="nccl", env=gpu_env(MACHINES, DEVICES),
                   timeout=300)
