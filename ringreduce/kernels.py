"""Run-time compiled CUDA kernels from native/*.cu, through cupy.RawModule (NVRTC).

Why cupy: it compiles CUDA C++ at run time, so ringreduce installs without a compiler
or a build step, and it launches on any stream handle, so kernels run on ringreduce's
own stage streams over torch tensors (raw pointers; no copies, no DLPack round trip).
Modules are cached per (kernel, dtype, op, vector width, device architecture), in the
``Kernels`` object each CUDA Communicator owns (no module-level state).

When cupy cannot be imported, the add stage uses torch ops instead (ringreduce.add);
that is logged once per Communicator, never silent.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import RingReduceError

NATIVE = Path(__file__).resolve().parent.parent / "native"
_PACKAGED = Path(__file__).resolve().parent / "native"

#: torch dtype -> (C++ element type, accumulator type, numpy type of the accumulator)
_TYPES: dict[torch.dtype, tuple[str, str, Any]] = {
    torch.float32: ("float", "float", np.float32),
    torch.float64: ("double", "double", np.float64),
    torch.float16: ("half_t", "float", np.float32),
    torch.bfloat16: ("bf16_t", "float", np.float32),
    torch.int32: ("int", "int", np.int32),
    torch.int64: ("long long", "long long", np.int64),
}
_OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3}

#: 256 threads x 16 bytes a thread, in a grid-stride loop over a bounded grid: no block
#: per 4 KiB. Blocks per SM by element size, measured on H200 (2026-11-23,
#: benchmarks/results/2026-11-23-h200-graphs): 16-bit types widen 8 elements per load
#: and need a full SM (2048 threads) to hide it, 0.82 -> 0.98-1.03 of a device copy;
#: 32-bit types run best at half occupancy (0.99-1.03 against 0.93-0.98 at full).
THREADS = 256
BLOCKS_PER_SM = {2: 8}
DEFAULT_BLOCKS_PER_SM = 4


def available() -> bool:
    return importlib.util.find_spec("cupy") is not None


def source_dir() -> Path:
    """native/ beside the package (editable installs) or inside it (wheels)."""
    return NATIVE if (NATIVE / "add.cu").exists() else _PACKAGED


class Kernels:
    """Compiled kernels of one device, and the cupy streams wrapping torch's."""

    def __init__(self, device: torch.device) -> None:
        import cupy  # imported here: nothing touches CUDA at ringreduce import

        self._cupy = cupy
        self._device = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(self._device)
        self._arch = f"sm_{major}{minor}"
        self._sms = torch.cuda.get_device_properties(self._device).multi_processor_count
        self._functions: dict[tuple[torch.dtype, str, int], Any] = {}
        self._streams: dict[int, Any] = {}
        self._source = (source_dir() / "add.cu").read_text()

    def _function(self, dtype: torch.dtype, op: str, vec: int) -> Any:
        key = (dtype, op, vec)
        fn = self._functions.get(key)
        if fn is None:
            elem, acc, _ = _TYPES[dtype]
            name = f"rr_add<{elem}, {acc}, {_OPS[op]}, {vec}>"
            try:
                options = ("-std=c++17", f"--gpu-architecture={self._arch}")
                module = self._cupy.RawModule(code=self._source, name_expressions=[name],
                                              options=options)
                fn = module.get_function(name)
            except self._cupy.cuda.compiler.CompileException as exc:
                raise RingReduceError(f"compiling native/add.cu ({name}, {self._arch}) failed; "
                                      f"compiler log:\n{exc.get_message()}") from exc
            self._functions[key] = fn
        return fn

    def _stream(self, handle: int) -> Any:
        s = self._streams.get(handle)
        if s is None:
            s = self._streams[handle] = self._cupy.cuda.ExternalStream(handle, self._device)
        return s

    def add(self, own: torch.Tensor, rows: torch.Tensor, op: str, world_size: int,
            stream: int) -> None:
        """Unpipelined meaning: ``own[:] = reduce(op, [own, *rows])``, AVG divided by N,
        on ``stream``. 16-byte vector loads when every row starts 16-byte aligned."""
        k = own.numel()
        if k == 0:
            return
        width = 16 // own.element_size()
        aligned = (own.data_ptr() % 16 == 0 and rows.data_ptr() % 16 == 0 and k % width == 0)
        vec = width if aligned else 1
        per_sm = BLOCKS_PER_SM.get(own.element_size(), DEFAULT_BLOCKS_PER_SM)
        blocks = max(1, min(-(-k // (THREADS * vec)), per_sm * self._sms))
        acc_type = _TYPES[own.dtype][2]
        with self._cupy.cuda.Device(self._device):
            self._function(own.dtype, op, vec)(
                (blocks,), (THREADS,),
                (np.uint64(own.data_ptr()), np.uint64(rows.data_ptr()), np.int64(k),
                 np.int32(rows.shape[0]), acc_type(world_size)),
                stream=self._stream(stream))
