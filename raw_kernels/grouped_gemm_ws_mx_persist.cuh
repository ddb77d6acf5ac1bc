// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// persistent form of the warp-specialised MXFP8 kernel, gemm_ws_mx_p, and its entry-point macro
// LPM_GG_DEFINE_WS_MX_P.
//
// gemm_ws_mx runs one 128 x 256 output tile per CTA, so every tile pays the CTA's start, a
// window check by the whole CTA before its first widening, the pipeline's fill and an epilogue
// during which the producers sit idle (~7.5 us per tile on the H200, against ~0.9 us per
// k-tile). gemm_ws_mx_p runs one CTA per SM over tiles blockIdx.x, + gridDim.x, ... and treats
// them as one sequence of J = tiles x KT k-tiles (gemm_ws_p's scheme): raw stages, canonical
// buffers, scale slots and mbarrier phases follow the sequence index, so the producers request
// and widen the next tile's first k-tiles while the consumers finish the current one.
//   * The producers check each tile against the fp16 window (mx_window_check on their own named
//     barrier) before they widen its first k-tile -- for tile ti + 1 while the consumers run
//     tile ti's last k-tiles -- into window slot ti % 2 (rows' and columns' largest codes, their
//     range, the staging mode), and signal it on WS_BAR_WIN. The consumers read the slot at the
//     tile's start (A's factors) and end (rescale). A slot is rewritten two tiles later, once
//     the consumers have handed back a k-tile of the tile between (KT >= 4: the EMPTY barrier
//     the producers pass before that check). The check scans the tile's block scales, which
//     grows with the contraction; past a few k-tiles' worth it is not hidden behind the
//     consumers' last k-tiles and epilogue (the launcher's PERSIST_MX_MAX_KTILES).
//   * At a tile's end the consumers retire their wgmma, rescale (fp16 window) and run the
//     register epilogue (reg_epi, 64 columns at a time) through the last k-tile's canonical
//     buffer, which they hand back only afterwards; the producers meanwhile widen the next
//     tile's first two k-tiles into the other two.
// Conditions (the launcher's): those of gemm_ws_mx's TMA build, one contraction length for
// every expert, a whole, nonzero number of scale groups (kWmxScaleTiles k-tiles) per tile, and
// 16-bit output without bias (reg_epi_ok). Each tile takes the staging mode gemm_ws_mx gives it
// and every output element the same products in the same order and the same epilogue
// arithmetic: the results are bitwise gemm_ws_mx's.

#ifndef LPM_GROUPED_GEMM_WS_MX_PERSIST_CUH
#define LPM_GROUPED_GEMM_WS_MX_PERSIST_CUH

#include "grouped_gemm_epi_regs.cuh"
#include "grouped_gemm_ws_mx.cuh"

namespace lpm_gg {

constexpr int WS_BAR_WIN = WS_BAR_EMPTY + kWmxCanonBuffers;  // a tile's window slot is written

// One tile of the consumer warpgroups of gemm_ws_mx_p: tile ti of the CTA, whose k-tiles start
// at j of the CTA's sequence (seq_kt / seq_j: shared words with the k-tiles per tile and in the
// sequence; smem, s0: the shared-memory base, as a pointer and a shared address). Waits for
// the producers' window verdict, runs the k-loop in the tile's staging mode, retires it,
// rescales (fp16 window) and runs the register epilogue through the last k-tile's canonical
// buffer, which it then hands back. Not inlined: inside the kernel's loop over tiles, ptxas
// placed the accumulators' second half at different registers in the unrolled k-tiles and
// moved it between them through local memory (~7 KB of spill stores); as a function of its
// own the tile compiles as in gemm_ws_mx (no spills), and the call costs once per tile.
template <bool AMN, bool BMN>
__device__ __noinline__ void wmx_p_consumer_tile(LPM_GG_PARAMS, const unsigned char* smem,
                                                 unsigned s0, unsigned abar, unsigned sbar,
                                                 unsigned tail_len, unsigned seq_kt,
                                                 unsigned seq_j, int ti, int j) {
    constexpr int BM = 128, BN = 256, NCB = kWmxCanonBuffers;
    using L = WmxLayout<AMN, BMN>;
    constexpr int NI = BN / 8;
    constexpr int T_WIN = L::T_EXPS;
    constexpr int W_RANGE = BM + BN, W_MODE = W_RANGE + 16;
    constexpr int EPI_B = reg_epi_bytes<BN / 4>();
    const bool ea5 = a_e5m2 != 0, eb5 = b_e5m2 != 0;
    const WmxFrag<AMN, L> fr(threadIdx.x);
    float acc[NI * 4];
    float* const accf = acc;
#pragma unroll
    for (int i = 0; i < NI * 4; ++i) acc[i] = 0.0f;
    named_sync(WS_BAR_WIN, kWsThreads);  // the producers checked the tile
    const unsigned char* const w = smem + T_WIN + (ti & 1) * kWmxWinSlot;
    const bool f16m = *reinterpret_cast<const unsigned*>(w + W_MODE) != 0u;
    const int bias_a = mx_s_max(ea5) + LPM_FP16_EXP_BIAS;
    const unsigned fka = mx_window_row(w[fr.ra0], bias_a);
    const unsigned fkb = mx_window_row(w[fr.ra1], bias_a);
    const int KT = static_cast<int>(lds_u32_volatile(seq_kt));
    const int J = static_cast<int>(lds_u32_volatile(seq_j));
    auto loop = [&](auto h, auto e5) {
        wmx_consume<AMN, BMN, L, decltype(h)::value, decltype(e5)::value, NI * 4>(
            accf, fr, s0, abar, sbar, tail_len, fka, fkb, j, j + KT, J);
        wg_wait0();
        wg_fence_acc<NI * 4>(accf);
    };
    with_flags(f16m, ea5, loop);
    j += KT;
    if (f16m) {
        mx_rescale<1, NI, AMN>(accf, w, w + BM, mx_rescale_shift(ea5, eb5), fr.wm0, 0, fr.lane,
                               reinterpret_cast<const unsigned*>(w + W_RANGE));
    }
    named_sync(WS_BAR_EPI, kWsConsumers);
    const CtaTile tl = locate_tile_at<BM, BN>(ctaid_x_volatile() + ti * nctaid_x_volatile(), tiles,
                                              n_col_tiles, desc, n_cols);
    Epilogue ep = LPM_GG_EPILOGUE_OF(tl.d);
    if (!reg_epi_ok(ep)) __trap();
    ep.init_alpha();
    const int cb = (j - 1) % NCB;
    const unsigned buf = s0 + L::T_CANON + cb * L::CANON_B + (threadIdx.x >> 5) * EPI_B;
    reg_epi<NI, AMN, NI / 4>(ep, buf, 0u, accf, fr.wm0, fr.lane, tl.r0, tl.c0,
                             tl.rows_valid<BM>(), tl.cols_valid<BN>());
    if (j - 1 + NCB < J) named_arrive(WS_BAR_EMPTY + cb, kWsThreads);
}

template <bool AMN, bool BMN>
__device__ __forceinline__ void gemm_ws_mx_p(LPM_GG_PARAMS, const TmaMap* tm_a, const TmaMap* tm_b,
                                             const TmaMap* tm_as, const TmaMap* tm_bs,
                                             int num_tiles) {
    constexpr int BM = 128, BN = 256;
    constexpr int AKIND = AMN ? KIND_FP8_MN : KIND_FP8_K;
    constexpr int BKIND = BMN ? KIND_FP8_MN : KIND_FP8_K;
    constexpr int NSA = kWmxAStages, NSB = kWmxBStages, NCB = kWmxCanonBuffers;
    constexpr int AHEAD = kWmxAhead, NSG = kWmxScaleSlots, SGT = kWmxScaleTiles;
    using L = WmxLayout<AMN, BMN>;
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)
    constexpr int SMEM = ws_mx_p_smem_bytes();
    // window slots (codes of A's rows, of B's columns, the range, the mode), the check's scratch
    constexpr int T_WIN = L::T_EXPS, T_SCR = T_WIN + 2 * kWmxWinSlot;
    constexpr int W_RANGE = BM + BN, W_MODE = W_RANGE + 16;
    constexpr int EPI_B = reg_epi_bytes<BN / 4>();  // a consumer warp's staging buffer
    static_assert(T_SCR + kWmxWinScratch + 1024 == SMEM && SMEM <= kMaxSmem &&
                      W_MODE + 4 <= kWmxWinSlot && kWmxWinSlot % 16 == 0,
                  "shared memory: gemm_ws_mx's buffers, the window slots and scratch");
    static_assert((kWsConsumers / 32) * EPI_B <= L::CANON_B,
                  "the consumer warps' staging buffers in one canonical buffer");
    static_assert(WS_BAR_WIN < 16 && NSA == AHEAD + NCB && NSB == AHEAD + 1 && SGT > NCB,
                  "named barriers; the pipeline of gemm_ws_mx; a slot is reused after a k-tile "
                  "of the tile between is handed back");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != 16 || b_ch != 16, s0);

    if (static_cast<int>(blockIdx.x) >= num_tiles) return;  // (the launcher's grid is smaller)
    // This CTA's tiles T0, T0 + TS, ... (my_tiles), KT k-tiles each (a multiple of SGT): J
    // k-tiles and NG scale groups in all. Each role computes them after the register split
    // (values live across setmaxnreg are spilled).
    auto schedule = [&](int& T0, int& TS, int& my_tiles, int& KT, int& J, int& NG) {
        T0 = static_cast<int>(blockIdx.x);
        TS = static_cast<int>(gridDim.x);
        my_tiles = (num_tiles - 1 - T0) / TS + 1;
        KT = static_cast<int>(
            (locate_tile_at<BM, BN>(T0, tiles, n_col_tiles, desc, n_cols).len + kBK - 1) / kBK);
        J = my_tiles * KT;
        NG = J / SGT;
    };
    auto tile_at = [&](int T) { return locate_tile_at<BM, BN>(T, tiles, n_col_tiles, desc, n_cols); };
    auto slot = [&](int ti) { return smem + T_WIN + (ti & 1) * kWmxWinSlot; };

    // mbarriers of A's and B's raw stages and of the scale slots (gemm_ws_mx's)
    __shared__ __align__(8) unsigned long long ws_bar[NSA + NSB + NSG];
    const unsigned abar = smem_u32(ws_bar), bbar = abar + 8 * NSA, sbar = bbar + 8 * NSB;
    // (MN-major A) the contraction's length in its last k-tile, 1..64 (one for every tile)
    // and the schedule's k-tile counts for the consumers: per tile, and in the CTA's sequence
    __shared__ unsigned ws_tail, ws_seq[2];
    const unsigned tail_len = smem_u32(&ws_tail);
    const unsigned seq_kt = smem_u32(&ws_seq[0]), seq_j = smem_u32(&ws_seq[1]);
    if (threadIdx.x == kWsConsumers) {
#pragma unroll
        for (int i = 0; i < NSA + NSB + NSG; ++i) mbar_init(abar + 8 * i, 1);
        mbar_init_fence();
        int T0, TS, my_tiles, KT, J, NG;
        schedule(T0, TS, my_tiles, KT, J, NG);
        const long long len = tile_at(T0).len;
        ws_tail = static_cast<unsigned>(len - static_cast<long long>(KT - 1) * kBK);
        ws_seq[0] = static_cast<unsigned>(KT);
        ws_seq[1] = static_cast<unsigned>(J);
    }
    __syncthreads();
    const bool ea5 = a_e5m2 != 0, eb5 = b_e5m2 != 0;

    if (threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups ----------------
        regs_release<WmxRegs<BMN>::PRODUCER>();
        int T0, TS, my_tiles, KT, J, NG;
        schedule(T0, TS, my_tiles, KT, J, NG);
        const int NGT = KT / SGT;  // scale groups per tile
        const int t = static_cast<int>(threadIdx.x) - kWsConsumers;
        const bool leader = t == 0;
        const int bias_b = mx_s_max(eb5) + LPM_FP16_EXP_BIAS;
        // The leader's tensor-map rows of tiles ti (at ti % 2) and ti + 1, ti the data stream's
        // tile (gemm_ws_p's scheme: the scale stream runs 3 k-tiles ahead of the data stream
        // and, with KT >= SGT, is in tile ti or ti + 1).
        __shared__ WmxRows rows_of[2];
        auto rows_at = [&](int ti) {
            const CtaTile tl = tile_at(T0 + ti * TS);
            return wmx_rows<AMN, BMN>(tl.d, tl.r0, tl.c0);
        };
        if (leader) {
            rows_of[0] = rows_at(0);
            if (my_tiles > 1) rows_of[1] = rows_at(1);
        }
        // both streams requested in order, each keeping its tile and place as counters
        int d_ti = 0, d_kt = 0;
        auto issue_data = [&](int j) {
            const int ti = d_ti, kt = d_kt;
            if (++d_kt == KT) {
                d_kt = 0;
                ++d_ti;
            }
            if (kt == 0 && ti > 0 && ti + 1 < my_tiles) rows_of[(ti + 1) & 1] = rows_at(ti + 1);
            wmx_issue_data<AMN, BMN, L>(s0, abar, bbar, j, kt, rows_of[ti & 1], tm_a, tm_b);
        };
        int s_ti = 0, s_g = 0;
        auto issue_scales = [&](int q) {
            const int ti = s_ti, g = s_g;
            if (++s_g == NGT) {
                s_g = 0;
                ++s_ti;
            }
            wmx_issue_scales<AMN, BMN, L>(s0, sbar, q, g, rows_of[ti & 1], tm_as, tm_bs);
        };
        if (leader) {
#pragma unroll
            for (int s = 0; s < AHEAD; ++s)
                if (s < J) issue_data(s);
            for (int g = 0; g < NSG && g < NG; ++g) issue_scales(g);
        }
        // gemm_ws_mx's refill on the sequence index j
        auto refill = [&](int j) {
            if (j >= NCB) {
                named_sync(WS_BAR_EMPTY + j % NCB, kWsThreads);
            } else if (j + AHEAD >= NSB) {
                named_sync(WS_BAR_PROD, kWsProducers);
            }
            if (leader) {
                if (j + AHEAD < J) issue_data(j + AHEAD);
                const int q = j - NCB + 1;
                if (q > 0 && q % SGT == 0 && q / SGT + NSG - 1 < NG)
                    issue_scales(q / SGT + NSG - 1);
            }
            const int g = j / SGT;
            mbar_wait(bbar + 8 * (j % NSB), static_cast<unsigned>(j / NSB) & 1u);
            mbar_wait(sbar + 8 * (g % NSG), static_cast<unsigned>(g / NSG) & 1u);
        };
        for (int ti = 0; ti < my_tiles; ++ti) {
            const CtaTile tl = tile_at(T0 + ti * TS);
            const long long* const d = tl.d;
            const int rows_valid = tl.rows_valid<BM>(), cols_valid = tl.cols_valid<BN>();
            unsigned char* const w = slot(ti);
            const long long a_sld = d[D_A_SLD], b_sld = d[D_B_SLD];
            const bool f16m = mx_window_check<AKIND, BKIND, BM, BN, kWsProducers, WS_BAR_PROD>(
                a_scale + d[D_A_SOFF] + (AMN ? tl.r0 : tl.r0 * a_sld), a_sld, rows_valid,
                b_scale + d[D_B_SOFF] + (BMN ? tl.c0 : tl.c0 * b_sld), b_sld, cols_valid,
                tl.len, ea5, eb5, mx_bf16 == 0 && KT >= kWmxMinKTiles,
                reinterpret_cast<unsigned*>(smem + T_SCR), w, w + BM, static_cast<unsigned>(t),
                reinterpret_cast<unsigned*>(w + W_RANGE));
            if (leader) *reinterpret_cast<unsigned*>(w + W_MODE) = f16m ? 1u : 0u;
            named_arrive(WS_BAR_WIN, kWsThreads);
            wmx_produce_b<BMN, L>(t, KT, s0, cols_valid, bias_b, w + BM, f16m, eb5, refill,
                                  ti * KT);
        }
        return;
    }

    // ---------------- consumer warpgroups ----------------
    regs_claim<WmxRegs<BMN>::CONSUMER>();
    for (int ti = 0, j = 0;; ++ti) {
        if (ctaid_x_volatile() + ti * nctaid_x_volatile() >= num_tiles) break;
        wmx_p_consumer_tile<AMN, BMN>(LPM_GG_ARGS, smem, s0, abar, sbar, tail_len, seq_kt, seq_j,
                                      ti, j);
        j += static_cast<int>(lds_u32_volatile(seq_kt));
    }
}

}  // namespace lpm_gg

// extern "C" entry point NAME of the persistent warp-specialised MXFP8 kernel (sm_90a; AMN /
// BMN as in LPM_GG_DEFINE_WS_MX): gemm_ws_mx's four tensor maps, then the number of output tiles,
// which the CTAs share (tile blockIdx.x, + gridDim.x, ...). On other architectures the wgmma
// compile to traps; the launcher never selects it there.
#define LPM_GG_DEFINE_WS_MX_P(NAME, AMN, BMN)                                                  \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWsThreads, 1)                        \
        NAME(LPM_GG_PARAMS, LPM_GG_WS_TMA_PARAMS, int num_tiles) {                             \
        lpm_gg::gemm_ws_mx_p<AMN, BMN>(LPM_GG_ARGS, LPM_GG_WS_TMA_ARGS, num_tiles);            \
    }

#endif  // LPM_GROUPED_GEMM_WS_MX_PERSIST_CUH
