// The block-quantized wires of the network hop (int8, fp8 e4m3, int4), fused: one pass
// over memory per stage of ringreduce/execution/compressed.py instead of quant.py's
// several torch ops, bit for bit the same bytes and values as those torch ops on CUDA.
//
//   rr_quantize           x (+ residual) -> packed rows; residual = (x + residual) - x'
//   rr_reduce_requantize  M packed rows -> fp32 sum in order 0..M-1 (+ residual)
//                         -> one packed row; residual = sum - its x'
//   rr_dequantize         packed rows -> values (/ N for AVG), in the tensor's dtype
//
// Layout (quant.py): a packed row of k values is k/B fp32 scales, then the payload (one
// byte a value; int4 two, the even element in the low nibble). Rows are contiguous.
//
// Threads: a quantization block of B elements belongs to a group of L lanes of one warp
// (L a power of two, 32 for B = 256), E = B / L elements a lane, kept in registers from
// the load to the store, so the block is read once. A lane holds E/4 chunks of 4
// consecutive elements, chunk c at block offset (c*L + lane)*4: each load instruction of
// a warp covers 32 consecutive chunks (512 contiguous bytes of fp32), and each payload
// store 128 contiguous bytes (int8, fp8) or 64 (int4). The block's max-abs is a
// register max over the lane's E values, then log2(L) xor-shuffles inside the group.
// A warp handles 32/L blocks per step of a grid-stride loop whose bound is uniform over
// the warp, so every lane reaches every shuffle (a lane past the end computes on zeros
// and stores nothing).
//
// Arithmetic, mirrored from quant.py's torch ops on CUDA (every product, sum and
// quotient rounded on its own, never contracted into an fma: torch's separate kernels
// round each of them). Subnormals are kept, as torch's kernels keep them: cupy compiles
// every NVRTC module with -ftz=true (appended after our options, so it cannot be
// overridden), which would flush them in abs, compares, min/max, mul, add and div. So
// every float operation here that can meet a subnormal is written without .ftz: the
// PTX of f_add .. f_max below, bit tests for abs, max-abs and scale > 0. (It showed as
// int4 differing on a block of 1e-44: max-abs/7 is the subnormal 2^-149, a usable
// scale for torch, 0 when flushed; int8's and fp8's underflow to 0 either way.)
//   scale = maxabs * rn(1/QMAX)        torch.div by a Python number multiplies by the
//                                      reciprocal on CUDA (inv_qmax, rounded on the host)
//   y     = usable ? x / scale : x     usable: scale finite and > 0; true division
//   y     = clamp(y, -QMAX, QMAX), nan -> 0
//   q     = rint(y) (int8, int4: ties to even) | e4m3 of y (c10's rounding, ties to even)
//   x'    = value(q) * scale
// max-abs propagates nan as torch.amax does; a residual that is not finite is kept as 0.
//
// VEC: vector loads and stores (16-byte fp32 chunks, 4-byte int8/fp8 and 2-byte int4
// payload chunks), when every pointer is aligned for them; else the same element order
// in scalar accesses. Compiled after numeric.cuh by ringreduce/execution/kernels.py.
// FMT: 0 int8, 1 fp8 (e4m3), 2 int4.

template <int FMT> struct QuantWire;
template <> struct QuantWire<0> { static constexpr float qmax = 127.0f; static constexpr int bits = 8; };
template <> struct QuantWire<1> { static constexpr float qmax = 448.0f; static constexpr int bits = 8; };
template <> struct QuantWire<2> { static constexpr float qmax = 7.0f; static constexpr int bits = 4; };

__device__ __forceinline__ bool finite(float f) {
    return (__float_as_uint(f) & 0x7f800000u) != 0x7f800000u;
}

// IEEE fp32 operations, round to nearest even, subnormals kept (no .ftz, whatever the
// module's -ftz), never contracted: torch's CUDA kernels' arithmetic.
#define RR_F32_OP(name, ptx)                                                     \
    __device__ __forceinline__ float name(float a, float b) {                      \
        float r;                                                                     \
        asm(ptx " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));                          \
        return r;                                                                    \
    }
RR_F32_OP(f_add, "add.rn.f32")
RR_F32_OP(f_sub, "sub.rn.f32")
RR_F32_OP(f_mul, "mul.rn.f32")
RR_F32_OP(f_div, "div.rn.f32")
RR_F32_OP(f_min, "min.f32")
RR_F32_OP(f_max, "max.f32")
#undef RR_F32_OP

// |f| as bits (fabsf would be abs.ftz under -ftz=true).
__device__ __forceinline__ float f_abs(float f) {
    return __uint_as_float(__float_as_uint(f) & 0x7fffffffu);
}

// Max of two magnitudes (sign bit clear), nan winning (torch.amax propagates nan): for
// non-negative floats the bit patterns order as the values, nan above inf; an integer
// compare, so a subnormal is not taken for 0.
__device__ __forceinline__ float nan_max(float a, float b) {
    return __float_as_uint(a) > __float_as_uint(b) ? a : b;
}

// scale finite and > 0 (subnormals included), as torch.isfinite(s) & (s > 0).
__device__ __forceinline__ bool usable_scale(float s) {
    return __float_as_uint(s) - 1u < 0x7f800000u - 1u;
}

// float -> e4m3fn bits: c10::detail::fp8e4m3fn_from_fp32_value, step for step (what
// torch's .to(torch.float8_e4m3fn) runs); |f| <= 448 here, so its nan branch is moot.
__device__ __forceinline__ unsigned e4m3_bits(float f) {
    unsigned bits = __float_as_uint(f);
    const unsigned sign = bits & 0x80000000u;
    bits ^= sign;
    unsigned result;
    if (bits >= (1087u << 20)) {
        result = 0x7fu;
    } else if (bits < (121u << 23)) {  // below 2^-6: an e4m3 subnormal, rounded by an add
        const float denorm = __uint_as_float(141u << 23);
        bits = __float_as_uint(f_add(__uint_as_float(bits), denorm));
        result = (bits - (141u << 23)) & 0xffu;
    } else {
        const unsigned mant_odd = (bits >> 20) & 1u;
        bits += (static_cast<unsigned>(7 - 127) << 23) + 0x7ffffu;
        bits += mant_odd;
        result = (bits >> 20) & 0xffu;
    }
    return result | (sign >> 24);
}

// e4m3fn bits -> float, exact (nan for 0x7f/0xff, which quantize never writes).
__device__ __forceinline__ float e4m3_value(unsigned b) {
    const unsigned e = (b >> 3) & 0xfu, m = b & 7u;
    float v;
    if (e == 15u && m == 7u) v = __uint_as_float(0x7fc00000u);
    else if (e == 0u) v = f_mul(static_cast<float>(m), 0.001953125f);  // m * 2^-9
    else v = __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -v : v;
}

// One element's code (a byte; int4 its low nibble) and the value it stands for.
template <int FMT>
__device__ __forceinline__ unsigned encode(float v, float scale, bool usable, float* value) {
    constexpr float Q = QuantWire<FMT>::qmax;
    float y = usable ? f_div(v, scale) : v;
    y = (y != y) ? 0.0f : f_min(f_max(y, -Q), Q);
    if constexpr (FMT == 1) {
        const unsigned b = e4m3_bits(y);
        *value = e4m3_value(b);
        return b;
    } else {
        const int q = __float2int_rn(y);  // rint: ties to even, as torch.round
        *value = static_cast<float>(q);
        return static_cast<unsigned>(q) & (FMT == 2 ? 0xfu : 0xffu);
    }
}

template <int FMT>
__device__ __forceinline__ float decode(unsigned code) {
    if constexpr (FMT == 1) return e4m3_value(code);
    else if constexpr (FMT == 2) return static_cast<float>(static_cast<int>(code << 28) >> 28);
    else return static_cast<float>(static_cast<signed char>(code));
}

// A packed row's pieces: where block b's scale and its chunk at element offset i start.
struct PackedRow {
    unsigned char* base;
    long long blocks;  // k / B
    __device__ __forceinline__ unsigned char* scale(long long b) const { return base + 4 * b; }
    __device__ __forceinline__ unsigned char* payload(long long b, int block, int i, int bits) const {
        return base + 4 * blocks + (b * block + i) * bits / 8;
    }
};

__device__ __forceinline__ long long row_bytes(long long blocks, int block, int bits) {
    return 4 * blocks + blocks * block * bits / 8;
}

template <bool VEC>
__device__ __forceinline__ float load_scale(const unsigned char* p) {
    if constexpr (VEC) {
        return *reinterpret_cast<const float*>(p);
    } else {
        unsigned u = 0;
        for (int j = 0; j < 4; ++j) u |= static_cast<unsigned>(p[j]) << (8 * j);
        return __uint_as_float(u);
    }
}

template <bool VEC>
__device__ __forceinline__ void store_scale(unsigned char* p, float s) {
    if constexpr (VEC) {
        *reinterpret_cast<float*>(p) = s;
    } else {
        const unsigned u = __float_as_uint(s);
        for (int j = 0; j < 4; ++j) p[j] = static_cast<unsigned char>(u >> (8 * j));
    }
}

// A chunk's 4 codes as one word: int8/fp8 4 bytes, int4 2 bytes (low nibble first).
template <int FMT, bool VEC>
__device__ __forceinline__ unsigned load_codes(const unsigned char* p) {
    if constexpr (VEC && FMT == 2) {
        return *reinterpret_cast<const unsigned short*>(p);
    } else if constexpr (VEC) {
        return *reinterpret_cast<const unsigned*>(p);
    } else {
        unsigned u = 0;
        for (int j = 0; j < (FMT == 2 ? 2 : 4); ++j) u |= static_cast<unsigned>(p[j]) << (8 * j);
        return u;
    }
}

template <int FMT, bool VEC>
__device__ __forceinline__ void store_codes(unsigned char* p, unsigned u) {
    if constexpr (VEC && FMT == 2) {
        *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(u);
    } else if constexpr (VEC) {
        *reinterpret_cast<unsigned*>(p) = u;
    } else {
        for (int j = 0; j < (FMT == 2 ? 2 : 4); ++j) p[j] = static_cast<unsigned char>(u >> (8 * j));
    }
}

template <int FMT>
__device__ __forceinline__ float code_at(unsigned codes, int e) {
    return FMT == 2 ? decode<FMT>((codes >> (4 * e)) & 0xfu)
                    : decode<FMT>((codes >> (8 * e)) & 0xffu);
}

template <typename T, bool VEC>
__device__ __forceinline__ void load4(const T* p, float* out) {
    if constexpr (VEC) {
        const Pack<T, 4> v = *reinterpret_cast<const Pack<T, 4>*>(p);
#pragma unroll
        for (int e = 0; e < 4; ++e) out[e] = to_acc(v.v[e]);
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) out[e] = to_acc(p[e]);
    }
}

template <typename T, bool VEC>
__device__ __forceinline__ void store4(T* p, const float* in) {
    if constexpr (VEC) {
        Pack<T, 4> v;
#pragma unroll
        for (int e = 0; e < 4; ++e) from_acc(in[e], &v.v[e]);
        *reinterpret_cast<Pack<T, 4>*>(p) = v;
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) from_acc(in[e], &p[e]);
    }
}

// The group's quantization of its block: v (this lane's E values) -> codes and scale in
// `row`, and, when `residual` is set, residual[chunk] = v - x' (0 where not finite).
template <int FMT, int E, bool VEC>
__device__ __forceinline__ void quantize_block(const float (&v)[E], bool active, int lane,
                                               int lanes, PackedRow row, long long b,
                                               float inv_qmax, float* residual) {
    constexpr int bits = QuantWire<FMT>::bits;
    const int block = E * lanes;
    float maxabs = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) maxabs = nan_max(maxabs, f_abs(v[e]));
    for (int o = lanes / 2; o > 0; o >>= 1)
        maxabs = nan_max(maxabs, __shfl_xor_sync(0xffffffffu, maxabs, o));
    if (!active) return;
    const float scale = f_mul(maxabs, inv_qmax);
    const bool usable = usable_scale(scale);
    if (lane == 0) store_scale<VEC>(row.scale(b), scale);
#pragma unroll
    for (int c = 0; c < E / 4; ++c) {
        const int i = (c * lanes + lane) * 4;
        unsigned codes = 0;
        float err[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float value;
            codes |= encode<FMT>(v[c * 4 + e], scale, usable, &value) << (bits * e);
            const float r = f_sub(v[c * 4 + e], f_mul(value, scale));
            err[e] = finite(r) ? r : 0.0f;
        }
        store_codes<FMT, VEC>(row.payload(b, block, i, bits), codes);
        if (residual != nullptr) store4<float, VEC>(residual + i, err);
    }
}

// Unpipelined meaning (quant.quantize, with compressed.py's error feedback):
//   v = x (+ residual); packed = quantize(v); residual = v - dequantize(packed)
// x: nblocks * B values of T (rows of k back to back); residual: fp32 alike, or null;
// packed: the rows, per_row = k / B blocks each.
template <typename T, int FMT, int E, bool VEC>
__global__ void rr_quantize(const T* __restrict__ x, float* __restrict__ residual,
                            unsigned char* __restrict__ packed, long long nblocks,
                            long long per_row, int lanes, float inv_qmax) {
    constexpr int bits = QuantWire<FMT>::bits;
    const int block = E * lanes, lane = threadIdx.x & (lanes - 1);
    const int groups = 32 / lanes, group = (threadIdx.x & 31) / lanes;
    const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const long long step = (static_cast<long long>(gridDim.x) * blockDim.x >> 5) * groups;
    for (long long first = warp * groups; first < nblocks; first += step) {
        const long long g = first + group;
        const bool active = g < nblocks;
        float v[E];
#pragma unroll
        for (int c = 0; c < E / 4; ++c) {
            const long long at = g * block + (c * lanes + lane) * 4;
            float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (active) {
                load4<T, VEC>(x + at, &v[c * 4]);
                if (residual != nullptr) load4<float, VEC>(residual + at, r);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) v[c * 4 + e] = 0.0f;
            }
            if (residual != nullptr) {
#pragma unroll
                for (int e = 0; e < 4; ++e) v[c * 4 + e] = f_add(v[c * 4 + e], r[e]);
            }
        }
        const long long r = active ? g / per_row : 0;
        const PackedRow row{packed + r * row_bytes(per_row, block, bits), per_row};
        quantize_block<FMT, E, VEC>(v, active, lane, lanes, row, g - r * per_row, inv_qmax,
                                    residual == nullptr ? nullptr : residual + g * block);
    }
}

// Unpipelined meaning (compressed.py's add and diffuse quantization):
//   v = dequantize(row 0) + ... + dequantize(row M-1)   fp32, in that order
//   v += residual; sent = quantize(v); residual = v - dequantize(sent)
// got: M packed rows of k values (per_row = k / B blocks), row own_index read from
// `own` instead (this machine's own partial, never copied into got); residual: k fp32
// values or null; sent: one packed row.
template <int FMT, int E, bool VEC>
__global__ void rr_reduce_requantize(const unsigned char* __restrict__ got,
                                     const unsigned char* __restrict__ own, int own_index,
                                     int nrows, float* __restrict__ residual,
                                     unsigned char* __restrict__ sent, long long per_row,
                                     int lanes, float inv_qmax) {
    constexpr int bits = QuantWire<FMT>::bits;
    const int block = E * lanes, lane = threadIdx.x & (lanes - 1);
    const int groups = 32 / lanes, group = (threadIdx.x & 31) / lanes;
    const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const long long step = (static_cast<long long>(gridDim.x) * blockDim.x >> 5) * groups;
    const long long stride = row_bytes(per_row, block, bits);
    for (long long first = warp * groups; first < per_row; first += step) {
        const long long g = first + group;
        const bool active = g < per_row;
        float v[E];
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = 0.0f;
        if (active) {
            for (int m = 0; m < nrows; ++m) {
                const PackedRow src{const_cast<unsigned char*>(
                    m == own_index ? own : got + m * stride), per_row};
                const float scale = load_scale<VEC>(src.scale(g));
#pragma unroll
                for (int c = 0; c < E / 4; ++c) {
                    const unsigned codes = load_codes<FMT, VEC>(
                        src.payload(g, block, (c * lanes + lane) * 4, bits));
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float x = f_mul(code_at<FMT>(codes, e), scale);
                        v[c * 4 + e] = m == 0 ? x : f_add(v[c * 4 + e], x);
                    }
                }
            }
            if (residual != nullptr) {
#pragma unroll
                for (int c = 0; c < E / 4; ++c) {
                    float r[4];
                    load4<float, VEC>(residual + g * block + (c * lanes + lane) * 4, r);
#pragma unroll
                    for (int e = 0; e < 4; ++e) v[c * 4 + e] = f_add(v[c * 4 + e], r[e]);
                }
            }
        }
        quantize_block<FMT, E, VEC>(v, active, lane, lanes, PackedRow{sent, per_row}, g,
                                    inv_qmax, residual == nullptr ? nullptr : residual + g * block);
    }
}

// Unpipelined meaning (quant.dequantize, then compressed.py's AVG and cast):
//   out = dequantize(packed) (/ world when world > 0), rounded to T
// packed: rows of per_row blocks; out: nblocks * B values of T.
template <typename T, int FMT, int E, bool VEC>
__global__ void rr_dequantize(const unsigned char* __restrict__ packed, T* __restrict__ out,
                              long long nblocks, long long per_row, int lanes, float world) {
    constexpr int bits = QuantWire<FMT>::bits;
    const int block = E * lanes, lane = threadIdx.x & (lanes - 1);
    const int groups = 32 / lanes, group = (threadIdx.x & 31) / lanes;
    const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const long long step = (static_cast<long long>(gridDim.x) * blockDim.x >> 5) * groups;
    for (long long g = warp * groups + group; g < nblocks; g += step) {
        const long long r = g / per_row, b = g - r * per_row;
        const PackedRow row{const_cast<unsigned char*>(packed) + r * row_bytes(per_row, block, bits),
                            per_row};
        const float scale = load_scale<VEC>(row.scale(b));
#pragma unroll
        for (int c = 0; c < E / 4; ++c) {
            const int i = (c * lanes + lane) * 4;
            const unsigned codes = load_codes<FMT, VEC>(row.payload(b, block, i, bits));
            float x[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                x[e] = f_mul(code_at<FMT>(codes, e), scale);
                if (world > 0.0f) x[e] = f_div(x[e], world);
            }
            store4<T, VEC>(out + g * block + i, x);
        }
    }
}
