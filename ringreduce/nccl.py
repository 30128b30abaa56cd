"""The one module that calls NCCL, through nccl4py (NVIDIA's maintained binding).

Why nccl4py: it is NVIDIA's own binding, tracks NCCL releases (config structs,
split, abort, async errors), loads the same ``libnccl`` wheel torch's CUDA build
depends on, and needs no compiler. PyPI's pynccl (2020) has no config, no
non-blocking init and no split (FINDINGS.md). cupy.cuda.nccl lacks split and config.

Hot-path calls go to ``nccl.bindings.nccl`` with raw pointers and stream handles:
nccl4py's high-level methods resolve every buffer through DLPack, which costs host
time on each of the ~20 calls of a sliced all-reduce. Each wrapper below sits under
the C prototype it calls. Every call names an explicit stream (nccl4py's default
stream would serialise against the caller's work).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .errors import RingReduceError

try:
    import nccl.core as _core
    from nccl.bindings import nccl as _raw
except ImportError as exc:  # pragma: no cover - only without the cu12/cu13 extra
    _core = None
    _raw = None
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

Comm = Any
"""An initialised ``nccl.core.Communicator``."""


def _require() -> None:
    if _core is None:
        raise RingReduceError(
            "the CUDA path needs nccl4py, which is not importable "
            f"({_IMPORT_ERROR}); install ringreduce[cu12] or ringreduce[cu13]")


_DTYPES: dict[torch.dtype, int] = {} if _core is None else {
    torch.float32: int(_core.FLOAT32), torch.float16: int(_core.FLOAT16),
    torch.bfloat16: int(_core.BFLOAT16), torch.float64: int(_core.FLOAT64),
    torch.int32: int(_core.INT32), torch.int64: int(_core.INT64)}

# AVG travels as SUM: the engine divides once, exactly, at the end.
_OPS: dict[str, int] = {} if _core is None else {
    "sum": int(_core.SUM), "avg": int(_core.SUM), "max": int(_core.MAX), "min": int(_core.MIN)}


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES[dtype]


def op_code(op: str) -> int:
    return _OPS[op]


def version() -> int:
    _require()
    return int(_raw.get_version())


def new_unique_id() -> bytes:
    _require()
    return bytes(_core.get_unique_id())


def config(channels_per_net_peer: int | None = None) -> Any:
    """Per-communicator settings (ncclConfig_t), so that nothing process-wide changes
    for the user's own NCCL communicators:
      blocking=True          calls return when enqueued (the watchdog variant with
                             non-blocking communicators is the reliability issue's);
      launch_order_implicit  (NCCL >= 2.26) kernels of ringreduce's communicators start
                             on a GPU in host issue order. Stages use four communicators
                             on five streams; without it two GPUs could start them in
                             different orders and wait on each other forever;
      n_channels_per_net_peer  how many channels (sockets) send/recv to one network
                             peer may use: the rail stages are send/recv."""
    _require()
    return _core.NCCLConfig(blocking=True, launch_order_implicit=True,
                            n_channels_per_net_peer=channels_per_net_peer)


def init(world_size: int, rank: int, unique_id: bytes) -> Comm:
    """ncclCommInitRankConfig."""
    _require()
    uid = _core.UniqueId.from_bytes(unique_id)
    return _core.Communicator.init(world_size, rank, uid, config())


def split(parent: Comm, color: int, key: int, channels_per_net_peer: int | None = None) -> Comm:
    """ncclCommSplit: collective over the parent; ranks with one color form a child."""
    return parent.split(color=color, key=key, config=config(channels_per_net_peer))


@contextmanager
def group() -> Iterator[None]:
    """ncclGroupStart/ncclGroupEnd: fuse the calls inside into one launch."""
    _raw.group_start()
    try:
        yield
    finally:
        _raw.group_end()


# ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
#     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
def all_reduce(comm: Comm, t: torch.Tensor, op: str, stream: int) -> None:
    _raw.all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), dtype_code(t.dtype),
                    op_code(op), comm._comm, stream)


# ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
#     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
def reduce_scatter(comm: Comm, send: torch.Tensor, recv: torch.Tensor, op: str,
                   stream: int) -> None:
    _raw.reduce_scatter(send.data_ptr(), recv.data_ptr(), recv.numel(),
                        dtype_code(send.dtype), op_code(op), comm._comm, stream)


# ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
#     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
def all_gather(comm: Comm, send: torch.Tensor, recv: torch.Tensor, stream: int) -> None:
    _raw.all_gather(send.data_ptr(), recv.data_ptr(), send.numel(),
                    dtype_code(send.dtype), comm._comm, stream)


# ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
#     int peer, ncclComm_t comm, cudaStream_t stream);
def send(comm: Comm, t: torch.Tensor, peer: int, stream: int) -> None:
    _raw.send(t.data_ptr(), t.numel(), dtype_code(t.dtype), peer, comm._comm, stream)


# ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype,
#     int peer, ncclComm_t comm, cudaStream_t stream);
def recv(comm: Comm, t: torch.Tensor, peer: int, stream: int) -> None:
    _raw.recv(t.data_ptr(), t.numel(), dtype_code(t.dtype), peer, comm._comm, stream)


def destroy(comm: Comm) -> None:
    """ncclCommDestroy: collective within a node; only on the happy path (close)."""
    comm.destroy()


def abort(comm: Comm) -> None:
    """ncclCommAbort: local, safe on error paths."""
    comm.abort()
