"""The native issuer's CPU-side parts (native/issuer.cpp as ringreduce._native): it is
built wherever a C++ compiler is, programs are encoded and validated as native.py
writes them, and the worker's queue keeps order, reports the first failure, drains,
stops and closes. NOP and FAIL are the test-only instructions; the CUDA instructions
run in tests/test_native_cuda.py."""

from __future__ import annotations

import functools
import itertools
import shutil
import struct
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from ringreduce import info
from ringreduce.config import Config
from ringreduce.errors import RingReduceError
from ringreduce.execution import call_check, kernels, native, recording
from ringreduce.execution.call_check import DeviceCallCheck
from ringreduce.execution.kernels import Kernels
from ringreduce.execution.pipeline import Buffers, run_waves
from ringreduce.execution.transport import NcclTransport
from ringreduce.plan import layout, schedule, topology
from ringreduce.safety.flight import Record

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
            issuer.submit(_native.Program(_instr("write_flag"), b"", 0), 0, 0)
    finally:
        issuer.close()


@built
def test_the_worker_issues_in_order_without_the_caller_waiting() -> None:
    issuer = _native.Issuer()
    slow = _native.Program(_instr("nop", NOP_US) * 5, b"", 0)  # 10 ms a job
    started = time.perf_counter()
    seqs = [issuer.submit(slow, 0, 0) for _ in range(10)]
    submitted = time.perf_counter() - started
    assert seqs == list(range(1, 11))
    assert submitted < 0.05, f"submit blocked the caller for {submitted:.3f} s"
    assert issuer.state(10) == 0  # 100 ms of queued work is not done yet
    busy = issuer.counters()  # where the worker is: what a deadline error reports
    while busy["at_op"] == "-" and time.perf_counter() - started < 5.0:  # not started yet
        busy = issuer.counters()
    assert busy["at_op"] == "nop" and 1 <= busy["at_job"] <= 10, busy
    assert 0 <= busy["at_instruction"] < 5 and busy["issued"] < 10, busy
    assert issuer.drain(30.0)
    assert [issuer.state(s) for s in seqs] == [1] * 10
    idle = issuer.counters()
    assert idle["issued"] == 10 and idle["at_op"] == "-" and issuer.error() is None, idle
    issuer.close()


@built
def test_run_issues_on_the_calling_thread_before_it_returns() -> None:
    """The "native" issuer: Issuer.run replays the job here, not on the worker."""
    issuer = _native.Issuer()
    slow = _native.Program(_instr("nop", NOP_US), b"", 0)  # 2 ms
    started = time.perf_counter()
    seq = issuer.run(slow, 0, 0)
    took = time.perf_counter() - started
    assert seq == 1 and took >= NOP_US / 1e6, f"run returned after {took:.4f} s"
    assert issuer.state(1) == 1 and issuer.counters()["issued"] == 1
    assert issuer.events(1) is None  # no CUDA events here (a deadline error says so)
    assert issuer.run(slow, 0, 0) == 2  # one sequence with submitted jobs
    issuer.submit(_native.Program(_instr("nop", 200 * NOP_US), b"", 0), 0, 0)
    with pytest.raises(RuntimeError, match="while submitted jobs are queued: drain"):
        issuer.run(slow, 0, 0)  # it would overtake the queue
    assert issuer.drain(30.0) and issuer.run(slow, 0, 0) == 4
    bad = _native.Program(_instr("fail", stage=1), b"", 0)
    assert issuer.run(bad, 0, 0) == 5 and issuer.error()[:3] == (5, 1, 0)
    issuer.close()


@built
def test_a_job_may_follow_only_a_job_already_submitted() -> None:
    """``after`` (a job on the same memory that this one follows on the device, the
    wait added by the issuing thread) must name a job already submitted: one issuing
    order guarantees its done event is recorded before this job's entry wait. Anything
    else is refused before the job is queued, and the numbering is unchanged."""
    issuer = _native.Issuer()
    nop = _native.Program(_instr("nop", 0), b"", 0)
    assert issuer.submit(nop, 0, 0) == 1
    assert issuer.submit(nop, 0, 0, 1) == 2  # follows job 1
    issuer.drain(30.0)
    assert issuer.run(nop, 0, 0, 2) == 3
    for bad in (4, 99, 2**32 + 1):
        with pytest.raises(ValueError, match=f"after={bad} is not a submitted job"):
            issuer.submit(nop, 0, 0, bad)
    with pytest.raises(ValueError, match=r"after=4 is not a submitted job \(the last is 3\)"):
        issuer.run(nop, 0, 0, 4)
    assert issuer.drain(30.0) and issuer.counters()["submitted"] == 3
    assert issuer.error() is None
    issuer.close()


@built
def test_issuers_of_one_process_issue_in_one_order() -> None:
    """Jobs of different Issuers (Communicators) are issued in the order they were
    submitted or run, across Issuers: NCCL kernels of different communicators must
    reach the device in one order on every rank. A later Issuer's job waits for an
    earlier one's; drain() on any Issuer waits for every Issuer's jobs."""
    first, second = _native.Issuer(), _native.Issuer()
    slow = _native.Program(_instr("nop", 100 * NOP_US), b"", 0)  # 200 ms
    quick = _native.Program(_instr("nop", 0), b"", 0)
    started = time.perf_counter()
    first.submit(slow, 0, 0)
    second.submit(quick, 0, 0)
    time.sleep(0.05)
    assert second.counters()["issued"] == 0, "the later job overtook the earlier Issuer's"
    assert not second.drain(0.01), "drain() returned while another Issuer's job is queued"
    assert second.drain(30.0) and first.counters()["issued"] == 1
    assert second.counters()["issued"] == 1
    assert time.perf_counter() - started >= 100 * NOP_US / 1e6
    first.submit(slow, 0, 0)
    began = time.perf_counter()
    assert second.run(quick, 0, 0) == 2  # inline, yet after the earlier queued job
    assert time.perf_counter() - began >= 0.9 * 100 * NOP_US / 1e6
    assert first.counters()["issued"] == 2
    first.close()
    second.close()


@built
def test_op_times_say_where_host_time_goes_and_reset() -> None:
    """What issue 18's profile of the remaining host time reads: instructions and host
    time per kind of instruction, summed over jobs until reset."""
    issuer = _native.Issuer()
    job = _native.Program(_instr("nop", NOP_US) * 2 + _instr("nop", 0), b"", 0)
    issuer.run(job, 0, 0)
    issuer.run(job, 0, 0)
    calls, ns = issuer.op_times()["nop"]
    assert calls == 6 and ns >= 4 * NOP_US * 1000, (calls, ns)
    assert set(issuer.op_times(True)) == {"nop"}  # only kinds that ran are listed
    assert issuer.op_times() == {}
    issuer.close()


@built
def test_a_failure_is_kept_with_its_job_stage_and_instruction_and_poisons_later_jobs() -> None:
    issuer = _native.Issuer()
    ok = _native.Program(_instr("nop"), b"", 0)
    bad = _native.Program(_instr("nop") + _instr("fail", stage=2), b"", 0)
    issuer.submit(ok, 0, 0)
    issuer.submit(bad, 0, 0)
    issuer.submit(ok, 0, 0)
    assert issuer.drain(10.0)
    seq, stage, index, message = issuer.error()
    assert (seq, stage, index) == (2, 2, 1) and "planted failure" in message
    assert issuer.state(1) == -1 and issuer.state(3) == -1  # the communicator is poisoned
    issuer.close()


@built
def test_stop_ends_issue_and_close_joins_with_work_queued() -> None:
    issuer = _native.Issuer()
    slow = _native.Program(_instr("nop", NOP_US) * 50, b"", 0)  # 100 ms
    for _ in range(20):  # 2 s if it were all issued
        issuer.submit(slow, 0, 0)
    assert issuer.stop(5.0)  # the worker is outside any call now
    started = time.perf_counter()
    issuer.close()  # the rest only has its flags written (none here): quick
    assert time.perf_counter() - started < 1.0
    seq, _, _, message = issuer.error()
    assert "communicators are aborted" in message and seq >= 1
    with pytest.raises(RuntimeError, match="closed"):
        issuer.submit(slow, 0, 0)


@built
def test_drain_times_out_instead_of_hanging() -> None:
    issuer = _native.Issuer()
    issuer.submit(_native.Program(_instr("nop", 300_000), b"", 0), 0, 0)
    assert issuer.drain(0.01) is False
    assert issuer.drain(10.0) is True
    issuer.close()


def test_the_issuer_setting_is_validated_and_reported() -> None:
    with pytest.raises(ValueError, match="issuer='fast' is not supported"):
        Config(issuer="fast")
    assert Config(issuer="native-async").issuer == "native-async"
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


def test_issue_probes_are_a_validated_setting_and_inert_without_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="issue_probes=-1 must be a non-negative int"):
        Config(issue_probes=-1)
    monkeypatch.setenv("RINGREDUCE_ISSUE_PROBES", "512")
    assert Config.from_env().issue_probes == 512
    if _native is None:
        return
    issuer = _native.Issuer()  # no CUDA: nothing to record, nothing to report
    issuer.enable_probes(512)
    job = issuer.submit(_native.Program(_instr("nop", 0), b"", 0), 0, 0)
    assert issuer.wait_issued(job, 10.0)
    assert issuer.probe(job) is None
    issuer.close()


def test_probe_text_names_per_stream_the_first_instruction_not_passed() -> None:
    """What a deadline error says with RINGREDUCE_ISSUE_PROBES set (native.py), from rows
    as Issuer.probe returns them: (instruction, op, stage, stream, reached, a1)."""
    collect, add, diffuse, done = 0xC0, 0xAD, 0xD1, 0xD0
    rows = [(0, "wait_event", 0, collect, 1, 0), (1, "record_event", 0, collect, 1, 0xE1),
            (3, "send", 0, collect, 0, 0), (4, "recv", 0, collect, 0, 0),
            (5, "record_event", 0, collect, 0, 0xE2), (6, "wait_event", 1, add, 0, 0xE2),
            (7, "launch", 1, add, 0, 0), (8, "wait_event", 2, diffuse, 0, 0xE9),
            (9, "write_flag", 2, diffuse, 0, 0)]
    streams = {name: SimpleNamespace(cuda_stream=h)
               for name, h in (("collect", collect), ("add", add), ("diffuse", diffuse))}
    issuer = SimpleNamespace(worker=SimpleNamespace(probe=lambda seq: rows if seq == 7 else None),
                             res=SimpleNamespace(sync=SimpleNamespace(streams=streams)),
                             _done_handle=done, _waits_on=native.NativeIssuer._waits_on)
    text = native.NativeIssuer.probe_text(issuer, 7)  # type: ignore[arg-type]
    assert text == ("; probes: collect at #3 send (2 passed); "
                    "add at #6 wait_event (recorded by #5 on collect) (0 passed); "
                    "diffuse at #8 wait_event (recorded by an earlier job) (0 passed)")
    assert native.NativeIssuer.probe_text(issuer, 8) == ""  # type: ignore[arg-type]
    rows[:] = [(0, "wait_event", 0, collect, 1, 0)]
    assert native.NativeIssuer.probe_text(issuer, 7) == \
        "; probes: every instruction passed"  # type: ignore[arg-type]


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
                           events={n: SimpleNamespace(cuda_event=1000 + i)
                                   for i, n in enumerate(names)})
    return topo, buffers, real, slots


@functools.cache
def _call_check(rank: int, machines: int, devices: int) -> DeviceCallCheck:
    """The communicator's end-of-call check (CPU memory: only traced, never run)."""
    int64 = torch.int64
    return DeviceCallCheck(call_check.hops(devices, machines, "stages"),
                           torch.zeros(2, dtype=int64), torch.zeros(2, dtype=int64),
                           torch.zeros(4, dtype=int64), REPORT)


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
    check = _call_check(rank, machines, devices)
    ctx = SimpleNamespace(topo=topo, buffers=buffers, kernels=kernels, wire=wire, record=None,
                          op_number=1, sync=recording.RecordedStreams(real, rec), check=check,
                          transport=NcclTransport(topo, comms, 1.0, True,
                                                  kernels if real_kernels else None,
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
    assert counts["reduce_scatter"] == counts["launch"] - 2 == parts
    assert counts["send"] == counts["recv"] == parts  # collect, one peer
    assert counts["all_gather"] == 2 * parts  # diffuse along the rail, then inside
    # The end-of-call check: put (a launch) before the last wave's group, its first hop
    # inside it after the stages' operations, the second in a group of its own, then
    # verify (a launch), all before the flag says done.
    assert counts["all_reduce"] == 2
    names = {code: name for name, code in _native.OPS.items()}
    order = [names[op] for op, *_ in struct.iter_unpack("<9q", bytes(rec.code))]
    hop = order.index("all_reduce")
    start = hop - order[hop::-1].index("group_start")
    assert "launch" in order[start - 2:start], order[start - 4:]
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
    assert bytes(again.code) == bytes(rec.code) and bytes(again.args) == bytes(rec.args)
    other, _, _, _ = _trace(numel, rank=3)  # another rank: other rows, other staging
    assert bytes(other.code) != bytes(rec.code)



@built
def test_wait_issued_returns_once_the_worker_issued_that_job() -> None:
    issuer = _native.Issuer()
    slow = _native.Program(_instr("nop", 100_000), b"", 0)  # 100 ms a job
    first, second = issuer.submit(slow, 0, 0), issuer.submit(slow, 0, 0)
    assert issuer.wait_issued(second, 0.0) is False  # nothing issued yet
    started = time.perf_counter()
    assert issuer.wait_issued(first, 10.0) is True
    assert issuer.state(first) == 1 and issuer.state(second) == 0
    assert issuer.wait_issued(second, 10.0) is True
    assert time.perf_counter() - started >= 0.15  # it waited for both jobs, in order
    issuer.close()


@built
def test_follow_waits_for_the_issue_and_refuses_failed_jobs() -> None:
    """The completer's one call per Future: 0 while the job is not issued (after its
    timeout), 1 once it is (the stream would now wait for its done event), -1 for the
    failed job and every one after it, none of them followed."""
    issuer = _native.Issuer()
    slow = _native.Program(_instr("nop", 100_000), b"", 0)  # 100 ms a job
    bad = _native.Program(_instr("fail", stage=1), b"", 0)
    first, second, third = (issuer.submit(p, 0, 0) for p in (slow, bad, slow))
    assert issuer.follow(0, first, 0.0) == 0  # not issued yet
    assert issuer.follow(0, first, 10.0) == 1
    assert issuer.follow(0, second, 10.0) == -1 and issuer.error()[:2] == (2, 1)
    assert issuer.follow(0, third) == -1  # no timeout: until issued
    assert issuer.follow(0, first, 0.0) == 1  # jobs before the failure still completed
    issuer.close()


@built
def test_follow_covers_every_issued_job_up_to_last_and_stops_before_a_failure() -> None:
    """The completer's batches: one follow for the Futures queued together counts the
    jobs from ``seq`` that are issued (up to ``last``), never past a failed one."""
    issuer = _native.Issuer()
    fast = _native.Program(_instr("nop", 0), b"", 0)
    slow = _native.Program(_instr("nop", 300_000), b"", 0)  # 300 ms a job
    bad = _native.Program(_instr("fail", stage=1), b"", 0)
    jobs = [issuer.submit(p, 0, 0) for p in (fast, fast, fast, slow, bad, fast)]
    assert issuer.wait_issued(jobs[2], 10.0)
    assert issuer.follow(0, jobs[0], 10.0, jobs[5]) in (3, 4)  # the slow one may be done
    assert issuer.follow(0, jobs[1], 10.0, jobs[1]) == 1  # never past last
    assert issuer.follow(0, jobs[1], 10.0, jobs[0]) == 1  # a last before seq: seq alone
    assert issuer.wait_issued(jobs[5], 10.0)
    assert issuer.follow(0, jobs[0], 0.0, jobs[5]) == 4  # stops before the failed job
    assert issuer.follow(0, jobs[4], 0.0, jobs[5]) == -1
    assert issuer.follow(0, jobs[5], 0.0, jobs[5]) == -1  # and after it
    issuer.close()


@built
def test_follow_waits_for_the_callers_quiet_but_no_longer_than_the_delay() -> None:
    """With quiet_s, follow returns once the process submitted no job for that long, to
    any Issuer, or max_delay_s after the job was issued while jobs keep coming (the
    completer stays off the GIL while the caller makes calls)."""
    issuer = _native.Issuer()
    nop = _native.Program(_instr("nop", 0), b"", 0)
    submitted = time.perf_counter()
    first = issuer.submit(nop, 0, 0)
    assert issuer.wait_issued(first, 10.0)
    assert issuer.follow(0, first, 10.0, first, 0.2, 5.0) == 1  # quiet 0.2 s after submit
    assert 0.19 <= time.perf_counter() - submitted < 4.0

    stop = threading.Event()
    other = _native.Issuer()  # another Communicator's

    def submitting() -> None:  # a caller that keeps making calls, every 20 ms
        for i in itertools.count():
            if stop.wait(0.02):
                return
            (issuer if i % 2 else other).submit(nop, 0, 0)

    caller = threading.Thread(target=submitting)
    caller.start()
    try:
        second = issuer.submit(nop, 0, 0)
        started = time.perf_counter()
        n = issuer.follow(0, second, 10.0, second + 1000, 0.5, 0.3)
        waited = time.perf_counter() - started
    finally:
        stop.set()
        caller.join()
    assert 0.29 <= waited < 1.5, waited  # the delay, not the quiet the caller never left
    assert n >= 2  # jobs submitted while it waited, and issued, are covered too
    issuer.close()
    other.close()


def _completer(issuer: Any, failed: Callable[[], bool] = lambda: False) -> native.Completer:
    """native-async's completer over a CPU Issuer: no stream to wait on, no setup."""
    return native.Completer(issuer, 0, failed,
                            lambda record: f"job failed (operation #{record.op_number})",
                            lambda: None)


def _queued(completer: native.Completer, seq: int, value: float) -> Any:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    record = Record(seq, 1, "torch.float32", "sum", "hierarchical (native-async)")
    completer.put((seq, fut, torch.tensor([value]), record))
    return fut


@built
def test_the_completer_completes_each_future_with_its_tensor_once_issued() -> None:
    """Futures complete in job order with their own tensors, none before its job is
    issued; a failed job's Future and every later one get the RingReduceError naming
    the operation, earlier ones their results; close() completes whatever is left."""
    issuer = _native.Issuer()
    slow = _native.Program(_instr("nop", 1_000_000), b"", 0)  # 1 s a job
    fast = _native.Program(_instr("nop", 0), b"", 0)
    bad = _native.Program(_instr("fail", stage=1), b"", 0)
    completer = _completer(issuer)
    jobs = [issuer.submit(p, 0, 0) for p in (slow, fast, fast, bad, fast)]
    futs = [_queued(completer, seq, float(i)) for i, seq in enumerate(jobs)]
    time.sleep(0.1)
    assert not any(f.done() for f in futs)  # the first job is still being issued
    for i in range(3):
        assert futs[i].wait().item() == float(i)
    for i in (3, 4):
        with pytest.raises(RingReduceError, match=f"operation #{jobs[i]}"):
            futs[i].wait()
    late = issuer.submit(fast, 0, 0)
    assert late == jobs[-1] + 1
    last = _queued(completer, late, 9.0)
    issuer.close()
    completer.close()
    with pytest.raises(RingReduceError):  # issued after the failure: refused
        last.wait()


@built
def test_the_completer_gives_up_when_the_communicator_fails() -> None:
    """A job the worker never issues (stuck, as inside NCCL for a dead peer) leaves its
    Future to the communicator's failure: the completer looks again after each poll and
    raises once ``failed()``, not never."""
    issuer = _native.Issuer()
    stuck = _native.Program(_instr("nop", 3_000_000), b"", 0)  # 3 s
    failed = threading.Event()
    completer = _completer(issuer, failed.is_set)
    fut = _queued(completer, issuer.submit(stuck, 0, 0), 1.0)
    time.sleep(0.3)
    assert not fut.done()
    started = time.perf_counter()
    failed.set()
    with pytest.raises(RingReduceError, match="operation #1"):
        fut.wait()
    assert time.perf_counter() - started < 1.5  # within a few polls, not the job's 3 s
    issuer.close()
    completer.close()


_GIL_AND_LOCK = """
import threading
from ringreduce.execution import native
issuer = native.extension()[0].Issuer()
stop = False
def waiter():  # as the completer and a synchronous caller: short timed waits
    while not stop:
        issuer.wait_issued(1, 0.0)
waiting = threading.Thread(target=waiter)
waiting.start()
for _ in range(300_000):  # as the watchdog: state() under the GIL
    issuer.state(1)
stop = True
waiting.join()
print("no deadlock")
"""


@built
def test_a_timed_wait_never_holds_the_lock_while_taking_the_gil_back() -> None:
    """native-async's hang (benchmarks/results/2026-11-25-h200-worker-hang): a wait that
    timed out took the GIL back still holding the issuer's lock, while a thread with the
    GIL (the watchdog's state()) waited for that lock. On the build before the fix this
    child deadlocked every time within a second; a child process, so a regression fails
    this test at its timeout instead of hanging the suite."""
    try:
        done = subprocess.run([sys.executable, "-c", _GIL_AND_LOCK], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("wait_issued() and state() on two threads deadlocked (GIL against the "
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
    assert counts["launch"] == per_part * parts + 2, counts  # and the end check's two
    assert counts["all_reduce"] == (devices > 1) + (machines > 1), counts  # its hops
    peers = machines - 1
    gathered = wire is None  # diffuse: one all-gather along the rail, else p2p (transport)
    assert counts["send"] == counts["recv"] == (1 if gathered else 2) * peers * parts
    assert counts.get("reduce_scatter", 0) == (parts if devices > 1 else 0)
    assert counts.get("all_gather", 0) == ((devices > 1) + gathered) * parts
