"""The per-call NCCL operations a stage issues: the hot path of the Python issuer.

Owns the collectives, send/recv and the group (ncclGroupStart ... ncclGroupEnd) that
NcclTransport issues for every slice. They go to ``nccl.bindings.nccl`` with raw
pointers and stream handles: nccl4py's high-level methods resolve every buffer through
DLPack, which costs host time on each of the ~20 calls of a sliced all-reduce. Each
wrapper sits under the C prototype it calls. Every call names an explicit stream
(nccl4py's default stream would serialise against the caller's work).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ringreduce.execution.nccl.library import Comm, dtype_code, op_code
from ringreduce.execution.nccl.library import raw as _raw

# ``_raw`` is bound once, at import, as the single module did before: a module global
# per call, no attribute walk through library on a path taken ~20 times per call.


# ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
#     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
def all_reduce(comm: Comm, t: torch.Tensor, op: str, stream: int) -> None:
    all_reduce_into(comm, t, t, op, stream)


def all_reduce_into(comm: Comm, send: torch.Tensor, recv: torch.Tensor, op: str,
                    stream: int) -> None:
    _raw.all_reduce(send.data_ptr(), recv.data_ptr(), send.numel(), dtype_code(send.dtype),
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


@contextmanager
def group() -> Iterator[None]:
    """A group (ncclGroupStart ... ncclGroupEnd) over blocking communicators: its
    kernels are enqueued when ncclGroupEnd returns."""
    _raw.group_start()
    try:
        yield
    finally:
        _raw.group_end()
