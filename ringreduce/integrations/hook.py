"""DDP communication hook: ``ddp_model.register_comm_hook(comm, ringreduce.ddp_hook)``.

No ``from __future__ import annotations`` here: DDP's ``_check_comm_hook`` compares
the evaluated annotations with ``dist.GradBucket`` and ``Future[Tensor]``."""

import torch
import torch.distributed as dist

from ringreduce.engine import Communicator


def ddp_hook(state: Communicator, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over the communicator's group, like torch's ``allreduce_hook``.

    The bucket is reduced in place and the Future holds ``bucket.buffer()``. On CUDA
    the Future is completed on a stream that follows the call, so the reducer's
    ``wait()`` only makes its stream wait; the autograd thread never blocks on the
    device. With ``RINGREDUCE_ISSUER=native-async`` the backward's last bucket returns
    once the worker issued every queued call, so DDP's own NCCL work comes after. AVG
    divides once after the sum, in fp32 for 16-bit gradients (torch's hook divides
    first, in the gradient's own precision).
    """
    return state._hook_all_reduce(bucket.buffer(), bucket.is_last())
