// The CUDA driver and NCCL, as ringreduce._native uses them: the few prototypes it calls,
// their function tables, loading, error text, and holders that destroy what it creates.
//
// No torch, no CUDA or NCCL headers: the prototypes used are declared here, and
// libcuda.so.1 and the libnccl the process already loaded (path passed from Python) are
// opened with dlopen when a CUDA Issuer is made. So one build serves every torch and
// CUDA release, and CI (gcc, no CUDA) compiles and tests the CPU-side parts: program
// encoding and validation, the issuer's failure handling (NOP/FAIL instructions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace ringreduce {

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
constexpr CUresult kNotReady = 600;                // CUDA_ERROR_NOT_READY

// dlopen both libraries (never closed: a thread may still call into them at exit) and
// fill the tables; "" on success, else what is missing.
std::string open_driver(Cuda& cuda, Nccl& nccl, const char* libcuda, const char* libnccl);

// "<what> failed: CUDA error <r> (<text>)", and the same for NCCL.
std::string cu_error(const Cuda& cuda, CUresult r, const char* what);
std::string nccl_error(const Nccl& nccl, ncclResult r, const char* what);

// A CUDA object the issuer created, destroyed once by the driver function that frees it
// (Free, taken from the loaded table when the holder is made). Move-only; empty (a null
// handle) destroys nothing.
template <CUresult (*Cuda::*Free)(void*)>
class Held {
public:
    Held() = default;
    Held(const Cuda& cuda, void* handle) : free_(cuda.*Free), handle_(handle) {}
    Held(Held&& other) noexcept
        : free_(other.free_), handle_(std::exchange(other.handle_, nullptr)) {}
    Held& operator=(Held&& other) noexcept {
        if (this != &other) {
            reset();
            free_ = other.free_;
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    ~Held() { reset(); }

    void* get() const { return handle_; }

private:
    void reset() {
        if (handle_) free_(handle_);
        handle_ = nullptr;
    }

    CUresult (*free_)(void*) = nullptr;
    void* handle_ = nullptr;
};

using Event = Held<&Cuda::eventDestroy>;       // cuEventCreate'd
using HostMemory = Held<&Cuda::memFreeHost>;   // cuMemHostAlloc'd (pinned)

}  // namespace ringreduce
