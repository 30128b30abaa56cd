// The add stage: own[i] = reduce(own[i], rows[0][i], ..., rows[R-1][i]), one pass.
//
// Bandwidth-bound: each element of the R staged rows and the own row is read once and
// the own row written once, so the kernel should run at device-copy speed.
// 16-bit floats accumulate in fp32 and round once; AVG divides the exact sum by N at
// the end (integer AVG truncates toward zero, like C++ division and NCCL).
//
// Compiled at run time by NVRTC through cupy.RawModule (ringreduce/execution/kernels.py), after
// native/numeric.cuh (element types, conversions, Pack).
//
// Template parameters: T element type, A accumulator type, OP (0 sum, 1 avg, 2 max,
// 3 min), VEC elements per 16-byte load (1 for the scalar variant used when the rows
// are not 16-byte aligned).

template <typename A, int OP> __device__ __forceinline__ A combine(A a, A b) {
    if (OP == 2) return a > b ? a : b;
    if (OP == 3) return a < b ? a : b;
    return a + b;
}

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

// The add stage with a 16-bit wire format W (float32 tensors, Config.wire_dtype): own
// (float32) combined with the R received rows (W) in float32, then rounded to W once.
// Both own (widened back, so this machine keeps exactly what the others receive) and
// out, the row diffuse sends (W), get the rounded value: one pass instead of four torch
// ops and two temporaries. VEC 4 (16-byte float loads) or 1 (unaligned scalar variant).
template <typename W, int OP>
__device__ __forceinline__ float add_wire_one(float own, const W* rows, long long k, int nrows,
                                              long long j, float world, W* out) {
    float acc = own;
    for (int r = 0; r < nrows; ++r) acc = combine<float, OP>(acc, to_acc(rows[r * k + j]));
    if (OP == 1) acc = acc / world;
    from_acc(acc, out);
    return to_acc(*out);
}

template <typename W, int OP, int VEC>
__global__ void rr_add_wire(float* __restrict__ own, const W* __restrict__ rows,
                            W* __restrict__ out, long long k, int nrows, float world) {
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x * VEC;
    for (long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
         i < k; i += step) {
        if (i + VEC > k) {  // only when VEC > 1 and k is not a multiple of VEC
            for (long long j = i; j < k; ++j)
                own[j] = add_wire_one<W, OP>(own[j], rows, k, nrows, j, world, &out[j]);
            return;
        }
        Pack<float, VEC> mine = *reinterpret_cast<const Pack<float, VEC>*>(own + i);
        Pack<W, VEC> sent;
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            mine.v[e] = add_wire_one<W, OP>(mine.v[e], rows, k, nrows, i + e, world, &sent.v[e]);
        *reinterpret_cast<Pack<float, VEC>*>(own + i) = mine;
        *reinterpret_cast<Pack<W, VEC>*>(out + i) = sent;
    }
}
