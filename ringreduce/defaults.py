"""The defaults of Config's sizes and deadlines, each with the measurement or reason behind it.

Plain numbers (no torch), read by config.py and by the model (ringreduce/model), which
prices the engine as it is configured by default.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

#: Smallest shard (slice / (devices * machines)) the default slice size allows.
#: Fairring lost to NCCL once shards fell to ~100 KiB and won from ~400 KiB; NCCL's
#: network path moves 128-512 KiB chunks, so smaller messages pay per-message cost.
MIN_SHARD_BYTES = 512 * KiB

#: The default largest slice on small clusters: 4 MiB slices keep a 25 MiB DDP bucket in
#: ~7 pipelined pieces while each network message stays large (smaller calls get smaller
#: slices: MIN_CALL_SHARD_BYTES).
MIN_SLICE_BYTES = 4 * MiB

#: Smallest shard of the slices a small call is cut into (layout.call_slice_bytes): a
#: 4 MiB DDP bucket at 2 x 2 becomes four 1 MiB slices of 256 KiB shards, which ran
#: the hook at 1.14-1.29x NCCL where one 4 MiB slice ran 0.87-1.00x (layout.py says
#: where); Fairring lost to NCCL only once shards fell to ~100 KiB.
MIN_CALL_SHARD_BYTES = 256 * KiB

#: Default staging budget. Staging holds the (M-1) rows a slice receives in
#: `collect`; 64 MiB keeps 16+ slices of 4 MiB in flight, like Fairring's 50 MiB.
DEFAULT_STAGING_BYTES = 64 * MiB

#: Below this size the hierarchical path's launches cost more than they save. Measured on
#: emulated 2 x 1 machines (two H200s): the pipeline ran at 0.66-0.78x NCCL at 1 MiB and
#: 0.75-0.97x at 4 MiB (one slice, nothing to overlap), 1.0-1.24x from 16 MiB; FINDINGS.md
#: saw a two-level scheme win from 4 MiB at 2 x 2. So tensors below 2 MiB take NCCL's own
#: all-reduce (a documented fast path).
DEFAULT_MIN_BYTES = 2 * MiB

#: Elements per quantization block (one fp32 scale each). 256: the scale costs 4/256 =
#: 1.6% of an int8 row (3.1% of int4), and a block of 256 gradient values still has a
#: max-abs close to the bulk's, so the int8 step stays ~1% of it; ZeRO++ and bitsandbytes
#: use blocks of the same order. A measurement on GPU (benchmarks/compressed.py) is to
#: confirm it. A multiple of 8 keeps every packed row a whole number of fp32 scales.
DEFAULT_WIRE_BLOCK = 256

#: torch's ProcessGroupNCCL watchdog default: long enough for any single all-reduce
#: of a real model, short enough that a dead peer does not hold a job for hours.
DEFAULT_TIMEOUT_S = 600.0
