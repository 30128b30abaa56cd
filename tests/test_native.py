"""The native issuer's CPU-side parts (native/*.cpp as ringreduce._native): it is
built wherever a C++ compiler is, programs are encoded and validated as native.py
writes them, and the issuer runs jobs on the calling thread one at a time per process,
reports the first failure, stops and closes. NOP and FAIL are the test-only
instructions; the CUDA instructions run in tests/test_native_cuda.py."""

from __future__ import annotations

import contextlib
import functools
import shutil
import struct
import subprocess
import sys
import sysconfig
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from ringreduce import info
from ringreduce.config import Config
from ringreduce.execution import call_check, compressed, kernels, native, one_slice, recording
from ringreduce.execution.buffers import Buffers
from ringreduce.execution.call_check import DeviceCallCheck
from ringreduce.execution.feedback import Feedback, Spec
from ringreduce.execution.kernels import Kernels
from ringreduce.execution.pipeline import run_waves
from ringreduce.execution.transport import NcclTransport
from ringreduce.plan import layout, schedule, topology

_native, WHY = native.extension()
built = pytest.mark.skipif(_native is None, reason=f"no extension: {WHY}")
NOP_US = 2000
SLICE = 4096
REPORT = 0x7E5000
"""Where the end-of-call check's report would be (an address outside every tensor)."""


def _compiler() -> str | None:
    cxx = (sysconfig.get_config_var("CXX") or "c++").split()[0]
    return shutil.which(cxx) or shutil.which("g++") or shutil.which("c++")


def test_the_extension_is_built_where_a_compiler_is() -> None:
    if _compiler() is None:
        pytest.skip("no C++ compiler here: the Python issuer is the documented fallback")
    assert _native is not None, (f"a C++ compiler exists but {WHY}; build it: pip install -e . "
                                "(or python setup.py build_ext --inplace)")
    assert set(_native.OPS) >= {"send", "recv", "launch", "write_flag", "nop", "fail"}


def _instr(op: str, *a: int, stage: int = 0, reloc: int = 0) -> bytes:
    return struct.pack("<9q", _native.OPS[op], stage, reloc, *a, *[0] * (6 - len(a)))


@built
def test_recorder_makes_tensor_pointers_relative_and_the_program_validates() -> None:
    rec = recording.Recorder(base=1 << 40, extent=4096, stages=("collect", "add", "diffuse"))
    rec.emit("send", 7, (1 << 40) + 64, 16, 0, 1, 99, pointers=(1,))  # inside: relative
    rec.emit("recv", 7, 5 << 40, 16, 0, 1, 99, pointers=(1,))  # staging: absolute
    program = rec.program()
    assert len(program) == 2 and program.counts() == {"send": 1, "recv": 1}
    fields = struct.unpack("<9q", bytes(rec.code[:72]))
    assert fields[2] == 0b10 and fields[4] == 64  # reloc bit of a1, offset into the tensor
    assert struct.unpack("<9q", bytes(rec.code[72:]))[2:5] == (0, 7, 5 << 40)


@built
@pytest.mark.parametrize("code,problem", [
    (lambda: _instr("group_start") + _instr("group_start"), "nested NCCL group"),
    (lambda: _instr("group_end"), "group_end without group_start"),
    (lambda: _instr("group_start"), "ends inside an NCCL group"),
    (lambda: _instr("group_start") + _instr("memcpy", 1, 2, 3, 4) + _instr("group_end"),
     "memcpy inside an NCCL group"),
    (lambda: _instr("send", 1, 5000, 1, 0, 1, 0, reloc=0b10), "tensor offset 5000 outside"),
    (lambda: _instr("send", 0, 8, 1, 0, 1, 0), "null comm"),
    (lambda: struct.pack("<9q", 99, 0, 0, 0, 0, 0, 0, 0, 0), "unknown op 99"),
    (lambda: _instr("launch", 1, 1, 256, 0, 3, 0), "kernel arguments out of range"),
    (lambda: _instr("nop")[:-1], "whole number of instructions"),
])
def test_invalid_programs_are_refused_with_the_reason(code, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        _native.Program(code(), b"", 4096)


@built
def test_kernel_arguments_are_checked_by_size_and_tensor_bounds() -> None:
    ok = struct.pack("<2q", 8 | 1 << 8, 100) + struct.pack("<2q", 4, 7)
    assert len(_native.Program(_instr("launch", 1, 2, 256, 0, 2, 0), ok, 4096)) == 1
    with pytest.raises(ValueError, match="kernel argument of size 3"):
        _native.Program(_instr("launch", 1, 2, 256, 0, 1, 0), struct.pack("<2q", 3, 0), 4096)
    with pytest.raises(ValueError, match="kernel pointer offset outside the tensor"):
        _native.Program(_instr("launch", 1, 2, 256, 0, 1, 0),
                        struct.pack("<2q", 8 | 1 << 8, 4096), 4096)


@built
def test_a_cpu_issuer_refuses_cuda_programs() -> None:
    issuer = _native.Issuer()
    try:
        with pytest.raises(ValueError, match="without libcuda"):
            issuer.run(_native.Program(_instr("write_flag"), b"", 0), 0, 0)
    finally:
        issuer.close()


def _in_thread(call: Any) -> threading.Thread:
    thread = threading.Thread(target=call)
    thread.start()
    return thread


def _until(check: Any, timeout_s: float = 5.0) -> None:
    started = time.perf_counter()
    while not check():
        assert time.perf_counter() - started < timeout_s, "timed out"
        time.sleep(0.001)


@built
def test_run_issues_on_the_calling_thread_before_it_returns() -> None:
    """The "native" issuer: Issuer.run replays the job here, before it returns."""
    issuer = _native.Issuer()
    slow = _native.Program(_instr("nop", NOP_US), b"", 0)  # 2 ms
    started = time.perf_counter()
    seq = issuer.run(slow, 0, 0)
    took = time.perf_counter() - started
    assert seq == 1 and took >= NOP_US / 1e6, f"run returned after {took:.4f} s"
    assert issuer.state(1) == 1 and issuer.counters()["issued"] == 1
    assert issuer.events(1) is None  # no CUDA events here (a deadline error says so)
    assert issuer.run(slow, 0, 0) == 2 and issuer.state(2) == 1
    bad = _native.Program(_instr("fail", stage=1), b"", 0)
    assert issuer.run(bad, 0, 0) == 3 and issuer.error()[:3] == (3, 1, 0)
    issuer.close()


@built
def test_counters_say_which_job_and_instruction_is_being_issued() -> None:
    """What a deadline error reports (native.Completion.progress) while a job is being
    issued on another thread: its number, instruction and op; idle once it returned."""
    issuer = _native.Issuer()
    slow = _native.Program(_instr("nop", NOP_US) * 50, b"", 0)  # 100 ms
    thread = _in_thread(lambda: issuer.run(slow, 0, 0))
    _until(lambda: issuer.counters()["at_op"] != "-")
    busy = issuer.counters()
    assert busy["at_op"] == "nop" and busy["at_job"] == 1, busy
    assert 0 <= busy["at_instruction"] < 50 and busy["submitted"] == 1, busy
    assert busy["issued"] == 0 and issuer.state(1) == 0, busy
    thread.join()
    idle = issuer.counters()
    assert idle["issued"] == 1 and idle["at_op"] == "-" and issuer.error() is None, idle
    issuer.close()


@built
def test_a_job_may_follow_only_a_job_already_submitted() -> None:
    """``after`` (a job on the same memory that this one follows on the device, the
    wait added by the issuing thread) must name a job already run: its done event is
    recorded before this job's entry wait then. Anything else is refused before the job
    is issued, and the numbering is unchanged."""
    issuer = _native.Issuer()
    nop = _native.Program(_instr("nop", 0), b"", 0)
    assert issuer.run(nop, 0, 0) == 1
    assert issuer.run(nop, 0, 0, 1) == 2  # follows job 1
    assert issuer.run(nop, 0, 0, 2) == 3
    for bad in (4, 99, 2**32 + 1):
        with pytest.raises(ValueError, match=f"after={bad} is not a submitted job"):
            issuer.run(nop, 0, 0, bad)
    with pytest.raises(ValueError, match=r"after=4 is not a submitted job \(the last is 3\)"):
        issuer.run(nop, 0, 0, 4)
    assert issuer.counters()["submitted"] == 3 and issuer.error() is None
    issuer.close()


@built
def test_issuers_of_one_process_issue_one_job_at_a_time() -> None:
    """Jobs of different Issuers (Communicators) run from two threads are issued one
    after the other, never at once: NCCL kernels of different communicators must reach
    the device in one order on every rank, and two threads issuing on communicators of
    one device at once hang."""
    first, second = _native.Issuer(), _native.Issuer()
    slow = _native.Program(_instr("nop", 100 * NOP_US), b"", 0)  # 200 ms
    quick = _native.Program(_instr("nop", 0), b"", 0)
    thread = _in_thread(lambda: first.run(slow, 0, 0))
    _until(lambda: first.counters()["at_op"] == "nop")
    began = time.perf_counter()
    assert second.run(quick, 0, 0) == 1  # waits for the other thread's job
    assert first.counters()["issued"] == 1, "the second job was issued beside the first"
    assert time.perf_counter() - began >= 0.5 * 100 * NOP_US / 1e6
    thread.join()
    first.close()
    second.close()


@built
def test_a_failure_is_kept_with_its_job_stage_and_instruction_and_poisons_later_jobs() -> None:
    issuer = _native.Issuer()
    ok = _native.Program(_instr("nop"), b"", 0)
    bad = _native.Program(_instr("nop") + _instr("fail", stage=2), b"", 0)
    assert [issuer.run(p, 0, 0) for p in (ok, bad, ok)] == [1, 2, 3]
    seq, stage, index, message = issuer.error()
    assert (seq, stage, index) == (2, 2, 1) and "planted failure" in message
    assert issuer.state(1) == -1 and issuer.state(3) == -1  # the communicator is poisoned
    assert issuer.counters()["issued"] == 3  # counted: its flag written, none of its work
    issuer.close()


@built
def test_stop_ends_a_job_being_issued_and_close_refuses_more() -> None:
    """A failure (the watchdog's thread) stops the issuing thread at its next
    instruction: stop() returns once it is outside every call, the job ends early with
    the abort as its error, and a closed issuer refuses jobs."""
    issuer = _native.Issuer()
    slow = _native.Program(_instr("nop", NOP_US) * 1000, b"", 0)  # 2 s if all issued
    started = time.perf_counter()
    thread = _in_thread(lambda: issuer.run(slow, 0, 0))
    _until(lambda: issuer.counters()["at_op"] == "nop")
    assert issuer.stop(5.0)  # the issuing thread is outside any call now
    thread.join()
    assert time.perf_counter() - started < 1.0  # it left the job at the poison
    seq, _, index, message = issuer.error()
    assert "communicators are aborted" in message and seq == 1 and 0 <= index < 1000
    assert issuer.state(1) == -1 and issuer.counters()["issued"] == 1
    issuer.close()
    with pytest.raises(RuntimeError, match="closed"):
        issuer.run(slow, 0, 0)


def test_the_issuer_setting_is_validated_and_reported() -> None:
    with pytest.raises(ValueError, match="issuer='fast' is not supported"):
        Config(issuer="fast")
    with pytest.raises(ValueError, match="issuer='native-async' is not supported"):
        Config(issuer="native-async")  # removed (issue 36): the caller's thread issues
    assert Config.from_env(issuer="python").issuer == "python"
    report = "\n".join(info.lines(Config(issuer="python")))
    assert "issuer for a CUDA call: python (issuer='python'" in report
    assert ("native extension: built" in report) == (_native is not None)
    default = "\n".join(info.lines(Config()))  # native where it can run, else python, why
    assert ("issuer for a CUDA call: native" in default) == (
        _native is not None and kernels.available()), default
    if _native is None:
        assert "issuer for a CUDA call: python (ringreduce._native is not built" in \
            "\n".join(info.lines(Config(issuer="native")))


def test_info_says_whether_nccl_starts_kernels_in_issue_order() -> None:
    """launch_order_implicit is in ncclConfig_t from NCCL 2.31; 2.26-2.30 read only the
    process-wide variable (torch's 2.28 ignored the config field in every device run)."""
    from ringreduce.execution.nccl import launch_order

    assert launch_order(23100, {}) == "on (per communicator, ncclConfig_t)"
    assert launch_order(22809, {}).startswith("off: NCCL 2.28.9 has no per-communicator")
    assert "NCCL_LAUNCH_ORDER_IMPLICIT=1 turns it on" in launch_order(23007, {})
    assert launch_order(22809, {"NCCL_LAUNCH_ORDER_IMPLICIT": "1"}).startswith("on (NCCL_")
    assert launch_order(23100, {"NCCL_LAUNCH_ORDER_IMPLICIT": "0"}) == \
        "off (NCCL_LAUNCH_ORDER_IMPLICIT=0)"
    assert launch_order(22500, {"NCCL_LAUNCH_ORDER_IMPLICIT": "1"}).startswith(
        "off: NCCL 2.25.0 has none")


class _Function:
    """A kernel handle as cupy gives one (RawKernel.kernel.ptr)."""

    ptr = 0xF00D


class _Kernels:
    """The kernel library's launch signature (kernels.Kernels), launching nothing:
    Kernels itself needs cupy and a GPU; here only the trace's shape is under test."""

    def __init__(self) -> None:
        self.emit = None

    def add(self, own, rows, op, world_size, stream) -> None:
        self.emit.launch(_Function(), 4, 256, (np.uint64(own.data_ptr()),
                         np.uint64(rows.data_ptr()), np.int64(own.numel()),
                         np.int32(rows.shape[0]), np.float32(world_size)), stream)

    def put_signature(self, words, signature, stream) -> None:
        self.emit.launch(_Function(), 1, 256, (np.uint64(words.data_ptr()),
                                               np.int64(signature)), stream)

    def check_signature(self, got, signature, report, stream) -> None:
        self.emit.launch(_Function(), 1, 256, (np.uint64(got.data_ptr()), np.int64(signature),
                                               np.uint64(report)), stream)


class _Compiled(dict):
    """Kernels' cache of compiled functions, as if every template were compiled: the
    launch arguments are built by the real kernels.Kernels; only NVRTC is left out."""

    def get(self, key: object, default: object = None) -> object:
        return _Function()


def _real_kernels(rec: recording.Recorder) -> Kernels:
    k = Kernels.__new__(Kernels)  # no cupy, no GPU: nothing here compiles or launches
    k._functions, k._sms, k.emit = _Compiled(), 132, rec
    return k


@functools.cache
def _communicator_parts(rank: int, machines: int = 2,
                        devices: int = 2) -> tuple[Any, Buffers, Any, int]:
    """What a communicator holds for rank ``rank`` (CPU tensors, fake handles)."""
    topo = topology.from_virtual(machines * devices, machines, rank)
    slot_bytes, slots = layout.staging_geometry(devices, machines, SLICE, 1 << 16)
    buffers = Buffers(topo, slot_bytes, slots, layout.PADDING_SLOTS, torch.device("cpu"))
    names = schedule.event_names(devices, slots, layout.PADDING_SLOTS)
    real = SimpleNamespace(handle=lambda stage: 100 + schedule.STAGES.index(stage),
                           on=lambda stage: contextlib.nullcontext(),
                           events={n: SimpleNamespace(cuda_event=1000 + i)
                                   for i, n in enumerate(names)})
    return topo, buffers, real, slots


@functools.cache
def _call_check(rank: int, machines: int, devices: int) -> DeviceCallCheck:
    """The communicator's end-of-call check (CPU memory: only traced, never run)."""
    int64 = torch.int64
    return DeviceCallCheck(call_check.hops(devices, machines),
                           torch.zeros(2, dtype=int64), torch.zeros(2, dtype=int64),
                           torch.zeros(4, dtype=int64), REPORT)


def _kept_check(rank: int, machines: int, devices: int) -> call_check.KeptWords:
    """The check as recording.trace wraps it: words made once per program (here CPU
    memory), kept in ``_keep``."""
    return call_check.KeptWords(_call_check(rank, machines, devices),
                                lambda own: torch.tensor([own, ~own]), _KEPT)


_KEPT: list[torch.Tensor] = []
"""Every traced check's words (tests only: small, kept for the module's life)."""


def _assert_reads_kept_words(exchange: tuple[int, ...], ops: dict[str, int]) -> None:
    """The check's first hop sends a kept [own, ~own], at its absolute address (the
    all_reduce's send argument, not relative: bit 1 of its flags clear)."""
    assert exchange[0] == ops["all_reduce"] and not exchange[2] & 0b10, exchange
    kept = [w for w in _KEPT if w.data_ptr() == exchange[4]]
    assert len(kept) == 1, "the first hop does not send a kept check's words"
    words = kept[0]
    assert int(words[1]) == ~int(words[0]) and int(words[0]) != 0, words


def _but_words(rec: recording.Recorder) -> bytes:
    """The program's instructions with the check's words (memory made per trace) at 0."""
    kept = {w.data_ptr() for w in _KEPT}
    code = [list(c) for c in struct.iter_unpack("<9q", bytes(rec.code))]
    for c in code:
        if c[0] == _native.OPS["all_reduce"] and c[4] in kept:
            c[4] = 0
    return b"".join(struct.pack("<9q", *c) for c in code)


def _trace(numel: int, rank: int, machines: int = 2, devices: int = 2,
           wire: torch.dtype | None = None, real_kernels: bool = False,
           ) -> tuple[recording.Recorder, Any, Any, torch.Tensor]:
    """Trace one float32 call as NativeIssuer._trace does, with CPU tensors."""
    topo, buffers, real, slots = _communicator_parts(rank, machines, devices)
    t = torch.arange(numel, dtype=torch.float32)
    reader = "add" if wire is None else "diffuse"
    plans, waves = schedule.plan_waves(numel, 4, devices, machines, SLICE, slots, reader)
    stages = schedule.active_stages(devices)
    rec = recording.Recorder(t.data_ptr(), numel * 4, stages)
    if real_kernels:
        kernels: Any = _real_kernels(rec)
    else:
        kernels = _Kernels()
        kernels.emit = rec
    comms = {s: SimpleNamespace(_comm=7 + i) for i, s in enumerate((*schedule.STAGES, "world"))}
    check = _kept_check(rank, machines, devices)
    ctx = SimpleNamespace(topo=topo, buffers=buffers, kernels=kernels, wire=wire, record=None,
                          op_number=1, sync=recording.RecordedStreams(real, rec), check=check,
                          recording=True,
                          transport=NcclTransport(topo, comms, kernels if real_kernels else None,
                                                  calls=recording.RecordedNccl(rec)))
    run_waves(waves, t, plans, "sum", ctx)
    rec.emit("write_flag")
    return rec, plans, waves, t


@built
def test_a_traced_call_is_the_plans_operations_and_independent_of_the_tensors_address() -> None:
    numel = 5 * 1024 + 7  # several 4 KiB slices, the last with a 3-element tail
    rec, plans, waves, first = _trace(numel, rank=0)
    steps = [s for wave in waves for s in wave]
    counts = rec.program().counts()
    assert plans[-1].k and plans[-1].tail == 3 and len(plans) > 2
    parts = len(plans) + 1  # every slice's body, and the padding slot on the last one
    # one NCCL group per wave (rs co di ag of up to four slices; the add follows its
    # collect's group in the same wave), not one per stage, and
    # one for the end-of-call check's second hop (along the rail)
    assert counts["group_start"] == counts["group_end"] == len(waves) + 1 == len(plans) + 4
    assert counts["reduce_scatter"] == counts["launch"] - 1 == parts  # adds, the verdict
    assert counts["send"] == counts["recv"] == parts  # collect, one peer
    assert counts["all_gather"] == 2 * parts  # diffuse along the rail, then inside
    # The end-of-call check: its words written when traced (no put in the program), its
    # first hop inside the last wave's group after the stages' operations, the second in
    # a group of its own, then verify (a launch), all before the flag says done.
    assert counts["all_reduce"] == 2
    names = {code: name for name, code in _native.OPS.items()}
    code = list(struct.iter_unpack("<9q", bytes(rec.code)))
    order = [names[op] for op, *_ in code]
    hop = order.index("all_reduce")
    start = hop - order[hop::-1].index("group_start")
    _assert_reads_kept_words(code[hop], _native.OPS)
    assert order[start:hop + 2] == ["group_start", "all_gather", "all_gather", "all_reduce",
                                      "group_end"], order[start:]
    tail = [n for n in order[hop + 2:] if n not in ("memcpy", "record_event")]
    assert tail == ["group_start", "all_reduce", "group_end", "launch", "write_flag"], tail
    assert counts["memcpy"] == 2 and counts["write_flag"] == 1  # tail in and out
    assert counts["wait_event"] == sum(1 for s in steps for n in s.waits
                                       if not n.startswith("tail"))
    assert counts["record_event"] == sum(1 for s in steps for n in s.records
                                         if not n.startswith("tail"))
    again, _, _, _ = _trace(numel, rank=0)  # a new tensor, elsewhere (first is alive)
    assert again.base != rec.base == first.data_ptr()
    assert _but_words(again) == _but_words(rec) and bytes(again.args) == bytes(rec.args)
    other, _, _, _ = _trace(numel, rank=3)  # another rank: other rows, other staging
    assert bytes(other.code) != bytes(rec.code)


def _one_stream_context(numel: int, rank: int, machines: int, devices: int,
                        stage_of_group: dict[str, str]) -> tuple[Any, torch.Tensor, Any]:
    """(recorder, tensor, context) for tracing a call walked on one stream (one slice,
    compressed), with the real kernels' arguments and CPU tensors."""
    topo, _, real, _ = _communicator_parts(rank, machines, devices)
    t = torch.arange(numel, dtype=torch.float32)
    rec = recording.Recorder(t.data_ptr(), numel * 4, schedule.active_stages(devices))
    kernels = _real_kernels(rec)
    comms = {s: SimpleNamespace(_comm=7 + i) for i, s in enumerate((*schedule.STAGES, "world"))}
    transport = recording.StagedTransport(rec, stage_of_group, topo, comms, kernels,
                                          calls=recording.RecordedNccl(rec))
    ctx = SimpleNamespace(topo=topo, kernels=kernels, record=None, op_number=1, divisors={},
                          sync=recording.RecordedStreams(real, rec), transport=transport,
                          recording=True,
                          check=_kept_check(rank, machines, devices))
    return rec, t, ctx


def _trace_one(numel: int, rank: int, op: str, machines: int = 2,
               devices: int = 2) -> tuple[recording.Recorder, torch.Tensor]:
    """Trace one float32 one-slice call as recording.trace does, with CPU tensors."""
    rec, t, ctx = _one_stream_context(numel, rank, machines, devices, one_slice.STAGE_OF_GROUP)
    stages = schedule.active_stages(devices)
    recording.walk_one_slice(t, op, ctx, stages)
    rec.stage = len(stages) - 1
    rec.emit("write_flag")
    return rec, t


@built
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_a_one_slice_call_traces_as_three_groups_on_the_flag_stream(op: str) -> None:
    """The one-slice plan recorded for the native issuer: after the job's entry, on the
    stream whose flag ends the job, the reduce-scatter, one group for the rail (chunk,
    the n mod D tail on the world communicator, the check's rail hop from words written
    when traced, on the chunk's communicator; nested groups recorded as one, which the
    program validator requires), AVG's division as launches, the all-gather with the
    check's machine hop, the verdict.
    Each instruction names the stage its failure would name; the program does not
    depend on the tensor's address."""
    numel, devices, rank = 2 * 5000 + 1, 2, 1
    rec, t = _trace_one(numel, rank, op)
    rec.program()  # validates: no nested group, every group closed
    names = {code: name for name, code in _native.OPS.items()}
    code = [struct.unpack("<9q", bytes(rec.code[i:i + 72])) for i in range(0, len(rec.code), 72)]
    order = [names[c[0]] for c in code]
    divide = ["launch", "launch"] if op == "avg" else []  # the chunk, then the tail
    assert order == ["wait_event", "group_start", "reduce_scatter", "group_end",
                     "group_start", "all_reduce", "all_reduce", "all_reduce", "group_end",
                     *divide, "group_start", "all_gather", "all_reduce", "group_end",
                     "launch", "write_flag"], order
    stages = schedule.active_stages(devices)
    flag_stream = 100 + schedule.STAGES.index(stages[-1])
    assert code[0][3:5] == (flag_stream, 0)  # the wait for the job's own entry event
    by_stage = {"reduce_scatter": [2], "collect": [5, 6, 7],
                "all_gather": [len(order) - 5, len(order) - 4]}
    for stage, where in by_stage.items():
        assert {code[i][1] for i in where} == {stages.index(stage)}, (stage, where)
    streams = {"reduce_scatter": 8, "all_reduce": 8, "all_gather": 8}  # a5: the stream
    assert {c[streams[names[c[0]]]] for c in code if names[c[0]] in streams} == {flag_stream}
    k = numel // devices
    rs = code[2]  # send = the body at offset 0, recv = row `rank` of it, both relative
    assert rs[2] & 0b110 == 0b110 and (rs[4], rs[5], rs[6]) == (0, rank * k * 4, k)
    rail, tail, hop = code[5], code[6], code[7]
    assert (rail[4], rail[6]) == (rank * k * 4, k) and (tail[4], tail[6]) == (k * devices * 4, 1)
    assert rail[3] == hop[3] != tail[3]  # the check's hop on the chunk's communicator
    _assert_reads_kept_words(hop, _native.OPS)
    if op == "avg":  # the add kernel on the chunk (relative) with no rows (nrows 0)
        first = code[9]
        args = [struct.unpack("<2q", bytes(rec.args[16 * (first[6] + j):16 * (first[6] + j + 1)]))
                for j in range(first[7])]
        assert args[0] == (8 | 1 << 8, rank * k * 4) and args[2][1] == k and args[3][1] == 0, args
    again, _ = _trace_one(numel, rank, op)  # a new tensor, elsewhere (t is alive)
    assert again.base != rec.base == t.data_ptr()
    assert _but_words(again) == _but_words(rec) and bytes(again.args) == bytes(rec.args)


def _trace_compressed(numel: int, rank: int, op: str, feedback: bool, machines: int = 2,
                      devices: int = 2) -> tuple[recording.Recorder, torch.Tensor, Any, list]:
    """Trace one float32 compressed call (int8) as recording.trace does, with CPU
    tensors: (recorder, tensor, spec, the work buffers kept)."""
    rec, t, ctx = _one_stream_context(numel, rank, machines, devices, {})
    ctx.check = None  # the compressed route has no end-of-call check
    stages = schedule.active_stages(devices)
    k = compressed.padded_row(numel, devices, machines, 256)
    errors = Feedback().errors("b", numel, "int8", machines, k, t.device) \
        if feedback else None
    spec, keep = Spec("int8", 256, errors), []
    recording.walk_compressed(t, op, ctx, stages, spec, keep)
    rec.stage = len(stages) - 1
    rec.emit("write_flag")
    return rec, t, spec, keep


@built
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "padded"])
@pytest.mark.parametrize("op,feedback", [("avg", True), ("sum", False)])
def test_a_compressed_call_traces_on_the_flag_stream_into_kept_buffers(exact, op,
                                                                       feedback) -> None:
    """The compressed route recorded for the native issuer: after the job's entry, on
    the stream whose flag ends the job, the reduce-scatter inside the machine, the
    quantize kernel, the rail exchange, the fused add-and-requantize, the diffuse
    all-gather, the dequantize (AVG's division inside it), the all-gather; a padded
    tensor is copied into a zeroed buffer first and out of the gathered one last.
    Work buffers are the kept ones (absolute pointers), the tensor's relative; the
    error feedback's memory is what the kernels point at; each group names its stage."""
    devices, machines, rank = 2, 2, 1
    numel = devices * machines * 256 * 3 if exact else devices * machines * 256 * 3 - 5
    rec, _, spec, keep = _trace_compressed(numel, rank, op, feedback)
    rec.program()  # validates
    names = {code: name for name, code in _native.OPS.items()}
    code = [struct.unpack("<9q", bytes(rec.code[i:i + 72])) for i in range(0, len(rec.code), 72)]
    order = [names[c[0]] for c in code]
    copy_in, copy_out = ([], []) if exact else (["memcpy"], ["memcpy"])
    assert order == ["wait_event", *copy_in, "group_start", "reduce_scatter", "group_end",
                     "launch", "group_start", "send", "recv", "group_end", "launch",
                     "group_start", "all_gather", "group_end", "launch",
                     "group_start", "all_gather", "group_end", *copy_out, "write_flag"], order
    stages = schedule.active_stages(devices)
    flag_stream = 100 + schedule.STAGES.index(stages[-1])
    assert code[0][3:5] == (flag_stream, 0)
    streams = {"reduce_scatter": 8, "all_gather": 8, "send": 8, "recv": 8, "memcpy": 6}
    on = {c[streams[n]] for c, n in zip(code, order, strict=True) if n in streams}
    assert on == {flag_stream}, on
    want = {"reduce_scatter": "reduce_scatter", "send": "collect", "recv": "collect"}
    for c, n in zip(code, order, strict=True):
        if n in want:
            assert c[1] == stages.index(want[n]), (n, c)
    gathers = [c for c, n in zip(code, order, strict=True) if n == "all_gather"]
    assert [g[1] for g in gathers] == [stages.index("diffuse"), stages.index("all_gather")]
    rs, last = code[order.index("reduce_scatter")], gathers[-1]
    # the reduce-scatter reads the tensor itself when exact (relative), else the kept
    # zeroed copy; the last all-gather writes the tensor itself when exact
    assert bool(rs[2] & 0b10) == exact and bool(last[2] & 0b100) == exact, (rs, last)
    kept = {b.data_ptr() for b in keep}
    assert rs[4] in kept or exact
    assert all(b.count_nonzero() == 0 for b in keep)  # zeroed once: the padding stays 0
    if not exact:  # t -> the padded buffer, the gathered buffer -> t (relative)
        first, final = code[1], code[order.index("write_flag") - 1]
        assert first[2] == 0b10 and first[4] == 0 and first[5] == numel * 4, first
        assert final[2] == 0b01 and final[3] == 0 and final[5] == numel * 4, final
    launches = [c for c, n in zip(code, order, strict=True) if n == "launch"]
    pointers = [{v for size, v in (struct.unpack("<2q", bytes(rec.args[16 * j:16 * j + 16]))
                                   for j in range(c[6], c[6] + c[7])) if size & 0xff == 8}
                for c in launches]
    errors = spec.errors
    if feedback:  # quantize reads/writes the collect error, the add the diffuse error
        assert errors.collect.data_ptr() in pointers[0]
        assert errors.diffuse.data_ptr() in pointers[1]
    assert all(b.data_ptr() not in kept for b in ((errors.collect, errors.diffuse)
                                                 if feedback else ()))


_GIL_AND_LOCK = """
import struct, threading
from ringreduce.execution import native
module = native.extension()[0]
issuer = module.Issuer()
bad = module.Program(struct.pack("<9q", module.OPS["fail"], 0, 0, 0, 0, 0, 0, 0, 0), b"", 0)
nop = module.Program(struct.pack("<9q", module.OPS["nop"], 0, 0, 0, 0, 0, 0, 0, 0), b"", 0)
stop = False
def caller():  # jobs run without the GIL, taking the issuer's locks (a failure: its own)
    issuer.run(bad, 0, 0)
    while not stop:
        issuer.run(nop, 0, 0)
calling = threading.Thread(target=caller)
calling.start()
for _ in range(300_000):  # as the watchdog: state() and error() under the GIL
    issuer.state(1)
    issuer.error()
stop = True
calling.join()
print("no deadlock")
"""


@built
def test_run_never_holds_a_lock_while_taking_the_gil_back() -> None:
    """native-async's hang (benchmarks/results/2026-11-25-h200-worker-hang): a wait took
    the GIL back still holding the issuer's lock, while a thread with the GIL (the
    watchdog's state()) waited for that lock. run takes the issuer's locks without the
    GIL and gives them back before it takes the GIL again; a child process, so a
    regression fails this test at its timeout instead of hanging the suite."""
    try:
        done = subprocess.run([sys.executable, "-c", _GIL_AND_LOCK], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("run() and state()/error() on two threads deadlocked (GIL against the "
                    "issuer's lock)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no deadlock"


@built
@pytest.mark.parametrize("machines,devices,wire", [(2, 2, torch.bfloat16), (2, 1, None),
                                                   (2, 1, torch.float16), (3, 2, None)])
def test_traces_with_the_real_kernel_arguments_validate(machines, devices, wire) -> None:
    """Every topology shape and the 16-bit wire: the launches carry kernels.Kernels' own
    arguments (pointers, counts, row counts, world size), which the program validates."""
    numel = 3 * 1024 + 5
    rec, plans, _, _ = _trace(numel, rank=machines * devices - 1, machines=machines,
                              devices=devices, wire=wire, real_kernels=True)
    counts = rec.program().counts()
    parts = sum(1 for p in plans if p.k) + (plans[-1].tail > 0)
    per_part = 3 if wire is not None else 1  # narrow, add_wire, widen; else add
    assert counts["launch"] == per_part * parts + 1, counts  # and the end check's verdict
    assert counts["all_reduce"] == (devices > 1) + (machines > 1), counts  # its hops
    peers = machines - 1
    gathered = wire is None  # diffuse: one all-gather along the rail, else p2p (transport)
    assert counts["send"] == counts["recv"] == (1 if gathered else 2) * peers * parts
    assert counts.get("reduce_scatter", 0) == (parts if devices > 1 else 0)
    assert counts.get("all_gather", 0) == ((devices > 1) + gathered) * parts


def test_forgetting_feedback_memory_drops_every_key_that_holds_it() -> None:
    """reset_feedback (or a key whose size changed) lets error-feedback memory go: the
    programs that point into it, and the first-sight keys that would keep it alive,
    are dropped; the other kinds of call stay."""
    feedback = Feedback()
    old = feedback.errors("b0", 1024, "int8", 2, 256, torch.device("cpu"))
    kept = feedback.errors("b1", 1024, "int8", 2, 256, torch.device("cpu"))
    issuer = native.NativeIssuer.__new__(native.NativeIssuer)  # no CUDA: only its tables
    kinds = [(1024, torch.float32, "avg", 0, Spec("int8", 256, errors))
             for errors in (old, kept)] + [(1024, torch.float32, "sum", 0, "")]
    issuer._programs = {k: (object(), []) for k in kinds}
    issuer._warm = set(kinds)
    issuer.forget_feedback(old)
    assert list(issuer._programs) == kinds[1:] and issuer._warm == set(kinds[1:])
