"""What the "ringreduce" backend's engine calls return (backend.py): EngineWork, whose
``wait()`` raises the operation's error, over the engine's Future as torch's Work
carries it (a list of tensors)."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from ringreduce.engine import Communicator
from ringreduce.errors import RingReduceError


class EngineWork(dist.Work):
    """The Work of one engine call: ``wait()`` raises the operation's error.

    torch's ``_create_work_from_future`` makes a Work whose ``wait()`` returns True
    even when its Future holds an exception (torch 2.13), so a synchronous
    ``dist.all_reduce`` after a peer died returned normally with a partial sum in the
    tensor. Here a failure reaches the caller from ``dist.all_reduce`` itself (CPU:
    it waits for the result), from ``work.wait()`` and from the Future's ``wait()``.
    On CUDA the call only enqueues, as NCCL's does: ``wait()`` makes the current
    stream wait, and raises once the watchdog has found this operation (or an
    earlier one) failed, within the deadline."""

    def __init__(self, fut: torch.futures.Future[list[torch.Tensor]],
                 engine: Communicator) -> None:
        super().__init__()
        self._fut, self._engine, self._op = fut, engine, engine.op_number

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        try:
            self._fut.wait()  # raises the Future's error; CUDA: a stream wait, no host sync
        except RingReduceError:
            raise
        except RuntimeError as exc:  # CUDA's own (torch.AcceleratorError): a sticky error
            raise RingReduceError(
                f"operation #{self._op} of the ringreduce backend failed: the CUDA context "
                f"reported an error ({exc}); the tensor's contents are undefined and this "
                "process's CUDA state is lost: restart it") from exc
        self._engine.raise_if_failed(self._op)
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self._fut.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        if not self._fut.done():
            return None
        try:
            self._fut.value()
            self._engine.raise_if_failed(self._op)
        except Exception as exc:  # the operation's own error, returned, not raised
            return exc
        return None

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self._fut

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._fut.value()


def listed(fut: torch.futures.Future[torch.Tensor],
            device: torch.device) -> torch.futures.Future[list[torch.Tensor]]:
    """The Future as torch's Work carries it: a list of tensors (DDP's reducer reads
    element 0). On CUDA ``then`` runs the callback with the current stream ordered
    after the engine's (the engine's Future holds no error there: issue errors raise
    from the call). On the CPU the error is forwarded as it is: ``then`` would turn a
    RingReduceError into a RuntimeError ("Got the following error when running the
    callback")."""
    if device.type == "cuda":
        return fut.then(lambda f: [f.value()])
    listed: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()

    def forward(f: torch.futures.Future[torch.Tensor]) -> None:
        try:
            value = f.value()
        except Exception as exc:  # the engine's error, handed on unchanged
            listed.set_exception(exc)  # type: ignore[arg-type]  # torch's stub: "result: T"
            return
        listed.set_result([value])

    fut.add_done_callback(forward)
    return listed
