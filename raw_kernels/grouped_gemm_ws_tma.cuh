// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the TMA
// build of the warp-specialised NVFP4 kernel, gemm_ws_tma, persistent, and its entry-point macro
// LPM_GG_DEFINE_WS_TMA. The roles, tile (128 x 256, 512 threads), decode and wgmma sequence are
// gemm_ws's (grouped_gemm_ws.cuh), so the results are bitwise those of gemm_ws and of the other
// wgmma kernels. What differs:
//   * loads: one producer thread issues tensor-map copies -- each k-tile's A (128 x 32 B) and
//     B (256 x 32 B) data boxes into a raw stage, and the block scales of kWsScaleTiles k-tiles
//     at a time (a 16-byte box per row) into one of kWsScaleSlots scale slots; both complete
//     on mbarriers that the producers wait on before expanding B and the consumers before
//     decoding A. The other producer threads only expand B;
//   * persistence: CTA c visits the output tiles c, c + gridDim.x, ... (n_tiles in all). Its
//     k-tiles form one sequence across those tiles: raw stages, canonical buffers, scale slots
//     and barrier phases follow the sequence number j, so the producers copy and expand the
//     next tile's first k-tiles while the consumers run this tile's last MMAs and epilogue;
//   * epilogue: each consumer warpgroup stages its 64 rows kWsEpiCols columns at a time in a
//     region of its own (ws_tma_smem_bytes), which the producers never touch.
// The launcher guarantees uniform row strides (multiples of 16 bytes) for data and scales,
// experts starting at whole rows, and one contraction length for every expert, a positive
// multiple of the k-tile (so every tile has the same KT). Rows past an expert's extent load the
// next expert's rows (or zeros past the array); they only reach outputs that are never stored.
// Launched with gridDim.x == n_tiles, it is the one-tile-per-CTA kernel.

#ifndef LPM_GROUPED_GEMM_WS_TMA_CUH
#define LPM_GROUPED_GEMM_WS_TMA_CUH

#include "grouped_gemm_ws.cuh"
#include "grouped_gemm_tma.cuh"

namespace lpm_gg {

// The producers hold no copy state, and the consumers keep a step's raw words one step ahead:
// 8 registers move from the producers to the consumers (against gemm_ws).
constexpr int kWsTmaConsumerRegs = kWsConsumerRegs + 8;
constexpr int kWsTmaProducerRegs =
    (kWsLaunchRegs * kWsThreads - kWsTmaConsumerRegs * kWsConsumers) / kWsProducers / 8 * 8;  // 72
static_assert(kWsTmaProducerRegs % 8 == 0 && kWsTmaProducerRegs >= 24, "setmaxnreg granularity");
constexpr int WS_BAR_EPI_WG = 9;  // + consumer warpgroup: its epilogue staging

template <int AKIND, int BKIND, bool F16>
__device__ __forceinline__ void gemm_ws_tma(LPM_GG_PARAMS, const TmaMap* tm_a, const TmaMap* tm_b,
                                            const TmaMap* tm_as, const TmaMap* tm_bs,
                                            int n_tiles) {
    constexpr int BM = 128, BN = 256;
    static_assert(AKIND == KIND_FP4_K && BKIND == KIND_FP4_K && F16, "NVFP4 operands only");
    constexpr int CANON_B = canon_bytes(BN);
    constexpr int NST = kWsStages, NCB = kWsCanonBuffers, AHEAD = kWsAhead;
    constexpr int NSG = kWsScaleSlots, SGT = kWsScaleTiles;
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)
    // Shared memory: raw stages of data only, the canonical B buffers, the scale slots (row r's
    // 16 scale bytes -- 4 per k-tile -- at 16 r; A's 128 rows, then B's 256), the epilogue's.
    constexpr int T_DA = raw_data_bytes(AKIND, BM), T_STAGE = T_DA + raw_data_bytes(BKIND, BN);
    constexpr int T_CANON = NST * T_STAGE;
    constexpr int T_SLD = SGT * (kBK / LPM_NVFP4_BLOCK);  // 16
    constexpr int T_SC = T_CANON + NCB * CANON_B, T_SLOT = ws_tma_scale_slot_bytes();
    constexpr int T_SB = BM * T_SLD;  // B's rows in a slot
    constexpr int T_EPI = T_SC + NSG * T_SLOT;
    constexpr int ECOLS = kWsEpiCols, ELD = kWsEpiLd;
    constexpr int SMEM = ws_tma_smem_bytes();
    // A scale group is requested once its first k-tile is at most LOOK k-tiles ahead of the one
    // being expanded (and its slot is free): with whole groups, group g at k-tile 4g - 6.
    constexpr int LOOK = AHEAD + NCB;
    static_assert(T_CANON % 1024 == 0 && CANON_B % 1024 == 0, "128-byte swizzle atoms");
    static_assert(T_STAGE % 128 == 0 && T_DA % 128 == 0 && T_SLOT % 128 == 0 &&
                      T_SB % 128 == 0 && T_SLD == 16,
                  "TMA destinations must be 128-byte aligned");
    static_assert(T_EPI + ws_tma_epi_bytes() + 1024 == SMEM && ws_tma_epi_bytes() ==
                      2 * 64 * ELD * 4 && BN % ECOLS == 0 && ECOLS % 8 == 0,
                  "shared memory");
    static_assert(AHEAD + NCB == NST && NCB >= 2 && NCB <= 3 && kBK == 64, "pipeline depth");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != 16 || b_ch != 16, s0);

    const int grid = static_cast<int>(gridDim.x), cta = static_cast<int>(blockIdx.x);
    if (cta >= n_tiles) return;
    const int n_my = (n_tiles - cta + grid - 1) / grid;  // this CTA's tiles
    const int KT = static_cast<int>(
        (locate_tile_at<BM, BN>(cta, tiles, n_col_tiles, desc, n_cols).len + kBK - 1) / kBK);
    if (KT <= 0) {  // not launched so (the launcher requires a positive length); kept total
        for (int i = 0; i < n_my; ++i) {
            const CtaTile ct = locate_tile_at<BM, BN>(cta + i * grid, tiles, n_col_tiles, desc,
                                                      n_cols);
            if (zero_if_empty && ct.rv > 0 && ct.cv > 0)
                LPM_GG_EPILOGUE_OF(ct.d).zero_tile(ct.r0, ct.c0, ct.rows_valid<BM>(),
                                                   ct.cols_valid<BN>(), kWsThreads);
        }
        return;
    }
    const int J = n_my * KT;                   // k-tiles of this CTA, in sequence
    const int NGT = (KT + SGT - 1) / SGT;      // scale groups per tile
    const int NGJ = n_my * NGT;                // scale groups of this CTA, in sequence

    // mbarriers of the raw stages (data) and of the scale slots, one arrival each (the issuing
    // thread's expect_tx) plus the copies' bytes.
    __shared__ __align__(8) unsigned long long ws_bar[NST + NSG];
    const unsigned dbar = smem_u32(ws_bar), sbar = dbar + 8 * NST;
    if (threadIdx.x == kWsConsumers) {
#pragma unroll
        for (int i = 0; i < NST + NSG; ++i) mbar_init(dbar + 8 * i, 1);
        mbar_init_fence();
    }
    __syncthreads();

    if (threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups ----------------
        regs_release<kWsTmaProducerRegs>();
        const unsigned t = threadIdx.x - kWsConsumers;
        const bool leader = t == 0;
        // The leader's two cursors, advanced one copy at a time (no division on its path: the
        // other producers wait for its copies). Data: the next k-tile to request (tile slot i:
        // tile cta + i * grid, k-tile kt, raw stage st) and that tile's first rows in the data
        // maps. Scales: the next group to request (slot, group g of the tile, its first k-tile
        // in the sequence, scale slot sl), that tile's first rows in the scale maps, and the
        // last k-tiles of the three groups requested before it (the previous holders of the
        // slots; far in the past before any).
        int d_slot = 0, d_kt = 0, d_st = 0, d_arow = 0, d_brow = 0;
        int s_slot = 0, s_g = 0, s_first = 0, s_sl = 0, s_arow = 0, s_brow = 0;
        int s_last0 = -(1 << 30), s_last1 = -(1 << 30), s_last2 = -(1 << 30);
        static_assert(NSG == 3, "three slots: s_last0 .. s_last2");
        auto map_rows = [&](int slot, bool scales, int& ra, int& rb) {
            const CtaTile ct = locate_tile_at<BM, BN>(cta + slot * grid, tiles, n_col_tiles,
                                                      desc, n_cols);
            const long long* dd = ct.d;
            if (scales) {
                ra = static_cast<int>(dd[D_A_SOFF] / dd[D_A_SLD] + ct.r0);
                rb = static_cast<int>(dd[D_B_SOFF] / dd[D_B_SLD] + ct.c0);
            } else {
                ra = static_cast<int>(dd[D_A_OFF] / dd[D_A_LD] + ct.r0);
                rb = static_cast<int>(dd[D_B_OFF] / dd[D_B_LD] + ct.c0);
            }
        };
        if (leader) {
            map_rows(0, false, d_arow, d_brow);
            map_rows(0, true, s_arow, s_brow);
        }
        int d_left = J;  // k-tiles not requested yet
        auto issue_data = [&]() {
            const unsigned sb = s0 + d_st * T_STAGE, bar = dbar + 8 * d_st;
            const int kb = d_kt * (kBK / 2);  // NVFP4: two elements per byte
            mbar_arrive_expect_tx(bar, T_STAGE);
            tma_load_2d(sb, tm_a, bar, kb, d_arow);
            tma_load_2d(sb + T_DA, tm_b, bar, kb, d_brow);
            --d_left;
            d_st = d_st + 1 == NST ? 0 : d_st + 1;
            if (++d_kt == KT && d_left > 0) {
                d_kt = 0;
                map_rows(++d_slot, false, d_arow, d_brow);
            }
        };
        int s_left = NGJ;  // scale groups not requested yet
        auto issue_scales = [&]() {
            const unsigned sb = s0 + T_SC + s_sl * T_SLOT, bar = sbar + 8 * s_sl;
            mbar_arrive_expect_tx(bar, T_SLOT);
            tma_load_2d(sb, tm_as, bar, s_g * T_SLD, s_arow);
            tma_load_2d(sb + T_SB, tm_bs, bar, s_g * T_SLD, s_brow);
            const int n = KT - s_g * SGT;  // k-tiles of the tile from this group on
            s_last0 = s_last1;
            s_last1 = s_last2;
            s_last2 = s_first + (n < SGT ? n : SGT) - 1;
            s_first = s_last2 + 1;
            --s_left;
            s_sl = s_sl + 1 == NSG ? 0 : s_sl + 1;
            if (++s_g == NGT && s_left > 0) {
                s_g = 0;
                map_rows(++s_slot, true, s_arow, s_brow);
            }
        };
        // At k-tile j (after its EMPTY wait, so k-tiles <= j - NCB retired): request every
        // group due within LOOK whose slot is free (its previous holder's last k-tile retired).
        auto issue_due = [&](int j) {
            while (s_left > 0 && s_first <= j + LOOK && s_last0 <= j - NCB) issue_scales();
        };
        if (leader) {
            for (int q = 0; q < AHEAD && d_left > 0; ++q) issue_data();
            issue_due(-1);
        }
        using GB = TileGeo<BKIND, BN>;
        constexpr int NU = GB::UNITS / kWsProducers;
        static_assert(GB::UNITS % kWsProducers == 0, "B units per producer thread");
        int j = 0;
        for (int i = 0; i < n_my; ++i) {
            const int cols_valid = locate_tile_at<BM, BN>(cta + i * grid, tiles, n_col_tiles,
                                                          desc, n_cols)
                                       .cols_valid<BN>();
            for (int kt = 0; kt < KT; ++kt, ++j) {
                const int cb = j % NCB;
                // k-tile j-NCB retired: its canonical buffer and its raw stage (which k-tile
                // j+AHEAD takes) are free.
                if (j >= NCB) named_sync(WS_BAR_EMPTY + cb, kWsThreads);
                if (leader) {
                    if (d_left > 0) issue_data();  // k-tile j + AHEAD
                    issue_due(j);
                }
                const int st = j % NST, G = i * NGT + kt / SGT;
                mbar_wait(dbar + 8 * st, static_cast<unsigned>(j / NST) & 1u);
                mbar_wait(sbar + 8 * (G % NSG), static_cast<unsigned>(G / NSG) & 1u);
                // Expand k-tile j's B half into canonical buffer cb.
                const unsigned char* rb = smem + st * T_STAGE + T_DA;
                const unsigned char* rsb =
                    smem + T_SC + (G % NSG) * T_SLOT + T_SB + (kt % SGT) * 4;
                unsigned char* cbuf = smem + T_CANON + cb * CANON_B;
                UnitRaw<BKIND> xb[NU];
#pragma unroll
                for (int u = 0; u < NU; ++u)
                    xb[u] = unit_load<BKIND, BN, T_SLD>(rb, rsb,
                                                        static_cast<int>(t) + u * kWsProducers);
#pragma unroll
                for (int u = 0; u < NU; ++u) {
                    const int un = static_cast<int>(t) + u * kWsProducers;
                    if (unit_live<BKIND>(un, cols_valid))
                        unit_store<BKIND, BN, false>(xb[u], cbuf, un);
                }
                fence_proxy_async();
                named_arrive(WS_BAR_FULL + cb, kWsThreads);
            }
        }
        return;
    }

    // ---------------- consumer warpgroups ----------------
    // Warpgroup w owns rows 64w..64w+63 x all 256 columns: per 16-deep step two m64n128k16
    // with A from registers (this thread's fragment rows ar, ar + 8, decoded from the raw
    // stage) and B from the canonical buffer. Each step is one commit group, so a step's
    // fragments are decoded while the previous step's wgmma run.
    regs_claim<kWsTmaConsumerRegs>();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2;
    const int wm0 = 64 * wg + 16 * (warp & 3);
    const int ar = wm0 + (lane >> 2), aq = lane & 3;
    const unsigned sel = static_cast<unsigned>(aq) | (static_cast<unsigned>(aq + 4) << 4);
    float acc[1][NI][4];
    float* const accf = &acc[0][0][0];
    float* const cs = reinterpret_cast<float*>(smem + T_EPI) + wg * 64 * ELD;
    int j = 0;
    for (int i = 0; i < n_my; ++i) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[0][ni][e] = 0.0f;
        for (int kt = 0; kt < KT; ++kt, ++j) {
            const int cb = j % NCB, st = j % NST, G = i * NGT + kt / SGT;
            named_sync(WS_BAR_FULL + cb, kWsThreads);  // B of k-tile j expanded into buffer cb
            // the producers waited for these copies before arriving at FULL; waiting here too
            // makes the TMA writes visible to this thread (already complete: one try_wait)
            mbar_wait(dbar + 8 * st, static_cast<unsigned>(j / NST) & 1u);
            mbar_wait(sbar + 8 * (G % NSG), static_cast<unsigned>(G / NSG) & 1u);
            const unsigned char* const rsc = smem + T_SC + (G % NSG) * T_SLOT + (kt % SGT) * 4;
            const unsigned char* const ra = smem + st * T_STAGE + ar * (kBK / 2);
            const unsigned long long db = wg_desc(s0 + T_CANON + cb * CANON_B, 16, 1024);
            unsigned af[2][1][4];  // fragments of the step in flight and of the next one
            // Each step's raw words are loaded one step ahead, before the wgmma wait, so that
            // only the decode stands between that wait and the next wgmma (the rows' scale
            // words once per k-tile).
            const unsigned sa = *reinterpret_cast<const unsigned*>(rsc + ar * T_SLD);
            const unsigned sb = *reinterpret_cast<const unsigned*>(rsc + (ar + 8) * T_SLD);
            uint2 wa = *reinterpret_cast<const uint2*>(ra);
            uint2 wb = *reinterpret_cast<const uint2*>(ra + 8 * (kBK / 2));
#pragma unroll
            for (int s = 0; s < kBK / 16; ++s) {
                // At most one group (step) pending: step s-2's fragments are free, and at s = 1
                // the whole of k-tile j-1 retired.
                wg_wait<1>();
                wg_fence_acc<NI * 4>(accf);
                if (s == 1 && kt >= 1 && j - 1 + NCB < J)
                    named_arrive(WS_BAR_EMPTY + (j - 1) % NCB, kWsThreads);
                fp4_a_step(s, wa.x, wa.y, wb.x, wb.y, sa, sb, sel, af[s & 1][0]);
                if (s + 1 < kBK / 16) {  // the next step's words, in flight across the wait
                    wa = *reinterpret_cast<const uint2*>(ra + (s + 1) * 8);
                    wb = *reinterpret_cast<const uint2*>(ra + 8 * (kBK / 2) + (s + 1) * 8);
                }
                wg_fence();
#pragma unroll
                for (int n = 0; n < 2; ++n)
                    wgmma_m64n128k16_rs(accf + 64 * n, af[s & 1][0],
                                        db + ((n * (128 * 128) + s * 32) >> 4));
                wg_commit();
                wg_fence_acc<NI * 4>(accf);
            }
        }
        wg_wait0();
        wg_fence_acc<NI * 4>(accf);
        // The tile's last k-tile retired (in the loop above, k-tile j-1 is released at the
        // next k-tile of the same tile).
        if (j - 1 + NCB < J) named_arrive(WS_BAR_EMPTY + (j - 1) % NCB, kWsThreads);
        // (the tile and its epilogue only now: nothing of them stays live across the k-loop)
        const CtaTile ct =
            locate_tile_at<BM, BN>(cta + i * grid, tiles, n_col_tiles, desc, n_cols);
        Epilogue ep = LPM_GG_EPILOGUE_OF(ct.d);
        ep.init_alpha();
        // Epilogue, ECOLS columns at a time through this warpgroup's staging rows: warp v of
        // the warpgroup stages rows 16v..16v+15 (fragments 8c/ECOLS ..), then the warpgroup's
        // 128 threads store them.
        const int rows_here = min(ct.rows_valid<BM>() - 64 * wg, 64);  // this warpgroup's
#pragma unroll  // static accumulator indices (a dynamic one would put them in local memory)
        for (int c = 0; c < BN / ECOLS; ++c) {
            stage_acc<1, ECOLS / 8, ELD>(cs, accf + c * (ECOLS / 8) * 4, 16 * (warp & 3), 0,
                                         lane);
            named_sync(WS_BAR_EPI_WG + wg, 128);
            ep.tile<ECOLS, ELD, 128>(cs, ct.r0 + 64 * wg, ct.c0 + c * ECOLS, rows_here,
                                     min(ct.cols_valid<BN>() - c * ECOLS, ECOLS),
                                     static_cast<int>(threadIdx.x & 127));
            named_sync(WS_BAR_EPI_WG + wg, 128);
        }
    }
}

}  // namespace lpm_gg

// extern "C" entry point NAME of the TMA build (sm_90a; NVFP4, 16-byte rows): the parameters of
// LPM_GG_PARAMS, then the tensor maps of A's and B's data and block scales, passed by value, and
// the number of output tiles (the grid may be smaller: persistent CTAs).
#define LPM_GG_DEFINE_WS_TMA(NAME, AKIND, BKIND, F16)                                          \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWsThreads, 1)                        \
        NAME(LPM_GG_PARAMS, const __grid_constant__ lpm_gg::TmaMap tma_a,                      \
             const __grid_constant__ lpm_gg::TmaMap tma_b,                                     \
             const __grid_constant__ lpm_gg::TmaMap tma_as,                                    \
             const __grid_constant__ lpm_gg::TmaMap tma_bs, int n_tiles) {                     \
        lpm_gg::gemm_ws_tma<AKIND, BKIND, F16>(LPM_GG_ARGS, &tma_a, &tma_b, &tma_as, &tma_bs,  \
                                               n_tiles);                                       \
    }

#endif  // LPM_GROUPED_GEMM_WS_TMA_CUH
