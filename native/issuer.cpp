// ringreduce._native: replays a recorded call program on the caller's thread, without
// the GIL, before the call returns (Issuer.run, the "native" issuer).
//
// The Python issuer (ringreduce/execution/pipeline.py) walks a call's plan and makes
// ~100 CUDA and NCCL calls from Python: about 2 ms of the caller's host time per 25 MiB
// call. Here the same sequence, recorded once per plan key
// (ringreduce/execution/recording.py), is a flat array of instructions.
//
// No torch, no CUDA or NCCL headers: the few prototypes used are declared below, and
// libcuda.so.1 and the libnccl the process already loaded (path passed from Python) are
// opened with dlopen when a CUDA Issuer is made. So one build serves every torch and
// CUDA release, and CI (gcc, no CUDA) compiles and tests the CPU-side parts: program
// encoding and validation, the issuer's failure handling (NOP/FAIL instructions).
//
// Ordering: run records the job's entry event (a ring of kEntryRing) on the caller's
// stream, then issues the program. Its last instruction, on the flag stream (the stream
// of the last stage), writes seq into the flag (mapped pinned memory: the host reads
// completion there) and records the job's done event (a ring too). The stream that must
// follow the result waits for that event (stream_wait) once run has returned. On a
// failure the issuer stores the first error and still writes every later job's flag and
// done event, in order on that same stream, so no stream waits forever and the flag
// never goes backwards.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---- CUDA driver and NCCL prototypes (cuda.h, nccl.h), opaque handles only ----------
using CUresult = int;
using CUstream = void*;
using CUevent = void*;
using CUfunction = void*;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;
using ncclComm_t = void*;
using ncclResult = int;

struct Cuda {
    CUresult (*ctxGetCurrent)(CUcontext*);
    CUresult (*ctxSetCurrent)(CUcontext);
    CUresult (*eventCreate)(CUevent*, unsigned);
    CUresult (*eventDestroy)(CUevent);
    CUresult (*eventRecord)(CUevent, CUstream);
    CUresult (*eventQuery)(CUevent);
    CUresult (*streamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
    CUresult (*memcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*writeValue32)(CUstream, CUdeviceptr, uint32_t, unsigned);
    CUresult (*memHostAlloc)(void**, size_t, unsigned);
    CUresult (*memHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
    CUresult (*memFreeHost)(void*);
    CUresult (*getErrorString)(CUresult, const char**);
};

struct Nccl {
    ncclResult (*groupStart)();
    ncclResult (*groupEnd)();
    ncclResult (*send)(const void*, size_t, int, int, ncclComm_t, CUstream);
    ncclResult (*recv)(void*, size_t, int, int, ncclComm_t, CUstream);
    ncclResult (*reduceScatter)(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
    ncclResult (*allGather)(const void*, void*, size_t, int, ncclComm_t, CUstream);
    ncclResult (*allReduce)(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
    const char* (*getErrorString)(ncclResult);
};

constexpr unsigned kEventDisableTiming = 0x2;      // CU_EVENT_DISABLE_TIMING
constexpr unsigned kHostAllocFlags = 0x1 | 0x2;    // PORTABLE | DEVICEMAP
constexpr int kEntryRing = 256;                    // entry and done events per issuer
constexpr int kMaxKernelArgs = 16;
constexpr CUresult kNotReady = 600;                // CUDA_ERROR_NOT_READY

// ---- The instruction set (ringreduce/execution/native.py packs the same layout) --------------
// Each instruction is 9 little-endian int64: op, stage, reloc, a0..a5. Bit i of reloc
// set: a_i is an offset into the caller's tensor (added to the job's base pointer).
enum Op : int64_t {
    NOP = 0,            // a0: microseconds to sleep (tests)
    FAIL = 1,           // tests: the issuer fails here, as after an NCCL error
    WAIT_EVENT = 2,     // a0 stream, a1 event (0: the job's entry event)
    RECORD_EVENT = 3,   // a0 stream, a1 event
    GROUP_START = 4,
    GROUP_END = 5,
    SEND = 6,           // a0 comm, a1 buffer, a2 count, a3 dtype, a4 peer, a5 stream
    RECV = 7,           // same
    REDUCE_SCATTER = 8, // a0 comm, a1 send, a2 recv, a3 recv count, a4 dtype | op << 8, a5 stream
    ALL_GATHER = 9,     // a0 comm, a1 send, a2 recv, a3 send count, a4 dtype, a5 stream
    ALL_REDUCE = 10,    // a0 comm, a1 send, a2 recv, a3 count, a4 dtype | op << 8, a5 stream
    LAUNCH = 11,        // a0 function, a1 grid, a2 block, a3 first arg, a4 arg count, a5 stream
    MEMCPY = 12,        // a0 dst, a1 src, a2 bytes, a3 stream
    WRITE_FLAG = 13,    // the job's seq into the flag, on the flag stream
    OP_COUNT = 14,
};

const char* const kOpNames[OP_COUNT] = {
    "nop", "fail", "wait_event", "record_event", "group_start", "group_end", "send", "recv",
    "reduce_scatter", "all_gather", "all_reduce", "launch", "memcpy", "write_flag"};

struct Instr {
    int64_t op, stage, reloc, a[6];
};
static_assert(sizeof(Instr) == 72, "9 int64 per instruction");

// Kernel arguments: pairs (size | reloc << 8, value); value holds the bytes, low first.
struct Arg {
    int64_t kind, value;
};

struct Program {
    PyObject_HEAD
    std::vector<Instr>* code;
    std::vector<Arg>* args;
    int64_t extent;
    bool needs_cuda;
};

// ---- Program: validated once, when Python builds it ---------------------------------
bool uses_cuda(int64_t op) { return op >= WAIT_EVENT; }

std::string validate(const std::vector<Instr>& code, const std::vector<Arg>& args,
                     int64_t extent) {
    int depth = 0;
    for (size_t i = 0; i < code.size(); ++i) {
        const Instr& in = code[i];
        std::string at = "instruction " + std::to_string(i);
        if (in.op < 0 || in.op >= OP_COUNT) return at + ": unknown op " + std::to_string(in.op);
        if (in.reloc & ~int64_t{0x3f}) return at + ": reloc mask out of range";
        for (int b = 0; b < 6; ++b)
            if ((in.reloc >> b & 1) && (in.a[b] < 0 || in.a[b] >= extent))
                return at + ": tensor offset " + std::to_string(in.a[b]) + " outside 0.." +
                       std::to_string(extent);
        if (in.op == GROUP_START && ++depth > 1) return at + ": nested NCCL group";
        if (in.op == GROUP_END && --depth < 0) return at + ": group_end without group_start";
        if (depth && !(in.op >= GROUP_START && in.op <= ALL_REDUCE))
            return at + ": " + kOpNames[in.op] + " inside an NCCL group";
        if (in.op == LAUNCH) {
            if (in.a[4] < 0 || in.a[4] > kMaxKernelArgs || in.a[3] < 0 ||
                in.a[3] + in.a[4] > static_cast<int64_t>(args.size()))
                return at + ": kernel arguments out of range";
            if (in.a[1] <= 0 || in.a[2] <= 0 || in.a[1] > INT32_MAX || in.a[2] > 1024)
                return at + ": bad launch shape";
            for (int64_t j = in.a[3]; j < in.a[3] + in.a[4]; ++j) {
                int64_t size = args[j].kind & 0xff;
                if (size != 4 && size != 8) return at + ": kernel argument of size " +
                                                   std::to_string(size);
                if ((args[j].kind >> 8 & 1) && (args[j].value < 0 || args[j].value >= extent))
                    return at + ": kernel pointer offset outside the tensor";
            }
        }
        if ((in.op >= SEND && in.op <= ALL_REDUCE) && in.a[0] == 0) return at + ": null comm";
    }
    if (depth) return "program ends inside an NCCL group";
    return "";
}

void program_dealloc(Program* self) {
    delete self->code;
    delete self->args;
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int program_init(Program* self, PyObject* a, PyObject* kw) {
    static const char* names[] = {"code", "args", "extent", nullptr};
    Py_buffer code, args;
    long long extent;
    if (!PyArg_ParseTupleAndKeywords(a, kw, "y*y*L", const_cast<char**>(names), &code, &args,
                                     &extent))
        return -1;
    std::string problem;
    if (code.len % sizeof(Instr)) problem = "code is not a whole number of instructions";
    if (args.len % sizeof(Arg)) problem = "args is not a whole number of arguments";
    if (extent < 0) problem = "negative extent";
    if (problem.empty()) {
        delete self->code;
        delete self->args;
        self->code = new std::vector<Instr>(code.len / sizeof(Instr));
        self->args = new std::vector<Arg>(args.len / sizeof(Arg));
        std::memcpy(self->code->data(), code.buf, code.len);
        std::memcpy(self->args->data(), args.buf, args.len);
        self->extent = extent;
        problem = validate(*self->code, *self->args, extent);
        self->needs_cuda = false;
        for (const Instr& in : *self->code) self->needs_cuda |= uses_cuda(in.op);
    }
    PyBuffer_Release(&code);
    PyBuffer_Release(&args);
    if (!problem.empty()) {
        PyErr_SetString(PyExc_ValueError, ("invalid ringreduce program: " + problem).c_str());
        return -1;
    }
    return 0;
}

PyObject* program_counts(Program* self, PyObject*) {
    PyObject* d = PyDict_New();
    std::vector<long> n(OP_COUNT, 0);
    for (const Instr& in : *self->code) ++n[in.op];
    for (int i = 0; i < OP_COUNT; ++i) {
        if (!n[i]) continue;
        PyObject* v = PyLong_FromLong(n[i]);
        PyDict_SetItemString(d, kOpNames[i], v);
        Py_DECREF(v);
    }
    return d;
}

Py_ssize_t program_len(Program* self) { return static_cast<Py_ssize_t>(self->code->size()); }

PyMethodDef program_methods[] = {
    {"counts", reinterpret_cast<PyCFunction>(program_counts), METH_NOARGS,
     "Instructions by op name."},
    {nullptr, nullptr, 0, nullptr}};

PySequenceMethods program_seq = {reinterpret_cast<lenfunc>(program_len)};

PyTypeObject ProgramType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---- The issuer: jobs replayed on the calling thread ---------------------------------
struct Job {
    const Program* p;
    uint64_t base;
    uint32_t seq;
    CUevent entry;
    uint32_t after;  // 0, or an earlier job this one follows on the device (same memory)
};

// Native jobs of every Issuer of the process (one per Communicator) are issued one at a
// time: two threads issuing on communicators of one device at once may hang (NCCL
// kernels of different communicators must reach each device in one order on every
// rank). Taken with the GIL released, and nothing takes the GIL while holding it.
// Never destroyed: a thread may still be inside run while the process exits.
std::mutex& issue_mutex() {
    static std::mutex* m = new std::mutex();
    return *m;
}

struct Failure {
    bool set = false;
    uint32_t seq = 0;
    int64_t stage = -1;
    int64_t index = -1;
    std::string message;
};

struct State {
    Cuda cuda{};
    Nccl nccl{};
    bool has_cuda = false;
    CUcontext ctx = nullptr;
    CUstream flag_stream = nullptr;
    volatile uint32_t* flag = nullptr;  // mapped pinned memory
    CUdeviceptr flag_dev = 0;
    std::vector<CUevent> entries;
    std::vector<CUevent> dones;  // job seq's end on the flag stream: dones[seq % kEntryRing]

    std::mutex mu;                       // failure
    std::atomic<uint32_t> submitted{0};  // the last job run took (issued or being issued)
    std::atomic<uint32_t> issued{0};     // the last job run finished issuing
    std::atomic<bool> poisoned{false};  // stop issuing: communicators are being aborted
    std::atomic<bool> in_call{false};   // inside a CUDA or NCCL call right now
    // Where the issuing thread is (for a watchdog's error: a hang inside an NCCL or CUDA
    // call names the call): job, instruction index and op; at_op -1 between jobs.
    std::atomic<uint32_t> at_seq{0};
    std::atomic<int64_t> at_index{-1};
    std::atomic<int64_t> at_op{-1};
    std::atomic<bool> closing{false};
    Failure failure;                    // under mu
    std::atomic<bool> failed{false};    // failure.set, readable without mu
};

template <typename F>
bool load(void* lib, const char* const* names, F* fn, std::string& err) {
    for (const char* const* n = names; *n; ++n) {
        void* sym = dlsym(lib, *n);
        if (sym) {
            *fn = reinterpret_cast<F>(sym);
            return true;
        }
    }
    err += std::string(" ") + names[0];
    return false;
}

#define SYM(lib, field, ...)                                           \
    do {                                                               \
        static const char* const n_[] = {__VA_ARGS__, nullptr};        \
        load(lib, n_, &(field), missing);                              \
    } while (0)

std::string open_cuda(State& s, const char* libcuda, const char* libnccl) {
    void* cu = dlopen(libcuda, RTLD_NOW | RTLD_GLOBAL);
    if (!cu) return std::string("dlopen ") + libcuda + ": " + dlerror();
    void* nc = dlopen(libnccl, RTLD_NOW | RTLD_GLOBAL);
    if (!nc) return std::string("dlopen ") + libnccl + ": " + dlerror();
    std::string missing;
    Cuda& c = s.cuda;
    SYM(cu, c.ctxGetCurrent, "cuCtxGetCurrent");
    SYM(cu, c.ctxSetCurrent, "cuCtxSetCurrent");
    SYM(cu, c.eventCreate, "cuEventCreate");
    SYM(cu, c.eventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
    SYM(cu, c.eventRecord, "cuEventRecord");
    SYM(cu, c.eventQuery, "cuEventQuery");
    SYM(cu, c.streamWaitEvent, "cuStreamWaitEvent");
    SYM(cu, c.launchKernel, "cuLaunchKernel");
    SYM(cu, c.memcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    SYM(cu, c.writeValue32, "cuStreamWriteValue32_v2", "cuStreamWriteValue32");
    SYM(cu, c.memHostAlloc, "cuMemHostAlloc");
    SYM(cu, c.memHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    SYM(cu, c.memFreeHost, "cuMemFreeHost");
    SYM(cu, c.getErrorString, "cuGetErrorString");
    Nccl& n = s.nccl;
    SYM(nc, n.groupStart, "ncclGroupStart");
    SYM(nc, n.groupEnd, "ncclGroupEnd");
    SYM(nc, n.send, "ncclSend");
    SYM(nc, n.recv, "ncclRecv");
    SYM(nc, n.reduceScatter, "ncclReduceScatter");
    SYM(nc, n.allGather, "ncclAllGather");
    SYM(nc, n.allReduce, "ncclAllReduce");
    SYM(nc, n.getErrorString, "ncclGetErrorString");
    if (!missing.empty()) return "missing symbols:" + missing;
    return "";
}

std::string cu_error(const State& s, CUresult r, const char* what) {
    const char* text = nullptr;
    if (s.cuda.getErrorString) s.cuda.getErrorString(r, &text);
    return std::string(what) + " failed: CUDA error " + std::to_string(r) + " (" +
           (text ? text : "?") + ")";
}

std::string nccl_error(const State& s, ncclResult r, const char* what) {
    return std::string(what) + " failed: NCCL error " + std::to_string(r) + " (" +
           (s.nccl.getErrorString ? s.nccl.getErrorString(r) : "?") + ")";
}

// One instruction; "" on success. NCCL and CUDA calls only here.
std::string execute(State& s, const Job& job, const Instr& in, const Program& p) {
    auto at = [&](int i) -> uint64_t {
        return static_cast<uint64_t>(in.a[i]) + ((in.reloc >> i & 1) ? job.base : 0);
    };
    auto stream = [&](int i) { return reinterpret_cast<CUstream>(in.a[i]); };
    auto comm = reinterpret_cast<ncclComm_t>(in.a[0]);
    auto ptr = [&](int i) { return reinterpret_cast<void*>(at(i)); };
    CUresult cr = 0;
    ncclResult nr = 0;
    switch (in.op) {
    case NOP:
        if (in.a[0] > 0) std::this_thread::sleep_for(std::chrono::microseconds(in.a[0]));
        return "";
    case FAIL:
        return "FAIL instruction (a test's planted failure)";
    case WAIT_EVENT:
        if (!in.a[1] && job.after && static_cast<int32_t>(*s.flag - job.after) < 0) {
            // The entry wait also waits for the earlier job on the same memory: issued
            // before this one (one issuing order), so its done event is recorded.
            cr = s.cuda.streamWaitEvent(stream(0), s.dones[job.after % kEntryRing], 0);
            if (cr) return cu_error(s, cr, "cuStreamWaitEvent (the earlier job on this memory)");
        }
        cr = s.cuda.streamWaitEvent(stream(0), in.a[1] ? reinterpret_cast<CUevent>(in.a[1])
                                                       : job.entry, 0);
        return cr ? cu_error(s, cr, "cuStreamWaitEvent") : "";
    case RECORD_EVENT:
        cr = s.cuda.eventRecord(reinterpret_cast<CUevent>(in.a[1]), stream(0));
        return cr ? cu_error(s, cr, "cuEventRecord") : "";
    case GROUP_START:
        nr = s.nccl.groupStart();
        return nr ? nccl_error(s, nr, "ncclGroupStart") : "";
    case GROUP_END:
        nr = s.nccl.groupEnd();
        return nr ? nccl_error(s, nr, "ncclGroupEnd") : "";
    case SEND:
        nr = s.nccl.send(ptr(1), in.a[2], int(in.a[3]), int(in.a[4]), comm, stream(5));
        return nr ? nccl_error(s, nr, "ncclSend") : "";
    case RECV:
        nr = s.nccl.recv(ptr(1), in.a[2], int(in.a[3]), int(in.a[4]), comm, stream(5));
        return nr ? nccl_error(s, nr, "ncclRecv") : "";
    case REDUCE_SCATTER:
        nr = s.nccl.reduceScatter(ptr(1), ptr(2), in.a[3], int(in.a[4] & 0xff),
                                  int(in.a[4] >> 8), comm, stream(5));
        return nr ? nccl_error(s, nr, "ncclReduceScatter") : "";
    case ALL_GATHER:
        nr = s.nccl.allGather(ptr(1), ptr(2), in.a[3], int(in.a[4]), comm, stream(5));
        return nr ? nccl_error(s, nr, "ncclAllGather") : "";
    case ALL_REDUCE:
        nr = s.nccl.allReduce(ptr(1), ptr(2), in.a[3], int(in.a[4] & 0xff), int(in.a[4] >> 8),
                              comm, stream(5));
        return nr ? nccl_error(s, nr, "ncclAllReduce") : "";
    case LAUNCH: {
        int64_t values[kMaxKernelArgs];
        void* params[kMaxKernelArgs];
        for (int64_t j = 0; j < in.a[4]; ++j) {
            const Arg& arg = (*p.args)[in.a[3] + j];
            values[j] = arg.value + ((arg.kind >> 8 & 1) ? static_cast<int64_t>(job.base) : 0);
            params[j] = &values[j];  // little-endian: a 4-byte argument is the low half
        }
        cr = s.cuda.launchKernel(reinterpret_cast<CUfunction>(in.a[0]), unsigned(in.a[1]), 1,
                                 1, unsigned(in.a[2]), 1, 1, 0, stream(5), params, nullptr);
        return cr ? cu_error(s, cr, "cuLaunchKernel") : "";
    }
    case MEMCPY:
        cr = s.cuda.memcpyDtoDAsync(at(0), at(1), in.a[2], stream(3));
        return cr ? cu_error(s, cr, "cuMemcpyDtoDAsync") : "";
    case WRITE_FLAG:
        cr = s.cuda.writeValue32(s.flag_stream, s.flag_dev, job.seq, 0);
        if (cr) return cu_error(s, cr, "cuStreamWriteValue32");
        cr = s.cuda.eventRecord(s.dones[job.seq % kEntryRing], s.flag_stream);
        return cr ? cu_error(s, cr, "cuEventRecord (done)") : "";
    }
    return "unknown op";
}

void write_flag_after_failure(State& s, uint32_t seq) {
    if (!s.has_cuda) return;
    // On the flag stream, in order, so the flag never goes backwards; after an abort the
    // stream drains (NCCL's kernels exit) and the write lands; the done event with it,
    // so a stream told to follow this job is released too.
    s.cuda.writeValue32(s.flag_stream, s.flag_dev, seq, 0);
    s.cuda.eventRecord(s.dones[seq % kEntryRing], s.flag_stream);
}

void run_job(State& s, const Job& job) {
    if (s.poisoned.load() || s.failed.load()) {
        {
            std::lock_guard<std::mutex> lock(s.mu);
            if (!s.failure.set) s.failure = {true, job.seq, -1, -1,
                                             "issue stopped: the communicators are aborted"};
        }
        s.failed.store(true);
        write_flag_after_failure(s, job.seq);
        return;
    }
    const Program& p = *job.p;
    int depth = 0;
    s.at_seq.store(job.seq, std::memory_order_relaxed);
    for (size_t i = 0; i < p.code->size(); ++i) {
        const Instr& in = (*p.code)[i];
        s.at_index.store(int64_t(i), std::memory_order_relaxed);
        s.at_op.store(in.op, std::memory_order_relaxed);
        // in_call before poisoned (both seq_cst), the reverse of stop(): either stop()
        // sees this call in progress and waits, or this thread sees the poison and never
        // touches a communicator that is being aborted (its handle is freed then).
        s.in_call.store(true);
        if (s.poisoned.load()) {
            s.in_call.store(false);
            std::lock_guard<std::mutex> lock(s.mu);
            if (!s.failure.set) s.failure = {true, job.seq, in.stage, int64_t(i),
                                             "issue stopped: the communicators are aborted"};
            s.failed.store(true);
            break;
        }
        std::string err = execute(s, job, in, p);
        if (!err.empty() && depth > 0 && in.op != GROUP_END) s.nccl.groupEnd();  // close it
        s.in_call.store(false);
        depth += in.op == GROUP_START ? 1 : in.op == GROUP_END ? -1 : 0;
        if (!err.empty()) {
            std::lock_guard<std::mutex> lock(s.mu);
            if (!s.failure.set) s.failure = {true, job.seq, in.stage, int64_t(i), err};
            s.failed.store(true);
            break;
        }
    }
    s.at_op.store(-1, std::memory_order_relaxed);
    if (s.failed.load() || s.poisoned.load()) write_flag_after_failure(s, job.seq);
}

struct Issuer {
    PyObject_HEAD
    State* s;
};

void issuer_dealloc(Issuer* self) {
    if (self->s) {
        State& s = *self->s;
        if (s.has_cuda) {
            for (CUevent e : s.entries) s.cuda.eventDestroy(e);
            for (CUevent e : s.dones) s.cuda.eventDestroy(e);
            if (s.flag) s.cuda.memFreeHost(const_cast<uint32_t*>(s.flag));
        }
        delete self->s;
    }
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int issuer_init(Issuer* self, PyObject* a, PyObject* kw) {
    static const char* names[] = {"libcuda", "libnccl", "flag_stream", nullptr};
    const char* libcuda = nullptr;
    const char* libnccl = nullptr;
    unsigned long long flag_stream = 0;
    if (!PyArg_ParseTupleAndKeywords(a, kw, "|zzK", const_cast<char**>(names), &libcuda,
                                     &libnccl, &flag_stream))
        return -1;
    if (self->s) {
        PyErr_SetString(PyExc_RuntimeError, "Issuer is already initialised");
        return -1;
    }
    if ((libcuda == nullptr) != (libnccl == nullptr)) {
        PyErr_SetString(PyExc_ValueError, "give both libcuda and libnccl, or neither (tests)");
        return -1;
    }
    auto s = std::make_unique<State>();
    if (libcuda) {
        std::string err = open_cuda(*s, libcuda, libnccl);
        CUresult r = 0;
        if (err.empty() && (r = s->cuda.ctxGetCurrent(&s->ctx)) == 0 && !s->ctx)
            err = "no current CUDA context on the calling thread (initialise torch.cuda first)";
        if (err.empty() && r) err = cu_error(*s, r, "cuCtxGetCurrent");
        void* host = nullptr;
        if (err.empty() && (r = s->cuda.memHostAlloc(&host, 64, kHostAllocFlags)))
            err = cu_error(*s, r, "cuMemHostAlloc");
        if (err.empty()) {
            s->flag = static_cast<volatile uint32_t*>(host);
            *s->flag = 0;
            if ((r = s->cuda.memHostGetDevicePointer(&s->flag_dev, host, 0)))
                err = cu_error(*s, r, "cuMemHostGetDevicePointer");
        }
        for (int i = 0; err.empty() && i < 2 * kEntryRing; ++i) {
            CUevent e = nullptr;
            if ((r = s->cuda.eventCreate(&e, kEventDisableTiming))) err = cu_error(*s, r, "cuEventCreate");
            else (i % 2 ? s->dones : s->entries).push_back(e);
        }
        if (!err.empty()) {
            for (CUevent e : s->entries) s->cuda.eventDestroy(e);
            for (CUevent e : s->dones) s->cuda.eventDestroy(e);
            if (s->flag) s->cuda.memFreeHost(const_cast<uint32_t*>(s->flag));
            PyErr_SetString(PyExc_RuntimeError, ("ringreduce native issuer: " + err).c_str());
            return -1;
        }
        s->has_cuda = true;
        s->flag_stream = reinterpret_cast<CUstream>(flag_stream);
    }
    self->s = s.release();
    return 0;
}

// The arguments of run: (program, base, entry_stream, after=0); the Program,
// or nullptr with the Python error set. `after`: an earlier job on the same memory that
// this one must follow on the device; its done event joins the entry wait, so the caller
// need not wait on the host for that job to be issued (issue.py after_pending).
const Program* job_args(const State& s, PyObject* args, PyObject** program,
                        unsigned long long* base, unsigned long long* entry_stream,
                        uint32_t* after) {
    unsigned long after_arg = 0;
    if (!PyArg_ParseTuple(args, "O!KK|k", &ProgramType, program, base, entry_stream,
                          &after_arg))
        return nullptr;
    const Program* p = reinterpret_cast<Program*>(*program);
    if (p->needs_cuda && !s.has_cuda) {
        PyErr_SetString(PyExc_ValueError, "this program issues CUDA work; the Issuer was "
                                          "made without libcuda/libnccl");
        return nullptr;
    }
    *after = static_cast<uint32_t>(after_arg);
    uint32_t last = s.submitted.load();
    if (*after && (after_arg > UINT32_MAX || static_cast<int32_t>(last - *after) < 0)) {
        PyErr_Format(PyExc_ValueError, "after=%lu is not a submitted job (the last is %lu); "
                     "pass a number run() returned, or 0",
                     after_arg, static_cast<unsigned long>(last));
        return nullptr;
    }
    return p;
}

// The issuer's context current on the calling thread (e.g. a fresh autograd thread).
void make_current(State& s) {
    CUcontext current = nullptr;
    s.cuda.ctxGetCurrent(&current);
    if (current != s.ctx) s.cuda.ctxSetCurrent(s.ctx);
}

// Job seq's entry event, recorded on the caller's stream (CUDA issuers only). Callers
// release the GIL around it: a launch queue full behind a stuck device blocks this
// call, and the watchdog (a Python thread) must still run to end it.
CUresult record_entry(State& s, uint32_t seq, unsigned long long entry_stream, CUevent* entry) {
    make_current(s);
    *entry = s.entries[seq % kEntryRing];
    return s.cuda.eventRecord(*entry, reinterpret_cast<CUstream>(entry_stream));
}

// run(program, base, entry_stream, after=0) -> seq: the job issued here, on the calling
// thread, without the GIL, before returning. The same program and the same order as the
// Python issuer, only without ~100 Python calls. One job at a time per process
// (issue_mutex); the job's number is taken under it, so jobs are issued in their order.
PyObject* issuer_run(Issuer* self, PyObject* args) {
    PyObject* program;
    unsigned long long base, entry_stream;
    uint32_t after;
    const Program* p = job_args(*self->s, args, &program, &base, &entry_stream, &after);
    if (!p) return nullptr;
    State& s = *self->s;
    if (s.closing.load()) {
        PyErr_SetString(PyExc_RuntimeError, "the native issuer is closed");
        return nullptr;
    }
    uint32_t seq;
    Py_BEGIN_ALLOW_THREADS
    {
        std::lock_guard<std::mutex> turn(issue_mutex());
        seq = s.submitted.load() + 1;
        s.submitted.store(seq);
        CUevent entry = nullptr;
        CUresult r = 0;
        if (s.has_cuda) r = record_entry(s, seq, entry_stream, &entry);
        if (!r) run_job(s, Job{p, base, seq, entry, after});
        else {
            {
                std::lock_guard<std::mutex> lock(s.mu);
                if (!s.failure.set) s.failure = {true, seq, -1, -1,
                                                 cu_error(s, r, "cuEventRecord (entry)")};
            }
            s.failed.store(true);
            write_flag_after_failure(s, seq);
        }
        s.issued.store(seq);
    }  // every lock is released before the GIL is taken back
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLong(seq);
}

// stream_wait(stream, seq): stream waits (on the device) until job seq has finished: an
// event wait on its done event, recorded on the flag stream after the job's last work.
// Only for issued jobs (the event is recorded then): a stream never waits on work that
// is not enqueued yet, because a context-wide synchronisation (CUDA loading a kernel
// lazily, a free), in any thread, would then wait for that stream, and so for the
// issuing thread, which may itself be the one synchronising (a deadlock, seen on H200
// before this rule). An event, not cuStreamWaitValue32 on the mapped flag: tried twice
// under MPS, the flag wait hung (H200) and let futures complete before their results
// (H100), as CUDA's driver API warns: orderings made through stream memory operations
// are not visible to CUDA and must also be expressed with events. Event waits are what
// the Python issuer's streams have always used. A job more than kEntryRing behind the
// newest issued one has had its event recorded again by a later job on the same
// in-order stream: the wait then lasts until that later job, longer but never too short.
PyObject* issuer_stream_wait(Issuer* self, PyObject* args) {
    unsigned long long stream;
    unsigned long seq_arg;
    if (!PyArg_ParseTuple(args, "Kk", &stream, &seq_arg)) return nullptr;
    State& s = *self->s;
    uint32_t seq = static_cast<uint32_t>(seq_arg);
    if (!s.has_cuda) Py_RETURN_NONE;
    if (static_cast<int32_t>(s.issued.load() - seq) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "stream_wait before the job was issued");
        return nullptr;
    }
    make_current(s);
    CUresult r;
    Py_BEGIN_ALLOW_THREADS  // as in run: a full launch queue may block here
    r = s.cuda.streamWaitEvent(reinterpret_cast<CUstream>(stream), s.dones[seq % kEntryRing], 0);
    Py_END_ALLOW_THREADS
    if (r) {
        PyErr_SetString(PyExc_RuntimeError, cu_error(s, r, "cuStreamWaitEvent (done)").c_str());
        return nullptr;
    }
    Py_RETURN_NONE;
}

// state(seq): 1 finished (flag reached it; CPU-only issuers: issued), 0 pending,
// -1 failed (the issuer stored an error).
PyObject* issuer_state(Issuer* self, PyObject* arg) {
    uint32_t seq = static_cast<uint32_t>(PyLong_AsUnsignedLong(arg));
    if (PyErr_Occurred()) return nullptr;
    State& s = *self->s;
    if (s.failed.load()) return PyLong_FromLong(-1);
    uint32_t reached = s.has_cuda ? *s.flag : s.issued.load();
    return PyLong_FromLong(static_cast<int32_t>(reached - seq) >= 0 ? 1 : 0);
}

PyObject* issuer_error(Issuer* self, PyObject*) {
    State& s = *self->s;
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.failure.set) Py_RETURN_NONE;
    return Py_BuildValue("(kLLs)", static_cast<unsigned long>(s.failure.seq),
                         static_cast<long long>(s.failure.stage),
                         static_cast<long long>(s.failure.index), s.failure.message.c_str());
}

// stop(timeout_s): issue nothing more (the communicators are about to be aborted) and
// wait until the issuing thread is outside CUDA/NCCL; False if it is still inside then.
PyObject* issuer_stop(Issuer* self, PyObject* args) {
    double timeout_s = 2.0;
    if (!PyArg_ParseTuple(args, "|d", &timeout_s)) return nullptr;
    State& s = *self->s;
    s.poisoned.store(true);
    bool out = false;
    Py_BEGIN_ALLOW_THREADS
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (s.in_call.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    out = !s.in_call.load();
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(out);
}

// release(): after a failure, the flag (what the host and the watchdog read) jumps to
// the last submitted job (one stuck inside NCCL included): the watchdog stops polling
// jobs that will never finish. Streams only ever wait for issued jobs' done events,
// which the flag stream reaches once the aborted kernels exit. The issuer still writes
// each job's flag in order afterwards, so the flag ends at the last job.
PyObject* issuer_release(Issuer* self, PyObject*) {
    State& s = *self->s;
    if (s.has_cuda) *s.flag = s.submitted.load();
    Py_RETURN_NONE;
}

// close(): run refuses jobs from now on (every job run took was issued before it
// returned: nothing is left to issue).
PyObject* issuer_close(Issuer* self, PyObject*) {
    self->s->closing.store(true);
    Py_RETURN_NONE;
}

PyObject* issuer_counters(Issuer* self, PyObject*) {
    State& s = *self->s;
    uint32_t flag = s.has_cuda ? *s.flag : 0;
    int64_t op = s.at_op.load(std::memory_order_relaxed);
    return Py_BuildValue("{s:k,s:k,s:k,s:k,s:L,s:s}", "submitted",
                         static_cast<unsigned long>(s.submitted.load()), "issued",
                         static_cast<unsigned long>(s.issued.load()), "flag",
                         static_cast<unsigned long>(flag), "at_job",
                         static_cast<unsigned long>(s.at_seq.load(std::memory_order_relaxed)),
                         "at_instruction",
                         static_cast<long long>(s.at_index.load(std::memory_order_relaxed)),
                         "at_op", op >= 0 && op < OP_COUNT ? kOpNames[op] : "-");
}

// events(seq) -> (entry, done) of job seq: 1 reached, 0 not yet (CUDA_ERROR_NOT_READY),
// -1 another error; None without CUDA. For a deadline error: an entry not reached means
// the caller's stream has not got to the call; an entry reached and no done, the job
// itself is stuck. Either may have been recorded again by a job kEntryRing later.
PyObject* issuer_events(Issuer* self, PyObject* arg) {
    uint32_t seq = static_cast<uint32_t>(PyLong_AsUnsignedLong(arg));
    if (PyErr_Occurred()) return nullptr;
    State& s = *self->s;
    if (!s.has_cuda) Py_RETURN_NONE;
    make_current(s);
    auto state = [&](CUevent e) {
        CUresult r = s.cuda.eventQuery(e);
        return r == 0 ? 1 : r == kNotReady ? 0 : -1;
    };
    return Py_BuildValue("(ii)", state(s.entries[seq % kEntryRing]),
                         state(s.dones[seq % kEntryRing]));
}

PyMethodDef issuer_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(issuer_run), METH_VARARGS,
     "run(program, base, entry_stream, after=0) -> seq: issue the job on this thread, now"},
    {"stream_wait", reinterpret_cast<PyCFunction>(issuer_stream_wait), METH_VARARGS,
     "stream_wait(stream, seq): the stream waits for an issued job's done event"},
    {"state", reinterpret_cast<PyCFunction>(issuer_state), METH_O,
     "state(seq): 1 finished, 0 pending, -1 failed"},
    {"error", reinterpret_cast<PyCFunction>(issuer_error), METH_NOARGS,
     "None, or (seq, stage, instruction, message) of the first failure"},
    {"stop", reinterpret_cast<PyCFunction>(issuer_stop), METH_VARARGS,
     "stop(timeout_s=2): issue nothing more; True once no thread is inside its CUDA/NCCL"},
    {"release", reinterpret_cast<PyCFunction>(issuer_release), METH_NOARGS,
     "after a failure: the host-visible flag jumps to the last submitted job"},
    {"close", reinterpret_cast<PyCFunction>(issuer_close), METH_NOARGS,
     "refuse further jobs"},
    {"events", reinterpret_cast<PyCFunction>(issuer_events), METH_O,
     "events(seq) -> (entry, done): 1 reached, 0 not yet, -1 error; None without CUDA"},
    {"counters", reinterpret_cast<PyCFunction>(issuer_counters), METH_NOARGS,
     "submitted, issued, flag; the job, instruction and op being issued ('-': idle)"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject IssuerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_native",
                          "ringreduce's native issuer (native/issuer.cpp)", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
    ProgramType.tp_name = "ringreduce._native.Program";
    ProgramType.tp_basicsize = sizeof(Program);
    ProgramType.tp_flags = Py_TPFLAGS_DEFAULT;
    ProgramType.tp_new = PyType_GenericNew;
    ProgramType.tp_init = reinterpret_cast<initproc>(program_init);
    ProgramType.tp_dealloc = reinterpret_cast<destructor>(program_dealloc);
    ProgramType.tp_methods = program_methods;
    ProgramType.tp_as_sequence = &program_seq;
    ProgramType.tp_doc = "Program(code, args, extent): a validated call program";
    IssuerType.tp_name = "ringreduce._native.Issuer";
    IssuerType.tp_basicsize = sizeof(Issuer);
    IssuerType.tp_flags = Py_TPFLAGS_DEFAULT;
    IssuerType.tp_new = PyType_GenericNew;
    IssuerType.tp_init = reinterpret_cast<initproc>(issuer_init);
    IssuerType.tp_dealloc = reinterpret_cast<destructor>(issuer_dealloc);
    IssuerType.tp_methods = issuer_methods;
    IssuerType.tp_doc = "Issuer(libcuda=None, libnccl=None, flag_stream=0): replays programs";
    if (PyType_Ready(&ProgramType) < 0 || PyType_Ready(&IssuerType) < 0) return nullptr;
    PyObject* m = PyModule_Create(&module_def);
    if (!m) return nullptr;
    Py_INCREF(&ProgramType);
    Py_INCREF(&IssuerType);
    PyModule_AddObject(m, "Program", reinterpret_cast<PyObject*>(&ProgramType));
    PyModule_AddObject(m, "Issuer", reinterpret_cast<PyObject*>(&IssuerType));
    PyModule_AddIntConstant(m, "ENTRY_RING", kEntryRing);
    PyModule_AddIntConstant(m, "MAX_KERNEL_ARGS", kMaxKernelArgs);
    PyObject* ops = PyDict_New();
    for (int i = 0; i < OP_COUNT; ++i) {
        PyObject* v = PyLong_FromLong(i);
        PyDict_SetItemString(ops, kOpNames[i], v);
        Py_DECREF(v);
    }
    PyModule_AddObject(m, "OPS", ops);
    return m;
}
