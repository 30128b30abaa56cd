"""DDP's first buckets after a resume, reduced in the layouts the saved state was kept in.

DDP builds its buckets in reverse registration order and rebuilds them after the first
backward in the order the gradients became ready, and a restarted process does this
again. A quantized wire rounds in blocks of the bucket's flat layout, and the saved
error feedback is per element of the saved (rebuilt) layout, so the restarted run's
first step, in DDP's initial buckets, would round other blocks than the uninterrupted
run did. Instead, until DDP forms the saved layouts itself, each saved bucket is
gathered from the DDP buckets that hold its parameters (views of their gradients),
averaged under its own key once all of them arrived, and written back; a DDP bucket's
Future completes when every saved bucket that shares its parameters is done. DDP waits
for the Futures only at the end of the backward, and every DDP bucket fires in every
backward, so every saved bucket of a model completes by its last bucket. Every rank
sees the hooks in the same order and so reduces the saved buckets in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ringreduce.execution.buckets import BucketKeys

Average = Callable[[torch.Tensor, str], torch.futures.Future[torch.Tensor]]
"""The hook's average of a flat tensor under a feedback key (Communicator)."""


class Regroup:
    """The saved layouts' reductions while DDP's buckets differ from them."""

    def __init__(self, keys: BucketKeys, average: Average) -> None:
        self._keys, self._average = keys, average
        self._grads: dict[int, torch.Tensor] = {}
        """Ordinal -> its gradient (a view of a DDP bucket), until its layout is done."""
        self._waiting: list[tuple[torch.futures.Future[torch.Tensor], torch.Tensor,
                                  tuple[int, ...]]] = []
        """DDP buckets whose saved layouts are not all done: (Future, buffer, ordinals)."""

    def hook(self, bucket: dist.GradBucket,
             ordinals: tuple[int, ...]) -> torch.futures.Future[torch.Tensor]:
        """The Future of a DDP bucket: completed once its parameters' layouts are done."""
        covered = {o for layout in self._keys.pending.values() for o in layout}
        alone = [o for o in ordinals if o not in covered]
        if alone:
            raise ValueError(f"DDP bucket {bucket.index()} holds parameters {alone} that no "
                             "bucket of the loaded ringreduce state holds, beside ones it "
                             "does: the state was saved for another model layout; load a "
                             "state saved by the same models, or none")
        self._grads.update(zip(ordinals, bucket.gradients(), strict=True))
        buffer = bucket.buffer()
        devices: list[int | str | torch.device] = [buffer.device] if buffer.is_cuda else []
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=devices)
        self._waiting.append((fut, buffer, ordinals))
        for key, layout in list(self._keys.pending.items()):
            if all(o in self._grads for o in layout):
                self._reduce(key, layout)
        self._complete()
        return fut

    def _reduce(self, key: str, layout: tuple[int, ...]) -> None:
        """One saved bucket: gathered flat, averaged (waited for: the calls of a
        regrouped step are few and this keeps every copy in order), written back."""
        grads = [self._grads.pop(o) for o in layout]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._average(flat, key).wait()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def _complete(self) -> None:
        still = []
        for fut, buffer, ordinals in self._waiting:
            if any(o in self._grads for o in ordinals):
                still.append((fut, buffer, ordinals))
            else:
                fut.set_result(buffer)
        self._waiting = still
