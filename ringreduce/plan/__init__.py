"""The plan: pure functions of sizes and topology, no torch, no devices.

Which rank is which machine and device (``topology``), how a slice is viewed as a
devices x machines array with padding slots (``layout``), and the pipelined order of the
five stages over the slices of a call, with the events between them (``schedule``). The
model (``ringreduce.model``) and the tests reason about a call through these modules
alone; nothing here may import torch.
"""
