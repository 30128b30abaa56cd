"""CallContext: what the step loop, the transport and the collectives need for one call.

A Communicator's long-lived parts (resources.Resources) plus this call's numbers. The
native issuer's trace swaps ``sync``, ``transport`` and ``kernels`` for recording
stand-ins of the same shape (recording.py), so those three are typed by what they do,
not by class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ringreduce.execution.buffers import Buffers
    from ringreduce.execution.resources import Resources
    from ringreduce.plan.topology import Topology
    from ringreduce.safety.flight import Record


class CallContext:
    """One call's view of a Communicator: topology, transport, streams, buffers,
    kernels, the operation number and flight record, and the wire format in use."""

    def __init__(self, res: Resources, record: Record) -> None:
        self.topo: Topology = res.topo
        self.transport: Any = res.transport  # NcclTransport, GlooTransport or a recording
        self.sync: Any = res.sync            # CudaStreams, HostOrder or RecordedStreams
        self.buffers: Buffers = res.buffers
        self.kernels: Any = res.kernels      # kernels.Kernels, a recording copy, or None
        self.rank_order: torch.Tensor | None = res.rank_order
        self.divisors: dict[torch.dtype, torch.Tensor] = res.divisors
        self.op_number: int = record.op_number
        self.record: Record = record
        self.wire: torch.dtype | None = None
        self.check: Any = res.call_check    # call_check.DeviceCallCheck, HostCallCheck or None
        self.recording: bool = False
        """Whether the native issuer is tracing this call (recording.trace): work that
        must land in the program takes the collaborators' way, not a torch op."""
