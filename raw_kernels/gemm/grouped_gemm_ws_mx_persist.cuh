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
//   * One staging mode for the whole launch: the fp16 window when the launcher's range kernel
//     (grouped_gemm_mx_ranges.cuh) found every row of both operands in it, else bf16. Each role
//     then runs one loop over its tiles per mode (a loop per mode inside the loop over tiles
//     left ptxas short of registers: it serialized the wgmma and spilled the accumulators).
//     In the window, the producers write each tile's rows' and columns' largest codes and
//     their range (mx_window_check_ranges on their own named barrier) into window slot
//     ti % 2 before they widen its first k-tile -- for tile ti + 1 while the consumers run
//     tile ti's last k-tiles -- and signal it on WS_BAR_WIN; the consumers read the slot at
//     the tile's start (A's factors) and end (rescale). A slot is rewritten two tiles later,
//     once the consumers have handed back a k-tile of the tile between (KT >= 4: the EMPTY
//     barrier the producers pass before that).
//   * At a tile's end the consumers retire their wgmma, hand back the last k-tile's canonical
//     buffer, rescale (fp16 window) and run the register epilogue (reg_epi, 64 columns at a
//     time) through each warp's own staging buffer; the producers meanwhile widen the next
//     tile's first three k-tiles. (Staged through the last canonical buffer, which went back
//     only after the epilogue, the producers sat idle for ~4.5 us of a ~15 us tile:
//     The staging buffers take the space of one B stage: the copies
//     are requested kWmxPAhead = 2 k-tiles ahead instead of 3.) The launcher allows no
//     output scaling, so the epilogue is reg_epi_unscaled: two variants inlined per k-loop
//     build instead of reg_epi's six, which halved the module's code. (Together: 1-6 %
//     faster on the H200.)
// Conditions (the launcher's): those of gemm_ws_mx's TMA build, one contraction length for
// every expert of whole k-tiles (no tail: wmx_consume<..., TAIL = false>), a whole, nonzero
// number of scale groups (kWmxScaleTiles k-tiles) per tile, 16-bit
// output without bias (reg_epi_ok), block scales 16-byte aligned for the window scan's rule
// (mx_scan_aligned, so that the launch's mode is every tile's mode in gemm_ws_mx when all rows
// are in the window). Every output element gets the same products in the same order and the
// same epilogue arithmetic as in gemm_ws_mx in the same staging mode: the results are
// gemm_ws_mx's bit for bit whenever the two modes agree, i.e. except for blocks of magnitude
// below ~1e-35 in tiles that gemm_ws_mx stages on fp16 while some other row of the launch
// leaves the window (grouped_gemm_mxf16.cuh).

#ifndef LPM_GROUPED_GEMM_WS_MX_PERSIST_CUH
#define LPM_GROUPED_GEMM_WS_MX_PERSIST_CUH

#include "grouped_gemm_epi_regs.cuh"
#include "grouped_gemm_ws_mx.cuh"

namespace lpm_gg {

constexpr int WS_BAR_WIN = WS_BAR_EMPTY + kWmxCanonBuffers;  // a tile's window slot is written

// A persistent consumer's tile end (gemm_ws_mx_p, gemm_ws_mx_g) after its k-loop, whose last
// k-tile was jl of the CTA's J: retire the wgmma, hand jl's canonical buffer back to the
// producers before the epilogue (which stages through each warp's own buffer) when a later
// k-tile takes it, and in the fp16 window (H) rescale by the tile's window slot w.
template <bool H, bool AMN, int NI, class Frag>
__device__ __forceinline__ void wmx_tile_drain(float* accf, int jl, int J, const unsigned char* w,
                                               int shift, const Frag& fr) {
    constexpr int NCB = kWmxCanonBuffers, BM = 128, W_RANGE = BM + 256;
    wg_wait0();
    wg_fence_acc<NI * 4>(accf);
    if (jl + NCB < J) named_arrive(WS_BAR_EMPTY + jl % NCB, kWsThreads);
    if constexpr (H) {
        mx_rescale<1, NI, AMN>(accf, w, w + BM, shift, fr.wm0, 0, fr.lane,
                               reinterpret_cast<const unsigned*>(w + W_RANGE));
    }
}

template <bool AMN, bool BMN>
__device__ __forceinline__ void gemm_ws_mx_p(LPM_GG_PARAMS, const TmaMap* tm_a, const TmaMap* tm_b,
                                             const TmaMap* tm_as, const TmaMap* tm_bs,
                                             LPM_GG_MX_RANGE_PARAMS, int num_tiles) {
    constexpr int BM = 128, BN = 256;
    using L = WmxLayout<AMN, BMN, kWmxPAhead>;
    constexpr int NSA = L::NSA, NSB = L::NSB, NCB = kWmxCanonBuffers, AHEAD = L::AHEAD;
    constexpr int NSG = kWmxScaleSlots, SGT = kWmxScaleTiles;
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)
    constexpr int SMEM = ws_mx_p_smem_bytes();
    // the consumer warps' epilogue staging buffers, then the window slots (codes of A's rows,
    // of B's columns, their range over the tile)
    constexpr int EPI_B = reg_epi_bytes<BN / 4>();  // a consumer warp's staging buffer
    constexpr int T_EPI = L::T_EXPS, T_WIN = T_EPI + kWmxEpiStaging;
    constexpr int W_RANGE = BM + BN;
    static_assert(T_WIN + 2 * kWmxWinSlot + 1024 == SMEM && SMEM <= kMaxSmem &&
                      W_RANGE + 16 <= kWmxWinSlot && kWmxWinSlot % 16 == 0 && T_EPI % 16 == 0,
                  "shared memory: gemm_ws_mx's buffers, the staging buffers, the window slots");
    static_assert((kWsConsumers / 32) * EPI_B == kWmxEpiStaging,
                  "one staging buffer per consumer warp");
    static_assert(WS_BAR_WIN < 16 && SGT > NCB,
                  "named barriers; a slot is reused after a k-tile of the tile between is "
                  "handed back");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != 16 || b_ch != 16, s0);

    if (static_cast<int>(blockIdx.x) >= num_tiles) return;  // (the launcher's grid is smaller)
    // This CTA's tiles T0, T0 + TS, ... (my_tiles), KT k-tiles each (a multiple of SGT): J
    // k-tiles and NG scale groups in all. Each role computes them after the register split
    // (values live across setmaxnreg are spilled).
    auto schedule = [&](int& T0, int& TS, int& my_tiles, int& KT, int& J, int& NG) {
        persist_schedule<BM, BN, SGT>(num_tiles, tiles, n_col_tiles, desc, n_cols, T0, TS,
                                      my_tiles, KT, J, NG);
    };
    auto tile_at = [&](int T) { return locate_tile_at<BM, BN>(T, tiles, n_col_tiles, desc, n_cols); };
    auto slot = [&](int ti) { return smem + T_WIN + (ti & 1) * kWmxWinSlot; };

    // mbarriers of A's and B's raw stages and of the scale slots (gemm_ws_mx's)
    __shared__ __align__(8) unsigned long long ws_bar[NSA + NSB + NSG];
    const unsigned abar = smem_u32(ws_bar), bbar = abar + 8 * NSA, sbar = bbar + 8 * NSB;
    if (threadIdx.x == kWsConsumers) {
#pragma unroll
        for (int i = 0; i < NSA + NSB + NSG; ++i) mbar_init(abar + 8 * i, 1);
        mbar_init_fence();
    }
    __syncthreads();
    const bool ea5 = a_e5m2 != 0, eb5 = b_e5m2 != 0;
    // The launch's staging mode: the fp16 window when the range kernel found every row of both
    // operands in it (and the launch allows it: gemm_ws_mx's conditions, the scale alignment
    // the launcher's), else bf16 -- one mode for every tile, so that each role runs one loop
    // over its tiles (with a loop per mode inside the loop over tiles, ptxas serialized the
    // wgmma for lack of registers and spilled the accumulators).
    auto launch_f16 = [&](int KT) {
        return mx_bf16 == 0 && KT >= kWmxMinKTiles && __ldg(mx_out_of_window) == 0u;
    };

    if (threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups ----------------
        regs_release<WmxRegs<BMN>::PRODUCER>();
        int T0, TS, my_tiles, KT, J, NG;
        schedule(T0, TS, my_tiles, KT, J, NG);
        const int NGT = KT / SGT;  // scale groups per tile
        const int t = static_cast<int>(threadIdx.x) - kWsConsumers;
        const bool leader = t == 0;
        const int bias_b = mx_s_max(eb5) + LPM_FP16_EXP_BIAS;
        const bool f16m = launch_f16(KT);
        // The leader's tensor-map rows of tiles ti (at ti % 2) and ti + 1, ti the data stream's
        // tile (gemm_ws_p's scheme: the scale stream runs SGT - NCB + 1 - AHEAD = 4 k-tiles
        // ahead of the data stream and, with KT >= SGT, is in tile ti or ti + 1).
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
            int ti, kt;
            stream_next(d_ti, d_kt, KT, ti, kt);
            if (kt == 0 && ti > 0 && ti + 1 < my_tiles) rows_of[(ti + 1) & 1] = rows_at(ti + 1);
            wmx_issue_data<AMN, BMN, L>(s0, abar, bbar, j, kt, rows_of[ti & 1], tm_a, tm_b);
        };
        int s_ti = 0, s_g = 0;
        auto issue_scales = [&](int q) {
            int ti, g;
            stream_next(s_ti, s_g, NGT, ti, g);
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
            wmx_refill<L>(j, J, NG, leader, bbar, sbar, issue_data, issue_scales);
        };
        for (int ti = 0; ti < my_tiles; ++ti) {
            const CtaTile tl = tile_at(T0 + ti * TS);
            const long long* const d = tl.d;
            const int rows_valid = tl.rows_valid<BM>(), cols_valid = tl.cols_valid<BN>();
            unsigned char* const w = slot(ti);
            if (f16m) {  // the tile's exponents and their range (in the window: the launcher's
                         // range kernel found every row there)
                const int g = static_cast<int>((d - desc) / kDescWords);
                mx_window_check_ranges<BM, BN, kWsProducers, WS_BAR_PROD>(
                    mx_ranges_a(mx_words, g, ranges_ra, ranges_rb, tl.r0), rows_valid,
                    mx_ranges_b(mx_words, g, ranges_ra, ranges_rb, tl.c0), cols_valid, ea5, eb5,
                    true, w, w + BM, static_cast<unsigned>(t),
                    reinterpret_cast<unsigned*>(w + W_RANGE));
            }
            named_arrive(WS_BAR_WIN, kWsThreads);
            wmx_produce_b<BMN, L>(t, KT, s0, cols_valid, bias_b, w + BM, f16m, eb5, refill,
                                  ti * KT);
        }
        return;
    }

    // ---------------- consumer warpgroups ----------------
    regs_claim<WmxRegs<BMN>::CONSUMER>();
    int T0, TS, my_tiles, KT, J, NG;
    schedule(T0, TS, my_tiles, KT, J, NG);
    const WmxFrag<AMN, L> fr(threadIdx.x);
    float acc[NI * 4];
    float* const accf = acc;
    const int bias_a = mx_s_max(ea5) + LPM_FP16_EXP_BIAS;
    // The epilogue, built once: MXFP8 output is unscaled, without bias (the launcher's
    // conditions, reg_epi_ok), so the tile's expert enters only through its output offset. (Built
    // per tile, from the expert's descriptor or from constants, it made ptxas serialize the wgmma
    // for lack of registers: C7512.)
    Epilogue ep = LPM_GG_EPILOGUE_OF(desc);
    if (!reg_epi_ok(ep) || ep.scale_mode != 0 || ep.has_bias || ep.has_probs) __trap();
    ep.init_alpha();
    // one loop over the CTA's tiles per staging mode (the launch's) and A format
    auto tiles_loop = [&](auto h, auto e5) {
        constexpr bool H = decltype(h)::value;
        int j = 0;
        for (int ti = 0; ti < my_tiles; ++ti, j += KT) {
#pragma unroll
            for (int i = 0; i < NI * 4; ++i) acc[i] = 0.0f;
            named_sync(WS_BAR_WIN, kWsThreads);  // the producers wrote the tile's window slot
            const unsigned char* const w = slot(ti);
            const unsigned fka = H ? mx_window_row(w[fr.ra0], bias_a) : 0u;
            const unsigned fkb = H ? mx_window_row(w[fr.ra1], bias_a) : 0u;
            wmx_consume<AMN, BMN, L, H, decltype(e5)::value, NI * 4, false>(
                accf, fr, s0, abar, sbar, 0u, nullptr, fka, fkb, j, j + KT, J);
            // the tile's place, read before the drain (the loads overlap it)
            const CtaTile tl = tile_at(T0 + ti * TS);
            ep.out_off = tl.d[D_OUT_OFF];
            wmx_tile_drain<H, AMN, NI>(accf, j + KT - 1, J, w, mx_rescale_shift(ea5, eb5), fr);
            reg_epi_unscaled<NI, AMN, NI / 4>(ep, s0 + T_EPI + (threadIdx.x >> 5) * EPI_B, accf,
                                              fr.wm0, fr.lane, tl.r0, tl.c0,
                                              tl.rows_valid<BM>(), tl.cols_valid<BN>());
        }
    };
    with_flags(launch_f16(KT), ea5, tiles_loop);
}

}  // namespace lpm_gg

// extern "C" entry point NAME of the persistent warp-specialised MXFP8 kernel (sm_90a; AMN /
// BMN as in LPM_GG_DEFINE_WS_MX): gemm_ws_mx's four tensor maps, then the number of output tiles,
// which the CTAs share (tile blockIdx.x, + gridDim.x, ...). On other architectures the wgmma
// compile to traps; the launcher never selects it there.
// (LPM_GG_WS_MX_PERSISTENT_ENTRY: the entry point of persistent body FN.)
#define LPM_GG_WS_MX_PERSISTENT_ENTRY(NAME, FN, AMN, BMN)                                      \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWsThreads, 1)                        \
        NAME(LPM_GG_PARAMS, LPM_GG_WS_TMA_PARAMS, LPM_GG_MX_RANGE_PARAMS, int num_tiles) {     \
        lpm_gg::FN<AMN, BMN>(LPM_GG_ARGS, LPM_GG_WS_TMA_ARGS, LPM_GG_MX_RANGE_ARGS, num_tiles); \
    }
#define LPM_GG_DEFINE_WS_MX_P(NAME, AMN, BMN) \
    LPM_GG_WS_MX_PERSISTENT_ENTRY(NAME, gemm_ws_mx_p, AMN, BMN)

#endif  // LPM_GROUPED_GEMM_WS_MX_PERSIST_CUH
