// lowprec_moe: per-expert column sums for the bias gradients of GroupedLinear / GroupedMLP's fc2
// (dbias_g = sum over expert g's rows of dy, optionally times the routing probs). Launched by
// lowprec_moe/backends/cupy/reduce.py; the NumPy twin is lowprec_moe/backends/numpy/reduce.py.
//
//   lpm_colsum_tiles_{f32,f16,bf16}  part[t, c] = sum over the rows r of tile t, in row order, of
//                                    x[r, c] (times probs[r]: one fp32 multiply), fp32; with
//                                    interleave 2, two such sums, over the tile's even and its
//                                    odd rows (counted from the tile's first row), then added
//   lpm_segment_sum_tiles            out[g, c] = sum of part[t, c] over the tiles of expert g, in
//                                    tile order; 0 for an expert without rows
//
// Tiles are consecutive rows of one expert (host or device table of int64 (row_begin, row_end)
// pairs), so an expert's sums depend on its own rows only: grouped calls equal per-expert calls
// bit for bit, and runs are deterministic (no atomics). The tile size and the interleave are the
// caller's: 128-row tiles in row order by default, or the order in which a quantize kernel sums
// dy's columns (MXFP8: 32-row tiles, interleave 2; NVFP4: 64-row tiles), so that a bias gradient
// has the same bits whether or not dy went through a quantize pass. Arithmetic: non-flushing fp32
// (lpm_formats.cuh); the summation order is not NumPy's, so results agree with the reference to
// rounding, not bitwise. 64-bit indexing throughout.
#include "lpm_formats.cuh"

#define LPM_RED_THREADS 256   // columns per CTA (one per thread)
#define LPM_RED_UNROLL 8      // rows loaded ahead of the in-order adds

#define LPM_RED_DT_F32 0
#define LPM_RED_DT_F16 1
#define LPM_RED_DT_BF16 2

template <int DT>
__device__ __forceinline__ float lpm_red_elem(const void* __restrict__ x, long long i) {
    if (DT == LPM_RED_DT_F32) return __ldg(reinterpret_cast<const float*>(x) + i);
    const unsigned short b = __ldg(reinterpret_cast<const unsigned short*>(x) + i);
    if (DT == LPM_RED_DT_F16) return lpm_f16_bits_to_f32(b);
    return __uint_as_float((unsigned int)b << 16);
}

// One row's value: x[r, c], times probs[r] when probs is given.
template <int DT>
__device__ __forceinline__ float lpm_red_term(const void* __restrict__ x,
                                              const float* __restrict__ probs, long long n,
                                              long long r, long long c) {
    const float v = lpm_red_elem<DT>(x, r * n + c);
    return probs != nullptr ? lpm_mul_rn(v, __ldg(probs + r)) : v;
}

// Grid (num_tiles, ceil(n / LPM_RED_THREADS)); probs may be null; interleave 1 or 2.
template <int DT>
__device__ __forceinline__ void lpm_colsum_tiles(const void* __restrict__ x,
                                                 const float* __restrict__ probs, long long n,
                                                 const long long* __restrict__ tiles,
                                                 float* __restrict__ part, int interleave) {
    const long long t = blockIdx.x;
    const long long c = (long long)blockIdx.y * LPM_RED_THREADS + threadIdx.x;
    if (c >= n) return;
    const long long r0 = __ldg(tiles + 2 * t), r1 = __ldg(tiles + 2 * t + 1);
    long long r = r0;
    float s0 = 0.0f, s1 = 0.0f;  // interleave 2: the tile's even rows, its odd rows
    // Rows are loaded LPM_RED_UNROLL (even) at a time ahead of the in-order adds.
    for (; r + LPM_RED_UNROLL <= r1; r += LPM_RED_UNROLL) {
        float v[LPM_RED_UNROLL];
#pragma unroll
        for (int j = 0; j < LPM_RED_UNROLL; ++j) v[j] = lpm_red_term<DT>(x, probs, n, r + j, c);
        if (interleave == 2) {
#pragma unroll
            for (int j = 0; j < LPM_RED_UNROLL; j += 2) {
                s0 = lpm_add_rn(s0, v[j]);
                s1 = lpm_add_rn(s1, v[j + 1]);
            }
        } else {
#pragma unroll
            for (int j = 0; j < LPM_RED_UNROLL; ++j) s0 = lpm_add_rn(s0, v[j]);
        }
    }
    for (; r < r1; ++r) {
        const float v = lpm_red_term<DT>(x, probs, n, r, c);
        if (interleave == 2 && ((r - r0) & 1)) {
            s1 = lpm_add_rn(s1, v);
        } else {
            s0 = lpm_add_rn(s0, v);
        }
    }
    part[t * n + c] = interleave == 2 ? lpm_add_rn(s0, s1) : s0;
}

#define LPM_RED_ARGS                                                                        \
    const void *__restrict__ x, const float *__restrict__ probs, long long n,               \
        const long long *__restrict__ tiles, float *__restrict__ part, int interleave
extern "C" __global__ void __launch_bounds__(LPM_RED_THREADS) lpm_colsum_tiles_f32(LPM_RED_ARGS) {
    lpm_colsum_tiles<LPM_RED_DT_F32>(x, probs, n, tiles, part, interleave);
}
extern "C" __global__ void __launch_bounds__(LPM_RED_THREADS) lpm_colsum_tiles_f16(LPM_RED_ARGS) {
    lpm_colsum_tiles<LPM_RED_DT_F16>(x, probs, n, tiles, part, interleave);
}
extern "C" __global__ void __launch_bounds__(LPM_RED_THREADS) lpm_colsum_tiles_bf16(LPM_RED_ARGS) {
    lpm_colsum_tiles<LPM_RED_DT_BF16>(x, probs, n, tiles, part, interleave);
}

// out[g, c] for g < num_groups, c < n; tile_off: int64 [num_groups + 1] (tiles of expert g are
// tile_off[g] .. tile_off[g+1]-1). One thread per (expert, column).
extern "C" __global__ void __launch_bounds__(LPM_RED_THREADS)
    lpm_segment_sum_tiles(const float* __restrict__ part, long long n,
                          const long long* __restrict__ tile_off, int num_groups,
                          float* __restrict__ out) {
    const long long idx = (long long)blockIdx.x * LPM_RED_THREADS + threadIdx.x;
    if (idx >= (long long)num_groups * n) return;
    const long long g = idx / n;
    const long long c = idx - g * n;
    const long long t1 = __ldg(tile_off + g + 1);
    float s = 0.0f;
    for (long long t = __ldg(tile_off + g); t < t1; ++t) s = lpm_add_rn(s, __ldg(part + t * n + c));
    out[idx] = s;
}
