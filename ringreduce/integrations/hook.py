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
    device.

    16-bit gradients (float16, bfloat16) are divided by the world size first, in their
    own precision, then summed, as plain DDP and torch's hook do, so gradients whose
    sum would pass fp16's 65504 but whose average does not come back finite, as in
    plain DDP. Other dtypes are summed, then divided once. Results may differ from
    plain DDP's in the last bit: the hierarchical route sums in another order than
    NCCL's, and fp32 is divided after the sum, not before.

    With an 8- or 4-bit wire (``Communicator(wire="int8")``) each bucket keeps error
    feedback, keyed by its index and the order of its parameters, so a bucket DDP
    rebuilds after the first step starts over (``Config.hook_feedback``;
    ``comm.reset_feedback()``).
    """
    return state._hook_all_reduce(bucket.buffer(), bucket)
