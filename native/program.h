// The program format: a recorded call as a flat array of instructions
// (ringreduce/execution/recording.py writes it, ringreduce/execution/native.py packs the
// same layout), and its validator, run once when Python builds a Program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ringreduce {

constexpr int kMaxKernelArgs = 16;

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

inline constexpr const char* kOpNames[OP_COUNT] = {
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

// A validated program: what the issuer replays.
struct Program {
    std::vector<Instr> code;
    std::vector<Arg> args;
    int64_t extent = 0;
    bool needs_cuda = false;  // any instruction calls CUDA or NCCL
};

// The program encoded in `code` and `args` (the bytes Python packed) for a tensor of
// `extent` bytes, validated; "" on success, else why it is refused (`out` is then
// unspecified).
std::string decode(const void* code, size_t code_len, const void* args, size_t args_len,
                   int64_t extent, Program& out);

}  // namespace ringreduce
