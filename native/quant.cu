// The block-quantized wires of the network hop (int8, fp8 e4m3, int4), fused: one pass
// over memory per stage of ringreduce/execution/compressed.py instead of quant.py's
// several torch ops, bit for bit the same bytes and values as those torch ops on CUDA.
//
//   rr_quantize           x (+ residual) -> packed rows; residual = (x + residual) - x'
//   rr_reduce_requantize  M packed rows -> fp32 sum in order 0..M-1 (+ residual)
//                         -> one packed row; residual = sum - its x'
//   rr_dequantize         packed rows -> values (/ N for AVG), in the tensor's dtype
//   rr_quantize_rot256, rr_dequantize_rot256: the rotated 256-value blocks (int4's),
//                         16 lanes of 16 values a block, one trip through a shared tile
//
// Layout (quant.py): a packed row of k values is k/B fp32 scales, then the payload (one
// byte a value; int4 two, the even element in the low nibble). Rows are contiguous.
//
// Threads: a quantization block of B elements belongs to a group of L lanes of one warp
// (L a power of two, 32 for B = 256; a template argument, so every shuffle loop
// unrolls), E = B / L elements a lane, kept in registers from
// the load to the store, so the block is read once. A lane holds E/4 chunks of 4
// consecutive elements, chunk c at block offset (c*L + lane)*4: each load instruction of
// a warp covers 32 consecutive chunks (512 contiguous bytes of fp32), and each payload
// store 128 contiguous bytes (int8, fp8) or 64 (int4). The block's max-abs is a
// register max over the lane's E values, then log2(L) xor-shuffles inside the group.
// A warp handles 32/L blocks per step of a grid-stride loop whose bound is uniform over
// the warp, so every lane reaches every shuffle (a lane past the end computes on zeros
// and stores nothing).
//
// Rotated formats (ROT): rr_quantize rotates each block in registers before adding the
// residual, rr_dequantize rotates it back before AVG's division (quant.cuh's
// rotate_block, rotate_block_back; each warp's blocks pass through its own slice of a
// shared-memory tile, RR_QUANT_THREADS threads a thread block); rr_reduce_requantize
// works in the rotated domain and does not rotate.
//
// The formats, the arithmetic mirrored from quant.py and the memory helpers are in
// quant.cuh, compiled before this file (after numeric.cuh) by
// ringreduce/execution/kernels.py.

// residual[chunk] = v - x' (0 where not finite), x' the values the codes stand for.
template <int FMT, int E, int L, bool VEC>
__device__ __forceinline__ void store_residual(const float (&v)[E], const unsigned (&codes)[E / 4],
                                               float scale, int lane, float* residual) {
#pragma unroll
    for (int c = 0; c < E / 4; ++c) {
        float err[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float r = f_sub(v[c * 4 + e], f_mul(code_at<FMT>(codes[c], e), scale));
            err[e] = finite(r) ? r : 0.0f;
        }
        store4<float, VEC>(residual + (c * L + lane) * 4, err);
    }
}

// The group's quantization of its block: v (this lane's E values) -> codes and scale in
// `row`, and, when `residual` is set, residual[chunk] = v - x' (0 where not finite). The
// codes first, then (feedback only) the values they stand for: without feedback no
// value is decoded.
template <int FMT, int E, int L, bool VEC>
__device__ __forceinline__ void quantize_block(const float (&v)[E], bool active, int lane,
                                               PackedRow row, long long b, float inv_qmax,
                                               float* residual) {
    constexpr int bits = QuantWire<FMT>::bits, block = E * L;
    float maxabs = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) maxabs = nan_max(maxabs, f_abs(v[e]));
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
        maxabs = nan_max(maxabs, __shfl_xor_sync(0xffffffffu, maxabs, o));
    if (!active) return;
    const float scale = f_mul(maxabs, inv_qmax);
    const bool usable = usable_scale(scale);
    if (lane == 0) store_scale<VEC>(row.scale(b), scale);
    unsigned codes[E / 4];
    const auto put = [&](auto code) {
#pragma unroll
        for (int c = 0; c < E / 4; ++c) {
            codes[c] = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) codes[c] |= code(v[c * 4 + e]) << (bits * e);
            store_codes<FMT, VEC>(row.payload(b, block, (c * L + lane) * 4, bits), codes[c]);
        }
    };
    bool by_cuts = false;
    if constexpr (FMT == 3) by_cuts = usable && inv_qmax == 1.0f;
    if (by_cuts) {
        // every value finite, |v| <= max-abs = scale > 0: the codes by compares, no division
        const Gauss4Cuts cuts = gauss4_cuts(scale);
        put([&](float x) { return static_cast<unsigned>(gauss4_code_cut(x, cuts)) & 0xfu; });
    } else {
        put([&](float x) { return encode<FMT>(x, scale, usable); });
    }
    if (residual != nullptr) store_residual<FMT, E, L, VEC>(v, codes, scale, lane, residual);
}

// Threads a thread block of these kernels: kernels.py's THREADS (the rotated kernels'
// shared-memory tile holds RR_QUANT_THREADS / 32 warps' blocks).
#define RR_QUANT_THREADS 256

// This warp's group's slice of the rotation tile.
template <int E, int L>
__device__ __forceinline__ float* group_tile(Pack<float, 4>* tile) {
    return reinterpret_cast<float*>(tile) + (threadIdx.x >> 5) * rot_tile_floats<E, L>() +
           ((threadIdx.x & 31) / L) * rr_pad(E * L);
}

// Unpipelined meaning (quant.quantize, with compressed.py's error feedback):
//   v = R(x) (+ residual); packed = quantize(v); residual = v - dequantize(packed)
// R: quant.rotate when ROT (rotate_block, quant.cuh), else nothing.
// x: nblocks * B values of T (rows of k back to back); residual: fp32 alike, or null;
// packed: the rows, per_row = k / B blocks each.
template <typename T, int FMT, int E, int L, bool VEC, bool ROT>
__global__ void __launch_bounds__(RR_QUANT_THREADS)
rr_quantize(const T* __restrict__ x, float* __restrict__ residual,
                            unsigned char* __restrict__ packed, long long nblocks,
                            long long per_row, float inv_qmax) {
    constexpr int bits = QuantWire<FMT>::bits;
    constexpr int block = E * L, groups = 32 / L;
    const int lane = threadIdx.x & (L - 1), group = (threadIdx.x & 31) / L;
    const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const long long step = (static_cast<long long>(gridDim.x) * blockDim.x >> 5) * groups;
    if constexpr (FMT == 3) gauss4_table_init();
    __shared__ Pack<float, 4> tile[ROT ? RR_QUANT_THREADS / 32 * rot_tile_floats<E, L>() / 4 : 1];
    float d[E];
    if constexpr (ROT) rotation_signs<E, L>(lane, false, d);
    for (long long first = warp * groups; first < nblocks; first += step) {
        const long long g = first + group;
        const bool active = g < nblocks;
        float v[E], r[E];
#pragma unroll
        for (int c = 0; c < E / 4; ++c) {
            const long long at = g * block + (c * L + lane) * 4;
#pragma unroll
            for (int e = 0; e < 4; ++e) v[c * 4 + e] = r[c * 4 + e] = 0.0f;
            if (active) {
                load4<T, VEC>(x + at, &v[c * 4]);
                if (residual != nullptr) load4<float, VEC>(residual + at, &r[c * 4]);
            }
        }
        if constexpr (ROT) rotate_block<E, L>(v, d, lane, group_tile<E, L>(tile));  // every lane
        if (residual != nullptr) {
#pragma unroll
            for (int e = 0; e < E; ++e) v[e] = f_add(v[e], r[e]);
        }
        const long long row_index = active ? g / per_row : 0;
        const PackedRow row{packed + row_index * row_bytes(per_row, block, bits), per_row};
        quantize_block<FMT, E, L, VEC>(v, active, lane, row, g - row_index * per_row, inv_qmax,
                                       residual == nullptr ? nullptr : residual + g * block);
    }
}

// Unpipelined meaning (compressed.py's add and diffuse quantization):
//   v = dequantize(row 0) + ... + dequantize(row M-1)   fp32, in that order
//   v += residual; sent = quantize(v); residual = v - dequantize(sent)
// got: M packed rows of k values (per_row = k / B blocks), row own_index read from
// `own` instead (this machine's own partial, never copied into got); residual: k fp32
// values or null; sent: one packed row.
template <int FMT, int E, int L, bool VEC>
__global__ void __launch_bounds__(RR_QUANT_THREADS)
rr_reduce_requantize(const unsigned char* __restrict__ got,
                                     const unsigned char* __restrict__ own, int own_index,
                                     int nrows, float* __restrict__ residual,
                                     unsigned char* __restrict__ sent, long long per_row,
                                     float inv_qmax) {
    constexpr int bits = QuantWire<FMT>::bits;
    constexpr int block = E * L, groups = 32 / L;
    const int lane = threadIdx.x & (L - 1), group = (threadIdx.x & 31) / L;
    const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const long long step = (static_cast<long long>(gridDim.x) * blockDim.x >> 5) * groups;
    const long long stride = row_bytes(per_row, block, bits);
    if constexpr (FMT == 3) gauss4_table_init();
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
                        src.payload(g, block, (c * L + lane) * 4, bits));
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
                    load4<float, VEC>(residual + g * block + (c * L + lane) * 4, r);
#pragma unroll
                    for (int e = 0; e < 4; ++e) v[c * 4 + e] = f_add(v[c * 4 + e], r[e]);
                }
            }
        }
        quantize_block<FMT, E, L, VEC>(v, active, lane, PackedRow{sent, per_row}, g, inv_qmax,
                                       residual == nullptr ? nullptr : residual + g * block);
    }
}

// Unpipelined meaning (quant.dequantize, then compressed.py's rotation back, AVG and cast):
//   out = R'(dequantize(packed)) (/ world when world > 0), rounded to T
// R': quant.rotate_back when ROT (rotate_block_back, quant.cuh), else nothing.
// packed: rows of per_row blocks; out: nblocks * B values of T. The loop's bound is
// uniform over the warp (a group past the end computes on zeros and stores nothing), so
// every lane reaches the rotation's shuffles.
template <typename T, int FMT, int E, int L, bool VEC, bool ROT>
__global__ void __launch_bounds__(RR_QUANT_THREADS)
rr_dequantize(const unsigned char* __restrict__ packed, T* __restrict__ out,
                              long long nblocks, long long per_row, float world) {
    constexpr int bits = QuantWire<FMT>::bits;
    constexpr int block = E * L, groups = 32 / L;
    const int lane = threadIdx.x & (L - 1), group = (threadIdx.x & 31) / L;
    const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const long long step = (static_cast<long long>(gridDim.x) * blockDim.x >> 5) * groups;
    if constexpr (FMT == 3) gauss4_table_init();
    __shared__ Pack<float, 4> tile[ROT ? RR_QUANT_THREADS / 32 * rot_tile_floats<E, L>() / 4 : 1];
    float d[E];
    if constexpr (ROT) rotation_signs<E, L>(lane, true, d);
    for (long long first = warp * groups; first < nblocks; first += step) {
        const long long g = first + group;
        const bool active = g < nblocks;
        float v[E];
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = 0.0f;
        if (active) {
            const long long r = g / per_row, b = g - r * per_row;
            const PackedRow row{const_cast<unsigned char*>(packed) +
                                    r * row_bytes(per_row, block, bits), per_row};
            const float scale = load_scale<VEC>(row.scale(b));
#pragma unroll
            for (int c = 0; c < E / 4; ++c) {
                const unsigned codes = load_codes<FMT, VEC>(
                    row.payload(b, block, (c * L + lane) * 4, bits));
#pragma unroll
                for (int e = 0; e < 4; ++e) v[c * 4 + e] = f_mul(code_at<FMT>(codes, e), scale);
            }
        }
        if constexpr (ROT) rotate_block_back<E, L>(v, d, lane, group_tile<E, L>(tile));
        if (!active) continue;
#pragma unroll
        for (int c = 0; c < E / 4; ++c) {
            if (world > 0.0f) {
#pragma unroll
                for (int e = 0; e < 4; ++e) v[c * 4 + e] = f_div(v[c * 4 + e], world);
            }
            store4<T, VEC>(out + g * block + (c * L + lane) * 4, &v[c * 4]);
        }
    }
}

// The Walsh-Hadamard passes of a rotated 256-value block held by 16 lanes (the two
// rot256 kernels): h = 1, 2, 4, 8 in layout A (register j of lane l: element l * 16 + j),
// then through the group's tile t into layout B (register j: element l + 16 * j) and
// h = 16 .. 128 there. The first __syncwarp: the tile's previous reads are done.
__device__ __forceinline__ void rotate_a_then_b(float (&v)[16], float* t, int lane) {
    constexpr int E = 16;
    butterflies_in_lane<E, 1, E>(v);
    __syncwarp();
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
        Pack<float, 4> f;
#pragma unroll
        for (int e = 0; e < 4; ++e) f.v[e] = v[q * 4 + e];
        *reinterpret_cast<Pack<float, 4>*>(t + lane * 20 + q * 4) = f;
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < E; ++j) v[j] = t[lane + 20 * j];
    butterflies_in_lane<E, 1, E>(v);
}

// rr_dequantize for rotated 256-value blocks (kernels.py takes it for every rotated
// 256-value dequantize): the same values out, with one shared-memory move a value instead of three and no move
// back into C for the stores. 16 lanes a block (two blocks a warp), 16 values a lane,
// in two layouts: "A", register j of lane l is element l * 16 + j (i's bits 0-3 in the
// registers), where the codes are loaded (32-bit words) and the passes h = 1, 2, 4, 8
// run; then, through the group's tile, "B", register j of lane l is element l + 16 * j
// (bits 4-7 in the registers), where the passes h = 16 .. 128 run, the signs multiply
// and each value is stored on its own (a warp's store covers 2 x 16 consecutive values:
// whole 32-byte sectors). The passes, their order and every rounding are walsh_hadamard's.
// Tile word of element i: i + 4 * (i >> 4) (a row of 16 padded to 20), the warp's second
// block 336 words on (16 banks over): A's 16-byte stores and B's loads are conflict-free.
template <typename T, int FMT, bool VEC>
__global__ void __launch_bounds__(RR_QUANT_THREADS)
rr_dequantize_rot256(const unsigned char* __restrict__ packed, T* __restrict__ out,
                     long long nblocks, long long per_row, float world) {
    constexpr int bits = QuantWire<FMT>::bits, block = 256, E = 16, words = E * bits / 32;
    constexpr int stride = 336;  // tile floats a block
    const int lane = threadIdx.x & 15, group = (threadIdx.x & 31) >> 4;
    const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const long long step = (static_cast<long long>(gridDim.x) * blockDim.x >> 5) * 2;
    if constexpr (FMT == 3) gauss4_table_init();
    __shared__ Pack<float, 4> tile[RR_QUANT_THREADS / 32 * 2 * stride / 4];
    float* const t = reinterpret_cast<float*>(tile) + (threadIdx.x >> 5) * 2 * stride +
                     group * stride;
    // quant.py's signs of rotate_back for B's elements: s_i 2^-4 (log2(256) - 4), s_i of
    // element lane + 16 j in bit lane + 16 (j % 2) of word j / 2.
    float d[E];
    {
        const float power = __uint_as_float(static_cast<unsigned>(127 - 4) << 23);
#pragma unroll
        for (int j = 0; j < E; ++j)
            d[j] = (rr_signs256.words[j / 2] >> (lane + 16 * (j % 2))) & 1u ? -power : power;
    }
    for (long long first = warp * 2; first < nblocks; first += step) {
        const long long g = first + group;
        const bool active = g < nblocks;
        float v[E];
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = 0.0f;
        if (active) {
            const long long r = g / per_row, b = g - r * per_row;
            const PackedRow row{const_cast<unsigned char*>(packed) +
                                    r * row_bytes(per_row, block, bits), per_row};
            const float scale = load_scale<VEC>(row.scale(b));
            const unsigned char* p = row.payload(b, block, lane * E, bits);
            unsigned w[words];
#pragma unroll
            for (int q = 0; q < words; ++q) w[q] = __float_as_uint(load_scale<VEC>(p + 4 * q));
#pragma unroll
            for (int q = 0; q < words; ++q) {
#pragma unroll
                for (int e = 0; e < 32 / bits; ++e)
                    v[q * (32 / bits) + e] =
                        f_mul(decode<FMT>((w[q] >> (bits * e)) & ((1u << bits) - 1u)), scale);
            }
        }
        rotate_a_then_b(v, t, lane);  // the previous block's reads of the tile are done
        if (!active) continue;
        T* const o = out + g * block + lane;
#pragma unroll
        for (int j = 0; j < E; ++j) {
            float x = f_add(f_mul(v[j], d[j]), 0.0f);
            if (world > 0.0f) x = f_div(x, world);
            from_acc(x, o + 16 * j);
        }
    }
}

// A 4-byte word of codes at p (4-byte aligned when VEC, else byte by byte).
template <bool VEC>
__device__ __forceinline__ void store_word(unsigned char* p, unsigned u) {
    if constexpr (VEC) {
        *reinterpret_cast<unsigned*>(p) = u;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) p[j] = static_cast<unsigned char>(u >> (8 * j));
    }
}

// x's staging for rr_quantize_rot256: a warp's two blocks (512 values, 128 chunks of 4)
// copied into shared memory with cp.async, coalesced (lane w copies chunks w, w + 32, ..),
// while the warp works on the previous two. Why: the kernel's first layout (B: lane l
// holds elements l + 16 j) loads single values, 64 bytes a group and instruction, and
// without the copy in flight during the work too few bytes are on their way to keep HBM
// busy. Chunk c (of `chunk` bytes) sits at slot c ^ ((c / 64) * 4), the second block 4
// chunks over: a copy (32 consecutive chunks) meets every bank once a phase, and so does
// a read of B's register j by both groups (4 chunks of each block). The addresses are
// registers a lane plus compile-time offsets: copy q the lane's first slot plus 32 q
// chunks (xored by 4 for the second block), read j one of two registers plus 4 j chunks.
// Needs sm_80 (cp.async); before that, plain loads.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define RR_STAGED_LOADS 1
#else
#define RR_STAGED_LOADS 0
#endif

template <typename T>
struct Staging {
    static constexpr int chunk = 4 * sizeof(T), chunks = 128;
    __host__ __device__ static constexpr int slot(int c) { return c ^ ((c >> 6) << 2); }
    unsigned copy_at;          // shared address of the lane's copy 0 (area 128-byte aligned)
    unsigned even_at, odd_at;  // of its read 0 in B, for even and odd j

    // Lane l of group gr reads element l + 16 j of its block: chunk 64 gr + 4 j + l / 4,
    // at slot 64 gr + 4 (j ^ gr) + l / 4.
    __device__ __forceinline__ Staging(unsigned char* warp_area, int w, int l, int gr) {
        const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(warp_area));
        const unsigned read = at + (64 * gr + l / 4) * chunk + (l % 4) * sizeof(T);
        copy_at = at + slot(w) * chunk;
        even_at = read + 4 * gr * chunk;
        odd_at = read - 4 * gr * chunk;
    }

    // Chunks w, w + 32, w + 64, w + 96 of blocks first, first + 1 (block first is always
    // real; past nblocks, block first again: a group past the end stores nothing).
    __device__ __forceinline__ void fetch(const T* x, int first, int nblocks, int w) const {
#if RR_STAGED_LOADS
        const T* const src = x + static_cast<long long>(first) * 256 + w * 4;
        const T* const second = first + 1 < nblocks ? src + 256 : src;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const unsigned dst = (copy_at ^ ((q / 2) * 4 * chunk)) + 32 * q * chunk;
            const T* const from = (q < 2 ? src : second) + (q % 2) * 128;
            if constexpr (chunk == 16) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                             :: "r"(dst), "l"(from) : "memory");
            } else {
                asm volatile("cp.async.ca.shared.global [%0], [%1], %2;"
                             :: "r"(dst), "l"(from), "n"(chunk) : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
#endif
    }

    // The lane's 16 values in B, once every lane's copies have landed.
    __device__ __forceinline__ void take(float (&v)[16]) const {
#if RR_STAGED_LOADS
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const unsigned at = (j % 2 ? odd_at : even_at) + 4 * j * chunk;
            if constexpr (sizeof(T) == 4) {
                asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v[j]) : "r"(at));
            } else {
                unsigned short h;
                asm volatile("ld.shared.u16 %0, [%1];" : "=h"(h) : "r"(at));
                v[j] = to_acc(T{h});
            }
        }
        __syncwarp();  // every lane's reads are done before the next fetch overwrites them
#endif
    }
};

// Where block g's scale and codes go, followed through the grid-stride loop's steps
// without a division a block: with b = g mod per_row, g's row begins (g - b) (4 + 32 bits)
// bytes in (a block is its 4-byte scale and 32 bits bytes of codes), so its scale is at
// packed + (4 + 32 bits) g - 32 bits b and its codes at packed + (4 + 32 bits) g + 4 per_row
// - 4 b.
template <int BITS>
struct BlockCursor {
    static constexpr int bytes = 4 + 32 * BITS;  // a block's, scale and codes
    unsigned char* at;                          // packed + bytes * g
    int b, per_row, b_step;

    __device__ __forceinline__ BlockCursor(unsigned char* packed, int g, int per_row, int step)
        : at(packed + static_cast<long long>(bytes) * g), b(g % per_row), per_row(per_row),
          b_step(step % per_row) {}

    __device__ __forceinline__ void advance(int step) {  // g += step
        at += static_cast<long long>(bytes) * step;
        b += b_step;
        if (b >= per_row) b -= per_row;
    }
    __device__ __forceinline__ unsigned char* scale() const { return at - 32 * BITS * b; }
    __device__ __forceinline__ unsigned char* codes() const { return at + 4 * (per_row - b); }
};

// A lane's 16 codes of consecutive elements (c[j]: bits 0 .. BITS - 1, anything above)
// as the payload's bytes at p: int4's pair c[2h] + 16 c[2h + 1] has them in its byte 0
// (the even element low; no carry reaches it), then byte permutes gather 4 bytes a word.
template <int BITS, bool VEC>
__device__ __forceinline__ void store_codes_a(const unsigned (&c)[16], unsigned char* p) {
    constexpr int per_byte = 8 / BITS;
    unsigned b[16 / per_byte];
#pragma unroll
    for (int h = 0; h < 16 / per_byte; ++h)
        b[h] = BITS == 4 ? c[2 * h] + (c[2 * h + 1] << 4) : c[h];
#pragma unroll
    for (int h = 0; h < 16 / per_byte / 4; ++h)
        store_word<VEC>(p + 4 * h, __byte_perm(__byte_perm(b[4 * h], b[4 * h + 1], 0x40),
                                               __byte_perm(b[4 * h + 2], b[4 * h + 3], 0x40),
                                               0x5410));
}

// The last Walsh-Hadamard pass of rr_quantize_rot256 (h = 8 in layout A: registers j,
// j + 8) and the lane's max-abs of its results: max(|a + b|, |a - b|) rounded is
// RN(|a| + |b|) (one of the two is |a| + |b| exactly; rounding is monotone and odd), one add a pair
// instead of an and and a max a value. Not where that add is inf: a nan the pass made
// (inf - inf) would be missed, so the caller takes nan_max over the values then.
__device__ __forceinline__ float last_pass_maxabs(float (&v)[16]) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float a = v[j], b = v[j + 8];
        v[j] = f_add(a, b);
        v[j + 8] = f_sub(a, b);
        float s;
        asm("{ .reg .f32 p, q; abs.f32 p, %1; abs.f32 q, %2; add.rn.f32 %0, p, q; }"
            : "=f"(s) : "f"(a), "f"(b));
        m = nan_max(m, s);
    }
    return m;
}

// rr_quantize for rotated 256-value blocks without error feedback (kernels.py takes it
// for those; with feedback rr_quantize runs): the same bytes as quant.py, whose forward
// rotation of these blocks passes index bits 4-7 first, then 0-3, for this kernel's
// layouts. 16 lanes a block (two blocks a warp), 16 values a lane, in two layouts: "B",
// register j of lane l is element l + 16 j (bits 4-7 in the registers), where x is loaded
// (from the warp's Staging, fetched a step ahead, for aligned x; else from global memory),
// multiplied by the signs and passes h = 16 .. 128 run; then, through the group's tile,
// "A", register j of lane l is element l * 16 + j (bits 0-3), where the passes h = 1, 2,
// 4, 8 run, the block's max-abs is taken (the last pass's, then 4 xor-shuffles inside the
// 16 lanes), and each value's code: int4's
// from the group's bucket table (quant.cuh's Gauss4Bucket: one fma, one lookup, one
// compare a value), the rest, and int4 blocks of scales outside [2^-100, 2^100), by
// quant.cuh's encode. In A a lane's 16 codes are 16 consecutive elements: packed in
// registers and stored as 2 words (int4; 8-bit codes 4).
// What bounds it is the shared-memory pipe and instruction issue (ncu), so a value moves
// through shared memory twice (staging, tile), the loop keeps its addresses in registers
// and divides nothing; kernels.py launches it for fewer than 2^31 blocks (int indices).
template <typename T, int FMT, bool VEC>
__global__ void __launch_bounds__(RR_QUANT_THREADS, 4)
rr_quantize_rot256(const T* __restrict__ x, unsigned char* __restrict__ packed,
                   long long nblocks, long long per_row, float inv_qmax) {
    constexpr int bits = QuantWire<FMT>::bits, block = 256, E = 16;
    constexpr int stride = 336;  // tile floats a block (rr_dequantize_rot256's tile)
    const int lane = threadIdx.x & 15, group = (threadIdx.x & 31) >> 4, w = threadIdx.x & 31;
    const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int step = static_cast<int>(gridDim.x * blockDim.x >> 5) * 2;
    const int count = static_cast<int>(nblocks);
    __shared__ Pack<float, 4> tile[RR_QUANT_THREADS / 32 * 2 * stride / 4];
    float* const t = reinterpret_cast<float*>(tile) + (threadIdx.x >> 5) * 2 * stride +
                     group * stride;
    // gauss4's bucket table (quant.cuh's Gauss4Bucket), the group's own: every entry's codes
    // once; each block, lanes 0-6 write threshold `lane`'s cut into its two entries.
    // (512 bytes a table, 64 entries of which 33 are used: an entry's address is one or
    // of the table's and the bucket's, gauss4_bucket)
    __shared__ __align__(512) Gauss4Bucket buckets[FMT == 3 ? RR_QUANT_THREADS / 16 * GAUSS4_TABLE : 1];
    Gauss4Bucket* const table = buckets + (FMT == 3 ? (threadIdx.x >> 4) * GAUSS4_TABLE : 0);
    const unsigned table_at = static_cast<unsigned>(__cvta_generic_to_shared(table));
    const double mid = gauss4_mid(lane);
    const int at = gauss4_bucket_of(lane);
    if constexpr (FMT == 3) {
        for (int n = lane; n < GAUSS4_BUCKETS; n += 16) gauss4_bucket_init(n, table);
    }
    // quant.py's signs of rotate for B's elements: s_i 2^-4 (log2(256) / 2), s_i of
    // element lane + 16 j in bit lane + 16 (j % 2) of word j / 2.
    float d[E];
    {
        const float power = __uint_as_float(static_cast<unsigned>(127 - 4) << 23);
#pragma unroll
        for (int j = 0; j < E; ++j)
            d[j] = (rr_signs256.words[j / 2] >> (lane + 16 * (j % 2))) & 1u ? -power : power;
        // kept in registers: under the loop's register pressure the compiler would
        // otherwise work them out again every block
#pragma unroll
        for (int j = 0; j < E; ++j) asm("" : "+f"(d[j]));
    }
    constexpr bool staged = VEC && RR_STAGED_LOADS;
    __shared__ __align__(128)
        Pack<float, 4> stage_x[staged ? RR_QUANT_THREADS / 32 * 32 * sizeof(T) : 1];
    const Staging<T> staging(reinterpret_cast<unsigned char*>(stage_x) +
                             (threadIdx.x >> 5) * Staging<T>::chunks * Staging<T>::chunk,
                             w, lane, group);
    if constexpr (staged) {
        if (warp * 2 < count) staging.fetch(x, warp * 2, count, w);
    }
    BlockCursor<bits> cursor(packed, warp * 2 + group, static_cast<int>(per_row), step);
    for (int first = warp * 2; first < count; first += step, cursor.advance(step)) {
        const int g = first + group;
        const bool active = g < count;
        float v[E];
        if constexpr (staged) {
            staging.take(v);
            if (first + step < count) staging.fetch(x, first + step, count, w);
        } else {
            const T* const from = x + static_cast<long long>(g) * block + lane;
#pragma unroll
            for (int j = 0; j < E; ++j) v[j] = active ? to_acc(from[16 * j]) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < E; ++j) v[j] = f_mul(v[j], d[j]);
        butterflies_in_lane<E, 1, E>(v);  // h = 16 .. 128
        __syncwarp();  // the previous block's reads of the tile are done
#pragma unroll
        for (int j = 0; j < E; ++j) t[lane + 20 * j] = v[j];  // element i at i + 4 (i >> 4)
        __syncwarp();
#pragma unroll
        for (int q = 0; q < E / 4; ++q) {
            const Pack<float, 4> f =
                *reinterpret_cast<const Pack<float, 4>*>(t + lane * 20 + q * 4);
#pragma unroll
            for (int e = 0; e < 4; ++e) v[q * 4 + e] = f.v[e];
        }
        butterflies_in_lane<E, 1, E / 2>(v);  // h = 1, 2, 4
        float maxabs = last_pass_maxabs(v);    // h = 8
#pragma unroll
        for (int o = 8; o > 0; o >>= 1)
            maxabs = nan_max(maxabs, __shfl_xor_sync(0xffffffffu, maxabs, o));
        if (__any_sync(0xffffffffu, __float_as_uint(maxabs) == 0x7f800000u)) {
            maxabs = 0.0f;  // an inf sum: nan_max over the values, which may hold inf - inf
#pragma unroll
            for (int j = 0; j < E; ++j) maxabs = nan_max(maxabs, f_abs(v[j]));
#pragma unroll
            for (int o = 8; o > 0; o >>= 1)
                maxabs = nan_max(maxabs, __shfl_xor_sync(0xffffffffu, maxabs, o));
        }
        const float scale = f_mul(maxabs, inv_qmax);
        const bool usable = usable_scale(scale);
        // The common block: every value finite, |v| <= max-abs = scale in [2^-100, 2^100).
        const bool bucketed = FMT == 3 && usable && inv_qmax == 1.0f &&
                              __float_as_uint(scale) - GAUSS4_BUCKET_MIN_SCALE <
                                  GAUSS4_BUCKET_MAX_SCALE - GAUSS4_BUCKET_MIN_SCALE;
        if (bucketed && lane < 7) {
            const unsigned cut = gauss4_cut(mid, scale);
            table[16 + at].cut = cut;
            table[16 - at].cut = cut | 0x80000000u;
        }
        // the previous block's table reads are done before these cuts, these cuts before
        // this block's reads
        __syncwarp();
        unsigned c[E];  // element lane * 16 + j's code in bits 0 .. bits - 1 (above: anything)
        if (bucketed) {
            const float r16 = gauss4_r16(scale);
#pragma unroll
            for (int j = 0; j < E; ++j) {
                const Gauss4Bucket e = gauss4_bucket(v[j], r16, table_at);
                c[j] = __float_as_uint(v[j]) > e.cut ? e.codes >> 8 : e.codes;
            }
        } else {
#pragma unroll
            for (int j = 0; j < E; ++j) c[j] = encode<FMT>(v[j], scale, usable);
        }
        if (!active) continue;
        if (lane == 0) store_scale<VEC>(cursor.scale(), scale);
        store_codes_a<bits, VEC>(c, cursor.codes() + lane * E * bits / 8);
    }
}
