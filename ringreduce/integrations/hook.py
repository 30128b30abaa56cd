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

    With an 8- or 4-bit wire and ``Communicator(wire="int8", hook_feedback=True)`` (off
    by default: Config.hook_feedback says why) each bucket keeps error feedback under a
    key of its model's parameters (execution/buckets.py): models
    sharing one Communicator keep theirs apart, a bucket DDP rebuilds after the first
    step starts over, and ``comm.state_dict()`` carries it to a resumed run
    (``comm.reset_feedback()`` clears it).

    ``state`` must be a Communicator over the model's process group
    (``ringreduce.ddp.apply`` builds one and checks the group); anything else is a
    TypeError at the first backward, before any communication.
    """
    if not isinstance(state, Communicator):
        raise TypeError(state_error(state))
    return state._hook_all_reduce(bucket.buffer(), bucket)


def state_error(state: object) -> str:
    """What to pass instead of a hook state that is not a Communicator."""
    return (f"ringreduce.ddp_hook's state is {type(state).__name__} {state!r:.60}, not a "
            "ringreduce.Communicator; call ringreduce.ddp.apply(model) (it builds one over "
            "model.process_group), or model.register_comm_hook(ringreduce.Communicator("
            "model.process_group), ringreduce.ddp_hook)")
