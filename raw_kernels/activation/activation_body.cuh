// GroupedMLP activation device code, part of activation.cu (design notes there; included by it
// after its launch-time constants): the forward and backward bodies of
// the extern "C" kernels (plain, NVFP4 amax and fused MXFP8 modes).
#ifndef LPM_ACTIVATION_BODY_CUH
#define LPM_ACTIVATION_BODY_CUH

#include "activation_stage.cuh"

namespace lpm_act {

// ---- forward ------------------------------------------------------------------------------------

// MODE: MODE_PLAIN (z), MODE_AMAX (z and NVFP4 amax outputs), MODE_MX (MXFP8 of z, no z).
constexpr int MODE_PLAIN = 0;
constexpr int MODE_AMAX = 1;
constexpr int MODE_MX = 2;

template <int KIND, int MODE, int FMT>
__device__ __forceinline__ void fwd_body(const u8* __restrict__ h, const float* __restrict__ probs,
                                         long long f_dim, long long h_width, int glu, int il,
                                         const Params& P, long long m_total,
                                         const long long* __restrict__ row_off,
                                         const long long* __restrict__ tile_off, int num_groups,
                                         long long num_row_tiles, u8* __restrict__ z,
                                         const TileOut& o, int flags, u32* __restrict__ amax_a,
                                         u32* __restrict__ amax_b, Stage& st) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    constexpr bool MX = MODE == MODE_MX;
    constexpr bool AMX = MODE == MODE_AMAX;
    Tile t;
    if (!setup_tile<KIND>(t, f_dim, m_total, row_off, tile_off, num_groups, num_row_tiles, flags))
        return;
    const bool do_row = MX && (flags & LPM_MX_FLAG_ROWWISE) != 0;
    const bool do_col = MX && (flags & LPM_MX_FLAG_COLUMNWISE) != 0;
    const bool rows = AMX && (flags & LPM_ACT_FLAG_AMAX_ROWS) != 0;
    const bool stage = MX || (AMX && KIND == KIND_BF16 && (flags & LPM_ACT_FLAG_AMAX_RHT) != 0);
    MaxAcc A;
    acc_init(A);
    // (not in the MXFP8 forward: its 72 registers allow the 6 CTAs / SM its shared memory allows;
    // prefetching would take it to 108 registers, 4 CTAs)
    constexpr bool PF = LPM_ACT_PREFETCH != 0 && !MX;
    RowIn nx;
    if (PF) nx = fetch_row<KIND, false>(h, nullptr, probs, h_width, f_dim, glu, il, t, 0);
#pragma unroll 1
    for (int j = 0; j < ROWS_PER_LANE; ++j) {
        const int r = t.rsub + 2 * j;
        const bool valid = t.col_ok && r < t.tr.valid;
        const long long row = t.tr.in_row0 + r;
        RowIn cur;
        if (PF) {
            cur = nx;
            if (j + 1 < ROWS_PER_LANE)
                nx = fetch_row<KIND, false>(h, nullptr, probs, h_width, f_dim, glu, il, t, j + 1);
        } else {
            cur = fetch_row<KIND, false>(h, nullptr, probs, h_width, f_dim, glu, il, t, j);
        }
        u32 e[VEC];
        if (valid) {
            float g[VEC], l[VEC], a[VEC];
            float p = cur.p;
            if (t.vec) {
                decode_vec<KIND>(cur.g, g);
                decode_vec<KIND>(cur.l, l);  // zeros for unary activations
            } else {
                load_inputs<KIND>(h, row, h_width, f_dim, glu, il, t, g, l);
                p = probs != nullptr ? __ldg(probs + row) : 1.0f;
            }
            act_values<VEC>(P, g, l, a);
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const float v = probs != nullptr ? lpm_mul_rn(a[c], p) : a[c];
                e[c] = c < t.nvalid ? enc<KIND>(v) : 0u;
            }
        } else {
#pragma unroll
            for (int c = 0; c < VEC; ++c) e[c] = 0u;
        }
        u32 w[4];
        pack<KIND>(e, w);
        if (stage) stage_put(st, r, t.chunk, w);
        if (!MX && valid) store_row<KIND>(z, row, f_dim, w, t, 0, 0, f_dim, 0);
        if (MX || AMX) {
            const u32 rm = acc_row<KIND>(A, w);
            if (do_row) {
                const u32 m = row_reduce(rm, LB);
                if (t.chunk % LB == 0) st.rowmax[threadIdx.x >> 5][r][t.chunk / LB] = m;
            }
            if (rows) {
                const u32 fb = amax_f32_bits<KIND>(row_reduce(rm, 16));
                if (t.chunk == 0 && r < t.tr.valid && fb != 0u) atomicMax(amax_a + row, fb);
            }
        }
    }
    if (MX)
        mx_emit<KIND, FMT>(st, A, o, f_dim, t.rt, t.tr, t.f0, t.col_ok, t.rsub, t.chunk, do_row,
                           do_col);
    if (AMX)
        amax_flush<KIND>(st, A, t, lpm_mx::find_member(tile_off, num_groups, t.rt), 0, 0, f_dim,
                         0, f_dim, flags, amax_a, amax_b);
}

// ---- backward -----------------------------------------------------------------------------------

template <int KIND, int MODE, int FMT>
__device__ __forceinline__ void bwd_body(const u8* __restrict__ dz, const u8* __restrict__ h,
                                         const float* __restrict__ probs, long long f_dim,
                                         long long h_width, int glu, int il, const Params& P,
                                         long long m_total, const long long* __restrict__ row_off,
                                         const long long* __restrict__ tile_off, int num_groups,
                                         long long num_row_tiles, u8* __restrict__ dh,
                                         const TileOut& o, int flags,
                                         float* __restrict__ dprobs_part,
                                         float* __restrict__ colsum_part, u32* __restrict__ amax_a,
                                         u32* __restrict__ amax_b, Stage& st) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int TILE_COLS = Kind<KIND>::TILE_COLS;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    constexpr bool MX = MODE == MODE_MX;
    constexpr bool AMX = MODE == MODE_AMAX;
    Tile t;
    if (!setup_tile<KIND>(t, f_dim, m_total, row_off, tile_off, num_groups, num_row_tiles, flags))
        return;
    const bool want_p = dprobs_part != nullptr && probs != nullptr;
    const long long f_tiles = (f_dim + TILE_COLS - 1) / TILE_COLS;
    const bool do_row = MX && (flags & LPM_MX_FLAG_ROWWISE) != 0;
    const bool do_col = MX && (flags & LPM_MX_FLAG_COLUMNWISE) != 0;
    const bool rows = AMX && (flags & LPM_ACT_FLAG_AMAX_ROWS) != 0;
    const bool stage = MX || (AMX && KIND == KIND_BF16 && (flags & LPM_ACT_FLAG_AMAX_RHT) != 0);
    const int g_member = AMX ? lpm_mx::find_member(tile_off, num_groups, t.rt) : 0;

    const int nphase = glu ? 2 : 1;
#pragma unroll 1
    for (int phase = 0; phase < nphase; ++phase) {
        float s[VEC];  // column sums of the lane's rows
#pragma unroll
        for (int c = 0; c < VEC; ++c) s[c] = 0.0f;
        MaxAcc A;
        acc_init(A);
        const bool want_v = want_p && phase == 0;
        constexpr bool PF = LPM_ACT_PREFETCH != 0;
        RowIn nx;
        if (PF) nx = fetch_row<KIND, true>(h, dz, probs, h_width, f_dim, glu, il, t, 0);
#pragma unroll 1
        for (int j = 0; j < ROWS_PER_LANE; ++j) {
            const int r = t.rsub + 2 * j;
            const bool valid = t.col_ok && r < t.tr.valid;
            const long long row = t.tr.in_row0 + r;
            RowIn cur;
            if (PF) {
                cur = nx;
                if (j + 1 < ROWS_PER_LANE)
                    nx = fetch_row<KIND, true>(h, dz, probs, h_width, f_dim, glu, il, t, j + 1);
            } else {
                cur = fetch_row<KIND, true>(h, dz, probs, h_width, f_dim, glu, il, t, j);
            }
            u32 e[VEC];
            float pj = 0.0f;  // this row's dprobs partial over the lane's features
            if (valid) {
                float g[VEC], l[VEC], d[VEC], da[VEC], gr[VEC], val[VEC];
                float p = cur.p;
                if (t.vec) {
                    decode_vec<KIND>(cur.g, g);
                    decode_vec<KIND>(cur.l, l);
                    decode_vec<KIND>(cur.d, d);
                } else {
                    load_inputs<KIND>(h, row, h_width, f_dim, glu, il, t, g, l);
#pragma unroll
                    for (int c = 0; c < VEC; ++c)
                        d[c] = c < t.nvalid ? load_one<KIND>(dz, row * f_dim + t.f0 + c) : 0.0f;
                    p = probs != nullptr ? __ldg(probs + row) : 1.0f;
                }
#pragma unroll
                for (int c = 0; c < VEC; ++c) da[c] = probs != nullptr ? lpm_mul_rn(d[c], p) : d[c];
                act_grads<VEC>(P, g, l, da, phase, want_v, gr, val);
#pragma unroll
                for (int c = 0; c < VEC; ++c) {
                    e[c] = c < t.nvalid ? enc<KIND>(gr[c]) : 0u;
                    if (want_v && c < t.nvalid) pj = lpm_add_rn(pj, lpm_mul_rn(val[c], d[c]));
                }
            } else {
#pragma unroll
                for (int c = 0; c < VEC; ++c) e[c] = 0u;
            }
#pragma unroll
            for (int c = 0; c < VEC; ++c) s[c] = lpm_add_rn(s[c], dec<KIND>(e[c]));
            u32 w[4];
            pack<KIND>(e, w);
            if (stage) stage_put(st, r, t.chunk, w);
            if (dh != nullptr && valid)
                store_row<KIND>(dh, row, h_width, w, t, phase, glu, f_dim, il);
            if (MX || AMX) {
                const u32 rm = acc_row<KIND>(A, w);
                if (do_row) {
                    const u32 m = row_reduce(rm, LB);
                    if (t.chunk % LB == 0) st.rowmax[threadIdx.x >> 5][r][t.chunk / LB] = m;
                }
                if (rows) {
                    const u32 fb = amax_f32_bits<KIND>(row_reduce(rm, 16));
                    if (t.chunk == 0 && r < t.tr.valid && fb != 0u) atomicMax(amax_a + row, fb);
                }
            }
            if (want_v) {
                // butterfly over the 16 lanes of this row (uniform: every lane runs it)
#pragma unroll
                for (int sh = 1; sh < 16; sh <<= 1)
                    pj = lpm_add_rn(pj, __shfl_xor_sync(0xFFFFFFFFu, pj, sh));
                if (t.chunk == 0 && r < t.tr.valid) dprobs_part[row * f_tiles + t.ft] = pj;
            }
        }
        if (colsum_part != nullptr) {
#pragma unroll
            for (int c = 0; c < VEC; ++c)
                s[c] = lpm_add_rn(s[c], __shfl_xor_sync(0xFFFFFFFFu, s[c], 16));
            if (t.rsub == 0) {
                float* dst = colsum_part + t.rt * h_width;
#pragma unroll
                for (int c = 0; c < VEC; ++c)
                    if (c < t.nvalid) dst[in_col(t.f0 + c, phase, glu, f_dim, il)] = s[c];
            }
        }
        if (MX)
            mx_emit<KIND, FMT>(st, A, o, h_width, t.rt, t.tr, in_col(t.f0, phase, glu, f_dim, il),
                               t.col_ok, t.rsub, t.chunk, do_row, do_col);
        if (AMX)
            amax_flush<KIND>(st, A, t, g_member, phase, glu, f_dim, il, h_width, flags, amax_a,
                             amax_b);
    }
}

}  // namespace lpm_act

#endif  // LPM_ACTIVATION_BODY_CUH
