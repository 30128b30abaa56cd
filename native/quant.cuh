// The formats and the arithmetic of the block-quantized wires (native/quant.cu's
// kernels, compiled after numeric.cuh and this file by ringreduce/execution/kernels.py):
// encoding, decoding, the scale, and the loads and stores of values, codes and scales.
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
// in scalar accesses.
// FMT: 0 int8, 1 fp8 (e4m3), 3 gauss4 (4-bit codes at Gaussian levels; 2 was the uniform
// int4 steps, which the wire study did not keep).

template <int FMT> struct QuantWire;
template <> struct QuantWire<0> { static constexpr float qmax = 127.0f; static constexpr int bits = 8; };
template <> struct QuantWire<1> { static constexpr float qmax = 448.0f; static constexpr int bits = 8; };
template <> struct QuantWire<3> { static constexpr float qmax = 1.0f; static constexpr int bits = 4; };


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

// gauss4 (FMT 3, quant.py GAUSS4_LEVELS / GAUSS4_THRESHOLDS): a code -7..7 stands for
// +-L[|code|] of the block's max-abs, L[j] = n_j / 1024; |y| above threshold j
// (t_j / 2048) takes a level above j. Every constant is exact in fp32, and the compares
// are exact: the torch ops' bucketize, bit for bit.
__device__ __forceinline__ float gauss4_level(int q) {
    const int m = q < 0 ? -q : q;
    float l = 0.0f;
    l = m == 1 ? 98.0f / 1024.0f : l;
    l = m == 2 ? 198.0f / 1024.0f : l;
    l = m == 3 ? 305.0f / 1024.0f : l;
    l = m == 4 ? 420.0f / 1024.0f : l;
    l = m == 5 ? 553.0f / 1024.0f : l;
    l = m == 6 ? 715.0f / 1024.0f : l;
    l = m == 7 ? 938.0f / 1024.0f : l;
    return q < 0 ? -l : l;
}

// The levels by 4-bit code (two's complement nibble, 8: gauss4_level(-8) = -0, never
// written), in shared memory: one load a value instead of gauss4_level's 7 selects; the
// 16 entries sit in 16 banks, so a warp's lanes read any mix of them in one pass.
// Filled by gauss4_table_init at the start of every kernel that decodes gauss4.
__shared__ float rr_gauss4_levels[16];

__device__ __forceinline__ void gauss4_table_init() {
    if (threadIdx.x < 16)
        rr_gauss4_levels[threadIdx.x] = gauss4_level(static_cast<int>(threadIdx.x << 28) >> 28);
    __syncthreads();
}

// The code of y (|y| <= 1, not nan): sign(y) * (thresholds below |y|), the count found
// by a binary search over the 7 sorted thresholds (the same compares, 3 instead of 7).
__device__ __forceinline__ int gauss4_code(float y) {
    const float a = f_abs(y);
    const bool p4 = a > 725.0f / 2048.0f;
    const bool p2 = a > (p4 ? 1268.0f / 2048.0f : 296.0f / 2048.0f);
    const float t = p4 ? (p2 ? 1653.0f / 2048.0f : 973.0f / 2048.0f)
                       : (p2 ? 503.0f / 2048.0f : 98.0f / 2048.0f);
    const int m = (p4 ? 4 : 0) + (p2 ? 2 : 0) + (a > t ? 1 : 0);
    return (__float_as_uint(y) >> 31) ? -m : m;
}

// gauss4_code(v / scale) for a block's finite values (|v| <= scale, scale usable) without
// a division a value: RN(v / scale) > t exactly when |v| / scale > m, m the midpoint between
// the threshold t and the next float (t = T / 2048 has a 0 last significand bit, so a tie
// rounds to t, not above it), that is when |v| > m * scale; m * scale is exact in fp64
// (25 x 24 significant bits) and a float |v| exceeds it exactly when it exceeds it rounded
// down to a float. So the block's 7 cuts RD(m_j * scale), then compares only: the same
// codes as gauss4_code(f_div(v, scale)), bit for bit, at any scale (tests/test_cpu_wire.py
// checks the arithmetic and these midpoints against quant.py's thresholds).
//
// The cuts are kept as bit patterns and compared as integers (non-negative floats order as
// their bits), so subnormal values and scales compare as they are whatever the module's
// -ftz; the conversions are PTX's without .ftz for the same reason.
struct Gauss4Cuts {
    unsigned c[7];
};

// T_j / 2048 + half its ulp (2^(e - 24) for T_j / 2048 in [2^e, 2^(e + 1))).
__device__ __forceinline__ double gauss4_mid(int j) {
    return j == 0 ? 98.0 / 2048 + 0x1p-29 : j == 1 ? 296.0 / 2048 + 0x1p-27
         : j == 2 ? 503.0 / 2048 + 0x1p-27 : j == 3 ? 725.0 / 2048 + 0x1p-26
         : j == 4 ? 973.0 / 2048 + 0x1p-26 : j == 5 ? 1268.0 / 2048 + 0x1p-25
         : 1653.0 / 2048 + 0x1p-25;
}

// RD(mid * scale) as bits: the cut of the threshold whose midpoint is mid.
__device__ __forceinline__ unsigned gauss4_cut(double mid, float scale) {
    double s;
    asm("cvt.f64.f32 %0, %1;" : "=d"(s) : "f"(scale));
    float c;
    asm("cvt.rm.f32.f64 %0, %1;" : "=f"(c) : "d"(mid * s));
    return __float_as_uint(c);
}

__device__ __forceinline__ Gauss4Cuts gauss4_cuts(float scale) {
    Gauss4Cuts k;
#pragma unroll
    for (int j = 0; j < 7; ++j) k.c[j] = gauss4_cut(gauss4_mid(j), scale);
    return k;
}

// gauss4_code's binary search on |v| against the block's cuts.
__device__ __forceinline__ int gauss4_code_cut(float v, const Gauss4Cuts& k) {
    const unsigned a = __float_as_uint(v) & 0x7fffffffu;
    const bool p4 = a > k.c[3];
    const bool p2 = a > (p4 ? k.c[5] : k.c[1]);
    const unsigned t = p4 ? (p2 ? k.c[6] : k.c[4]) : (p2 ? k.c[2] : k.c[0]);
    const int m = (p4 ? 4 : 0) + (p2 ? 2 : 0) + (a > t ? 1 : 0);
    return (__float_as_uint(v) >> 31) ? -m : m;
}

// gauss4's codes by a table of buckets (rr_quantize_rot256's common block): entry n of a
// block's table serves the values v whose v * 16 / scale rounds to n - 16. Every threshold
// lies inside one bucket, at least 13/2048 of the scale from its edges (973 against 960), so
// a bucket holds one at most, and a value's code is the entry's code0, or its code1 when v
// is above that threshold's cut: one lookup and one compare a value instead of
// gauss4_code_cut's three compares and six selects, the same codes. The bucket comes from an
// approximate reciprocal and an fma, within 8/2048 of the scale (gauss4_bucket; each entry's
// range is widened by that much); the decision stays the cut's exact integer compare, on
// v's own bits (a negative bucket's cut carries the sign bit, since every v there is
// negative). Entries without a threshold never pass their compare (cut 0xffffffff). Kept to
// scales in [2^-100, 2^100) (gauss4_r16). tests/test_cpu_wire.py builds the same table
// against quant.py's division.
struct Gauss4Bucket {
    unsigned cut, codes;  // codes: code0 in byte 0, code1 in byte 1
};
constexpr int GAUSS4_BUCKETS = 33;
constexpr int GAUSS4_TABLE = 64;  // entries a table takes: 512 bytes
constexpr unsigned GAUSS4_BUCKET_MIN_SCALE = 27u << 23;   // bits of 2^-100
constexpr unsigned GAUSS4_BUCKET_MAX_SCALE = 227u << 23;  // of 2^100 (scales below it)

// 16 / scale for gauss4_bucket, scale in [2^-100, 2^100): an approximate reciprocal (at
// most 2 ulp off, and a normal float in that range) times 16 moves v * r16 by under
// 2^-18 of a bucket, where the entries' widening leaves 5/2048 of the scale (1/25 of a
// bucket) to spare; no division's correction steps.
__device__ __forceinline__ float gauss4_r16(float scale) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(scale));
    return f_mul(r, 16.0f);
}

// v's entry of the table at shared-memory address `table` (a multiple of 512): fma's sum
// 1.5 * 2^20 + 16.5 + v * 16 / scale, rounded to 1/8 (its ulp), has 8 * floor(16 y +
// 16.5) = 8 * n in bits 3-8 of its significand, y = v / scale in [-1, 1]: n's bucket
// within 1/16 of its edges (an -ftz flush of a subnormal v, to bucket 16, is as close).
// The address is one or; volatile: the load stays after the __syncwarp that publishes
// the block's cuts.
__device__ __forceinline__ Gauss4Bucket gauss4_bucket(float v, float r16, unsigned table) {
    const float f = fmaf(v, r16, 1572880.5f);  // 1.5 * 2^20 + 16.5
    Gauss4Bucket e;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
                 : "=r"(e.cut), "=r"(e.codes)
                 : "r"((__float_as_uint(f) & 0x1f8u) | table));
    return e;
}

// quant.py's GAUSS4_THRESHOLDS: threshold j is T_j / 2048.
__host__ __device__ constexpr int gauss4_threshold(int j) {
    return j == 0 ? 98 : j == 1 ? 296 : j == 2 ? 503 : j == 3 ? 725 : j == 4 ? 973
         : j == 5 ? 1268 : 1653;
}

// Entry n's codes: code0 in byte 0, code1 in byte 1 (at compile time, for
// rr_gauss4_bucket_codes).
__host__ __device__ constexpr unsigned gauss4_bucket_codes(int n) {
    const int b = n < 16 ? 16 - n : n - 16;  // |bucket|
    // its edges in 1/2048 of the scale, widened by gauss4_bucket's 1/16 of a bucket
    const int lo = 128 * b - 64 - 8, hi = 128 * b + 64 + 8;
    int below = 0, inside = 0;
    for (int j = 0; j < 7; ++j) {
        below += gauss4_threshold(j) < lo ? 1 : 0;
        inside += lo <= gauss4_threshold(j) && gauss4_threshold(j) <= hi ? 1 : 0;
    }
    const int sign = n < 16 ? -1 : 1;
    return (static_cast<unsigned>(sign * below) & 0xfu) |
           (static_cast<unsigned>(sign * (below + inside)) & 0xfu) << 8;
}

struct Gauss4BucketCodes {
    unsigned codes[GAUSS4_BUCKETS];
};

__host__ __device__ constexpr Gauss4BucketCodes gauss4_bucket_code_table() {
    Gauss4BucketCodes t{};
    for (int n = 0; n < GAUSS4_BUCKETS; ++n) t.codes[n] = gauss4_bucket_codes(n);
    return t;
}

// Every entry's codes, computed by the compiler: a kernel's start copies them instead of
// working them out in every warp (a warp of a small call quantizes one or two blocks).
__constant__ Gauss4BucketCodes rr_gauss4_bucket_codes = gauss4_bucket_code_table();

// Entry n's codes (its cut: 0xffffffff, or, each block, the cut of the threshold inside).
__device__ __forceinline__ void gauss4_bucket_init(int n, Gauss4Bucket* table) {
    table[n] = Gauss4Bucket{0xffffffffu, rr_gauss4_bucket_codes.codes[n]};
}

// The bucket |n - 16| holding threshold j: lane j < 7 writes cut j into entries 16 +- it.
__device__ __forceinline__ int gauss4_bucket_of(int j) {
    return (gauss4_threshold(j) + 64) / 128;
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

// One element's code (a byte; int4 its low nibble); decode(code) is the value it stands
// for (only error feedback needs it, so it is computed apart).
template <int FMT>
__device__ __forceinline__ unsigned encode(float v, float scale, bool usable) {
    constexpr float Q = QuantWire<FMT>::qmax;
    float y = usable ? f_div(v, scale) : v;
    y = (y != y) ? 0.0f : f_min(f_max(y, -Q), Q);
    if constexpr (FMT == 1) {
        return e4m3_bits(y);
    } else if constexpr (FMT == 3) {
        return static_cast<unsigned>(gauss4_code(y)) & 0xfu;
    } else {
        const int q = __float2int_rn(y);  // rint: ties to even, as torch.round
        return static_cast<unsigned>(q) & 0xffu;
    }
}

// The value of a code (its low byte; 4-bit formats their low nibble, the rest 0).
template <int FMT>
__device__ __forceinline__ float decode(unsigned code) {
    if constexpr (FMT == 1) return e4m3_value(code);
    else if constexpr (FMT == 3) return rr_gauss4_levels[code];
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
    if constexpr (VEC && QuantWire<FMT>::bits == 4) {
        return *reinterpret_cast<const unsigned short*>(p);
    } else if constexpr (VEC) {
        return *reinterpret_cast<const unsigned*>(p);
    } else {
        unsigned u = 0;
        for (int j = 0; j < (QuantWire<FMT>::bits == 4 ? 2 : 4); ++j) u |= static_cast<unsigned>(p[j]) << (8 * j);
        return u;
    }
}

template <int FMT, bool VEC>
__device__ __forceinline__ void store_codes(unsigned char* p, unsigned u) {
    if constexpr (VEC && QuantWire<FMT>::bits == 4) {
        *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(u);
    } else if constexpr (VEC) {
        *reinterpret_cast<unsigned*>(p) = u;
    } else {
        for (int j = 0; j < (QuantWire<FMT>::bits == 4 ? 2 : 4); ++j) p[j] = static_cast<unsigned char>(u >> (8 * j));
    }
}

template <int FMT>
__device__ __forceinline__ float code_at(unsigned codes, int e) {
    return QuantWire<FMT>::bits == 4 ? decode<FMT>((codes >> (4 * e)) & 0xfu)
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

// The rotated formats' randomized Hadamard transform of one block (quant.py's rotate and
// rotate_back, bit for bit). A group of L lanes holds the block in the layout of every
// load and store here ("C"): v[c * 4 + e] of lane `lane` is element i = (c * L + lane) *
// 4 + e, so i's bits 0-1 are e, the next log2(L) the lane, the rest c. The butterfly
// passes run in quant.py's order, h = 1, 2, 4, .., B/2, each pass one f_add or f_sub per
// element, rounded alone as torch's ops do: the same sums, the same order, the same bits.
// A pass needs both elements of each pair in one lane's registers: the passes over i's
// bits 0-1 run in C; then the group moves its block through shared memory into layouts
// "P(w)" where a lane's E registers run over bits w .. w + log2(E) - 1 of i (the other
// bits from the lane number, in order) and runs those passes there, until no pass is
// left over a bit that C keeps in the lane number; back in C, the passes over c's bits.
// B = 256 over 32 lanes: C (h = 1, 2), P(2) (h = 4, 8, 16), P(5) (h = 32, 64, 128), C.
// A move is one store and one load a value (16-byte ones in C), no arithmetic, where
// exchanging through shuffles cost a shuffle, both sums and a select a value a pass.

// quant.py's sign_hash: lowbias32 of lowbias32(SIGN_SEED ^ B) + i.
__host__ __device__ constexpr unsigned lowbias32(unsigned x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}
#define RR_SIGN_SEED 0x52494E47u

// A block of 256's signs as bits (bit i of word i / 32 set: s_i = -1), computed by the
// compiler: the rot256 kernels read their lanes' 16 instead of hashing them in every warp.
struct Signs256 {
    unsigned words[8];
};

__host__ __device__ constexpr Signs256 signs256() {
    Signs256 s{};
    const unsigned base = lowbias32(RR_SIGN_SEED ^ 256u);
    for (unsigned i = 0; i < 256; ++i) s.words[i / 32] |= (lowbias32(base + i) >> 31) << (i % 32);
    return s;
}

__constant__ Signs256 rr_signs256 = signs256();

// log2 of a power of two, at compile time.
__host__ __device__ constexpr int rr_log2(int n) { return n <= 1 ? 0 : 1 + rr_log2(n / 2); }

// This lane's E multipliers in C (loop-invariant: every block's positions are the same):
// s_i 2^-shift, s_i = -1 where the top bit of the hash of i is set (quant.py's signs:
// shift = log2(B) / 2 forward, log2(B) - that back).
template <int E, int L>
__device__ __forceinline__ void rotation_signs(int lane, bool back, float (&d)[E]) {
    constexpr int block = E * L, log = rr_log2(block);
    const int shift = back ? log - log / 2 : log / 2;
    const unsigned base = lowbias32(RR_SIGN_SEED ^ static_cast<unsigned>(block));
    const float power = __uint_as_float(static_cast<unsigned>(127 - shift) << 23);
#pragma unroll
    for (int j = 0; j < E; ++j) {
        const unsigned i = static_cast<unsigned>(((j / 4) * L + lane) * 4 + j % 4);
        d[j] = (lowbias32(base + i) >> 31) ? -power : power;
    }
}

// The butterfly passes of register strides FIRST, 2 FIRST, ... below LAST over a lane's
// own values (template bounds: every index known at compile time, so v stays in
// registers).
template <int E, int FIRST, int LAST>
__device__ __forceinline__ void butterflies_in_lane(float (&v)[E]) {
#pragma unroll
    for (int h = FIRST; h < LAST; h <<= 1) {
#pragma unroll
        for (int j = 0; j < E; ++j) {
            if (j & h) continue;
            const float a = v[j], b = v[j + h];
            v[j] = f_add(a, b);
            v[j + h] = f_sub(a, b);
        }
    }
}

// Shared-memory word of element i of a group's block: 4 words of padding after every
// 32, so that a warp's 32 lanes reading one register of a P layout hit 32 banks (B =
// 256: the lane bits of P(2) are i's bits 0-1 and 5-7, of P(5) bits 0-4), while C's
// 16-byte chunks stay 16-byte aligned. Additive over disjoint bits (pad(a | b) =
// pad(a) + pad(b)), so a lane's addresses are a base plus compile-time offsets.
__host__ __device__ constexpr int rr_pad(int i) { return i + 4 * (i >> 5); }

// Floats of shared memory a warp's groups use (32 / L blocks of E * L values each).
template <int E, int L>
__host__ __device__ constexpr int rot_tile_floats() { return (32 / L) * rr_pad(E * L); }

// C <-> shared memory: chunk c at word pad((c * L + lane) * 4), 16 bytes.
template <int E, int L>
__device__ __forceinline__ void tile_store_c(float* tile, int lane, const float (&v)[E]) {
#pragma unroll
    for (int c = 0; c < E / 4; ++c)
    {
        Pack<float, 4> f;
#pragma unroll
        for (int e = 0; e < 4; ++e) f.v[e] = v[c * 4 + e];
        *reinterpret_cast<Pack<float, 4>*>(tile + rr_pad((c * L + lane) * 4)) = f;
    }
}

template <int E, int L>
__device__ __forceinline__ void tile_load_c(const float* tile, int lane, float (&v)[E]) {
#pragma unroll
    for (int c = 0; c < E / 4; ++c) {
        const Pack<float, 4> f =
            *reinterpret_cast<const Pack<float, 4>*>(tile + rr_pad((c * L + lane) * 4));
#pragma unroll
        for (int e = 0; e < 4; ++e) v[c * 4 + e] = f.v[e];
    }
}

// P(W): register t is element (lane's low W bits) | t << W | (lane's other bits) above.
template <int E, int W>
__device__ __forceinline__ int p_base(int lane) {
    constexpr int lE = rr_log2(E);
    return rr_pad((lane & ((1 << W) - 1)) | ((lane >> W) << (W + lE)));
}

// The passes over i's bits LO .. until none is left among C's lane bits (2 .. 2 +
// log2(L) - 1), each window of log2(E) bits in its P layout; returns through NEXT the
// first bit left for C (template recursion: every window known at compile time).
template <int E, int L, int LO>
__device__ __forceinline__ void passes_across_lanes(float (&v)[E], float* tile, int lane) {
    constexpr int lE = rr_log2(E), lL = rr_log2(L), nb = lE + lL;
    if constexpr (LO < 2 + lL) {
        constexpr int W = LO < nb - lE ? LO : nb - lE;  // the window holds bit LO
        const int base = p_base<E, W>(lane);
#pragma unroll
        for (int t = 0; t < E; ++t) v[t] = tile[base + rr_pad(t << W)];
        butterflies_in_lane<E, 1 << (LO - W), E>(v);  // bits LO .. W + lE - 1
#pragma unroll
        for (int t = 0; t < E; ++t) tile[base + rr_pad(t << W)] = v[t];
        __syncwarp();
        passes_across_lanes<E, L, W + lE>(v, tile, lane);
    }
}

// The first bit C still has to pass after passes_across_lanes<E, L, 2>.
template <int E, int L, int LO = 2>
__host__ __device__ constexpr int first_c_bit() {
    constexpr int lE = rr_log2(E), lL = rr_log2(L), nb = lE + lL;
    if constexpr (LO < 2 + lL) {
        constexpr int W = LO < nb - lE ? LO : nb - lE;
        return first_c_bit<E, L, W + lE>();
    } else {
        return LO;
    }
}

// v = H v over the group's block (unnormalized, quant.py's _walsh_hadamard). `tile`: the
// group's rr_pad(E * L) floats of shared memory; every lane of the warp calls this
// (__syncwarp).
template <int E, int L>
__device__ __forceinline__ void walsh_hadamard(float (&v)[E], int lane, float* tile) {
    constexpr int lL = rr_log2(L);
    butterflies_in_lane<E, 1, 4>(v);
    if constexpr (L > 1) {
        __syncwarp();  // the previous block's loads from the tile are done
        tile_store_c<E, L>(tile, lane, v);
        __syncwarp();
        passes_across_lanes<E, L, 2>(v, tile, lane);
        tile_load_c<E, L>(tile, lane, v);
    }
    // C's register j holds bit b >= 2 + log2(L) of i at bit b - log2(L) of j.
    constexpr int first = first_c_bit<E, L>();
    butterflies_in_lane<E, (1 << (first - lL)), E>(v);
}

// The passes over bits W .. W + log2(LAST) - 1 in P(W), from and back to the tile (every
// lane's stores are done when it returns).
template <int E, int W, int LAST>
__device__ __forceinline__ void window_passes(float (&v)[E], float* tile, int lane) {
    const int base = p_base<E, W>(lane);
#pragma unroll
    for (int t = 0; t < E; ++t) v[t] = tile[base + rr_pad(t << W)];
    butterflies_in_lane<E, 1, LAST>(v);
#pragma unroll
    for (int t = 0; t < E; ++t) tile[base + rr_pad(t << W)] = v[t];
    __syncwarp();
}

// H v in quant.py's forward_passes order: as walsh_hadamard, except for blocks of 256
// (bits 4-7 first, then 0-3; over 32 lanes of 8, C holding bits 0-1 and 7): P(4) (h =
// 16, 32, 64), C (h = 128, 1, 2), P(2) (h = 4, 8), C.
template <int E, int L>
__device__ __forceinline__ void walsh_hadamard_forward(float (&v)[E], int lane, float* tile) {
    if constexpr (E * L == 256) {
        static_assert(E == 8 && L == 32, "a rotated 256-value block is 32 lanes of 8 here");
        __syncwarp();  // the previous block's loads from the tile are done
        tile_store_c<E, L>(tile, lane, v);
        __syncwarp();
        window_passes<E, 4, E>(v, tile, lane);  // bits 4, 5, 6
        tile_load_c<E, L>(tile, lane, v);
        butterflies_in_lane<E, 4, E>(v);  // bit 7 (C's register bit 2)
        butterflies_in_lane<E, 1, 4>(v);  // bits 0, 1
        __syncwarp();  // every lane's C loads are done
        tile_store_c<E, L>(tile, lane, v);
        __syncwarp();
        window_passes<E, 2, 4>(v, tile, lane);  // bits 2, 3 (bit 4 is done)
        tile_load_c<E, L>(tile, lane, v);
    } else {
        walsh_hadamard<E, L>(v, lane, tile);
    }
}

// quant.py's rotate: v = H (d * v), in forward_passes' order.
template <int E, int L>
__device__ __forceinline__ void rotate_block(float (&v)[E], const float (&d)[E], int lane,
                                             float* tile) {
#pragma unroll
    for (int j = 0; j < E; ++j) v[j] = f_mul(v[j], d[j]);
    walsh_hadamard_forward<E, L>(v, lane, tile);
}

// quant.py's rotate_back: v = d * (H v) + 0 (the add turns -0 into +0 and nothing else).
template <int E, int L>
__device__ __forceinline__ void rotate_block_back(float (&v)[E], const float (&d)[E], int lane,
                                                  float* tile) {
    walsh_hadamard<E, L>(v, lane, tile);
#pragma unroll
    for (int j = 0; j < E; ++j) v[j] = f_add(f_mul(v[j], d[j]), 0.0f);
}
