"""nccl4py itself: the import, the check that it is there, and what every call shares.

Owns the only ``import nccl`` in ringreduce: ``core`` (``nccl.core``) and ``raw``
(``nccl.bindings.nccl``, the low-level wrappers) are None without the cu12/cu13 extra,
and ``require()`` turns that into a RingReduceError on the CUDA path. Also the
ncclDataType_t / ncclRedOp_t codes (with nccl.h's values when nccl4py is absent, so
native programs trace on any CPU), NCCL's version and unique id, the result codes the
polling in lifecycle.py tells apart, and the text of an NCCL result.
"""

from __future__ import annotations

from typing import Any

import torch

from ringreduce.errors import RingReduceError

try:
    import nccl.core as core
    from nccl.bindings import nccl as raw
except ImportError as exc:  # pragma: no cover - only without the cu12/cu13 extra
    core = None
    raw = None
    IMPORT_ERROR: ImportError | None = exc
else:
    IMPORT_ERROR = None

Comm = Any
"""An initialised ``nccl.core.Communicator``."""

SUCCESS = 0
IN_PROGRESS = 7
"""ncclSuccess and ncclInProgress (nccl.h; nccl.bindings.nccl.Result)."""


def require() -> None:
    if core is None:
        raise RingReduceError(
            "the CUDA path needs nccl4py, which is not importable "
            f"({IMPORT_ERROR}); install ringreduce[cu12] or ringreduce[cu13]")


# Without nccl4py, nccl.h's values (ncclDataType_t, ncclRedOp_t: a stable ABI), so that
# native programs can be traced and tested on any CPU (tests/test_native.py).
_DTYPES: dict[torch.dtype, int] = {
    torch.float32: 7, torch.float16: 6, torch.bfloat16: 9, torch.float64: 8,
    torch.int32: 2, torch.int64: 4, torch.uint8: 1} if core is None else {
    torch.float32: int(core.FLOAT32), torch.float16: int(core.FLOAT16),
    torch.bfloat16: int(core.BFLOAT16), torch.float64: int(core.FLOAT64),
    torch.int32: int(core.INT32), torch.int64: int(core.INT64),
    torch.uint8: int(core.UINT8)}  # the packed rows of the quantized wires (quant.py)

# AVG travels as SUM: the engine divides once, exactly, at the end.
_OPS: dict[str, int] = {"sum": 0, "avg": 0, "max": 2, "min": 3} if core is None else {
    "sum": int(core.SUM), "avg": int(core.SUM), "max": int(core.MAX), "min": int(core.MIN)}


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES[dtype]


def op_code(op: str) -> int:
    return _OPS[op]


def version() -> int:
    require()
    return int(raw.get_version())


def new_unique_id() -> bytes:
    require()
    return bytes(core.get_unique_id())


def describe_result(code: int, comm: Comm | None = None) -> str:
    """An NCCL result's name and text, e.g. ncclRemoteError (remote process exited or
    there was a network error), plus NCCL's last error text when ``comm`` has one."""
    try:
        name = f"nccl{raw.Result(code).name}"
    except ValueError:
        name = f"ncclResult {code}"
    text = f"{name} ({raw.get_error_string(code)})"
    last = raw.get_last_error(comm._comm) if comm is not None and comm._comm else ""
    return f"{text}; last NCCL error: {last.strip()}" if last.strip() else text
