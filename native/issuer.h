// The issuer: jobs (a program and the caller's tensor) replayed on the calling thread,
// one at a time per process, and what it keeps after a failure.
//
// Ordering: submit records the job's entry event (a ring of kEntryRing) on the caller's
// stream, then issues the program. Its last instruction, on the flag stream (the stream
// of the last stage), writes seq into the flag (mapped pinned memory: the host reads
// completion there) and records the job's done event (a ring too). The stream that must
// follow the result waits for that event (stream_wait) once run has returned. On a
// failure the issuer stores the first error and still writes every later job's flag and
// done event, in order on that same stream, so no stream waits forever and the flag
// never goes backwards.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "driver.h"
#include "program.h"

namespace ringreduce {

constexpr int kEntryRing = 256;  // entry and done events per issuer

// Job numbers wrap around (uint32): a comes before b when a - b, read as signed, is < 0.
inline bool seq_before(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) < 0; }

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
std::mutex& issue_mutex();

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
    // What the issuer created, destroyed with it in the reverse of this order: the entry
    // events, the done events, then the flag's memory.
    HostMemory flag_memory;
    volatile uint32_t* flag = nullptr;  // flag_memory: mapped pinned memory
    CUdeviceptr flag_dev = 0;
    std::vector<Event> dones;  // job seq's end on the flag stream: done(seq)
    std::vector<Event> entries;

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

    // Job seq's entry and done events (a ring: reused kEntryRing jobs later).
    CUevent entry(uint32_t seq) const { return entries[seq % kEntryRing].get(); }
    CUevent done(uint32_t seq) const { return dones[seq % kEntryRing].get(); }
};

// Loads the libraries and creates the flag and the event rings for the calling thread's
// current context; "" on success (has_cuda set), else why not (what was created is
// destroyed with s).
std::string start_cuda(State& s, const char* libcuda, const char* libnccl,
                       CUstream flag_stream);

// The issuer's context current on the calling thread (e.g. a fresh autograd thread).
void make_current(State& s);

// Takes the next job number and issues the job on this thread (under issue_mutex, the
// GIL released); returns its number. A failure is stored (s.failure), not returned.
uint32_t submit(State& s, const Program& p, uint64_t base, CUstream entry_stream,
                uint32_t after);

// Issue nothing more, and wait until the issuing thread is outside CUDA/NCCL; false if
// it is still inside after timeout_s.
bool stop(State& s, double timeout_s);

}  // namespace ringreduce
