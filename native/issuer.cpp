// ringreduce._native: replays a recorded call program without the GIL, on the caller's
// thread (run, the default "native" issuer) or on a worker thread (submit: "native-async").
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
// encoding and validation, the queue and the worker's lifecycle (NOP/FAIL instructions).
//
// Ordering: the caller records a per-call entry event (a ring, so a later call never
// re-records one the worker has not waited on yet) on its stream and queues the job. The
// program's last instruction, on the flag stream (the stream of the last stage), writes
// seq into the flag (mapped pinned memory: the host reads completion there) and records
// the job's done event (a ring too). Once the job is issued (wait_issued), the stream
// that must follow the result waits for that event (stream_wait), never before (see
// stream_wait). On a failure the worker stores the first error and still writes every
// job's flag and done event, in order on that same stream, so no stream waits forever
// and the flag never goes backwards.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
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
// Probes (a hang's diagnosis, off unless enable_probes): an event after each instruction
// of the last kProbeJobs jobs: as deep as the queue may grow, so a stuck job keeps its row.
constexpr int kProbeJobs = kEntryRing;

// ---- The instruction set (ringreduce/execution/native.py packs the same layout) --------------
// Each instruction is 9 little-endian int64: op, stage, reloc, a0..a5. Bit i of reloc
// set: a_i is an offset into the caller's tensor (added to the job's base pointer).
enum Op : int64_t {
    NOP = 0,            // a0: microseconds to sleep (tests of the queue)
    FAIL = 1,           // tests: the worker fails here, as after an NCCL error
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

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

// ---- The issuer: one worker thread, a queue of jobs ----------------------------------
struct Job {
    PyObject* program;  // a Program, referenced (released under the GIL by the caller)
    const Program* p;
    uint64_t base;
    uint32_t seq;
    CUevent entry;
    uint32_t after;  // 0, or an earlier job this one follows on the device (same memory)
    uint64_t ticket;  // its place in the process's one issue order (Order)
};

// ---- One issue order per process --------------------------------------------------
// Every Issuer of the process (one per Communicator) issues its jobs in the order they
// were submitted or run, across Issuers: a job waits for its ticket. NCCL kernels of
// different communicators on one device must reach it in one order on every rank, or
// each rank's kernels wait for peers' kernels queued behind others (a deadlock): two
// native-async Communicators, each worker issuing on its own, hung at 2x2. Callers make
// their calls in one order on every rank (the collective contract), so tickets taken in
// call order give one issue order.
// Fairring has one worker per device for the same reason. Never destroyed: worker
// threads may still touch it while the process exits.
struct Order {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t next = 0;     // the ticket the next job takes
    uint64_t serving = 0;  // the ticket whose job may issue now
};

Order& order() {
    static Order* o = new Order();
    return *o;
}

uint64_t take_ticket() {
    std::lock_guard<std::mutex> lock(order().mu);
    return order().next++;
}

// When the process last submitted a job to any Issuer (steady clock, ns): a caller
// making calls holds the GIL between them, whichever Communicator it calls, so the
// completers wait for the process's quiet (wait_quiet), not their own Issuer's.
std::atomic<int64_t>& submitted_ns() {
    static std::atomic<int64_t>* t = new std::atomic<int64_t>(0);
    return *t;
}

// The job holding `ticket` may issue once every earlier ticket was served; the turn ends
// (the next ticket is served) when this object goes, whatever the job did.
class Turn {
  public:
    explicit Turn(uint64_t ticket) {
        Order& o = order();
        std::unique_lock<std::mutex> lock(o.mu);
        o.cv.wait(lock, [&] { return o.serving == ticket; });
    }
    ~Turn() {
        Order& o = order();
        {
            std::lock_guard<std::mutex> lock(o.mu);
            ++o.serving;
        }
        o.cv.notify_all();
    }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
};

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

    std::mutex mu;
    std::condition_variable cv;       // worker: new job or closing
    std::condition_variable idle_cv;  // callers: a job was issued
    std::deque<Job> queue;
    std::vector<PyObject*> finished;  // programs to release (under the GIL, by callers)
    uint32_t submitted = 0;
    std::atomic<uint32_t> issued{0};
    std::atomic<bool> poisoned{false};  // stop issuing: communicators are being aborted
    std::atomic<bool> in_call{false};   // inside a CUDA or NCCL call right now
    // Where the worker is (for a watchdog's error: a hang inside an NCCL or CUDA call
    // names the call): job, instruction index and op; at_op -1 between jobs.
    std::atomic<uint32_t> at_seq{0};
    std::atomic<int64_t> at_index{-1};
    std::atomic<int64_t> at_op{-1};
    // Host time spent in each kind of instruction since the last op_times(reset=True):
    // where a call's host time goes (two clock reads per instruction, ~50 ns).
    std::atomic<uint64_t> op_ns[OP_COUNT] = {};
    std::atomic<uint64_t> op_calls[OP_COUNT] = {};
    // Probes: row seq % kProbeJobs holds job seq's instructions, each with the stream it
    // enqueued on and an event recorded there right after it (NCCL calls: after their
    // group's end), so a hang names the first instruction each stream has not passed.
    // Written by the issuing thread, read by the watchdog's only after the job was issued;
    // probe_mu keeps a reader off a row the worker is reusing (256 jobs later).
    std::mutex probe_mu;
    size_t probe_width = 0;                 // instructions per row; 0: off
    std::vector<CUevent> probe_events;      // kProbeJobs * probe_width
    std::vector<CUstream> probe_streams;    // nullptr: the instruction enqueued nothing
    std::vector<uint32_t> probe_seq;        // the job in each row
    std::vector<std::vector<Instr>> probe_code;  // a copy: the Program may go first
    bool closing = false;
    Failure failure;                    // under mu
    std::atomic<bool> failed{false};    // failure.set, readable without mu
    std::thread worker;
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

// The stream instruction `in` enqueues on (nullptr: none; NCCL calls inside a group
// enqueue at its end).
CUstream probe_stream(const State& s, const Instr& in) {
    switch (in.op) {
    case WAIT_EVENT: case RECORD_EVENT: return reinterpret_cast<CUstream>(in.a[0]);
    case SEND: case RECV: case REDUCE_SCATTER: case ALL_GATHER: case ALL_REDUCE:
    case LAUNCH: return reinterpret_cast<CUstream>(in.a[5]);
    case MEMCPY: return reinterpret_cast<CUstream>(in.a[3]);
    case WRITE_FLAG: return s.flag_stream;
    default: return nullptr;
    }
}

// After instruction i of the job in `row` was issued: its probe event on its stream.
// NCCL calls inside a group (`grouped`) wait in `group` until group_end launched them.
void probe_after(State& s, size_t row, size_t i, const Instr& in, bool grouped,
                 std::vector<size_t>& group) {
    if (i >= s.probe_width) return;
    size_t base = row * s.probe_width;
    auto mark = [&](size_t j, CUstream stream) {
        s.probe_streams[base + j] = stream;
        s.cuda.eventRecord(s.probe_events[base + j], stream);
    };
    if (in.op == GROUP_END) {
        for (size_t j : group) mark(j, probe_stream(s, s.probe_code[row][j]));
        group.clear();
        return;
    }
    CUstream stream = probe_stream(s, in);
    if (stream == nullptr) return;
    if (grouped) group.push_back(i);
    else mark(i, stream);
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
    size_t row = job.seq % kProbeJobs;
    std::vector<size_t> group;
    if (s.probe_width) {
        std::lock_guard<std::mutex> lock(s.probe_mu);
        std::fill_n(s.probe_streams.begin() + row * s.probe_width, s.probe_width, nullptr);
        s.probe_code[row] = *job.p->code;
        s.probe_seq[row] = job.seq;
    }
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
        auto started = std::chrono::steady_clock::now();
        std::string err = execute(s, job, in, p);
        auto spent = std::chrono::steady_clock::now() - started;
        s.op_ns[in.op].fetch_add(
            uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count()),
            std::memory_order_relaxed);
        s.op_calls[in.op].fetch_add(1, std::memory_order_relaxed);
        if (!err.empty() && depth > 0 && in.op != GROUP_END) s.nccl.groupEnd();  // close it
        s.in_call.store(false);
        depth += in.op == GROUP_START ? 1 : in.op == GROUP_END ? -1 : 0;
        if (err.empty() && s.probe_width) probe_after(s, row, i, in, depth > 0, group);
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

void worker_main(State* s) {
    // Named, so per-thread CPU accounting (benchmarks/native_host.py, top -H) tells the
    // issuer apart from the Python threads and NCCL's proxies (NCCL_SET_THREAD_NAME=1).
    pthread_setname_np(pthread_self(), "rr-issuer");
    if (s->has_cuda) s->cuda.ctxSetCurrent(s->ctx);
    std::unique_lock<std::mutex> lock(s->mu);
    for (;;) {
        s->cv.wait(lock, [&] { return s->closing || !s->queue.empty(); });
        if (s->queue.empty()) return;  // closing, and everything was issued
        Job job = s->queue.front();
        lock.unlock();
        {
            Turn turn(job.ticket);
            run_job(*s, job);
            lock.lock();  // counted issued before the next ticket is served (drain)
            s->queue.pop_front();
            s->finished.push_back(job.program);
            s->issued.store(job.seq);
            lock.unlock();
        }
        s->idle_cv.notify_all();
        lock.lock();
    }
}

struct Issuer {
    PyObject_HEAD
    State* s;
};

void release_finished(State& s) {  // GIL held
    std::vector<PyObject*> done;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        done.swap(s.finished);
    }
    for (PyObject* o : done) Py_DECREF(o);
}

// Wait (GIL released) until pred holds or timeout_s passes (< 0: forever).
//
// Lock order: the GIL is never requested while mu is held. Py_END_ALLOW_THREADS takes
// the GIL back before its closing brace, so the lock lives in a scope of its own and is
// released first. With the lock still held there, a waiter woken by its timeout sat on
// mu waiting for the GIL while a Python thread holding the GIL (the watchdog's state(),
// the caller's state() or error()) waited for mu: both stopped, and with them the worker
// (it takes mu between jobs), so the peers' NCCL kernels waited for this rank's: a host
// deadlock that looks like a device hang.
// The wait itself, for a caller that released the GIL already (follow).
template <typename Pred>
bool wait_released(std::mutex& mu, std::condition_variable& cv, double timeout_s, Pred pred) {
    std::unique_lock<std::mutex> lock(mu);
    if (timeout_s < 0) {
        cv.wait(lock, pred);
        return true;
    }
    return cv.wait_for(lock, std::chrono::duration<double>(timeout_s), pred);
}

template <typename Pred>
bool wait_for(std::mutex& mu, std::condition_variable& cv, double timeout_s, Pred pred) {
    bool ok;
    Py_BEGIN_ALLOW_THREADS
    ok = wait_released(mu, cv, timeout_s, pred);  // its lock is gone before the GIL returns
    Py_END_ALLOW_THREADS
    return ok;
}

// The same on the issuer's own lock: until a job of this Issuer was issued.
template <typename Pred>
bool wait_for(State& s, double timeout_s, Pred pred) {
    return wait_for(s.mu, s.idle_cv, timeout_s, pred);
}

void shutdown(State& s) {
    {
        std::lock_guard<std::mutex> lock(s.mu);
        s.closing = true;
    }
    s.cv.notify_all();
    if (s.worker.joinable()) {
        Py_BEGIN_ALLOW_THREADS
        s.worker.join();
        Py_END_ALLOW_THREADS
    }
}

void issuer_dealloc(Issuer* self) {
    if (self->s) {
        shutdown(*self->s);
        release_finished(*self->s);
        State& s = *self->s;
        if (s.has_cuda) {
            for (CUevent e : s.entries) s.cuda.eventDestroy(e);
            for (CUevent e : s.dones) s.cuda.eventDestroy(e);
            for (CUevent e : s.probe_events) s.cuda.eventDestroy(e);
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
    self->s->worker = std::thread(worker_main, self->s);
    return 0;
}

// The arguments of submit and run: (program, base, entry_stream, after=0); the Program,
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
    if (*after && (after_arg > UINT32_MAX ||
                   static_cast<int32_t>(s.submitted - *after) < 0)) {
        PyErr_Format(PyExc_ValueError, "after=%lu is not a submitted job (the last is %lu); "
                     "pass a number submit() or run() returned, or 0",
                     after_arg, static_cast<unsigned long>(s.submitted));
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

// submit(program, base, entry_stream, after=0) -> seq. Records the job's entry event on
// entry_stream (0 is the legacy default stream, a real one) and queues the job.
PyObject* issuer_submit(Issuer* self, PyObject* args) {
    PyObject* program;
    unsigned long long base, entry_stream;
    uint32_t after;
    const Program* p = job_args(*self->s, args, &program, &base, &entry_stream, &after);
    if (!p) return nullptr;
    State& s = *self->s;
    if (s.closing) {
        PyErr_SetString(PyExc_RuntimeError, "the native issuer is closed");
        return nullptr;
    }
    release_finished(s);
    uint32_t seq = s.submitted + 1;
    // The entry event of seq reuses the one of seq - kEntryRing: that job must be issued
    // (its wait enqueued) first. Only a queue kEntryRing deep waits here.
    if (static_cast<int32_t>(seq - kEntryRing - s.issued.load()) > 0)
        wait_for(s, -1, [&] { return static_cast<int32_t>(seq - kEntryRing - s.issued.load()) <= 0; });
    CUevent entry = nullptr;
    if (s.has_cuda) {
        CUresult r;
        Py_BEGIN_ALLOW_THREADS
        r = record_entry(s, seq, entry_stream, &entry);
        Py_END_ALLOW_THREADS
        if (r) {
            PyErr_SetString(PyExc_RuntimeError, cu_error(s, r, "cuEventRecord (entry)").c_str());
            return nullptr;
        }
    }
    Py_INCREF(program);
    {
        std::lock_guard<std::mutex> lock(s.mu);
        s.queue.push_back(Job{program, p, base, seq, entry, after, take_ticket()});
        s.submitted = seq;
    }
    submitted_ns().store(now_ns(), std::memory_order_relaxed);
    s.cv.notify_one();
    return PyLong_FromUnsignedLong(seq);
}

// run(program, base, entry_stream) -> seq: the job issued here, on the calling thread,
// without the GIL, before returning (the "native" issuer; submit is "native-async").
// The same program and the same order as the Python issuer, only without ~100 Python
// calls: no other thread issues CUDA or NCCL work for this communicator, so nothing
// can interleave with a half-issued job (the worker thread could, and hung on H200
// under MPS). Refused while jobs are queued.
PyObject* issuer_run(Issuer* self, PyObject* args) {
    PyObject* program;
    unsigned long long base, entry_stream;
    uint32_t after;
    const Program* p = job_args(*self->s, args, &program, &base, &entry_stream, &after);
    if (!p) return nullptr;
    State& s = *self->s;
    uint32_t seq;
    uint64_t ticket;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        if (s.closing || s.submitted != s.issued.load()) {
            PyErr_SetString(PyExc_RuntimeError, s.closing ? "the native issuer is closed"
                            : "run() while submitted jobs are queued: drain() first");
            return nullptr;
        }
        seq = s.submitted + 1;
        s.submitted = seq;  // claimed: a submit from another thread now queues behind it
        ticket = take_ticket();
    }
    CUevent entry = nullptr;
    CUresult r = 0;
    Py_BEGIN_ALLOW_THREADS
    {
        Turn turn(ticket);  // after every job other Issuers were given before this one
        if (s.has_cuda) r = record_entry(s, seq, entry_stream, &entry);
        if (!r) run_job(s, Job{program, p, base, seq, entry, after, ticket});
        else {
            std::lock_guard<std::mutex> lock(s.mu);
            if (!s.failure.set) s.failure = {true, seq, -1, -1, cu_error(s, r, "cuEventRecord (entry)")};
            s.failed.store(true);
            write_flag_after_failure(s, seq);
        }
        std::lock_guard<std::mutex> lock(s.mu);  // issued before the next ticket is served
        s.issued.store(seq);
    }
    Py_END_ALLOW_THREADS
    s.idle_cv.notify_all();
    return PyLong_FromUnsignedLong(seq);
}

// wait_issued(seq, timeout_s=-1) -> bool: the worker has issued job seq (its flag write
// is enqueued), or it failed; GIL released while waiting.
PyObject* issuer_wait_issued(Issuer* self, PyObject* args) {
    unsigned long seq_arg;
    double timeout_s = -1;
    if (!PyArg_ParseTuple(args, "k|d", &seq_arg, &timeout_s)) return nullptr;
    State& s = *self->s;
    uint32_t seq = static_cast<uint32_t>(seq_arg);
    bool ok = static_cast<int32_t>(s.issued.load() - seq) >= 0 ||
              wait_for(s, timeout_s, [&] { return static_cast<int32_t>(s.issued.load() - seq) >= 0; });
    return PyBool_FromLong(ok);
}

// stream_wait(stream, seq): stream waits (on the device) until job seq has finished: an
// event wait on its done event, recorded on the flag stream after the job's last work.
// Only for issued jobs (the event is recorded then): a stream never waits on work that
// is not enqueued yet, because a context-wide synchronisation (CUDA loading a kernel
// lazily, a free), in any thread, would then wait for that stream, and so for the
// worker, which may itself be the one synchronising (a deadlock, seen on H200 before
// this rule). An event, not cuStreamWaitValue32 on the mapped flag: tried twice under
// MPS, the flag wait hung (H200) and, with the GIL/lock order kept, let futures
// complete before their results (H100), as CUDA's driver API warns: orderings made
// through stream memory operations are not visible to CUDA and must also be expressed
// with events. Event waits are what the Python issuer's streams have always used. A job
// more than kEntryRing behind the newest issued one has had its event recorded again by
// a later job on the same in-order stream: the wait then lasts until that later job,
// longer but never too short.
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
    Py_BEGIN_ALLOW_THREADS  // as in submit: a full launch queue may block here
    r = s.cuda.streamWaitEvent(reinterpret_cast<CUstream>(stream), s.dones[seq % kEntryRing], 0);
    Py_END_ALLOW_THREADS
    if (r) {
        PyErr_SetString(PyExc_RuntimeError, cu_error(s, r, "cuStreamWaitEvent (done)").c_str());
        return nullptr;
    }
    Py_RETURN_NONE;
}

// The caller's quiet (follow): once job seq is issued, wait until the process submitted
// no job for quiet_s, or max_delay_s passed, or the issuer fails or closes; GIL released.
void wait_quiet(State& s, double quiet_s, double max_delay_s) {
    const int64_t quiet = static_cast<int64_t>(quiet_s * 1e9);
    const int64_t until = now_ns() + static_cast<int64_t>(max_delay_s * 1e9);
    for (;;) {
        int64_t now = now_ns();
        int64_t left = std::min(submitted_ns().load(std::memory_order_relaxed) + quiet, until) - now;
        if (left <= 0 || s.failed.load() || s.poisoned.load()) return;
        {
            std::lock_guard<std::mutex> lock(s.mu);
            if (s.closing) return;
        }
        std::this_thread::sleep_for(std::chrono::nanoseconds(left));
    }
}

// follow(stream, seq, timeout_s=-1, last=seq, quiet_s=0, max_delay_s=0) -> n, 0 or -1:
// once job seq is issued (and, with quiet_s, once the caller stopped submitting for that
// long or max_delay_s passed: wait_quiet), `stream` waits (on the device) for its done
// event, as stream_wait does, and n counts the jobs seq .. seq+n-1 issued by then, up to
// `last` and before any failed one: the caller may follow those with stream_wait without
// waiting (one wait each, so each Future's event follows its own job, not a later one).
// 0: seq not issued within timeout_s; -1: job seq failed or was refused (error() says
// why), and nothing was enqueued. All of it in one release of the GIL: each time the
// completer thread takes the GIL from a caller making calls back to back, the caller
// waits; quiet_s keeps it off the GIL while the caller is making calls.
PyObject* issuer_follow(Issuer* self, PyObject* args) {
    unsigned long long stream;
    unsigned long seq_arg, last_arg = 0;
    double timeout_s = -1, quiet_s = 0, max_delay_s = 0;
    if (!PyArg_ParseTuple(args, "Kk|dkdd", &stream, &seq_arg, &timeout_s, &last_arg, &quiet_s,
                          &max_delay_s))
        return nullptr;
    State& s = *self->s;
    uint32_t seq = static_cast<uint32_t>(seq_arg);
    uint32_t last = PyTuple_GET_SIZE(args) > 3 ? static_cast<uint32_t>(last_arg) : seq;
    if (static_cast<int32_t>(last - seq) < 0) last = seq;
    auto issued = [&] { return static_cast<int32_t>(s.issued.load() - seq) >= 0; };
    long out = 0;
    uint32_t upto = seq;
    CUresult r = 0;
    Py_BEGIN_ALLOW_THREADS
    out = wait_released(s.mu, s.idle_cv, timeout_s, issued) ? 1 : 0;
    if (out && quiet_s > 0) wait_quiet(s, quiet_s, max_delay_s);
    if (out) {
        std::lock_guard<std::mutex> lock(s.mu);
        uint32_t now = s.issued.load();
        upto = static_cast<int32_t>(now - last) >= 0 ? last : now;
        if (s.failure.set && static_cast<int32_t>(upto - s.failure.seq) >= 0)
            upto = s.failure.seq - 1;  // the jobs before the failure still finished
        out = static_cast<int32_t>(upto - seq) >= 0 ? static_cast<long>(upto - seq) + 1 : -1;
    }
    if (out > 0 && s.has_cuda) {
        make_current(s);
        r = s.cuda.streamWaitEvent(reinterpret_cast<CUstream>(stream), s.dones[seq % kEntryRing], 0);
    }
    Py_END_ALLOW_THREADS
    if (r) {
        PyErr_SetString(PyExc_RuntimeError, cu_error(s, r, "cuStreamWaitEvent (done)").c_str());
        return nullptr;
    }
    return PyLong_FromLong(out);
}

// state(seq): 1 finished (flag reached it; CPU-only issuers: issued), 0 pending,
// -1 failed (the worker stored an error).
PyObject* issuer_state(Issuer* self, PyObject* arg) {
    uint32_t seq = static_cast<uint32_t>(PyLong_AsUnsignedLong(arg));
    if (PyErr_Occurred()) return nullptr;
    State& s = *self->s;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        if (s.failure.set) return PyLong_FromLong(-1);
    }
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

// drain(timeout_s=-1) -> bool: every job submitted so far, by any Issuer of the process,
// was issued (one issue order: work the caller issues itself next comes after all of
// them); False if timeout_s passed first. GIL released while waiting.
PyObject* issuer_drain(Issuer* self, PyObject* args) {
    double timeout_s = -1;
    if (!PyArg_ParseTuple(args, "|d", &timeout_s)) return nullptr;
    State& s = *self->s;
    Order& o = order();
    uint64_t target;
    {
        std::lock_guard<std::mutex> lock(o.mu);
        target = o.next;
    }
    bool ok = wait_for(o.mu, o.cv, timeout_s, [&] { return o.serving >= target; });
    release_finished(s);
    return PyBool_FromLong(ok);
}

// stop(timeout_s): issue nothing more (the communicators are about to be aborted) and
// wait until the worker is outside CUDA/NCCL; False if it is still inside then.
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
// the last submitted job: the watchdog stops polling jobs that will never run. Streams
// only ever wait for issued jobs' done events, which the flag stream reaches once the
// aborted kernels exit. The worker still writes each job's flag in order afterwards, so
// the flag ends at the last job.
PyObject* issuer_release(Issuer* self, PyObject*) {
    State& s = *self->s;
    if (s.has_cuda) *s.flag = s.submitted;
    Py_RETURN_NONE;
}

PyObject* issuer_close(Issuer* self, PyObject*) {
    shutdown(*self->s);
    release_finished(*self->s);
    Py_RETURN_NONE;
}

PyObject* issuer_counters(Issuer* self, PyObject*) {
    State& s = *self->s;
    uint32_t flag = s.has_cuda ? *s.flag : 0;
    int64_t op = s.at_op.load(std::memory_order_relaxed);
    return Py_BuildValue("{s:k,s:k,s:k,s:k,s:L,s:s}", "submitted",
                         static_cast<unsigned long>(s.submitted), "issued",
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

// enable_probes(width): from the next job on, an event after each of a job's first
// `width` instructions (the last kProbeJobs jobs kept); see State::probe_width. For a
// hang's diagnosis: about a microsecond of host time per instruction. Only while idle.
PyObject* issuer_enable_probes(Issuer* self, PyObject* arg) {
    long width = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return nullptr;
    State& s = *self->s;
    if (!s.has_cuda || width <= 0 || s.probe_width) Py_RETURN_NONE;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        if (s.submitted != s.issued.load()) {
            PyErr_SetString(PyExc_RuntimeError, "enable_probes() while jobs are queued");
            return nullptr;
        }
    }
    make_current(s);
    size_t n = kProbeJobs * static_cast<size_t>(width);
    std::vector<CUevent> events(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
        CUresult r = s.cuda.eventCreate(&events[i], kEventDisableTiming);
        if (r) {
            for (size_t j = 0; j < i; ++j) s.cuda.eventDestroy(events[j]);
            PyErr_SetString(PyExc_RuntimeError, cu_error(s, r, "cuEventCreate (probe)").c_str());
            return nullptr;
        }
    }
    s.probe_events.swap(events);
    s.probe_streams.assign(n, nullptr);
    s.probe_seq.assign(kProbeJobs, 0);
    s.probe_code.assign(kProbeJobs, {});
    s.probe_width = static_cast<size_t>(width);
    Py_RETURN_NONE;
}

// probe(seq) -> [(instruction, op, stage, stream, reached, a1)] for each instruction of
// job seq that enqueued work (reached: 1 passed on the device, 0 not yet, -1 error;
// a1: the event of a wait or record), or None: probes off, or the row holds another job.
PyObject* issuer_probe(Issuer* self, PyObject* arg) {
    uint32_t seq = static_cast<uint32_t>(PyLong_AsUnsignedLong(arg));
    if (PyErr_Occurred()) return nullptr;
    State& s = *self->s;
    size_t row = seq % kProbeJobs;
    std::lock_guard<std::mutex> lock(s.probe_mu);  // the worker never waits for the GIL
    if (!s.probe_width || s.probe_seq[row] != seq ||
        static_cast<int32_t>(s.issued.load() - seq) < 0)
        Py_RETURN_NONE;
    make_current(s);
    const std::vector<Instr>& code = s.probe_code[row];
    PyObject* out = PyList_New(0);
    if (!out) return nullptr;
    for (size_t i = 0; i < code.size() && i < s.probe_width; ++i) {
        CUstream stream = s.probe_streams[row * s.probe_width + i];
        if (!stream) continue;
        CUresult r = s.cuda.eventQuery(s.probe_events[row * s.probe_width + i]);
        const Instr& in = code[i];
        PyObject* t = Py_BuildValue("(nsLKiL)", static_cast<Py_ssize_t>(i), kOpNames[in.op],
                                    static_cast<long long>(in.stage),
                                    reinterpret_cast<unsigned long long>(stream),
                                    r == 0 ? 1 : r == kNotReady ? 0 : -1,
                                    static_cast<long long>(in.a[1]));
        if (!t || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            return nullptr;
        }
        Py_DECREF(t);
    }
    return out;
}

PyObject* issuer_op_times(Issuer* self, PyObject* args) {
    int reset = 0;
    if (!PyArg_ParseTuple(args, "|p", &reset)) return nullptr;
    State& s = *self->s;
    PyObject* d = PyDict_New();
    if (!d) return nullptr;
    for (int i = 0; i < OP_COUNT; ++i) {
        uint64_t calls = reset ? s.op_calls[i].exchange(0) : s.op_calls[i].load();
        uint64_t ns = reset ? s.op_ns[i].exchange(0) : s.op_ns[i].load();
        if (!calls) continue;
        PyObject* v = Py_BuildValue("(KK)", static_cast<unsigned long long>(calls),
                                    static_cast<unsigned long long>(ns));
        if (!v || PyDict_SetItemString(d, kOpNames[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return nullptr;
        }
        Py_DECREF(v);
    }
    return d;
}

PyMethodDef issuer_methods[] = {
    {"submit", reinterpret_cast<PyCFunction>(issuer_submit), METH_VARARGS,
     "submit(program, base, entry_stream, after=0) -> seq (after: a job it follows)"},
    {"run", reinterpret_cast<PyCFunction>(issuer_run), METH_VARARGS,
     "run(program, base, entry_stream, after=0) -> seq: issue the job on this thread, now"},
    {"wait_issued", reinterpret_cast<PyCFunction>(issuer_wait_issued), METH_VARARGS,
     "wait_issued(seq, timeout_s=-1) -> bool: job seq was issued (or failed)"},
    {"stream_wait", reinterpret_cast<PyCFunction>(issuer_stream_wait), METH_VARARGS,
     "stream_wait(stream, seq): the stream waits for an issued job's done event"},
    {"follow", reinterpret_cast<PyCFunction>(issuer_follow), METH_VARARGS,
     "follow(stream, seq, timeout_s=-1, last=seq, quiet_s=0, max_delay_s=0) -> n: the stream "
     "waits for job seq; jobs seq..seq+n-1 are issued (up to last); 0: not yet; -1: seq failed"},
    {"state", reinterpret_cast<PyCFunction>(issuer_state), METH_O,
     "state(seq): 1 finished, 0 pending, -1 failed"},
    {"error", reinterpret_cast<PyCFunction>(issuer_error), METH_NOARGS,
     "None, or (seq, stage, instruction, message) of the first failure"},
    {"drain", reinterpret_cast<PyCFunction>(issuer_drain), METH_VARARGS,
     "drain(timeout_s=-1) -> bool: every job submitted so far, by any Issuer, was issued"},
    {"stop", reinterpret_cast<PyCFunction>(issuer_stop), METH_VARARGS,
     "stop(timeout_s=2): issue nothing more; True once the worker is outside CUDA/NCCL"},
    {"release", reinterpret_cast<PyCFunction>(issuer_release), METH_NOARGS,
     "after a failure: the host-visible flag jumps to the last submitted job"},
    {"close", reinterpret_cast<PyCFunction>(issuer_close), METH_NOARGS,
     "issue what is queued, then end the worker thread"},
    {"op_times", reinterpret_cast<PyCFunction>(issuer_op_times), METH_VARARGS,
     "op_times(reset=False) -> {op: (instructions, host ns)} since the last reset"},
    {"events", reinterpret_cast<PyCFunction>(issuer_events), METH_O,
     "events(seq) -> (entry, done): 1 reached, 0 not yet, -1 error; None without CUDA"},
    {"enable_probes", reinterpret_cast<PyCFunction>(issuer_enable_probes), METH_O,
     "enable_probes(width): an event after each instruction of the last jobs (diagnosis)"},
    {"probe", reinterpret_cast<PyCFunction>(issuer_probe), METH_O,
     "probe(seq) -> [(instruction, op, stage, stream, reached, a1)], or None"},
    {"counters", reinterpret_cast<PyCFunction>(issuer_counters), METH_NOARGS,
     "submitted, issued, flag; the job, instruction and op the worker is at ('-': idle)"},
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
    IssuerType.tp_doc = "Issuer(libcuda=None, libnccl=None, flag_stream=0): one worker thread";
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
