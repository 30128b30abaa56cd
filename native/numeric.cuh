// Element types and conversions shared by native/*.cu (kernels.py prepends this file).
//
// No CUDA headers: fp16 converts through PTX cvt, bf16 through bit operations, so the
// sources build under NVRTC wherever cupy does. Narrowing rounds to nearest, ties to
// even, as torch's casts do, so kernels and the torch-op fallback agree bit for bit
// (on every value but NaN payloads).

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

template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Pack { T v[VEC]; };
