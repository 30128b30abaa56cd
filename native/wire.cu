// Casts for the 16-bit wire format on the network hop (Config.wire_dtype).
//
// A slice's (M, k) rows on this device: row j is the part that machine j reduces.
// collect sends every row but this machine's own (``skip`` = m) narrowed to W, packed
// as M-1 rows; diffuse brings the other machines' reduced rows back packed the same
// way, widened into place. Packed row i is view row i + (i >= skip). One launch per
// slice instead of a torch copy per row. Rounding: nearest, ties to even (numeric.cuh).
//
// VEC 4 (16-byte float32 side, 8-byte W side) needs k % 4 == 0 and aligned rows, so a
// pack never crosses a row; VEC 1 is the scalar variant. Compiled after numeric.cuh.

__device__ __forceinline__ long long view_index(long long i, long long k, int skip) {
    const long long r = i / k;
    return i + (r >= skip ? k : 0);  // packed row r is view row r + (r >= skip)
}

template <typename W, int VEC>
__global__ void rr_narrow_rows(const float* __restrict__ view, W* __restrict__ packed,
                               long long k, int nrows, int skip) {
    const long long total = static_cast<long long>(nrows) * k;
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x * VEC;
    for (long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
         i < total; i += step) {
        Pack<float, VEC> wide = *reinterpret_cast<const Pack<float, VEC>*>(
            view + view_index(i, k, skip));
        Pack<W, VEC> narrow;
#pragma unroll
        for (int e = 0; e < VEC; ++e) from_acc(wide.v[e], &narrow.v[e]);
        *reinterpret_cast<Pack<W, VEC>*>(packed + i) = narrow;
    }
}

template <typename W, int VEC>
__global__ void rr_widen_rows(const W* __restrict__ packed, float* __restrict__ view,
                              long long k, int nrows, int skip) {
    const long long total = static_cast<long long>(nrows) * k;
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x * VEC;
    for (long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
         i < total; i += step) {
        Pack<W, VEC> narrow = *reinterpret_cast<const Pack<W, VEC>*>(packed + i);
        Pack<float, VEC> wide;
#pragma unroll
        for (int e = 0; e < VEC; ++e) wide.v[e] = to_acc(narrow.v[e]);
        *reinterpret_cast<Pack<float, VEC>*>(view + view_index(i, k, skip)) = wide;
    }
}
