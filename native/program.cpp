// The program format's decoding and validation (program.h): once per program, when
// Python builds it, so the issuer replays it without checks.
#include "program.h"

#include <cstring>

namespace ringreduce {
namespace {

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

template <typename T>
std::vector<T> copy_of(const void* bytes, size_t len) {
    std::vector<T> out(len / sizeof(T));
    if (len) std::memcpy(out.data(), bytes, len);
    return out;
}

}  // namespace

std::string decode(const void* code, size_t code_len, const void* args, size_t args_len,
                   int64_t extent, Program& out) {
    std::string problem;
    if (code_len % sizeof(Instr)) problem = "code is not a whole number of instructions";
    if (args_len % sizeof(Arg)) problem = "args is not a whole number of arguments";
    if (extent < 0) problem = "negative extent";
    if (!problem.empty()) return problem;
    out.code = copy_of<Instr>(code, code_len);
    out.args = copy_of<Arg>(args, args_len);
    out.extent = extent;
    out.needs_cuda = false;
    for (const Instr& in : out.code) out.needs_cuda |= uses_cuda(in.op);
    return validate(out.code, out.args, extent);
}

}  // namespace ringreduce
