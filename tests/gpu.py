"""What the GPU tests share: the marks that skip them without CUDA or nccl4py, each
rank's environment and the topologies (virtual machines on one host), and the fault
tests' pieces (test_gpu_faults.py, test_native_cuda.py): a healthy communicator, the
survivor's checks, leaving without torch's teardown, and the skip under CUDA MPS.

Virtual machines are emulated on one host: rank (m, d) sets ``NCCL_HOSTID=vm<m>`` and
uses GPU d, so NCCL routes rail traffic over its network transport. When a machine has
more devices than the host has GPUs, its ranks share GPUs (run them under CUDA MPS, as
the GPU run script does): NCCL refuses two ranks of one host id on one GPU, so each of
those ranks gets its own host id (``vm<m>r<d>``) and the machine count is passed
explicitly (``RINGREDUCE_MACHINES``). Topologies: ``RINGREDUCE_GPU_TOPOLOGIES`` (default
``2x1``; e.g. ``2x1,2x2,4x2``).
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

import ringreduce

from . import faults

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("nccl") is None, reason="needs nccl4py"),
]
SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1"}


def topologies() -> list[tuple[int, int]]:
    """(machines, devices per machine) from RINGREDUCE_GPU_TOPOLOGIES, e.g. "2x1,2x2"."""
    raw = os.environ.get("RINGREDUCE_GPU_TOPOLOGIES", "2x1")
    out = []
    for item in raw.replace(" ", "").split(","):
        m, _, d = item.partition("x")
        if not (m.isdigit() and d.isdigit() and int(m) >= 1 and int(d) >= 1):
            raise ValueError(f"RINGREDUCE_GPU_TOPOLOGIES={raw!r}: {item!r} is not MxD "
                             "(machines x devices), e.g. RINGREDUCE_GPU_TOPOLOGIES=2x1,2x2,4x2")
        out.append((int(m), int(d)))
    return out


TOPOLOGIES = topologies()
IDS = [f"{m}x{d}" for m, d in TOPOLOGIES]
SMALL = (2, 2) if GPUS >= 2 else (2, 1)
"""The multi-machine topology of the single-case tests: 2 x 1 fits one GPU."""


def gpu_env(machines: int, devices: int) -> list[dict[str, str]]:
    """Rank r = (m, d) on GPU d (modulo the GPUs there are). Ranks of one machine that
    share a GPU need host ids of their own (NCCL: "Duplicate GPU detected")."""
    shared = devices > GPUS
    return [{**SAFE, "RINGREDUCE_MACHINES": str(machines),
             "NCCL_HOSTID": f"vm{r // devices}" + (f"r{r % devices}" if shared else ""),
             "RR_TEST_DEVICE": str(r % devices % max(GPUS, 1))}
            for r in range(machines * devices)]


# The fault tests: a fault must become an error within DEADLINE + SLACK.
DEADLINE = 10.0
SLACK = 15.0  # abort, NCCL proxy teardown, up to 8 processes on one shared GPU
NUMEL = 64 << 20  # 256 MiB of float32: 64 slices, far longer in flight than the kill delay
OPS = 2  # if the victim's first operation beat its fault, the second one still hangs
HANG_S = DEADLINE + SLACK + 120  # fault, new group and Communicator of up to 7 survivors
STAGE_ERROR = (r"stage '(reduce_scatter|collect|add|diffuse|all_gather)' failed on rank \d+ "
               r"in operation #\d+ \(.*\), peers \(group ranks\) \[[\d, ]+\]")


def env_with_deadline(machines: int, devices: int,
                      extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    base = {"RINGREDUCE_TIMEOUT": str(DEADLINE)}
    return [{**e, **base, **(extra or {})} for e in gpu_env(machines, devices)]


def healthy(dev: torch.device, check_new_calls: bool = False) -> ringreduce.Communicator:
    """A communicator whose connections exist: the fault must hit a running pipeline,
    not NCCL's connection setup. A survivor that hangs anyway prints every thread's
    stack (faulthandler) and exits, so the log shows where. The new-call check is off
    unless asked for: the faults stand for a training step's calls, made before."""
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    comm = ringreduce.Communicator(min_bytes=0, check_new_calls=check_new_calls)
    t = torch.ones(1 << 20, device=dev)
    comm.all_reduce(t)
    comm.wait_idle()
    torch.cuda.synchronize()
    assert torch.equal(t, torch.full_like(t, float(dist.get_world_size())))
    return comm


def survive(comm: ringreduce.Communicator, dev: torch.device, fault: str,
            stamped: bool = False) -> str:
    """Issue OPS large calls whose peer is gone; the error must come within the
    deadline plus slack (from the injecting rank's stamp when ``stamped``, else from
    the first call), and the communicator must refuse work and close promptly."""
    started = time.time()
    with pytest.raises(ringreduce.RingReduceError, match=STAGE_ERROR) as info:
        for _ in range(OPS):
            comm.all_reduce(torch.ones(NUMEL, device=dev))
        comm.wait_idle()
    faults.report(fault, dist.get_rank(), info.value, DEADLINE + SLACK,
                  None if stamped else started)
    message = str(info.value)
    assert str(NUMEL) in message, message  # names the tensor size
    with pytest.raises(ringreduce.RingReduceError, match="refuses new work"):
        comm.all_reduce(torch.ones(10, device=dev))
    closing = time.monotonic()
    comm.close()  # after an abort: no collective destroy waiting for a dead peer
    assert time.monotonic() - closing < SLACK
    return message


def leave() -> None:
    """Exit without torch's own NCCL group teardown: with a dead or stopped peer that
    teardown is torch's business (and may wait for it), not what these tests measure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


KILLED_UNDER_MPS = pytest.mark.skipif(
    os.environ.get("RR_MPS") == "1",
    reason="a client killed under CUDA MPS breaks the MPS server for every client of the GPU "
           "(survivors: 'illegal memory access'; new clients: 'MPS server is not ready', error "
           "807; benchmarks/results/2026-11-23-h200-clusters): run without MPS")
"""CUDA MPS has limited error containment (NVIDIA's MPS guide): a client killed with
work on the GPU takes the MPS server down for every client, so the killed-peer tests run
without MPS (ranks time-sliced on one GPU, or on GPUs of their own)."""
