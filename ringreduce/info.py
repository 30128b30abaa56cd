"""``python -m ringreduce.info``: what this installation would run, before any call.

Versions (Python, torch and its CUDA, nccl4py and NCCL, cupy), whether the native
extension (ringreduce._native, native/issuer.cpp) is built, the effective
configuration (``RINGREDUCE_*``), the topology when torch.distributed is initialised,
and which issuer a CUDA call would use, with the reason when it is the Python one.
Touches no GPU unless torch.distributed is up on one.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import platform
import sys

import torch
import torch.distributed as dist

from ringreduce.config import Config, host_identity
from ringreduce.execution import kernels, native
from ringreduce.plan import slicing


def _version(dist_name: str) -> str:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _nccl() -> str:
    if importlib.util.find_spec("nccl") is None:
        return "nccl4py not installed (the CUDA path needs ringreduce[cu12] or [cu13])"
    try:
        from ringreduce.execution import nccl
        code = nccl.version()
    except Exception as exc:  # a broken CUDA install is what this tool should report
        return f"nccl4py {_version('nccl4py')}, NCCL not loadable: {exc}"
    return (f"nccl4py {_version('nccl4py')}, NCCL {code // 10000}.{code // 100 % 100}."
            f"{code % 100} ({native.loaded_library('libnccl.so') or '?'}); implicit launch "
            f"order {nccl.launch_order(code, os.environ)}")


def _cupy() -> str:
    if not kernels.available():
        return "not installed (the add stage would run torch ops)"
    import cupy
    return f"{cupy.__version__}"


def lines(config: Config | None = None) -> list[str]:
    """The report, one line each (tests read it)."""
    config = config or Config.from_env()
    module, why_built = native.extension()
    cuda = torch.cuda.is_available()
    out = [
        f"ringreduce {_version('ringreduce')} (python {platform.python_version()}, "
        f"{sys.platform})",
        f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (CPU build)'}, "
        f"GPUs visible: {torch.cuda.device_count() if cuda else 0}",
        f"nccl: {_nccl()}",
        f"cupy: {_cupy()}",
        f"native extension: {'built (' + module.__file__ + ')' if module else why_built}",
        "configuration: " + ", ".join(f"{f.name}={getattr(config, f.name)!r}"
                                      for f in dataclasses.fields(config)),
        f"host identity: {host_identity()}",
    ]
    if dist.is_available() and dist.is_initialized():
        out.append(f"torch.distributed: backend {dist.get_backend()}, rank {dist.get_rank()} "
                   f"of {dist.get_world_size()}")
    else:
        out.append("torch.distributed: not initialised (topology is detected per "
                   "Communicator from NCCL_HOSTID or host name and boot id)")
    why = native.why_not(config, True, kernels.available())
    chosen = config.issuer or "native"
    out.append(f"issuer for a CUDA call: {chosen if not why else 'python (' + why + ')'}")
    out.append("plan of a hierarchical call: " + (
        f"{config.plan} (set by plan= / RINGREDUCE_PLAN)" if config.plan else
        "chosen at construction: on CUDA a probe times calls of "
        f"{' and '.join(f'{b >> 20} MiB' for b in slicing.probe_sizes(config.min_bytes))} "
        "on NCCL's flat all-reduce, one slice (three collectives) and the pipeline (and an "
        "8- or 4-bit wire against them) and takes the fastest, a route with fewer "
        f"collectives within a margin ({slicing.MIN_MARGIN:.0%}-{slicing.MAX_MARGIN:.0%}, "
        "the probe's spread); on the CPU the pipeline; each Communicator's describe() "
        "and flight records say which and why"))
    return out


def main() -> None:
    print("\n".join(lines()))


if __name__ == "__main__":
    main()
