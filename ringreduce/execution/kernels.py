"""Run-time compiled CUDA kernels from native/*.cu, through cupy.RawModule (NVRTC).

Why cupy: it compiles CUDA C++ at run time, so ringreduce installs without a compiler
or a build step, and it launches on any stream handle, so kernels run on ringreduce's
own stage streams over torch tensors (raw pointers; no copies, no DLPack round trip).
Modules are cached per (kernel, dtype, op, vector width, device architecture), in the
``Kernels`` object each CUDA Communicator owns (no module-level state).

When cupy cannot be imported, the add stage uses torch ops instead (ringreduce.execution.add),
and so does the compressed route (quant.py); that is logged once per Communicator, never
silent.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ringreduce.errors import RingReduceError
from ringreduce.execution.quant import SCALE_BYTES, Format

NATIVE = Path(__file__).resolve().parents[2] / "native"
"""The repository's native/ (editable installs)."""
_PACKAGED = Path(__file__).resolve().parents[1] / "native"
"""ringreduce/native/ inside an installed wheel (setup.py copies the sources there)."""

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

#: 256 threads x 16 bytes a thread (native/quant.cu's RR_QUANT_THREADS sizes its shared
#: memory for this), in a grid-stride loop over a bounded grid: no block
#: per 4 KiB. Blocks per SM by element size, measured on H200: 16-bit types widen 8
#: elements per load and need a full SM (2048 threads) to hide it, 0.82 -> 0.98-1.03 of
#: a device copy; 32-bit types run best at half occupancy (0.99-1.03 against 0.93-0.98
#: at full).
THREADS = 256
BLOCKS_PER_SM = {2: 8}
DEFAULT_BLOCKS_PER_SM = 4


#: 16-bit wire formats -> C++ element type (float32 tensors only, Config.wire_dtype).
_WIRE = {torch.bfloat16: "bf16_t", torch.float16: "half_t"}
#: Elements per vector access of the wire kernels: 16-byte float32 loads.
_WIRE_VEC = 4

#: Each kernel file and what NVRTC compiles for it: the shared helpers first (no
#: ``#include``: the sources are joined as text, so nothing needs an include path).
_SOURCES = {"add.cu": ("numeric.cuh", "add.cu"), "wire.cu": ("numeric.cuh", "wire.cu"),
            "check.cu": ("numeric.cuh", "check.cu"),
            "quant.cu": ("numeric.cuh", "quant.cuh", "quant.cu")}

#: Block-quantized wire encodings (execution/quant.py Format.encoding) -> FMT of
#: native/quant.cu.
_QUANT = {"int8": 0, "fp8": 1, "gauss4": 3}
#: Element types a quantize reads and a dequantize writes.
_QUANT_TYPES = {torch.float32: "float", torch.float16: "half_t", torch.bfloat16: "bf16_t"}
#: quant.cu keeps a lane's share of a block in registers: E = block / lanes values, at
#: most 32 lanes (one warp, so the block's max is a shuffle reduction), in chunks of 4.
_WARP = 32
_CHUNK = 4
#: Rotated 256-value blocks: rr_quantize_rot256 (without error feedback) and
#: rr_dequantize_rot256, 16 lanes of 16 values a block (quant.cu); DEFAULT_BLOCKS_PER_SM
#: (6 measured the same for the dequantize).
_ROT256 = 256
_ROT256_VALUES = 16


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
        self._functions: dict[tuple[str, str], Any] = {}
        self.emit: Any = None
        """A recorder (ringreduce.execution.native.Recorder): launches are written into a native
        program instead of run (a copy of this object records, see native.py)."""
        self._streams: dict[int, Any] = {}
        self._sources = {name: "".join((source_dir() / part).read_text() for part in parts)
                         for name, parts in _SOURCES.items()}

    def _function(self, source: str, name: str) -> Any:
        """``name`` (a template instance) compiled from native/``source``, cached."""
        fn = self._functions.get((source, name))
        if fn is None:
            try:
                options = ("-std=c++17", f"--gpu-architecture={self._arch}")
                module = self._cupy.RawModule(code=self._sources[source],
                                              name_expressions=[name], options=options)
                fn = module.get_function(name)
            except self._cupy.cuda.compiler.CompileException as exc:
                raise RingReduceError(f"compiling native/{source} ({name}, {self._arch}) "
                                      f"failed; compiler log:\n{exc.get_message()}") from exc
            self._functions[(source, name)] = fn
        return fn

    def _stream(self, handle: int) -> Any:
        s = self._streams.get(handle)
        if s is None:
            s = self._streams[handle] = self._cupy.cuda.ExternalStream(handle, self._device)
        return s

    def _launch(self, source: str, name: str, n: int, vec: int, element_size: int,
                args: tuple[Any, ...], stream: int) -> None:
        """One grid-stride launch over ``n`` elements, ``vec`` per thread per step."""
        per_sm = BLOCKS_PER_SM.get(element_size, DEFAULT_BLOCKS_PER_SM)
        blocks = max(1, min(-(-n // (THREADS * vec)), per_sm * self._sms))
        fn = self._function(source, name)
        if self.emit is not None:
            self.emit.launch(fn, blocks, THREADS, args, stream)
            return
        if self._cupy.cuda.runtime.getDevice() == self._device:  # the usual case: no switch
            fn((blocks,), (THREADS,), args, stream=self._stream(stream))
            return
        with self._cupy.cuda.Device(self._device):
            fn((blocks,), (THREADS,), args, stream=self._stream(stream))

    def add(self, own: torch.Tensor, rows: torch.Tensor, op: str, world_size: int,
            stream: int) -> None:
        """Unpipelined meaning: ``own[:] = reduce(op, [own, *rows])``, AVG divided by N,
        on ``stream``. 16-byte vector loads when every row starts 16-byte aligned."""
        k = own.numel()
        if k == 0:
            return
        width = 16 // own.element_size()
        vec = width if _aligned(k, width, (own, 16), (rows, 16)) else 1
        elem, acc, acc_type = _TYPES[own.dtype]
        self._launch("add.cu", f"rr_add<{elem}, {acc}, {_OPS[op]}, {vec}>", k, vec,
                     own.element_size(),
                     (np.uint64(own.data_ptr()), np.uint64(rows.data_ptr()), np.int64(k),
                      np.int32(rows.shape[0]), acc_type(world_size)), stream)

    def add_wire(self, own: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, op: str,
                 world_size: int, stream: int) -> None:
        """Unpipelined meaning (ringreduce.execution.add.add_wire): ``own`` (float32) reduced with
        ``rows`` (R, k) in the wire format, rounded to it once, into ``own`` and ``out``."""
        k = own.numel()
        if k == 0:
            return
        vec = _WIRE_VEC if _aligned(k, _WIRE_VEC, (own, 16), (rows, 8), (out, 8)) else 1
        self._launch("add.cu", f"rr_add_wire<{_WIRE[rows.dtype]}, {_OPS[op]}, {vec}>", k, vec,
                     rows.element_size(),
                     (np.uint64(own.data_ptr()), np.uint64(rows.data_ptr()),
                      np.uint64(out.data_ptr()), np.int64(k), np.int32(rows.shape[0]),
                      np.float32(world_size)), stream)

    def narrow_rows(self, view: torch.Tensor, packed: torch.Tensor, skip: int,
                    stream: int) -> None:
        """``packed[i] = view[i + (i >= skip)]`` in the wire format: ``view`` (M, k)
        float32, ``packed`` (M-1, k) 16-bit."""
        self._rows("rr_narrow_rows", view, packed, (view, packed), skip, stream)

    def widen_rows(self, packed: torch.Tensor, view: torch.Tensor, skip: int,
                   stream: int) -> None:
        """``view[i + (i >= skip)] = packed[i]`` widened to float32 (narrow_rows undone)."""
        self._rows("rr_widen_rows", view, packed, (packed, view), skip, stream)

    def _rows(self, kernel: str, view: torch.Tensor, packed: torch.Tensor,
              pointers: tuple[torch.Tensor, torch.Tensor], skip: int, stream: int) -> None:
        nrows, k = packed.shape
        if nrows * k == 0:
            return
        vec = _WIRE_VEC if _aligned(k, _WIRE_VEC, (view, 16), (packed, 8)) else 1
        self._launch("wire.cu", f"{kernel}<{_WIRE[packed.dtype]}, {vec}>", nrows * k, vec,
                     packed.element_size(),
                     (np.uint64(pointers[0].data_ptr()), np.uint64(pointers[1].data_ptr()),
                      np.int64(k), np.int32(nrows), np.int32(skip)), stream)

    def quantize(self, x: torch.Tensor, fmt: Format, block: int, out: torch.Tensor,
                 residual: torch.Tensor | None, stream: int, rotate: bool = False) -> None:
        """Unpipelined meaning (quant.quantize, with error feedback when ``residual``):
        ``v = R(x) + residual; out = quantize(v); residual = v - dequantize(out)``, its
        non-finite elements 0; R: quant.rotate when ``rotate``, else nothing. ``x``: (R,
        k) float32/float16/bfloat16 (16-bit widened exactly first); ``residual``: (R, k)
        float32 or None; ``out``: (R, row bytes)."""
        rows, k = x.shape
        if rows * k == 0:
            return
        elems, lanes = _quant_shape(block)
        width = _CHUNK * x.element_size()
        vec = _aligned(k, _CHUNK, (x, width), (out, 4), *_also(residual, 16))
        if rotate and block == _ROT256 and residual is None:
            if rows * k // block >= 2**31:  # its indices are int: 2 TiB of float32
                raise ValueError(f"quantizing {rows * k // block} blocks of {block} in one "
                                 "call; the rotated kernel takes fewer than 2^31: split it")
            self._launch("quant.cu", f"rr_quantize_rot256<{_QUANT_TYPES[x.dtype]}, "
                         f"{_QUANT[fmt.encoding]}, {_bool(vec)}>", rows * k, _ROT256_VALUES, 4,
                         (np.uint64(x.data_ptr()), np.uint64(out.data_ptr()),
                          np.int64(rows * k // block), np.int64(k // block), _inverse(fmt)),
                         stream)
            return
        self._launch("quant.cu", f"rr_quantize<{_QUANT_TYPES[x.dtype]}, "
                     f"{_QUANT[fmt.encoding]}, {elems}, {lanes}, {_bool(vec)}, {_bool(rotate)}>",
                     rows * k, elems, 4,
                     (np.uint64(x.data_ptr()), _pointer(residual), np.uint64(out.data_ptr()),
                      np.int64(rows * k // block), np.int64(k // block), _inverse(fmt)),
                     stream)

    def reduce_requantize(self, got: torch.Tensor, own: torch.Tensor, own_index: int,
                          fmt: Format, block: int, sent: torch.Tensor,
                          residual: torch.Tensor | None, stream: int) -> None:
        """Unpipelined meaning (compressed.py's add, then diffuse's quantization):
        ``v = dequantize(row 0) + ... + dequantize(row M-1)`` in fp32, in that order, row
        ``own_index`` read from ``own`` (one packed row) and the others from ``got`` (M,
        row bytes); ``v += residual; sent = quantize(v); residual = v - dequantize(sent)``.
        ``residual``: (k,) float32 or None; ``sent``: (1, row bytes)."""
        k = sent.shape[1] * 8 * block // (8 * SCALE_BYTES + fmt.bits * block)
        assert fmt.row_bytes(k, block) == sent.shape[1] == got.shape[1], (k, sent.shape)
        if k == 0:
            return
        elems, lanes = _quant_shape(block)
        vec = _aligned(k, _CHUNK, (got, 4), (own, 4), (sent, 4), *_also(residual, 16))
        self._launch("quant.cu", f"rr_reduce_requantize<{_QUANT[fmt.encoding]}, {elems}, "
                     f"{lanes}, {_bool(vec)}>", k, elems, 4,
                     (np.uint64(got.data_ptr()), np.uint64(own.data_ptr()),
                      np.int32(own_index), np.int32(got.shape[0]), _pointer(residual),
                      np.uint64(sent.data_ptr()), np.int64(k // block), _inverse(fmt)),
                     stream)

    def dequantize(self, packed: torch.Tensor, fmt: Format, block: int, out: torch.Tensor,
                   world_size: int, stream: int) -> None:
        """Unpipelined meaning (quant.dequantize, then compressed.py's rotation back,
        AVG and cast): ``out = R'(dequantize(packed))`` (R': quant.rotate_back for a
        rotated format), divided by ``world_size`` when it is not 0, in
        ``out``'s dtype (float32/float16/bfloat16, (R, k)), rounded once."""
        rows, k = out.shape
        if rows * k == 0:
            return
        elems, lanes = _quant_shape(block)
        vec = _aligned(k, _CHUNK, (packed, 4), (out, _CHUNK * out.element_size()))
        args = (np.uint64(packed.data_ptr()), np.uint64(out.data_ptr()),
                np.int64(rows * k // block), np.int64(k // block), np.float32(world_size))
        if fmt.rotated and block == _ROT256:
            self._launch("quant.cu", f"rr_dequantize_rot256<{_QUANT_TYPES[out.dtype]}, "
                         f"{_QUANT[fmt.encoding]}, {_bool(vec)}>", rows * k, _ROT256_VALUES,
                         4, args, stream)
            return
        self._launch("quant.cu", f"rr_dequantize<{_QUANT_TYPES[out.dtype]}, "
                     f"{_QUANT[fmt.encoding]}, {elems}, {lanes}, {_bool(vec)}, "
                     f"{_bool(fmt.rotated)}>",
                     rows * k, elems, 4, args, stream)

    def put_signature(self, words: torch.Tensor, signature: int, stream: int) -> None:
        """``words[:] = [signature, ~signature]`` (int64, 2), on ``stream``."""
        self._launch("check.cu", "rr_put_signature", 1, 1, 8,
                     (np.uint64(words.data_ptr()), np.int64(signature)), stream)

    def check_signature(self, got: torch.Tensor, signature: int, report: int,
                        stream: int) -> None:
        """After the all-reduce (MAX) of every rank's words into ``got``: a mismatch
        with ``signature`` is written to ``report`` (device pointer of host memory)."""
        self._launch("check.cu", "rr_check_signature", 1, 1, 8,
                     (np.uint64(got.data_ptr()), np.int64(signature), np.uint64(report)),
                     stream)


def _quant_shape(block: int) -> tuple[int, int]:
    """(values a lane, lanes a block) of native/quant.cu for ``block`` (a multiple of
    8): the most lanes, up to a warp, that leave whole chunks of 4 to each. 256: 32
    lanes of 8 values (two 16-byte fp32 loads). A block of 8 * odd > 8 leaves 2 lanes
    of block/2 values: correct, but past ~64 values a lane they spill to local memory."""
    lanes = _WARP
    while block % (_CHUNK * lanes):
        lanes //= 2
    assert lanes >= 1 and block % _CHUNK == 0, block
    return block // lanes, lanes


def _bool(flag: bool) -> str:
    """A C++ template argument."""
    return "true" if flag else "false"


def _inverse(fmt: Format) -> np.float32:
    """1/QMAX rounded to fp32 as torch's CUDA division by a Python number computes it
    (``opmath_t(1) / b``, then a multiply): quant.py's scale on CUDA, bit for bit."""
    return np.float32(1.0) / np.float32(fmt.qmax)


def _pointer(t: torch.Tensor | None) -> np.uint64:
    """A kernel's optional pointer argument: 0 (nullptr) for None."""
    return np.uint64(0 if t is None else t.data_ptr())


def _also(t: torch.Tensor | None, align: int) -> tuple[tuple[torch.Tensor, int], ...]:
    """``_aligned``'s (tensor, alignment) for an optional tensor."""
    return () if t is None else ((t, align),)


def _aligned(k: int, vec: int, *tensors: tuple[torch.Tensor, int]) -> bool:
    """Whether every row of ``k`` elements is ``vec``-packable: k a multiple of vec,
    each tensor's start aligned to its pack (bytes)."""
    return k % vec == 0 and all(t.data_ptr() % align == 0 for t, align in tensors)
