"""A call's signature: what the end-of-call check (Config.check_call_end) compares.

NCCL's operations do not compare what ranks call: a rank whose peers reduce another
dtype or size can finish with wrong values and report success. So every hierarchical
all_reduce ends with one more operation over every rank: an all-reduce (MAX) of
``[s, ~s]``, where ``s`` packs (numel, dtype, op) into 64 bits. Over ranks that agree
the result is ``[s, ~s]`` again; otherwise the first word is the largest signature and
``~`` of the second the smallest, and they differ (``~`` reverses the order of signed
integers), which names both calls. A rank that never reaches that operation (its
stages are stuck on a mismatched peer) keeps every other rank from finishing too, so
the call ends at the deadline instead of returning.

Pure: no torch. Layout, low bits first: numel (40 bits), dtype code (8), op (4), and
a marker in the top byte so that memory that was never written does not decode.
"""

from __future__ import annotations

_NUMEL_BITS = 40
_MARK = 0x5A
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int16", "int8",
          "uint8", "bool", "complex64", "complex128")
"""torch dtype names, by code; any other dtype encodes as 255 ("other")."""
OPS = ("sum", "avg", "max", "min")


def encode(numel: int, dtype: str, op: str) -> int:
    """The signed 64-bit signature of all_reduce(numel x dtype, op); ``dtype`` is the
    torch name without "torch." (str(torch.float32)[6:])."""
    if not 0 <= numel < 1 << _NUMEL_BITS:
        raise ValueError(f"numel={numel} does not fit the call signature's {_NUMEL_BITS} "
                         "bits; split the tensor into calls of fewer elements")
    code = DTYPES.index(dtype) if dtype in DTYPES else 255
    raw = numel | code << _NUMEL_BITS | OPS.index(op) << 48 | _MARK << 56
    return raw - (1 << 64) if raw >= 1 << 63 else raw


def describe(signature: int) -> str:
    """``all_reduce(numel=..., dtype=torch...., op=...)``, or what the bits are when
    they are no signature (a peer's data arrived in their place)."""
    raw = signature & ((1 << 64) - 1)
    numel = raw & ((1 << _NUMEL_BITS) - 1)
    code, op = (raw >> _NUMEL_BITS) & 0xFF, (raw >> 48) & 0xF
    if raw >> 56 != _MARK or op >= len(OPS):
        return f"no call signature (0x{raw:016x})"
    dtype = f"torch.{DTYPES[code]}" if code < len(DTYPES) else "one not in signature.DTYPES"
    return f"all_reduce(numel={numel}, dtype={dtype}, op={OPS[op]})"


def disagreement(largest: int, smallest: int, own: int) -> str | None:
    """None when every rank's signature was ``own``; else what the ranks called."""
    if largest == own == smallest:
        return None
    calls = sorted({describe(largest), describe(smallest)} - {describe(own)})
    others = " and ".join(calls) if calls else "a call with the same signature but " \
        "different bits"
    return (f"ranks called different operations: this rank {describe(own)}, another "
            f"{others} (RINGREDUCE_DEBUG=1 names the rank)")
