// Loading the CUDA driver and NCCL tables (driver.h), and their errors as text.
#include "driver.h"

#include <dlfcn.h>

namespace ringreduce {
namespace {

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

}  // namespace

std::string open_driver(Cuda& c, Nccl& n, const char* libcuda, const char* libnccl) {
    void* cu = dlopen(libcuda, RTLD_NOW | RTLD_GLOBAL);
    if (!cu) return std::string("dlopen ") + libcuda + ": " + dlerror();
    void* nc = dlopen(libnccl, RTLD_NOW | RTLD_GLOBAL);
    if (!nc) return std::string("dlopen ") + libnccl + ": " + dlerror();
    std::string missing;
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

#undef SYM

std::string cu_error(const Cuda& cuda, CUresult r, const char* what) {
    const char* text = nullptr;
    if (cuda.getErrorString) cuda.getErrorString(r, &text);
    return std::string(what) + " failed: CUDA error " + std::to_string(r) + " (" +
           (text ? text : "?") + ")";
}

std::string nccl_error(const Nccl& nccl, ncclResult r, const char* what) {
    return std::string(what) + " failed: NCCL error " + std::to_string(r) + " (" +
           (nccl.getErrorString ? nccl.getErrorString(r) : "?") + ")";
}

}  // namespace ringreduce
