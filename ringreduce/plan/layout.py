"""Pure layout: how a flat tensor is cut into slices and viewed as (D, M, k).

No torch, no CUDA: plans are frozen dataclasses of ints, tested on any CPU.

A slice of ``n`` elements has a *body*, its largest prefix divisible by D*M, viewed
as ``(D, M, k)``, and a *tail* of ``n - D*M*k < D*M`` elements that travels through
a ``(D, M, 1)`` padding slot. Full slices are sized to a multiple of D*M*ALIGN, so
only the last slice of a tensor can have a tail.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Shards start on 16-byte boundaries in full slices: vector loads in the add stage
#: and NCCL's fastest copy paths want 16-byte alignment.
ALIGN_BYTES = 16

#: Padding slots: one. Only a call's last slice can have a tail, and every call's tail
#: uses slot 0 (schedule.py: a call's steps never depend on the calls before it), so the
#: next call's tail waits for this one's to be copied back, long after the rail stream
#: moved on to the next call.
PADDING_SLOTS = 1


#: A call the default slice size would leave in fewer pieces is cut into this many: one
#: slice runs its five stages one after another, with nothing to overlap. Measured (H100
#: under MPS, capped 10 Gbit/s 2 x 2, a 48-block transformer in DDP with 146 buckets of
#: 4 MiB a step): 4 MiB slices ran the hook at 0.87-1.00x NCCL's samples/s, 1 MiB
#: slices at 1.14-1.29x.
SLICES_PER_CALL = 4


@dataclass(frozen=True)
class SlicePlan:
    """One slice of a flat tensor, in elements."""

    index: int
    offset: int
    numel: int
    k: int
    """Body row length: the body is ``(D, M, k)``, ``D*M*k`` elements."""
    tail: int
    """Elements after the body (``< D*M``), carried in a padding slot."""

    @property
    def body(self) -> int:
        return self.numel - self.tail


def slice_elements(itemsize: int, devices: int, machines: int, slice_bytes: int) -> int:
    """Elements in a full slice: ``slice_bytes`` rounded down to a multiple of
    D*M*(ALIGN_BYTES/itemsize), and at least one such unit."""
    unit = devices * machines * max(1, ALIGN_BYTES // itemsize)
    return max(unit, (slice_bytes // itemsize) // unit * unit)


def call_slice_bytes(nbytes: int, largest: int, smallest: int, devices: int = 1,
                     machines: int = 1) -> int:
    """The slice size of one call of ``nbytes``: ``largest``, unless that leaves fewer
    than SLICES_PER_CALL slices; then about SLICES_PER_CALL of them, none smaller than
    ``smallest`` (so network messages keep their size). ``smallest >= largest``: always
    ``largest`` (a fixed slice size). Every rank gets the same size for the same call.
    Rounded up to whole D*M*ALIGN_BYTES units: slice_elements rounds down to them, which
    would otherwise leave a sliver of a fifth slice (one more NCCL group) after four."""
    if smallest >= largest:
        return largest
    unit = devices * machines * ALIGN_BYTES
    quarter = -(-nbytes // SLICES_PER_CALL)
    return max(smallest, min(largest, -(-quarter // unit) * unit))


def plan_slices(numel: int, itemsize: int, devices: int, machines: int,
                slice_bytes: int) -> tuple[SlicePlan, ...]:
    """Cut ``numel`` elements into slices; every element is covered exactly once."""
    if numel < 0 or itemsize < 1 or devices < 1 or machines < 1 or slice_bytes < 1:
        raise ValueError(
            f"plan_slices needs numel >= 0 and positive sizes, got numel={numel}, "
            f"itemsize={itemsize}, devices={devices}, machines={machines}, "
            f"slice_bytes={slice_bytes}")
    step = slice_elements(itemsize, devices, machines, slice_bytes)
    group = devices * machines
    plans = []
    for index, offset in enumerate(range(0, numel, step)):
        n = min(step, numel - offset)
        k = n // group
        plans.append(SlicePlan(index, offset, n, k, n - k * group))
    return tuple(plans)


def staging_geometry(devices: int, machines: int, slice_bytes: int,
                     staging_bytes: int) -> tuple[int, int]:
    """(bytes of one staging slot, slot count). A slot holds the (M-1) collect rows of
    the largest shard any dtype's full slice has (a shard is at most
    slice_bytes / (D*M) bytes, at least one 16-byte unit), so one geometry serves every
    dtype. At least 2 slots, so that ``collect`` of the next slice can overlap ``add``
    of this one even under a tiny budget; no slots at all on one machine."""
    shard = max(ALIGN_BYTES, slice_bytes // (devices * machines))
    slot = (machines - 1) * (-(-shard // ALIGN_BYTES) * ALIGN_BYTES)
    if slot == 0:
        return 0, 0
    return slot, max(2, staging_bytes // slot)
