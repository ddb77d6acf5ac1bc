// GroupedMLP activation device code, part of activation.cu (design notes there; included by it
// after its launch-time constants): per-warp staging of the packed tile in
// shared memory, the fused MXFP8 quantization of the staged tile (lpm_mx::process_tile's
// arithmetic) and the NVFP4 amax outputs (per member, per row / column, RHT).
#ifndef LPM_ACTIVATION_STAGE_CUH
#define LPM_ACTIVATION_STAGE_CUH

#include "nvfp4_common.cuh"
#include "activation_tile.cuh"

namespace lpm_act {

// ---- per-warp staging of the packed tile ----------------------------------------------------
//
// The rows of a lane are computed in a rolled loop (one copy of the activation math per feature
// instead of one per (row, feature): the kernels stay small and compile fast). With MXFP8 output
// the packed words of each row go to shared memory, together with the row maxima of each
// 32-column block, and the column maxima are kept in registers; after the loop every lane reads
// its rows back one at a time and quantizes them (rowwise and / or columnwise). This is the
// arithmetic of lpm_mx::process_tile (same maxima, same scale rule, same conversions, NaN bytes
// canonicalised when the tile holds a NaN) without holding the 16 x 16-byte tile of a lane in
// registers. The RHT amax (NVFP4) reads the staged tile by columns.

constexpr int STAGE_ROWS = 2 * ROWS_PER_LANE;  // 32
constexpr int STAGE_CHUNKS = 16;
constexpr int STAGE_ROW_BLOCKS = 4;  // 32-column blocks of a warp tile (TILE_COLS / 32 <= 4)

struct Stage {
    uint4 w[LPM_ACT_WARPS_PER_CTA][STAGE_ROWS][STAGE_CHUNKS];
    u32 rowmax[LPM_ACT_WARPS_PER_CTA][STAGE_ROWS][STAGE_ROW_BLOCKS];
};

__device__ __forceinline__ void stage_put(Stage& st, int r, int chunk, const u32 (&w)[4]) {
    uint4 v;
    v.x = w[0];
    v.y = w[1];
    v.z = w[2];
    v.w = w[3];
    st.w[threadIdx.x >> 5][r][chunk] = v;
}

// |x| maxima of a lane's rows (layer-dtype bit patterns, NaN elements ignored): per word over
// the rows, and whether any element was a NaN.
struct MaxAcc {
    u32 col[4];
    bool nan;
};

__device__ __forceinline__ void acc_init(MaxAcc& A) {
#pragma unroll
    for (int q = 0; q < 4; ++q) A.col[q] = 0u;
    A.nan = false;
}

// Add one row (4 packed words); returns the lane's maximum over the row (NaN ignored).
template <int KIND>
__device__ __forceinline__ u32 acc_row(MaxAcc& A, const u32 (&w)[4]) {
    u32 a[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        a[q] = lpm_mx::abs_word_nonan<KIND>(w[q]);
        A.nan |= a[q] != lpm_mx::abs_word<KIND>(w[q]);
        A.col[q] = lpm_mx::max_word<KIND>(A.col[q], a[q]);
    }
    return lpm_mx::word_scalar_max<KIND>(lpm_mx::max_word<KIND>(
        lpm_mx::max_word<KIND>(a[0], a[1]), lpm_mx::max_word<KIND>(a[2], a[3])));
}

// Layer-dtype |x| bits of element c of a word array.
template <int KIND>
__device__ __forceinline__ u32 word_elem(const u32 (&w)[4], int c) {
    if (KIND == KIND_F32) return w[c];
    return (c & 1) ? (w[c / 2] >> 16) : (w[c / 2] & 0xFFFFu);
}

// fp32 bits of a layer-dtype |x| pattern (non-NaN): order-preserving, 0 stays 0.
template <int KIND>
__device__ __forceinline__ u32 amax_f32_bits(u32 a) {
    return __float_as_uint(lpm_mx::amax_bits_to_f32<KIND>(a));
}

// Row maximum (lane value -> the whole row block of `lanes` lanes).
__device__ __forceinline__ u32 row_reduce(u32 m, int lanes) {
    for (int s = 1; s < lanes; s <<= 1) m = lpm_mx::umax(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
    return m;
}

// The lane's 16 staged rows, quantized and stored (FIXNAN: canonical NaN bytes).
template <int KIND, int FMT, bool FIXNAN>
__device__ __forceinline__ void mx_emit_rows(const Stage& st, const TileOut& o, long long k,
                                             long long rt, const TileRows& tr, long long c0,
                                             bool col_ok, int rsub, int chunk, bool do_row,
                                             bool do_col, const float (&mcol)[Kind<KIND>::VEC]) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    const int warp = threadIdx.x >> 5;
    const long long kb = k / LPM_MXFP8_BLOCK;
    const long long r0 = tr.in_row0 + rsub;
    u8* rdp = do_row ? o.row_data + r0 * k + c0 : nullptr;
    u8* rsp = do_row ? o.row_scale + r0 * kb + c0 / LPM_MXFP8_BLOCK : nullptr;
    u8* cdp = do_col ? o.col_data + (rt * LPM_MXFP8_BLOCK + rsub) * k + c0 : nullptr;
    const bool scale_lane = (chunk % LB) == 0;
#pragma unroll 1
    for (int j = 0; j < ROWS_PER_LANE; ++j) {
        const int r = rsub + 2 * j;
        const uint4 v = st.w[warp][r][chunk];
        const u32 raw[4] = {v.x, v.y, v.z, v.w};
        float xv[VEC];
#pragma unroll
        for (int c = 0; c < VEC; ++c)
            xv[c] = KIND == KIND_F32 ? lpm_mx::elem_to_f32<KIND>(raw[c], false)
                                     : lpm_mx::elem_to_f32<KIND>(raw[c / 2], (c & 1) != 0);
        if (do_row) {
            const u32 erow = lpm_mx::scale_exponent_nonan<FMT>(
                lpm_mx::amax_bits_to_f32<KIND>(st.rowmax[warp][r][chunk / LB]));
            const float m = lpm_mx::scale_multiplier_finite(erow);
            float mrow[VEC];
#pragma unroll
            for (int c = 0; c < VEC; ++c) mrow[c] = m;
            u32 rbytes[VEC / 4];
            lpm_mx::quantize_vec<FMT, true, VEC>(xv, mrow, FIXNAN, rbytes);
            if (col_ok && r < tr.valid) {
                lpm_mx::store_words<VEC / 4>(rdp + 2LL * j * k, rbytes);
                if (scale_lane) rsp[2LL * j * kb] = (u8)erow;
            }
        }
        if (do_col && col_ok) {
            u32 cbytes[VEC / 4];
            lpm_mx::quantize_vec<FMT, true, VEC>(xv, mcol, FIXNAN, cbytes);
            lpm_mx::store_words<VEC / 4>(cdp + 2LL * j * k, cbytes);
        }
    }
}

// MXFP8 of the staged tile: maxima -> scales -> the lane's rows, quantized and stored. Columns
// c0 .. c0 + VEC of a k-column output; row tile rt (rows tr.in_row0 + r, r < tr.valid).
template <int KIND, int FMT>
__device__ __forceinline__ void mx_emit(const Stage& st, MaxAcc& A, const TileOut& o,
                                        long long k, long long rt, const TileRows& tr,
                                        long long c0, bool col_ok, int rsub, int chunk,
                                        bool do_row, bool do_col) {
    constexpr int VEC = Kind<KIND>::VEC;
    const bool has_nan = __any_sync(0xFFFFFFFFu, A.nan);
#pragma unroll
    for (int q = 0; q < 4; ++q)
        A.col[q] = lpm_mx::max_word<KIND>(A.col[q], __shfl_xor_sync(0xFFFFFFFFu, A.col[q], 16));
    u32 ecol[VEC];
    float mcol[VEC];
#pragma unroll
    for (int c = 0; c < VEC; ++c) {
        ecol[c] = do_col ? lpm_mx::scale_exponent_nonan<FMT>(
                               lpm_mx::amax_bits_to_f32<KIND>(word_elem<KIND>(A.col, c)))
                         : 0u;
        mcol[c] = lpm_mx::scale_multiplier_finite(ecol[c]);
    }
    __syncwarp();  // the staged rows and row maxima of the other lanes
    // a uniform branch picks the instantiation: NaN-free tiles carry no NaN fix-up instructions
    if (has_nan) {
        mx_emit_rows<KIND, FMT, true>(st, o, k, rt, tr, c0, col_ok, rsub, chunk, do_row, do_col,
                                      mcol);
    } else {
        mx_emit_rows<KIND, FMT, false>(st, o, k, rt, tr, c0, col_ok, rsub, chunk, do_row, do_col,
                                       mcol);
    }
    if (do_col && col_ok && rsub == 0) {
        u32 sw[VEC / 4];
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q)
            sw[q] = ecol[4 * q] | (ecol[4 * q + 1] << 8) | (ecol[4 * q + 2] << 16) |
                    (ecol[4 * q + 3] << 24);
        lpm_mx::store_words<VEC / 4>(o.col_scale + rt * k + c0, sw);
    }
    __syncwarp();  // the stage is rewritten next (backward: the next phase)
}

// NVFP4 amax outputs of one phase (see the kernel comments for the modes and buffers).
template <int KIND>
__device__ __forceinline__ void amax_flush(const Stage& st, MaxAcc& A, const Tile& t, int g,
                                           int phase, int glu, long long f_dim, int il,
                                           long long h_width, int flags,
                                           u32* __restrict__ amax_a, u32* __restrict__ amax_b) {
    constexpr int VEC = Kind<KIND>::VEC;
    if ((flags & (LPM_ACT_FLAG_AMAX | LPM_ACT_FLAG_AMAX_RHT)) != 0) {
        u32 m = lpm_mx::word_scalar_max<KIND>(lpm_mx::max_word<KIND>(
            lpm_mx::max_word<KIND>(A.col[0], A.col[1]), lpm_mx::max_word<KIND>(A.col[2], A.col[3])));
        m = row_reduce(m, 32);
        const u32 fb = amax_f32_bits<KIND>(m);
        if ((threadIdx.x & 31) == 0 && fb != 0u) atomicMax(amax_a + g, fb);
    }
    if ((flags & LPM_ACT_FLAG_AMAX_ROWS) != 0) {
        u32 col[4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
            col[q] = lpm_mx::max_word<KIND>(A.col[q], __shfl_xor_sync(0xFFFFFFFFu, A.col[q], 16));
        if (t.rsub == 0) {
            u32* dst = amax_b + (long long)g * h_width;
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const u32 fb = amax_f32_bits<KIND>(word_elem<KIND>(col, c));
                if (c < t.nvalid && fb != 0u)
                    atomicMax(dst + in_col(t.f0 + c, phase, glu, f_dim, il), fb);
            }
        }
    }
    if (KIND == KIND_BF16 && (flags & LPM_ACT_FLAG_AMAX_RHT) != 0) {
        // Columnwise RHT amax: lane (rsub, chunk) transforms rows 16 rsub .. 16 rsub + 15 (one
        // 16-row chunk of the member: tiles start at member rows multiple of 32, rows past the
        // member are zero, as the quantizer's zero padding) of its VEC columns.
        __syncwarp();
        const int warp = threadIdx.x >> 5;
        const unsigned short* base = reinterpret_cast<const unsigned short*>(
            &st.w[warp][16 * t.rsub][t.chunk]);
        constexpr int ROW_STRIDE = STAGE_CHUNKS * 8;  // unsigned shorts per staged row
        float mt = 0.0f;
#pragma unroll 1
        for (int c = 0; c < VEC; ++c) {
            float v[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) v[i] = __uint_as_float((u32)base[i * ROW_STRIDE + c] << 16);
            q_rht16<8>(v);
            mt = lpm_fmax(mt, q_amax16(v));
        }
        // mt >= 0 and not NaN: its bits order like its values
        const u32 fb = row_reduce(__float_as_uint(mt), 32);
        if ((threadIdx.x & 31) == 0 && fb != 0u) atomicMax(amax_b + g, fb);
        __syncwarp();
    }
}

}  // namespace lpm_act

#endif  // LPM_ACTIVATION_STAGE_CUH
