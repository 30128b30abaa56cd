// The issuer (issuer.h): each job's instructions, in order, on the calling thread; the
// first failure stored; every job's flag and done event written even after one.
#include "issuer.h"

#include <chrono>
#include <thread>
#include <utility>

namespace ringreduce {

std::mutex& issue_mutex() {
    static std::mutex* m = new std::mutex();
    return *m;
}

std::string start_cuda(State& s, const char* libcuda, const char* libnccl,
                       CUstream flag_stream) {
    std::string err = open_driver(s.cuda, s.nccl, libcuda, libnccl);
    CUresult r = 0;
    if (err.empty() && (r = s.cuda.ctxGetCurrent(&s.ctx)) == 0 && !s.ctx)
        err = "no current CUDA context on the calling thread (initialise torch.cuda first)";
    if (err.empty() && r) err = cu_error(s.cuda, r, "cuCtxGetCurrent");
    void* host = nullptr;
    if (err.empty() && (r = s.cuda.memHostAlloc(&host, 64, kHostAllocFlags)))
        err = cu_error(s.cuda, r, "cuMemHostAlloc");
    if (err.empty()) {
        s.flag_memory = HostMemory(s.cuda, host);
        s.flag = static_cast<volatile uint32_t*>(host);
        *s.flag = 0;
        if ((r = s.cuda.memHostGetDevicePointer(&s.flag_dev, host, 0)))
            err = cu_error(s.cuda, r, "cuMemHostGetDevicePointer");
    }
    s.entries.reserve(kEntryRing);
    s.dones.reserve(kEntryRing);
    for (int i = 0; err.empty() && i < 2 * kEntryRing; ++i) {
        CUevent e = nullptr;
        if ((r = s.cuda.eventCreate(&e, kEventDisableTiming)))
            err = cu_error(s.cuda, r, "cuEventCreate");
        else (i % 2 ? s.dones : s.entries).emplace_back(s.cuda, e);
    }
    if (!err.empty()) return err;
    s.has_cuda = true;
    s.flag_stream = flag_stream;
    return "";
}

void make_current(State& s) {
    CUcontext current = nullptr;
    s.cuda.ctxGetCurrent(&current);
    if (current != s.ctx) s.cuda.ctxSetCurrent(s.ctx);
}

namespace {

// One instruction; "" on success. NCCL and CUDA calls only here.
std::string execute(State& s, const Job& job, const Instr& in, const Program& p) {
    auto at = [&](int i) -> uint64_t {
        return static_cast<uint64_t>(in.a[i]) + ((in.reloc >> i & 1) ? job.base : 0);
    };
    auto stream = [&](int i) { return reinterpret_cast<CUstream>(in.a[i]); };
    auto comm = reinterpret_cast<ncclComm_t>(in.a[0]);
    auto ptr = [&](int i) { return reinterpret_cast<void*>(at(i)); };
    auto cu = [&](CUresult r, const char* what) {
        return r ? cu_error(s.cuda, r, what) : std::string();
    };
    auto nccl = [&](ncclResult r, const char* what) {
        return r ? nccl_error(s.nccl, r, what) : std::string();
    };
    switch (in.op) {
    case NOP:
        if (in.a[0] > 0) std::this_thread::sleep_for(std::chrono::microseconds(in.a[0]));
        return "";
    case FAIL:
        return "FAIL instruction (a test's planted failure)";
    case WAIT_EVENT:
        if (!in.a[1] && job.after && seq_before(*s.flag, job.after)) {
            // The entry wait also waits for the earlier job on the same memory: issued
            // before this one (one issuing order), so its done event is recorded.
            std::string err = cu(s.cuda.streamWaitEvent(stream(0), s.done(job.after), 0),
                                 "cuStreamWaitEvent (the earlier job on this memory)");
            if (!err.empty()) return err;
        }
        return cu(s.cuda.streamWaitEvent(stream(0), in.a[1] ? reinterpret_cast<CUevent>(in.a[1])
                                                            : job.entry, 0),
                  "cuStreamWaitEvent");
    case RECORD_EVENT:
        return cu(s.cuda.eventRecord(reinterpret_cast<CUevent>(in.a[1]), stream(0)),
                  "cuEventRecord");
    case GROUP_START:
        return nccl(s.nccl.groupStart(), "ncclGroupStart");
    case GROUP_END:
        return nccl(s.nccl.groupEnd(), "ncclGroupEnd");
    case SEND:
        return nccl(s.nccl.send(ptr(1), in.a[2], int(in.a[3]), int(in.a[4]), comm, stream(5)),
                    "ncclSend");
    case RECV:
        return nccl(s.nccl.recv(ptr(1), in.a[2], int(in.a[3]), int(in.a[4]), comm, stream(5)),
                    "ncclRecv");
    case REDUCE_SCATTER:
        return nccl(s.nccl.reduceScatter(ptr(1), ptr(2), in.a[3], int(in.a[4] & 0xff),
                                         int(in.a[4] >> 8), comm, stream(5)),
                    "ncclReduceScatter");
    case ALL_GATHER:
        return nccl(s.nccl.allGather(ptr(1), ptr(2), in.a[3], int(in.a[4]), comm, stream(5)),
                    "ncclAllGather");
    case ALL_REDUCE:
        return nccl(s.nccl.allReduce(ptr(1), ptr(2), in.a[3], int(in.a[4] & 0xff),
                                     int(in.a[4] >> 8), comm, stream(5)),
                    "ncclAllReduce");
    case LAUNCH: {
        int64_t values[kMaxKernelArgs];
        void* params[kMaxKernelArgs];
        for (int64_t j = 0; j < in.a[4]; ++j) {
            const Arg& arg = p.args[in.a[3] + j];
            values[j] = arg.value + ((arg.kind >> 8 & 1) ? static_cast<int64_t>(job.base) : 0);
            params[j] = &values[j];  // little-endian: a 4-byte argument is the low half
        }
        return cu(s.cuda.launchKernel(reinterpret_cast<CUfunction>(in.a[0]), unsigned(in.a[1]),
                                      1, 1, unsigned(in.a[2]), 1, 1, 0, stream(5), params,
                                      nullptr),
                  "cuLaunchKernel");
    }
    case MEMCPY:
        return cu(s.cuda.memcpyDtoDAsync(at(0), at(1), in.a[2], stream(3)),
                  "cuMemcpyDtoDAsync");
    case WRITE_FLAG: {
        std::string err = cu(s.cuda.writeValue32(s.flag_stream, s.flag_dev, job.seq, 0),
                             "cuStreamWriteValue32");
        if (!err.empty()) return err;
        return cu(s.cuda.eventRecord(s.done(job.seq), s.flag_stream), "cuEventRecord (done)");
    }
    }
    return "unknown op";
}

// The first failure is kept (later ones are its consequences); failed is set either way.
void record_failure(State& s, uint32_t seq, int64_t stage, int64_t index,
                    std::string message) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.failure.set) s.failure = {true, seq, stage, index, std::move(message)};
    s.failed.store(true);
}

void write_flag_after_failure(State& s, uint32_t seq) {
    if (!s.has_cuda) return;
    // On the flag stream, in order, so the flag never goes backwards; after an abort the
    // stream drains (NCCL's kernels exit) and the write lands; the done event with it,
    // so a stream told to follow this job is released too.
    s.cuda.writeValue32(s.flag_stream, s.flag_dev, seq, 0);
    s.cuda.eventRecord(s.done(seq), s.flag_stream);
}

// A job that is not issued at all: the failure stored, its flag and done event written.
void skip_job(State& s, uint32_t seq, std::string message) {
    record_failure(s, seq, -1, -1, std::move(message));
    write_flag_after_failure(s, seq);
}

void run_job(State& s, const Job& job) {
    if (s.poisoned.load() || s.failed.load()) {
        skip_job(s, job.seq, "issue stopped: the communicators are aborted");
        return;
    }
    const Program& p = *job.p;
    int depth = 0;
    s.at_seq.store(job.seq, std::memory_order_relaxed);
    for (size_t i = 0; i < p.code.size(); ++i) {
        const Instr& in = p.code[i];
        s.at_index.store(int64_t(i), std::memory_order_relaxed);
        s.at_op.store(in.op, std::memory_order_relaxed);
        // in_call before poisoned (both seq_cst), the reverse of stop(): either stop()
        // sees this call in progress and waits, or this thread sees the poison and never
        // touches a communicator that is being aborted (its handle is freed then).
        s.in_call.store(true);
        if (s.poisoned.load()) {
            s.in_call.store(false);
            record_failure(s, job.seq, in.stage, int64_t(i),
                           "issue stopped: the communicators are aborted");
            break;
        }
        std::string err = execute(s, job, in, p);
        if (!err.empty() && depth > 0 && in.op != GROUP_END) s.nccl.groupEnd();  // close it
        s.in_call.store(false);
        depth += in.op == GROUP_START ? 1 : in.op == GROUP_END ? -1 : 0;
        if (!err.empty()) {
            record_failure(s, job.seq, in.stage, int64_t(i), std::move(err));
            break;
        }
    }
    s.at_op.store(-1, std::memory_order_relaxed);
    if (s.failed.load() || s.poisoned.load()) write_flag_after_failure(s, job.seq);
}

// Job seq's entry event, recorded on the caller's stream (CUDA issuers only). Callers
// release the GIL around it: a launch queue full behind a stuck device blocks this
// call, and the watchdog (a Python thread) must still run to end it.
CUresult record_entry(State& s, uint32_t seq, CUstream entry_stream, CUevent* entry) {
    make_current(s);
    *entry = s.entry(seq);
    return s.cuda.eventRecord(*entry, entry_stream);
}

}  // namespace

uint32_t submit(State& s, const Program& p, uint64_t base, CUstream entry_stream,
                uint32_t after) {
    std::lock_guard<std::mutex> turn(issue_mutex());
    uint32_t seq = s.submitted.load() + 1;
    s.submitted.store(seq);
    CUevent entry = nullptr;
    CUresult r = 0;
    if (s.has_cuda) r = record_entry(s, seq, entry_stream, &entry);
    if (!r) run_job(s, Job{&p, base, seq, entry, after});
    else skip_job(s, seq, cu_error(s.cuda, r, "cuEventRecord (entry)"));
    s.issued.store(seq);
    return seq;
}

bool stop(State& s, double timeout_s) {
    s.poisoned.store(true);
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (s.in_call.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    return !s.in_call.load();
}

}  // namespace ringreduce
