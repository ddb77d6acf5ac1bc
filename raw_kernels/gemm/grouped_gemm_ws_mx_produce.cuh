// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// shared-memory layout of the warp-specialised MXFP8 kernel (grouped_gemm_ws_mx.cuh), WmxLayout,
// and its producers' k-loops, wmx_produce_b: every producer thread widens 64 elements of B per
// k-tile into a canonical buffer -- K-major B: two 32-element units (rows ur, ur + 128,
// contraction half uh), one block factor each; MN-major B: 8 columns x 8 contraction lines of
// one block, the 8 columns' factors computed from their codes.

#ifndef LPM_GROUPED_GEMM_WS_MX_PRODUCE_CUH
#define LPM_GROUPED_GEMM_WS_MX_PRODUCE_CUH

#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_tma.cuh"
#include "grouped_gemm_ws_roles.cuh"
#include "grouped_gemm_mxf16.cuh"

namespace lpm_gg {

// Byte offsets from the kernel's shared-memory base: A's raw ring (NSA = kWmxAStages stages),
// B's (NSB = AHEAD_ + 1: the data copies are requested AHEAD_ k-tiles ahead, kWmxAhead in
// gemm_ws_mx, kWmxPAhead in the persistent forms), kWmxCanonBuffers canonical B buffers,
// kWmxScaleSlots scale slots (A's rows, then B's at T_SB), then the tile's row and column
// maxima of the block codes (T_EXPS).
template <bool AMN, bool BMN, int AHEAD_ = kWmxAhead>
struct WmxLayout {
    static constexpr int BM = 128, BN = 256;
    static constexpr int AHEAD = AHEAD_, NSA = kWmxAStages, NSB = AHEAD_ + 1;
    static_assert(AHEAD >= 2 && NSA >= AHEAD + kWmxCanonBuffers,
                  "A's stage holds its k-tile until the consumers retire it");
    static constexpr int T_DA =  // 128 rows x 64 bytes or 64 lines x 128
        raw_data_bytes(AMN ? KIND_FP8_MN : KIND_FP8_K, BM);
    static constexpr int T_DB =  // 256 rows x 64 bytes or 2 x 64 x 128
        raw_data_bytes(BMN ? KIND_FP8_MN : KIND_FP8_K, BN);
    static constexpr int T_B0 = kWmxAStages * T_DA;  // A's ring, then B's
    static constexpr int CANON_B = canon_bytes(BN);
    static constexpr int T_CANON = T_B0 + NSB * T_DB;
    static constexpr int T_SLD = kWmxScaleTiles * (kBK / LPM_MXFP8_BLOCK);  // scale bytes per row
    static constexpr int T_SC = T_CANON + kWmxCanonBuffers * CANON_B;
    static constexpr int T_SLOT = ws_mx_scale_slot_bytes();
    static constexpr int T_SB = BM * T_SLD;  // B's rows (MN-major: 2 SGT block lines of 256)
    static constexpr int T_EXPS = T_SC + kWmxScaleSlots * T_SLOT;
    static constexpr int P_RAW = kBK * 128;  // MN-major B: a raw panel, [64 lines][128 bytes]
};

// The copy-issuing thread's tensor-map rows of a tile at (r0, c0) of the expert with descriptor
// words d: K-major operands their first row; MN-major ones their first contraction line / block
// line, their columns from ac / bc (the tile's first row / column).
struct WmxRows {
    int a, b, as, bs, ac, bc;
};
template <bool AMN, bool BMN>
__device__ __forceinline__ WmxRows wmx_rows(const long long* d, long long r0, long long c0) {
    WmxRows r;
    r.a = static_cast<int>(d[D_A_OFF] / d[D_A_LD] + (AMN ? 0 : r0));
    r.b = static_cast<int>(d[D_B_OFF] / d[D_B_LD] + (BMN ? 0 : c0));
    r.as = static_cast<int>(d[D_A_SOFF] / d[D_A_SLD] + (AMN ? 0 : r0));
    r.bs = static_cast<int>(d[D_B_SOFF] / d[D_B_SLD] + (BMN ? 0 : c0));
    r.ac = static_cast<int>(r0);
    r.bc = static_cast<int>(c0);
    return r;
}

// The copies of k-tile kt of a tile (rows rw) into the ring positions of the CTA's k-tile j:
// A's raw stage (K-major: 128 rows x 64 bytes; MN-major: one 128-row panel of 64 lines), B's
// (K-major: 256 rows; MN-major: two 128-row panels), each on its stage's mbarrier.
template <bool AMN, bool BMN, class L>
__device__ __forceinline__ void wmx_issue_data(unsigned s0, unsigned abar, unsigned bbar, int j,
                                               int kt, const WmxRows& rw, const TmaMap* tm_a,
                                               const TmaMap* tm_b) {
    constexpr int NSA = L::NSA, NSB = L::NSB;
    const unsigned sa = s0 + (j % NSA) * L::T_DA, ba = abar + 8 * (j % NSA);
    const unsigned sb = s0 + L::T_B0 + (j % NSB) * L::T_DB, bb = bbar + 8 * (j % NSB);
    mbar_arrive_expect_tx(ba, L::T_DA);
    if constexpr (AMN) {
        tma_load_2d(sa, tm_a, ba, rw.ac, rw.a + kt * kBK);
    } else {
        tma_load_2d(sa, tm_a, ba, kt * kBK, rw.a);
    }
    mbar_arrive_expect_tx(bb, L::T_DB);
    if constexpr (BMN) {
        tma_load_2d(sb, tm_b, bb, rw.bc, rw.b + kt * kBK);
        tma_load_2d(sb + L::P_RAW, tm_b, bb, rw.bc + 128, rw.b + kt * kBK);
    } else {
        tma_load_2d(sb, tm_b, bb, kt * kBK, rw.b);
    }
}
// ... and of scale group g of a tile (kWmxScaleTiles k-tiles: K-major 16 bytes per row,
// MN-major 2 kWmxScaleTiles block lines) into the slot of the CTA's group q.
template <bool AMN, bool BMN, class L>
__device__ __forceinline__ void wmx_issue_scales(unsigned s0, unsigned sbar, int q, int g,
                                                 const WmxRows& rw, const TmaMap* tm_as,
                                                 const TmaMap* tm_bs) {
    constexpr int SGT = kWmxScaleTiles;
    const int sl = q % kWmxScaleSlots;
    const unsigned sb = s0 + L::T_SC + sl * L::T_SLOT, bar = sbar + 8 * sl;
    mbar_arrive_expect_tx(bar, L::T_SLOT);
    if constexpr (AMN) {
        tma_load_2d(sb, tm_as, bar, rw.ac, rw.as + g * 2 * SGT);
    } else {
        tma_load_2d(sb, tm_as, bar, g * L::T_SLD, rw.as);
    }
    if constexpr (BMN) {
        tma_load_2d(sb + L::T_SB, tm_bs, bar, rw.bc, rw.bs + g * 2 * SGT);
    } else {
        tma_load_2d(sb + L::T_SB, tm_bs, bar, g * L::T_SLD, rw.bs);
    }
}

// The producers' step before widening k-tile j of the CTA's sequence of J k-tiles (NG scale
// groups; gemm_ws_mx: one tile's, gemm_ws_mx_p: all its tiles'): k-tile j - NCB retired, so
// its canonical buffer, its raw A stage (which k-tile j + AHEAD takes) and, after the last
// k-tile of a scale group, its slot are free; B's raw stage for k-tile j + AHEAD last held
// k-tile j - 1, which every producer has widened once all of them pass the barrier: EMPTY
// (consumers and producers), or before the first EMPTY the producers' own barrier. The leader
// then requests k-tile j + AHEAD (issue_data) and the group whose slot just freed
// (issue_scales); every producer waits for k-tile j's B data and block scales.
// Its two ends, shared with the ragged form: the barrier that frees k-tile j's ring positions,
// and the waits for k-tile j's B data and scale group g.
template <class L>
__device__ __forceinline__ void wmx_refill_sync(int j) {
    constexpr int NSB = L::NSB, NCB = kWmxCanonBuffers, AHEAD = L::AHEAD;
    if (j >= NCB) {
        named_sync(WS_BAR_EMPTY + j % NCB, kWsThreads);
    } else if (j + AHEAD >= NSB) {
        named_sync(WS_BAR_PROD, kWsProducers);
    }
}
template <class L>
__device__ __forceinline__ void wmx_refill_wait(int j, int g, unsigned bbar, unsigned sbar) {
    constexpr int NSB = L::NSB, NSG = kWmxScaleSlots;
    mbar_wait(bbar + 8 * (j % NSB), static_cast<unsigned>(j / NSB) & 1u);
    mbar_wait(sbar + 8 * (g % NSG), static_cast<unsigned>(g / NSG) & 1u);
}
template <class L, class IssueData, class IssueScales>
__device__ __forceinline__ void wmx_refill(int j, int J, int NG, bool leader, unsigned bbar,
                                           unsigned sbar, const IssueData& issue_data,
                                           const IssueScales& issue_scales) {
    constexpr int NCB = kWmxCanonBuffers, AHEAD = L::AHEAD;
    constexpr int NSG = kWmxScaleSlots, SGT = kWmxScaleTiles;
    wmx_refill_sync<L>(j);
    if (leader) {
        if (j + AHEAD < J) issue_data(j + AHEAD);
        // group g's slot last held group g - NSG, whose last k-tile SGT (g - NSG + 1) - 1 is
        // j - NCB
        const int q = j - NCB + 1;
        if (q > 0 && q % SGT == 0 && q / SGT + NSG - 1 < NG) issue_scales(q / SGT + NSG - 1);
    }
    wmx_refill_wait<L>(j, j / SGT, bbar, sbar);
}

// The k-loops of producer thread t (0..255) of gemm_ws_mx: per k-tile j (KT of them from j0, the
// CTA's k-tile sequence: one tile's, j0 a multiple of kWmxScaleTiles), refill(j) (frees the
// ring positions, requests copies, waits for k-tile j's), then widens its share of B into
// canonical buffer j % kWmxCanonBuffers and arrives at FULL. One loop per staging mode (f16m:
// fp16 window, factors relative to the columns' largest codes in exps_b and bias_b; else bf16)
// and B format (eb5: E5M2). Columns from cols_valid on are not widened.
template <bool BMN, class L, class Refill>
__device__ __forceinline__ void wmx_produce_b(int t, int KT, unsigned s0, int cols_valid,
                                              int bias_b, const unsigned char* exps_b,
                                              bool f16m, bool eb5, const Refill& refill,
                                              int j0) {
    constexpr int BN = L::BN, NSB = L::NSB, NCB = kWmxCanonBuffers;
    constexpr int NSG = kWmxScaleSlots, SGT = kWmxScaleTiles;
    constexpr int T_B0 = L::T_B0, T_DB = L::T_DB, CANON_B = L::CANON_B, T_CANON = L::T_CANON;
    constexpr int T_SLD = L::T_SLD, T_SC = L::T_SC, T_SLOT = L::T_SLOT, T_SB = L::T_SB;
    constexpr int P_RAW = L::P_RAW;
    if constexpr (BMN) {
        // Thread t widens 8 columns x 8 contraction lines of each k-tile: columns
        // col .. col + 7 (col = 128 p + 8 g: half g % 2 of chunk g / 2 of raw panel p,
        // [64 lines][128 bytes], TMA 128-byte swizzle: chunk c of line l at c ^ (l & 7)) of
        // lines 8 w + j (j < 8, w = t / 32: one block, w / 4, per thread), stored as
        // canonical chunk 16 p + g of each line (mn_canon_off). Its 8 factors per k-tile come
        // from the 8 columns' codes (one 8-byte load from the scale slot), so no producer
        // waits for another. Per line, the warp reads one whole 128-byte line of each panel
        // and a quarter-warp stores 8 distinct 16-byte chunks of one canonical line.
        const int g = t & 15, p = (t >> 4) & 1, w = t >> 5;
        const int col = 128 * p + 8 * g;
        const bool live = col < cols_valid;
        // line 8 w + j: raw chunk gc ^ j, canonical chunk gk ^ j (mn_canon_off) of its line
        const unsigned o_raw = static_cast<unsigned>(p * P_RAW + 8 * w * 128 + ((g & 1) << 3));
        const unsigned o_cn = static_cast<unsigned>(mn_canon_off(8 * w, 16 * p + g) -
                                                    ((g & 7) << 4));
        const unsigned o_sc = static_cast<unsigned>(T_SB + (w >> 2) * BN + col);
        const unsigned gc = static_cast<unsigned>(g >> 1), gk = static_cast<unsigned>(g & 7);
        // fp16 window: the factor of code e in column c is 2^(e - e_max(c) + S_MAX), as fp16
        // bits (mx_factor_bits: f = e - e_max + bias_b clamped to [0, 30], << 10). Per pair of
        // columns, two halves at once: e + (256 + bias_b - e_max) = f + 256 stays in
        // [1, 65535] per half (no carry between them); the clamp to [256, 286] and
        // (<< 10) & 0x7C00 per half give f << 10.
        unsigned dh[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned d0 = 256u + static_cast<unsigned>(bias_b) - exps_b[col + 2 * i];
            const unsigned d1 = 256u + static_cast<unsigned>(bias_b) - exps_b[col + 2 * i + 1];
            dh[i] = d0 | (d1 << 16);
        }
        auto loop = [&](auto h, auto e5) {
            constexpr bool H = decltype(h)::value, E5 = decltype(e5)::value;
            for (int j = j0; j < j0 + KT; ++j) {
                const int cb = j % NCB, gs = j / SGT;
                const int pos = j % SGT;
                refill(j);
                const unsigned rb = s0 + T_B0 + (j % NSB) * T_DB + o_raw;
                const unsigned cbb = s0 + T_CANON + cb * CANON_B + o_cn;
                const uint2 sc =
                    lds_v2(s0 + T_SC + (gs % NSG) * T_SLOT + pos * 2 * BN + o_sc);
                uint2 x[8];
#pragma unroll
                for (int l = 0; l < 8; ++l)
                    x[l] = lds_v2(rb + l * 128 + ((gc ^ static_cast<unsigned>(l)) << 4));
                if (live) {
                    if constexpr (H) {
                        unsigned m[4];
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const unsigned e2 = __byte_perm(i < 2 ? sc.x : sc.y, 0u,
                                                            (i & 1) ? 0x4342u : 0x4140u);
                            const unsigned v =
                                __vminu2(__vmaxu2(e2 + dh[i], 0x01000100u), 0x011E011Eu);
                            m[i] = (v << LPM_FP16_MANT_BITS) & 0x7C007C00u;
                        }
#pragma unroll
                        for (int l = 0; l < 8; ++l) {
                            unsigned o[4];
                            fp8_decode4_f16<E5>(x[l].x, m[0], m[1], o[0], o[1]);
                            fp8_decode4_f16<E5>(x[l].y, m[2], m[3], o[2], o[3]);
                            sts_v4(cbb + l * 128 + ((gk ^ static_cast<unsigned>(l)) << 4), o[0],
                                   o[1], o[2], o[3]);
                        }
                    } else {
                        float f[8];
#pragma unroll
                        for (int i = 0; i < 8; ++i)
                            f[i] = lpm_e8m0_to_f32(((i < 4 ? sc.x : sc.y) >> (8 * (i & 3))) &
                                                   0xFFu);
#pragma unroll
                        for (int l = 0; l < 8; ++l) {
                            unsigned o[4];
                            fp8_decode4<E5>(x[l].x, f[0], f[1], f[2], f[3], o[0], o[1]);
                            fp8_decode4<E5>(x[l].y, f[4], f[5], f[6], f[7], o[2], o[3]);
                            sts_v4(cbb + l * 128 + ((gk ^ static_cast<unsigned>(l)) << 4), o[0],
                                   o[1], o[2], o[3]);
                        }
                    }
                }
                fence_proxy_async();
                named_arrive(WS_BAR_FULL + cb, kWsThreads);
            }
        };
        with_flags(f16m, eb5, loop);  // one k-loop per staging mode and B format
    } else {
        const int ur = t >> 1, uh = t & 1;
        // unit (ur, uh): raw chunks 2uh and 2uh + 1 of row ur (the second at the first's
        // address with bit 4 flipped: the swizzle XORs whole chunk indices), its block code,
        // and canonical chunks 4uh + j (canon_chunk4); row ur + 128 at constant distances.
        const unsigned o_raw =
            static_cast<unsigned>(ur * kBK + (((2 * uh) ^ ((ur >> 1) & 3)) << 4));
        const unsigned o_sc = static_cast<unsigned>(ur * T_SLD + uh);
        const unsigned o_cn = static_cast<unsigned>(k_canon_off(ur, 4 * uh));
        constexpr unsigned D_RAW = 128 * kBK, D_SC = 128 * T_SLD, D_CN = 128 * kBK * 2;
        const bool live0 = ur < cols_valid, live1 = ur + 128 < cols_valid;
        // fp16 window only: the rows' parts of their factor words (mx_window_row; a live
        // row's codes all lie in the window)
        const unsigned fk0 = mx_window_row(exps_b[ur], bias_b);
        const unsigned fk1 = mx_window_row(exps_b[ur + 128], bias_b);
        auto loop = [&](auto h, auto e5) {
            constexpr bool H = decltype(h)::value, E5 = decltype(e5)::value;
            for (int j = j0; j < j0 + KT; ++j) {
                const int cb = j % NCB, g = j / SGT;
                refill(j);
                const unsigned rb = s0 + T_B0 + (j % NSB) * T_DB + o_raw;
                const unsigned rsb =
                    s0 + T_SC + (g % NSG) * T_SLOT + T_SB + (j % SGT) * 2 + o_sc;
                const unsigned cbb = s0 + T_CANON + cb * CANON_B + o_cn;
                const uint4 x0 = lds_v4(rb), y0 = lds_v4(rb ^ 16u);
                const uint4 x1 = lds_v4(rb + D_RAW), y1 = lds_v4((rb + D_RAW) ^ 16u);
                const unsigned e0 = lds_u8(rsb), e1 = lds_u8(rsb + D_SC);
                auto unit = [&](const uint4& x, const uint4& y, unsigned m, unsigned dst) {
                    unsigned o[16];
                    mx_decode4<E5, H>(x.x, m, o[0], o[1]);
                    mx_decode4<E5, H>(x.y, m, o[2], o[3]);
                    mx_decode4<E5, H>(x.z, m, o[4], o[5]);
                    mx_decode4<E5, H>(x.w, m, o[6], o[7]);
                    mx_decode4<E5, H>(y.x, m, o[8], o[9]);
                    mx_decode4<E5, H>(y.y, m, o[10], o[11]);
                    mx_decode4<E5, H>(y.z, m, o[12], o[13]);
                    mx_decode4<E5, H>(y.w, m, o[14], o[15]);
#pragma unroll
                    for (int l = 0; l < 4; ++l)
                        sts_v4(canon_chunk4(dst, l), o[4 * l], o[4 * l + 1], o[4 * l + 2],
                               o[4 * l + 3]);
                };
                if (live0) unit(x0, y0, mx_block_factor<H>(e0, fk0), cbb);
                if (live1) unit(x1, y1, mx_block_factor<H>(e1, fk1), cbb + D_CN);
                fence_proxy_async();
                named_arrive(WS_BAR_FULL + cb, kWsThreads);
            }
        };
        with_flags(f16m, eb5, loop);  // one k-loop per staging mode and B format
    }
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_WS_MX_PRODUCE_CUH
