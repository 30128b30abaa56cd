"""One-off probe of the GPU machine: nccl4py call forms and 2 processes per GPU."""
import os
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=torch.device("cuda", dev))
    import nccl.core as nc
    from nccl.bindings import nccl as nb
    print(rank, "bindings names", [n for n in dir(nb) if "Result" in n or "Error" in n][:10], flush=True)
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("probe/uid", bytes(nc.get_unique_id()))
    uid = nc.UniqueId.from_bytes(store.get("probe/uid"))
    comm = nc.Communicator.init(world, rank, uid, nc.NCCLConfig(blocking=False))
    for _ in range(100000):
        r = comm.get_async_error()
        if int(r) == 0:
            break
        time.sleep(0.001)
    print(rank, "async err", r, int(r), flush=True)
    t = torch.full((1024,), float(rank + 1), device="cuda")
    s = torch.cuda.current_stream().cuda_stream
    for form, c in (("ptr", comm.ptr), ("obj", comm._comm)):
        try:
            nb.all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), int(nc.FLOAT32), int(nc.SUM), c, s)
            torch.cuda.synchronize()
            print(rank, "form", form, "ok", t[0].item(), flush=True)
        except Exception as e:
            print(rank, "form", form, "failed", type(e).__name__, e, flush=True)
    t0 = time.perf_counter()
    for _ in range(1000):
        nb.all_reduce(t.data_ptr(), t.data_ptr(), 8, int(nc.FLOAT32), int(nc.SUM), comm.ptr, s)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(rank, "host us per low-level call", (t1 - t0) * 1e3, flush=True)
    x = torch.ones(8, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(rank, "torch nccl", x[0].item(), "nccl", nc.get_version(), "torch", torch.__version__, flush=True)
    comm.abort()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
