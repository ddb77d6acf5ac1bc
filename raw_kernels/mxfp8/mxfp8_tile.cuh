// MXFP8 device code, part of mxfp8_impl.cuh (design notes there): tile location (single and
// grouped tensors) and the tile pipeline of a warp (lane / warp maxima, scales, conversion and
// stores of the rowwise and columnwise blocks: process_tile).
#ifndef LPM_MXFP8_TILE_CUH
#define LPM_MXFP8_TILE_CUH

#include "mxfp8_formats.cuh"

namespace lpm_mx {

// ---- tile location --------------------------------------------------------------------------

// Largest g in [0, n) with offs[g] <= v (offs nondecreasing, offs[0] <= v; for v >= offs[n],
// a tile past the last member's as device-split launches have, n - 1).
__device__ __forceinline__ int find_member(const long long* __restrict__ offs, int n, long long v) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (__ldg(offs + mid) <= v) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

struct TileRows {
    long long in_row0;  // first input (and rowwise output) row of the tile
    int valid;          // rows of the tile inside its member (1..32; <= 0 past the last tile)
};

// Row tile `rt` of the grouped layout: member g owns columnwise tiles
// [tile_off[g], tile_off[g+1]) and input rows [row_off[g], row_off[g+1]). Without offsets (a
// single tensor) tile rt covers rows [32 rt, 32 rt + 32) of m_total.
__device__ __forceinline__ TileRows locate_tile(long long rt, long long m_total,
                                                const long long* __restrict__ row_off,
                                                const long long* __restrict__ tile_off,
                                                int num_groups) {
    TileRows t;
    long long base, end;
    if (row_off == nullptr) {
        base = rt * LPM_MXFP8_BLOCK;
        end = m_total;
    } else {
        const int g = find_member(tile_off, num_groups, rt);
        base = __ldg(row_off + g) + (rt - __ldg(tile_off + g)) * LPM_MXFP8_BLOCK;
        end = __ldg(row_off + g + 1);
    }
    const long long v = end - base;
    t.in_row0 = base;
    t.valid = (int)(v < LPM_MXFP8_BLOCK ? v : LPM_MXFP8_BLOCK);
    return t;
}

// ---- the tile pipeline ------------------------------------------------------------------------

struct TileOut {
    u8* __restrict__ row_data;
    u8* __restrict__ row_scale;
    u8* __restrict__ col_data;
    u8* __restrict__ col_scale;
};

// Column maxima (per word, over the lane's 16 rows) and row maxima (per row, over the lane's
// VEC columns) of |x|; MASK_NAN ignores NaN elements.
template <int KIND, bool MASK_NAN>
__device__ __forceinline__ void lane_maxes(const u32 (&raw)[LPM_MX_ROWS_PER_LANE][4],
                                           u32 (&colmax)[4], u32 (&rowmax)[LPM_MX_ROWS_PER_LANE],
                                           bool want_rows) {
#pragma unroll
    for (int w = 0; w < 4; ++w) colmax[w] = 0u;
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
        u32 a[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            a[w] = MASK_NAN ? abs_word_nonan<KIND>(raw[j][w]) : abs_word<KIND>(raw[j][w]);
            colmax[w] = max_word<KIND>(colmax[w], a[w]);
        }
        if (want_rows) {
            const u32 m = max_word<KIND>(max_word<KIND>(a[0], a[1]), max_word<KIND>(a[2], a[3]));
            rowmax[j] = word_scalar_max<KIND>(m);
        }
    }
}

// Reduce the lane maxima across the warp: columns over the two row halves (lanes l, l ^ 16),
// rows over the lanes of one 32-element block.
template <int KIND>
__device__ __forceinline__ void warp_maxes(u32 (&colmax)[4], u32 (&rowmax)[LPM_MX_ROWS_PER_LANE],
                                           bool want_rows) {
#pragma unroll
    for (int w = 0; w < 4; ++w)
        colmax[w] = max_word<KIND>(colmax[w], __shfl_xor_sync(0xFFFFFFFFu, colmax[w], 16));
    if (want_rows) {
#pragma unroll
        for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
#pragma unroll
            for (int s = 1; s < Kind<KIND>::LANES_PER_BLOCK; s <<= 1)
                rowmax[j] = umax(rowmax[j], __shfl_xor_sync(0xFFFFFFFFu, rowmax[j], s));
        }
    }
}

// Quantize VEC values with per-element multipliers into VEC fp8 bytes (VEC / 4 words).
template <int FMT, bool HW, int VEC>
__device__ __forceinline__ void quantize_vec(const float (&xv)[VEC], const float (&mult)[VEC],
                                             bool fix_nan, u32 (&out)[VEC / 4]) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
        const u32 p0 = cvt_pair<FMT, HW>(lpm_mul_rn(xv[4 * q + 0], mult[4 * q + 0]),
                                         lpm_mul_rn(xv[4 * q + 1], mult[4 * q + 1]));
        const u32 p1 = cvt_pair<FMT, HW>(lpm_mul_rn(xv[4 * q + 2], mult[4 * q + 2]),
                                         lpm_mul_rn(xv[4 * q + 3], mult[4 * q + 3]));
        u32 w = __byte_perm(p0, p1, 0x5410);
        if (fix_nan) w = canonical_nan4<FMT>(w);
        out[q] = w;
    }
}

template <int NWORDS>
__device__ __forceinline__ void store_words(u8* p, const u32 (&w)[NWORDS]) {
    if (NWORDS == 2) {
        uint2 v;
        v.x = w[0];
        v.y = w[NWORDS - 1];
        *reinterpret_cast<uint2*>(p) = v;
    } else {
        *reinterpret_cast<u32*>(p) = w[0];
    }
}

// Scale exponent of a NaN-free block maximum (the tile pipeline masks NaNs before taking
// maxima, so amax is finite or +inf): the ceiling rule of scale_exponent in a few integer ops.
// v = amax * fp32(1/max) >= 0 with bits b: b <= 0x400000 (v <= 2^-127, zero included) gives 0;
// otherwise (b + 0x7FFFFF) >> 23 is the biased exponent plus 1 when the mantissa is nonzero
// (a subnormal v above 2^-127 gives 1), clamped to 254 (exponent 254 is never increased, +inf
// gives 254). Equal to scale_exponent for every non-NaN amax >= 0.
template <int FMT>
__device__ __forceinline__ u32 scale_exponent_nonan(float amax) {
    const u32 b = __float_as_uint(lpm_mul_rn(amax, __uint_as_float(Fp8<FMT>::INV_MAX_BITS)));
    const u32 e = umin((b + LPM_FP32_MANT_MASK) >> LPM_FP32_MANT_BITS, LPM_E8M0_MAX_FINITE);
    return b > (1u << (LPM_FP32_MANT_BITS - 1)) ? e : 0u;
}

// scale_multiplier for e <= 254.
__device__ __forceinline__ float scale_multiplier_finite(u32 e) {
    return __uint_as_float(e == LPM_E8M0_MAX_FINITE ? (1u << (LPM_FP32_MANT_BITS - 1))
                                                    : (u32)(2 * LPM_E8M0_BIAS - (int)e)
                                                          << LPM_FP32_MANT_BITS);
}

// The 16 rows of a lane: quantize (rowwise and / or columnwise) and store. FIXNAN: the tile
// holds a NaN, canonicalise the NaN bytes (a uniform branch picks the instantiation, so NaN-free
// tiles carry no fix-up instructions). Store addresses advance by two rows per step.
template <int KIND, int FMT, bool HW, bool FIXNAN>
__device__ __forceinline__ void emit_rows(const u32 (&raw)[LPM_MX_ROWS_PER_LANE][4],
                                          const TileOut& o, long long k, long long rt,
                                          const TileRows& tr, long long c0, bool col_ok,
                                          int rsub, int chunk, bool do_row, bool do_col,
                                          bool block_2d, const u32 (&ecol)[Kind<KIND>::VEC],
                                          const float (&mcol)[Kind<KIND>::VEC],
                                          const u32 (&rowmax)[LPM_MX_ROWS_PER_LANE]) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    const long long kb = k / LPM_MXFP8_BLOCK;  // row scale columns
    const long long r0 = tr.in_row0 + rsub;
    u8* rdp = do_row ? o.row_data + r0 * k + c0 : nullptr;
    u8* rsp = do_row ? o.row_scale + r0 * kb + c0 / LPM_MXFP8_BLOCK : nullptr;
    u8* cdp = do_col ? o.col_data + (rt * LPM_MXFP8_BLOCK + rsub) * k + c0 : nullptr;
    const long long step_d = 2 * k, step_s = 2 * kb;
    const bool scale_lane = (chunk % LB) == 0;
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
        const int r = rsub + 2 * j;
        float xv[VEC];
#pragma unroll
        for (int c = 0; c < VEC; ++c)
            xv[c] = KIND == KIND_F32 ? elem_to_f32<KIND>(raw[j][c], false)
                                     : elem_to_f32<KIND>(raw[j][c / 2], (c & 1) != 0);
        u32 rbytes[VEC / 4];
        if (do_row) {
            u32 erow;
            float mrow[VEC];
            if (block_2d) {
                erow = ecol[0];
#pragma unroll
                for (int c = 0; c < VEC; ++c) mrow[c] = mcol[0];
            } else {
                erow = scale_exponent_nonan<FMT>(amax_bits_to_f32<KIND>(rowmax[j]));
                const float m = scale_multiplier_finite(erow);
#pragma unroll
                for (int c = 0; c < VEC; ++c) mrow[c] = m;
            }
            quantize_vec<FMT, HW, VEC>(xv, mrow, FIXNAN, rbytes);
            if (col_ok && r < tr.valid) {
                store_words<VEC / 4>(rdp, rbytes);
                if (scale_lane) *rsp = (u8)erow;
            }
        }
        if (do_col && col_ok) {
            u32 cbytes[VEC / 4];
            if (block_2d && do_row) {
#pragma unroll
                for (int q = 0; q < VEC / 4; ++q) cbytes[q] = rbytes[q];  // same scale, same bytes
            } else {
                quantize_vec<FMT, HW, VEC>(xv, mcol, FIXNAN, cbytes);
            }
            store_words<VEC / 4>(cdp, cbytes);
        }
        rdp += step_d;
        rsp += step_s;
        cdp += step_d;
    }
}

// Everything after the loads: maxima, scales, both quantized copies, stores.
//
// raw[j] holds row (rsub + 2 j) of the tile, VEC columns starting at c0 (zeros for rows past
// `valid` and for lanes past K). Rowwise outputs go to rows in_row0 + r (r < valid); columnwise
// outputs to rows 32 rt + r (all 32 rows, padding rows quantize to 0) and scale row rt.
template <int KIND, int FMT, bool HW>
__device__ __forceinline__ void process_tile(const u32 (&raw)[LPM_MX_ROWS_PER_LANE][4],
                                             const TileOut& o, long long k, long long rt,
                                             const TileRows& tr, long long c0, bool col_ok,
                                             int rsub, int chunk, bool do_row, bool do_col,
                                             bool block_2d) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    const bool want_rows = do_row && !block_2d;

    u32 colmax[4];
    u32 rowmax[LPM_MX_ROWS_PER_LANE];
    lane_maxes<KIND, false>(raw, colmax, rowmax, want_rows);
    // The column maxima cover every element of the tile: a NaN anywhere shows up here.
    bool nan_here = false;
#pragma unroll
    for (int w = 0; w < 4; ++w) nan_here |= word_has_nan<KIND>(colmax[w]);
    const bool has_nan = __any_sync(0xFFFFFFFFu, nan_here);
    if (has_nan) lane_maxes<KIND, true>(raw, colmax, rowmax, want_rows);  // rare slow path
    warp_maxes<KIND>(colmax, rowmax, want_rows);
    // From here on every maximum is NaN-free (finite or +inf).

    // Column scales (or the 2-D tile scale).
    u32 ecol[VEC];
    float mcol[VEC];
    if (block_2d) {
        const u32 m01 = max_word<KIND>(colmax[0], colmax[1]);
        const u32 m23 = max_word<KIND>(colmax[2], colmax[3]);
        u32 m = word_scalar_max<KIND>(max_word<KIND>(m01, m23));
#pragma unroll
        for (int s = 1; s < LB; s <<= 1) m = umax(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
        const u32 e = scale_exponent_nonan<FMT>(amax_bits_to_f32<KIND>(m));
        const float mult = scale_multiplier_finite(e);
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
            ecol[c] = e;
            mcol[c] = mult;
        }
    } else {
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
            const u32 w = colmax[KIND == KIND_F32 ? c : c / 2];
            const u32 a = KIND == KIND_F32 ? w : ((c & 1) ? (w >> 16) : (w & 0xFFFFu));
            ecol[c] = do_col ? scale_exponent_nonan<FMT>(amax_bits_to_f32<KIND>(a)) : 0u;
            mcol[c] = scale_multiplier_finite(ecol[c]);
        }
    }

    if (has_nan) {
        emit_rows<KIND, FMT, HW, true>(raw, o, k, rt, tr, c0, col_ok, rsub, chunk, do_row, do_col,
                                       block_2d, ecol, mcol, rowmax);
    } else {
        emit_rows<KIND, FMT, HW, false>(raw, o, k, rt, tr, c0, col_ok, rsub, chunk, do_row,
                                        do_col, block_2d, ecol, mcol, rowmax);
    }
    if (do_col && col_ok && rsub == 0) {
        u32 sw[VEC / 4];
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q)
            sw[q] = ecol[4 * q] | (ecol[4 * q + 1] << 8) | (ecol[4 * q + 2] << 16) |
                    (ecol[4 * q + 3] << 24);
        store_words<VEC / 4>(o.col_scale + rt * k + c0, sw);
    }
}

}  // namespace lpm_mx

#endif  // LPM_MXFP8_TILE_CUH
