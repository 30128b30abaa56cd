"""A Communicator's staging and padding memory (CUDA or CPU), allocated once.

The collect rows of slices in flight land in staging slots; a slice's padding tail
travels through a padding slot (plan/layout.py says how many and why).
"""

from __future__ import annotations

import torch

from ringreduce.execution.transport import Part
from ringreduce.plan.topology import Topology


class Buffers:
    """Staging and padding memory, allocated once as bytes and viewed per dtype."""

    def __init__(self, topo: Topology, slot_bytes: int, staging_slots: int,
                 padding_slots: int, device: torch.device) -> None:
        self.topo = topo
        self.slot_bytes = slot_bytes
        self.staging_bytes = torch.empty(staging_slots * slot_bytes, dtype=torch.uint8,
                                         device=device)
        # A padding slot holds the (D, M, 1) view plus its M-1 collect rows; 8 bytes
        # an element fits every dtype, and 16-byte strides keep views aligned.
        group, rows = topo.devices_per_machine * topo.machines, topo.machines - 1
        self.pad_stride = -(-(group + rows) * 8 // 16) * 16
        self.padding_bytes = torch.empty(padding_slots * self.pad_stride, dtype=torch.uint8,
                                         device=device)

    def staging(self, slot: int, dtype: torch.dtype, k: int,
                wire: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(received rows, rows to send). With a 16-bit wire format for float32, both
        are 16-bit and together take exactly the bytes of the float32 rows."""
        rows = self.topo.machines - 1
        start = slot * self.slot_bytes
        nbytes = rows * k * dtype.itemsize
        assert nbytes <= self.slot_bytes, (nbytes, self.slot_bytes)
        area = self.staging_bytes[start:start + nbytes]
        if wire is None:
            return area.view(dtype).view(rows, k), None
        both = area.view(wire).view(2, rows, k)
        return both[0], both[1]

    def padding(self, slot: int, dtype: torch.dtype, wire: torch.dtype | None = None) -> Part:
        t = self.topo
        group, rows = t.devices_per_machine * t.machines, t.machines - 1
        start = slot * self.pad_stride
        flat = self.padding_bytes[start:start + (group + rows) * dtype.itemsize].view(dtype)
        view = flat[:group].view(t.devices_per_machine, t.machines, 1)
        if wire is None:
            return Part(view, flat[group:].view(rows, 1))
        # The rows' float32 bytes hold both 16-bit row sets (received, to send).
        both = flat[group:].view(wire).view(2, rows, 1)
        return Part(view, both[0], both[1])
