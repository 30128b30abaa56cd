// The add stage: own[i] = reduce(own[i], rows[0][i], ..., rows[R-1][i]), one pass.
//
// Bandwidth-bound: each element of the R staged rows and the own row is read once and
// the own row written once, so the kernel should run at device-copy speed (target T8).
// 16-bit floats accumulate in fp32 and round once; AVG divides the exact sum by N at
// the end (integer AVG truncates toward zero, like C++ division and NCCL).
//
// Compiled at run time by NVRTC through cupy.RawModule (ringreduce/kernels.py), with
// no CUDA headers: fp16 converts through PTX cvt, bf16 through bit operations, so the
// same source builds wherever cupy does.
//
// Template parameters: T element type, A accumulator type, OP (0 sum, 1 avg, 2 max,
// 3 min), VEC elements per 16-byte load (1 for the scalar variant used when the rows
// are not 16-byte aligned).

struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

__device__ __forceinline__ float to_acc(half_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float to_acc(bf16_t x) {
    return __uint_as_float(static_cast<unsigned>(x.bits) << 16);
}
template <typename T> __device__ __forceinline__ T to_acc(T x) { return x; }

__device__ __forceinline__ void from_acc(float f, half_t* out) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    out->bits = h;
}
__device__ __forceinline__ void from_acc(float f, bf16_t* out) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
        out->bits = static_cast<unsigned short>((u >> 16) | 0x40u);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    out->bits = static_cast<unsigned short>(u >> 16);
}
template <typename T> __device__ __forceinline__ void from_acc(T v, T* out) { *out = v; }

template <typename A, int OP> __device__ __forceinline__ A combine(A a, A b) {
    if (OP == 2) return a > b ? a : b;
    if (OP == 3) return a < b ? a : b;
    return a + b;
}

template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Pack { T v[VEC]; };

template <typename T, typename A, int OP, int VEC>
__global__ void rr_add(T* __restrict__ own, const T* __restrict__ rows, long long k,
                       int nrows, A world) {
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x * VEC;
    for (long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
         i < k; i += step) {
        if (i + VEC > k) {  // only when VEC > 1 and k is not a multiple of VEC
            for (long long j = i; j < k; ++j) {
                A acc = to_acc(own[j]);
                for (int r = 0; r < nrows; ++r) acc = combine<A, OP>(acc, to_acc(rows[r * k + j]));
                if (OP == 1) acc = acc / world;
                from_acc(acc, &own[j]);
            }
            return;
        }
        Pack<T, VEC> mine = *reinterpret_cast<const Pack<T, VEC>*>(own + i);
        A acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = to_acc(mine.v[e]);
        for (int r = 0; r < nrows; ++r) {
            Pack<T, VEC> row = *reinterpret_cast<const Pack<T, VEC>*>(rows + r * k + i);
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] = combine<A, OP>(acc[e], to_acc(row.v[e]));
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            if (OP == 1) acc[e] = acc[e] / world;
            from_acc(acc[e], &mine.v[e]);
        }
        *reinterpret_cast<Pack<T, VEC>*>(own + i) = mine;
    }
}
