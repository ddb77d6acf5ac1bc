// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// persistent form of the 384-thread warp-specialised NVFP4 kernel gemm_ws_n256, gemm_ws_p, and
// its entry-point macro LPM_GG_DEFINE_WS_NP.
//
// gemm_ws_n256 runs one 128 x 256 output tile per CTA, so every tile pays the CTA's
// start (barrier set-up, the first copies' latency, the first expansion before any wgmma) and
// an epilogue during which the producers sit idle. gemm_ws_p runs one CTA per SM (the launcher
// sizes the grid) over tiles blockIdx.x, + gridDim.x, ... and treats the CTA's tiles as one
// long contraction of J = tiles x KT k-tiles: raw stages, canonical buffers, scale slots,
// mbarrier phases and the copy schedule all run on the flattened k-tile index j, so the
// producers request and expand the next tile's first k-tiles while the consumers finish the
// current one and run its epilogue. Each consumer warp stages its accumulators through its
// own small buffer past the pipeline's (no CTA barrier), because the pipeline buffers already
// hold the next tile: 16-bit words, 128 columns at a time, for 16-bit output without bias
// (reg_epi, grouped_gemm_epi_regs.cuh, with a column-amax table per warp when row-scaled),
// else 64 fp32 columns at a time (Epilogue::warp_tile).
// Conditions (the launcher's): those of the TMA build, one contraction length for every expert,
// at least one k-tile and a whole number of scale groups (kWsScaleTiles k-tiles) per tile, so
// that a scale group never straddles two tiles. Every output element gets the same products in
// the same order and the same epilogue arithmetic as in gemm_ws: the results are bitwise its.
// The consumers run each tile's k-tiles in spans of the ring period (ws_fp4_consume_span), so
// every ring index stays a constant as in gemm_ws_n256, and keep their B units' addresses in
// their warp's staging buffer between epilogues.

#ifndef LPM_GROUPED_GEMM_WS_PERSIST_CUH
#define LPM_GROUPED_GEMM_WS_PERSIST_CUH

#include "grouped_gemm_ws_fp4.cuh"
#include "grouped_gemm_ws_n256.cuh"

namespace lpm_gg {

template <int AKIND, int BKIND>
__device__ __forceinline__ void gemm_ws_p(LPM_GG_PARAMS, const TmaMap* tm_a, const TmaMap* tm_b,
                                          const TmaMap* tm_as, const TmaMap* tm_bs,
                                          int num_tiles) {
    constexpr int BM = 128, BN = 256;
    static_assert(AKIND == KIND_FP4_K && BKIND == KIND_FP4_K, "NVFP4 operands only");
    using L = WsTmaLayout;  // gemm_ws's TMA layout, then the consumer warps' staging buffers
    constexpr int NT = kWnThreads;  // the FULL / EMPTY barriers' count
    constexpr int NST = kWsStages, NCB = kWsCanonBuffers, AHEAD = kWsAhead;
    constexpr int NSG = kWsScaleSlots, SGT = kWsScaleTiles;
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)
    constexpr int SMEM = ws_p_smem_bytes();
    static_assert(L::T_END + (kWsConsumers / 32) * (Epilogue::kWarpBufFloats + kEpiColTable) * 4 +
                          1024 == SMEM && SMEM <= kMaxSmem,
                  "shared memory: the TMA build's, then the staging buffers and column tables");
    static_assert(Epilogue::kWarpBufFloats * 4 == reg_epi_bytes<BN / 2>() && kEpiColTable == BN / 2,
                  "a staging buffer holds half a warp's rows in 16 bits, a table their column "
                  "amaxes (reg_epi)");
    static_assert(AHEAD == 3 && kBK == 64, "the leader's tile rows (below)");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != 16 || b_ch != 16, s0);

    if (static_cast<int>(blockIdx.x) >= num_tiles) return;  // (the launcher's grid is smaller)
    // This CTA's tiles T0, T0 + TS, ... (my_tiles of them); every expert contracts the same KT
    // k-tiles, a multiple of SGT (the launcher's conditions): J k-tiles and NG scale groups in
    // all. Each role computes them after the register split: values live across setmaxnreg
    // are spilled (and reloaded in every k-tile).
    auto schedule = [&](int& T0, int& TS, int& my_tiles, int& KT, int& J, int& NG) {
        persist_schedule<BM, BN, SGT>(num_tiles, tiles, n_col_tiles, desc, n_cols, T0, TS,
                                      my_tiles, KT, J, NG);
    };

    // mbarriers of the raw stages (data) and of the scale slots, one arrival each (the issuing
    // thread's expect_tx) plus the copies' bytes.
    __shared__ __align__(8) unsigned long long ws_bar[NST + NSG];
    const unsigned dbar = smem_u32(ws_bar), sbar = dbar + 8 * NST;
    ws_fp4_bars_init(dbar, threadIdx.x == kWsConsumers);

    if (threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups ----------------
        regs_release<kWnProducerRegs>();
        int T0, TS, my_tiles, KT, J, NG;
        schedule(T0, TS, my_tiles, KT, J, NG);
        const int NGT = KT / SGT;  // scale groups per tile
        const unsigned t = threadIdx.x - kWsConsumers;
        const bool leader = t == 0;
        // The leader's tensor-map rows of tiles ti (slot ti % 2) and ti + 1, where ti is the
        // data stream's tile: the next tile's are loaded when the stream enters ti, and used a
        // tile later. The scale stream runs 3 k-tiles ahead of the data stream (group q at
        // k-tile 4q - 6, data k-tile j + 3 at k-tile j), so with KT >= 4 it is in tile ti or
        // ti + 1. Kept in shared memory: the producers' registers are few.
        __shared__ WsRows rows_of[2];
        if (leader) {
            rows_of[0] = ws_rows_of<BM, BN>(T0, tiles, n_col_tiles, desc, n_cols);
            if (my_tiles > 1)
                rows_of[1] = ws_rows_of<BM, BN>(T0 + TS, tiles, n_col_tiles, desc, n_cols);
        }
        // Both streams are requested in order (data k-tiles 0, 1, ..., scale groups 0, 1, ...),
        // so each keeps its tile and its position in it as counters: a division by the
        // runtime KT per request (the leader's warp also expands B) made the persistent
        // 384-thread form 15 % slower per k-tile than the per-tile one.
        int d_ti = 0, d_kt = 0;  // the data stream's next tile and k-tile in it
        auto issue_data = [&](int j) {
            int ti, kt;
            stream_next(d_ti, d_kt, KT, ti, kt);
            if (kt == 0 && ti > 0 && ti + 1 < my_tiles)  // the stream enters tile ti
                rows_of[(ti + 1) & 1] =
                    ws_rows_of<BM, BN>(T0 + (ti + 1) * TS, tiles, n_col_tiles, desc, n_cols);
            ws_fp4_issue_data(s0, dbar, j % NST, kt, rows_of[ti & 1], tm_a, tm_b);
        };
        int s_ti = 0, s_q = 0;  // the scale stream's next tile and group in it
        auto issue_scales = [&](int q) {
            int ti, qt;
            stream_next(s_ti, s_q, NGT, ti, qt);
            ws_fp4_issue_scales(s0, sbar, q % NSG, qt, rows_of[ti & 1], tm_as, tm_bs);
        };
        if (leader) ws_fp4_issue_first(J, NG, issue_data, issue_scales);
        const WsFp4Units u(t);
        // columns of the current tile (units past them are not expanded)
        auto cols_of = [&](int ti) {
            const long long cv = n_cols - static_cast<long long>((T0 + ti * TS) % n_col_tiles) * BN;
            return static_cast<int>(cv < BN ? cv : BN);
        };
        int kt = 0, ti = 0, cv = cols_of(0);
        for (int j = 0; j < J; ++j) {
            ws_fp4_produce<NT>(j, J, NG, leader, s0, dbar, sbar, u, cv, issue_data,
                               issue_scales);
            if (++kt == KT) {
                kt = 0;
                cv = cols_of(++ti);
            }
        }
        return;
    }

    // ---------------- consumer warpgroups ----------------
    // gemm_ws_n256's consumers, tile after tile; at a tile's end every MMA
    // retires, the last k-tile's canonical buffer goes back to the producers at once (they
    // expand the next tile's first k-tiles meanwhile) and each warp runs its rows' epilogue.
    regs_claim<kWnConsumerRegs>();
    int T0, TS, my_tiles, KT, J, NG;
    schedule(T0, TS, my_tiles, KT, J, NG);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm0 = 64 * (warp >> 2) + 16 * (warp & 3);
    const int aq = lane & 3;
    float acc[NI * 4];
    float* const accf = acc;
    // the lanes' B-unit addresses, 16 bytes each at the start of the warp's staging buffer
    // (after the pipeline buffers) between epilogues, and the first k-tile's unit
    static_assert(32 * 16 <= Epilogue::kWarpBufFloats * 4, "unit addresses in a staging buffer");
    const WsNextUnit nu(threadIdx.x, s0,
                        smem_u32(smem + L::T_END) + warp * Epilogue::kWarpBufFloats * 4 +
                            16 * lane);
    if (J > 0) ws_n256_consumer_unit(0, 0u, dbar, sbar, nu);
    unsigned ph_s = 0u;  // the scale slots' phase of the current span's period
    // after step 1 of k-tile kt (ring position u), the unit of k-tile kt + 1 (the next
    // tile's first at a tile's last)
    const auto next_unit = [&](int u, int kt, int s) {
        if (s == 1 && kt + 1 < J) ws_n256_consumer_unit(u + 1, ph_s, dbar, sbar, nu);
    };
    const WsARow me(threadIdx.x);
    int j = 0;
    for (int ti = 0; ti < my_tiles; ++ti) {
        // the tile's place, kept in few registers across the k-loop (only the epilogue uses it)
        const CtaTile tl = locate_tile_at<BM, BN>(T0 + ti * TS, tiles, n_col_tiles, desc, n_cols);
        const long long* const d = tl.d;
        const int r0 = static_cast<int>(tl.r0), c0 = static_cast<int>(tl.c0);
        const int rows_valid = tl.rows_valid<BM>(), cols_valid = tl.cols_valid<BN>();
#pragma unroll
        for (int i = 0; i < NI * 4; ++i) acc[i] = 0.0f;
        {
            // the tile's k-tiles kfirst .. kend - 1 of the flattened sequence, in spans of the
            // ring period (every ring index a constant of the unrolled span)
            constexpr int P = kWsRingPeriod;
            const int kfirst = j, kend = j + KT;
            while (j < kend) {
                const int k0 = j - j % P;
                ph_s = static_cast<unsigned>(k0 / P) & 1u;
                ws_fp4_consume_span<NI * 4, kWnThreads, true, true>(
                    accf, k0, j, kfirst, kend, J, s0, dbar, sbar, me, aq, next_unit);
                j = k0 + P < kend ? k0 + P : kend;
            }
        }
        wg_wait0();
        wg_fence_acc<NI * 4>(accf);
        if (j - 1 + NCB < J) named_arrive(WS_BAR_EMPTY + (j - 1) % NCB, NT);
        Epilogue ep = LPM_GG_EPILOGUE_OF(d);
        ep.init_alpha();
        // the warp's staging buffer and (row-scaled register epilogue) column table, after the
        // pipeline buffers (computed here: nothing of the epilogue stays live in the k-loop)
        float* const ws = reinterpret_cast<float*>(smem + L::T_END) +
                          (threadIdx.x >> 5) * Epilogue::kWarpBufFloats;
        if (reg_epi_ok(ep)) {
            // 128 columns at a time: the staging buffer is reg_epi_bytes<128>() (static_assert)
            const unsigned tab = smem_u32(smem + L::T_END) +
                                 (kWsConsumers / 32) * Epilogue::kWarpBufFloats * 4 +
                                 (threadIdx.x >> 5) * (kEpiColTable * 4);
            reg_epi<NI, false, NI / 2>(ep, smem_u32(ws), tab, accf, wm0, lane, r0, c0,
                                       rows_valid, cols_valid);
        } else {
            ep.warp_tile<NI>(ws, accf, wm0, lane, r0, c0, rows_valid, cols_valid);
        }
        __syncwarp();  // every lane's last read of the staging buffer is done
        nu.store(threadIdx.x, s0);
    }
}

}  // namespace lpm_gg

// extern "C" entry point NAME of the persistent warp-specialised NVFP4 kernel (sm_90a, gemm_ws_n256's
// 384-thread roles): the four tensor maps of the TMA build, then the number of output tiles,
// which the CTAs share (tile blockIdx.x, + gridDim.x, ...). On other architectures the wgmma
// compile to traps; the launcher never selects it there.
#define LPM_GG_DEFINE_WS_NP(NAME)                                                              \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWnThreads, 1)                        \
        NAME(LPM_GG_PARAMS, LPM_GG_WS_TMA_PARAMS, int num_tiles) {                             \
        lpm_gg::gemm_ws_p<lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K>(                       \
            LPM_GG_ARGS, LPM_GG_WS_TMA_ARGS, num_tiles);                                       \
    }

#endif  // LPM_GROUPED_GEMM_WS_PERSIST_CUH
