"""Host cost of the pieces of an asynchronous call's return path, one process, no NCCL:
torch.futures.Future(devices=[cuda]) construction, set_result on a side stream, a
CPU-only Future, an event record, record_stream, the raw current-stream lookup."""
import time

import torch

dev = torch.device("cuda", 0)
t = torch.ones(1 << 20, device=dev)
side = torch.cuda.Stream(dev)
N = 2000


def us(fn) -> float:
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(N):
        fn()
    return (time.perf_counter() - start) / N * 1e6


def cuda_future() -> None:
    fut = torch.futures.Future(devices=[dev])
    with torch.cuda.stream(side):
        fut.set_result(t)


def cpu_future() -> None:
    torch.futures.Future().set_result(t)


ev = torch.cuda.Event()
def make() -> object:
    return torch.futures.Future(devices=[dev])


print(f"Future(devices=[cuda])              {us(make):8.2f} us")
print(f"  + set_result on a side stream     {us(cuda_future):8.2f} us")
print(f"Future() CPU + set_result           {us(cpu_future):8.2f} us")
def enter() -> None:
    torch.cuda.stream(side).__enter__()


print(f"torch.cuda.stream(side) enter      {us(enter):8.2f} us")
print(f"Event().record()                    {us(lambda: torch.cuda.Event().record()):8.2f} us")
print(f"event.record() (reused)             {us(lambda: ev.record()):8.2f} us")
print(f"t.record_stream(side)               {us(lambda: t.record_stream(side)):8.2f} us")
raw = torch._C._cuda_getCurrentRawStream
print(f"_cuda_getCurrentRawStream(0)        {us(lambda: raw(0)):8.2f} us")
print(f"is_current_stream_capturing()       {us(torch.cuda.is_current_stream_capturing):8.2f} us")
torch.cuda.synchronize()
