// NVFP4 device code, part of nvfp4_common.cuh (design notes there): the quantize kernel body
// (rowwise and columnwise in one pass), the dequantize helpers, and the parameter-list macros of
// the quantize kernels.
#ifndef LPM_NVFP4_QUANTIZE_CUH
#define LPM_NVFP4_QUANTIZE_CUH

#include "nvfp4_codes.cuh"
#include "nvfp4_tiles.cuh"
#include "nvfp4_amax.cuh"

// ==========================================================================================
// Kernel: quantize
// ==========================================================================================

// Per tensor: tabs (built by the amax kernel) holds each member's enc tables and k6 values.
// Row-scaled: amax_row[row_base + m], amax_col[g*K + k]. Outputs: row_data [M_total, K/2],
// row_scale [M_total, K/16]; columnwise data and scales flat, member g at K*cw_rows/2 and
// K*cw_rows/16 bytes, [K, Mp/2] and [K, Mp/16]. Stochastic-rounding member index:
// member_base + g.
template <int DT, bool EXT, bool SR>
LPM_DEV void quantize_phases(const QTile& ti, long long K, int flags, unsigned int member_base,
                             unsigned long long seed, const unsigned int (&rw)[QCfg<DT>::RB][QCfg<DT>::WPB],
                             const unsigned char* s_tile, const float (&s_tamax)[4][8],
                             const float (&s_tab)[2][Q_TAB_STRIDE],
                             const float (&s_rs)[2][Q_TM], const float (&s_cs)[2][128],
                             uint2 (&s_cd)[4][128], unsigned char (&s_csc)[4][128],
                             unsigned char* __restrict__ row_data, unsigned char* __restrict__ row_scale,
                             unsigned char* __restrict__ col_data, unsigned char* __restrict__ col_scale) {
    typedef QCfg<DT> C;
    const int tid = threadIdx.x;
    const bool row_scaled = (flags & LPM_Q_ROW_SCALED) != 0;
    const bool block2d = (flags & LPM_Q_BLOCK2D) != 0;
    const unsigned int member = member_base + (unsigned int)ti.g;
    // rows / columns of the tile inside the member / matrix (small ints: cheap bounds checks)
    const int rows_in = (int)min(ti.M - ti.row0, (long long)Q_TM);
    const int cols_in = (int)min(K - ti.k0, (long long)C::TK);

    if (flags & LPM_Q_ROWWISE) {
        const float k6_r = s_tab[0][128];
#pragma unroll
        for (int i = 0; i < C::RB; ++i) {
            const int b = tid + i * Q_THREADS;
            const int r = b / C::BPR, cb = b % C::BPR;
            if (r >= rows_in || cb * 16 >= cols_in) continue;
            const long long m = ti.row0 + r;
            const long long kb = ti.k0 + cb * 16;
            float v[16];
            q_unpack_block<DT>(rw[i], v);
            float bmn;
            if (C::BYTES == 2) {
                bmn = q_block_max_words<DT>(rw[i]);
            } else {
                bmn = 0.0f;
#pragma unroll
                for (int e = 0; e < 16; ++e) bmn = q_max_nan(bmn, q_abs(v[e]));
            }
            const bool has_nan = lpm_isnan_bits(bmn);
            float bm = bmn;
            if (block2d) bm = s_tamax[r >> 4][cb];
            else if (has_nan) bm = q_amax16(v);
            unsigned int sc;
            float enc;
            if (row_scaled) {
                sc = q_block_scale(bm, s_rs[0][r]);
                enc = q_enc(sc, s_rs[1][r]);
            } else {
                sc = q_block_scale(bm, k6_r);
                enc = s_tab[0][sc];
            }
            const uint2 pk = q_block16<SR>(v, C::BYTES == 2 ? rw[i] : nullptr, has_nan, enc, seed,
                                           (unsigned long long)(m * K + kb), 0u, member);
            const long long row = ti.row_base + m;
            *reinterpret_cast<uint2*>(row_data + row * (K >> 1) + (kb >> 1)) = pk;
            row_scale[row * (K >> 4) + (kb >> 4)] = (unsigned char)sc;
        }
    }

    if (flags & LPM_Q_COLWISE) {
        const int rc = tid >> 5, cg = tid & 31;
        const long long mblk = ti.row0 + rc * 16;  // member row of the column blocks (warp-uniform)
        if (mblk < ti.Mp) {
            const bool rht = EXT && (flags & LPM_Q_RHT) != 0;
            const float k6_c = s_tab[1][128];
            unsigned int cw[16][2];
            q_read_cols<DT>(s_tile, rc, cg, cw);
            // NaN-propagating max |x| of each column block of the untransformed tile
            float cmax[C::CPU];
            if (C::BYTES == 2) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    unsigned int a[8];
#pragma unroll
                    for (int i = 0; i < 8; ++i) a[i] = q_hmax2<DT>(cw[2 * i][q], cw[2 * i + 1][q]);
                    const unsigned int m4 = q_hmax2<DT>(q_hmax2<DT>(q_hmax2<DT>(a[0], a[1]), q_hmax2<DT>(a[2], a[3])),
                                                        q_hmax2<DT>(q_hmax2<DT>(a[4], a[5]), q_hmax2<DT>(a[6], a[7])));
                    cmax[2 * q] = q_lane_to_f32<DT>(m4 & 0x7FFFu);
                    cmax[2 * q + 1] = q_lane_to_f32<DT>((m4 >> 16) & 0x7FFFu);
                }
            } else {
#pragma unroll
                for (int j = 0; j < C::CPU; ++j) {
                    float m = 0.0f;
#pragma unroll
                    for (int i = 0; i < 16; ++i) m = q_max_nan(m, q_abs(q_word_elem<DT>(cw[i][j], 0)));
                    cmax[j] = m;
                }
            }
            float tamax_rht = 0.0f;
            if (block2d && rht) {
                // 16x16 tiles of the transformed matrix: reduce over the LPG lanes of a 16-column group
                float mx = 0.0f;
#pragma unroll
                for (int j = 0; j < C::CPU; ++j) {
                    float v[16];
                    q_col_values<DT>(cw, j, v);
                    q_rht16<C::PREC>(v);
                    mx = lpm_fmax(mx, q_amax16(v));
                }
                unsigned int u = __float_as_uint(mx);
#pragma unroll
                for (int o = 1; o < C::LPG; o <<= 1) u = max(u, __shfl_xor_sync(0xFFFFFFFFu, u, o));
                tamax_rht = __uint_as_float(u);
            }
#pragma unroll
            for (int j = 0; j < C::CPU; ++j) {
                const int cl = cg * C::CPU + j;
                if (cl >= cols_in) continue;
                const long long k = ti.k0 + cl;
                float v[16];
                q_col_values<DT>(cw, j, v);
                float bmn = cmax[j];
                if (rht) {
                    q_rht16<C::PREC>(v);
                    bmn = 0.0f;
#pragma unroll
                    for (int e = 0; e < 16; ++e) bmn = q_max_nan(bmn, q_abs(v[e]));
                }
                const bool has_nan = lpm_isnan_bits(bmn);
                float bm = bmn;
                if (block2d) bm = rht ? tamax_rht : s_tamax[rc][cl >> 4];
                else if (has_nan) bm = q_amax16(v);
                unsigned int sc;
                float enc;
                if (row_scaled) {
                    sc = q_block_scale(bm, s_cs[0][cl]);
                    enc = q_enc(sc, s_cs[1][cl]);
                } else {
                    sc = q_block_scale(bm, k6_c);
                    enc = s_tab[1][sc];
                }
                const unsigned long long idx0 = (unsigned long long)(k * ti.Mp + mblk);
                const uint2 pk = q_block16<SR>(v, nullptr, has_nan, enc, seed, idx0, 1u, member);
                s_cd[rc][cl] = pk;  // staged: written out below in whole 32-byte column runs
                s_csc[rc][cl] = (unsigned char)sc;
            }
        }
        __syncthreads();  // (flags are uniform: every thread of the CTA gets here)
        // Column k of the tile owns 64 consecutive rows = 32 data bytes at k * Mp/2 + row0/2
        // and 4 scale bytes at k * Mp/16 + row0/16 of the member's transposed storage: one
        // thread pair writes the 32 bytes (two 16-byte stores, one full sector per column),
        // one thread the 4 scale bytes, instead of 8-byte / 1-byte stores from four warps.
        const int nrc = (int)min((ti.Mp - ti.row0) >> 4, 4ll);  // valid 16-row chunks
        const long long ld = ti.Mp >> 1, ls = ti.Mp >> 4;
        unsigned char* dbase = col_data + ti.cw_rows * K / 2 + (ti.row0 >> 1) + ti.k0 * ld;
        unsigned char* sbase = col_scale + ti.cw_rows * K / 16 + (ti.row0 >> 4) + ti.k0 * ls;
        const bool vec16 = nrc == 4 && (ld & 15) == 0;
#pragma unroll
        for (int it = 0; it < 2 * C::TK / Q_THREADS; ++it) {
            const int idx = tid + it * Q_THREADS;
            const int c = idx >> 1, h = idx & 1;
            if (c < cols_in) {
                unsigned char* dst = dbase + (long long)c * ld + 16 * h;
                const uint2 a = s_cd[2 * h][c], b = s_cd[2 * h + 1][c];
                if (vec16) {
                    *reinterpret_cast<uint4*>(dst) = make_uint4(a.x, a.y, b.x, b.y);
                } else {
                    if (2 * h < nrc) *reinterpret_cast<uint2*>(dst) = a;
                    if (2 * h + 1 < nrc) *reinterpret_cast<uint2*>(dst + 8) = b;
                }
            }
        }
        for (int c = tid; c < cols_in; c += Q_THREADS) {
            unsigned char* dst = sbase + (long long)c * ls;
            if (nrc == 4 && (ls & 3) == 0) {
                *reinterpret_cast<unsigned int*>(dst) =
                    (unsigned int)s_csc[0][c] | ((unsigned int)s_csc[1][c] << 8) |
                    ((unsigned int)s_csc[2][c] << 16) | ((unsigned int)s_csc[3][c] << 24);
            } else {
                for (int q = 0; q < nrc; ++q) dst[q] = s_csc[q][c];
            }
        }
    }
}

// Column sums of the tile from its shared-memory copy (a bias gradient fused into the pass that
// quantizes dy): sums_row[k0 + c] = sum over the tile's member rows, in order, of x[row, k0 + c]
// (each value first times probs[row] when probs is given); fp32, non-flushing; one thread per
// tile column.
template <int DT>
LPM_DEV void q_tile_column_sums(const unsigned char* s_tile, const QTile& ti, long long K,
                                const float* __restrict__ probs, float* __restrict__ sums_row) {
    typedef QCfg<DT> C;
    const int c = threadIdx.x;
    const int rows_in = (int)min(ti.M - ti.row0, (long long)Q_TM);
    if (c < C::TK && ti.k0 + c < K) {
        const int chunk = c / C::EPC, byte = (c % C::EPC) * C::BYTES;
        const float* p = probs != nullptr ? probs + ti.row_base + ti.row0 : nullptr;
        float s = 0.0f;
#pragma unroll 8
        for (int r = 0; r < rows_in; ++r) {
            const unsigned char* e = s_tile + q_smem_off(r, chunk) + byte;
            float v = q_word_elem<DT>(C::BYTES == 4 ? *reinterpret_cast<const unsigned int*>(e)
                                                    : *reinterpret_cast<const unsigned short*>(e),
                                      0);
            if (p != nullptr) v = lpm_mul_rn(v, __ldg(p + r));
            s = lpm_add_rn(s, v);
        }
        sums_row[ti.k0 + c] = s;
    }
}

template <int DT, bool EXT>
LPM_DEV void quantize_impl(const unsigned char* __restrict__ x, long long K, long long M_single,
                           const long long* __restrict__ meta, int G, int n_ct, int flags,
                           unsigned int member_base, unsigned long long seed,
                           const float* __restrict__ amax_row, const float* __restrict__ amax_col,
                           const float* __restrict__ tabs,
                           unsigned char* __restrict__ row_data, unsigned char* __restrict__ row_scale,
                           unsigned char* __restrict__ col_data, unsigned char* __restrict__ col_scale,
                           float* __restrict__ col_sums, const float* __restrict__ probs) {
    typedef QCfg<DT> C;
    __shared__ __align__(16) unsigned char s_tile[Q_TM * Q_ROW_BYTES];
    __shared__ float s_tamax[4][8];
    __shared__ float s_tab[2][Q_TAB_STRIDE];  // per tensor: the member's two encode tables
    __shared__ float s_rs[2][Q_TM];  // row-scaled: k6, S_dec per tile row
    __shared__ float s_cs[2][128];   // row-scaled: k6, S_dec per tile column
    __shared__ __align__(16) uint2 s_cd[4][128];   // columnwise codes [row chunk][tile column]
    __shared__ unsigned char s_csc[4][128];        // columnwise scales [row chunk][tile column]
    const int tid = threadIdx.x;
    const QTile ti = q_resolve_tile(M_single, meta, G, n_ct, Q_TM, C::TK, true);
    const bool rowwise = (flags & LPM_Q_ROWWISE) != 0;
    const bool colwise = (flags & LPM_Q_COLWISE) != 0;
    const bool block2d = (flags & LPM_Q_BLOCK2D) != 0;
    const bool row_scaled = (flags & LPM_Q_ROW_SCALED) != 0;

    unsigned int rw[C::RB][C::WPB];
    q_load_tile<DT>(x, K, ti, rw, s_tile, colwise || block2d || col_sums != nullptr);

    if (!row_scaled) {
        const float* tab = tabs + (long long)(2 * ti.g) * Q_TAB_STRIDE;
        for (int c = tid; c < 2 * Q_TAB_STRIDE; c += Q_THREADS) (&s_tab[0][0])[c] = __ldg(tab + c);
    } else {
        if (tid < Q_TM) {
            const long long m = ti.row0 + tid;
            const float a = (rowwise && m < ti.M) ? amax_row[ti.row_base + m] : 0.0f;
            const float se = q_encode_scale(a);
            s_rs[0][tid] = q_k6(se);
            s_rs[1][tid] = lpm_rcp_rn(se);
        }
        for (int c = tid; c < C::TK; c += Q_THREADS) {
            const long long k = ti.k0 + c;
            const float a = (colwise && k < K) ? amax_col[(long long)ti.g * K + k] : 0.0f;
            const float se = q_encode_scale(a);
            s_cs[0][c] = q_k6(se);
            s_cs[1][c] = lpm_rcp_rn(se);
        }
    }
    __syncthreads();

    if (col_sums != nullptr) {  // row tile rt of the launch's tile list (tiles run in reverse)
        const long long rt = ((long long)gridDim.x - 1 - (long long)blockIdx.x) / n_ct;
        q_tile_column_sums<DT>(s_tile, ti, K, probs, col_sums + rt * K);
    }

    if (block2d) {
        // amax of each 16x16 tile of x (NaN ignored), from the column layout
        const int rc = tid >> 5, cg = tid & 31;
        unsigned int cw[16][2];
        q_read_cols<DT>(s_tile, rc, cg, cw);
        float mx = 0.0f;
#pragma unroll
        for (int j = 0; j < C::CPU; ++j) {
            float v[16];
            q_col_values<DT>(cw, j, v);
            mx = lpm_fmax(mx, q_amax16(v));
        }
        unsigned int u = __float_as_uint(mx);
#pragma unroll
        for (int o = 1; o < C::LPG; o <<= 1) u = max(u, __shfl_xor_sync(0xFFFFFFFFu, u, o));
        if ((cg % C::LPG) == 0) s_tamax[rc][cg / C::LPG] = __uint_as_float(u);
        __syncthreads();
    }

    if (EXT && (flags & LPM_Q_SR))
        quantize_phases<DT, EXT, EXT>(ti, K, flags, member_base, seed, rw, s_tile, s_tamax, s_tab,
                                      s_rs, s_cs, s_cd, s_csc, row_data, row_scale, col_data,
                                      col_scale);
    else
        quantize_phases<DT, EXT, false>(ti, K, flags, member_base, seed, rw, s_tile, s_tamax, s_tab,
                                        s_rs, s_cs, s_cd, s_csc, row_data, row_scale, col_data,
                                      col_scale);
}

// ==========================================================================================
// Kernels: dequantize
// ==========================================================================================

// value = e2m1(code) * ((float(scale) * amax) * fp32(1/2688))
LPM_DEV float q_dequant_factor(unsigned int scale8, float amax) {
    return lpm_mul_rn(lpm_mul_rn(q_e4m3_to_f32(scale8), amax),
                      __uint_as_float(LPM_FP32_INV_NVFP4_AMAX_DIVISOR_BITS));
}

LPM_DEV void q_dequant16(uint2 d, float f, float (&v)[16]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        v[j] = lpm_mul_rn(lpm_e2m1_to_f32(d.x >> (4 * j)), f);
        v[8 + j] = lpm_mul_rn(lpm_e2m1_to_f32(d.y >> (4 * j)), f);
    }
}

// Parameters of every quantize kernel (nvfp4.cu, nvfp4_ext.cu).
#define LPM_QUANTIZE_ARGS                                                                   \
    const unsigned char *x, long long K, long long M, const long long *meta, int G, int n_ct, \
        int flags, unsigned int member_base, unsigned long long seed, const float *amax_row,  \
        const float *amax_col, const float *tabs, unsigned char *row_data,                  \
        unsigned char *row_scale, unsigned char *col_data, unsigned char *col_scale,        \
        float *col_sums, const float *probs
#define LPM_QUANTIZE_CALL                                                                   \
    (x, K, M, meta, G, n_ct, flags, member_base, seed, amax_row, amax_col, tabs, row_data,  \
     row_scale, col_data, col_scale, col_sums, probs)

#endif  // LPM_NVFP4_QUANTIZE_CUH
