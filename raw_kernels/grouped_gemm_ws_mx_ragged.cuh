// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the ragged
// persistent form of the warp-specialised MXFP8 wgrad kernel, gemm_ws_mx_g, and its entry-point
// macro LPM_GG_DEFINE_WS_MX_G.
//
// gemm_ws_mx_p needs one contraction length for every expert. K-grouped wgrad with uneven
// splits (a skewed router) gives each expert its own: most experts contract a few k-tiles, so a
// tile's fixed cost in gemm_ws_mx (~7.8 us on the H200: start, pipeline fill, window check,
// epilogue with idle producers) outweighs its k-tiles. gemm_ws_mx_g runs one CTA per SM over a
// list of tiles of any lengths, gemm_ws_mx_p's pipeline on the CTA's k-tile sequence:
//   * Tile list: CTA b runs entries b, b + gridDim.x, ... of the tile table, kWmxGEntryWords
//     int32 words each (WmxGEntry; the launcher's lowprec_moe.backends.cupy.gemm.balance builds them):
//     everything the kernel needs of a tile -- expert, k-tiles, first k-tile and scale group in
//     the CTA's sequences, last k-tile's length, extents, tensor-map rows, output offset -- so a
//     tile costs one 64-byte read instead of chains of dependent loads through the descriptors
//     (on the H200 the two measured alike: 0.500 and 0.503 ms on skewed wgrad). The launcher
//     balances the CTAs' work (longest tiles first, each to the least loaded CTA) and
//     pads the lists with entries of no tile (expert -1, no k-tiles, the CTA's totals).
//   * Each tile starts a new scale group: its k-tile kt reads group q0 + kt / kWmxScaleTiles of
//     the CTA's group sequence (q0: the groups of the CTA's earlier tiles), at place
//     kt % kWmxScaleTiles. A group may thus hold a single k-tile, so a slot cannot be known
//     free from the k-tiles handed back (gemm_ws_mx_p's rule, which waits for the k-tile
//     kWmxCanonBuffers back: with short groups the next group would be requested only after
//     the producers need it -- a deadlock). Instead the consumers arrive at the slot's own
//     mbarrier once they have read the codes of the group's last k-tile (at the next k-tile's
//     start, or after the tile's k-loop), and the copy-issuing
//     thread, in each k-tile, requests every next group whose slot is free, waiting for the
//     slot only when the k-tile needs that group.
//   * A last k-tile that ends early (each expert contracts its tokens, padded to the 32-token
//     block; its length in the tile's entry) is zeroed past its end by the producers
//     (wmx_tail_zero), not in the consumers' k-loop as in gemm_ws_mx (wmx_consume's TAIL), which
//     made ptxas serialize the wgmma here (C7515).
//   * Window slots (the tile's rows' and columns' largest codes and range) are a ring of
//     kWmxGWinSlots with a full and an empty mbarrier each, so producers may run any number of
//     short tiles ahead (gemm_ws_mx_p's two slots rely on four k-tiles per tile); they take
//     one arrival per warp (warp_arrive).
//   * One staging mode for the launch (the range kernel's verdict), as gemm_ws_mx_p, without the
//     k-tile threshold: tiles of fewer than kWmxMinKTiles k-tiles are staged on fp16 too when
//     the launch is in the window. Results are gemm_ws_mx's bit for bit whenever both stage a
//     tile alike, and otherwise differ only for blocks below ~1e-35 (grouped_gemm_mxf16.cuh).
//   * An expert without tokens gets +0 over its tiles (Epilogue::zero_tile by the consumers).
// Conditions (the launcher's): both operands MN-major (wgrad), gemm_ws_mx's TMA build for
// ragged lengths (every length a multiple of 16), 16-bit output without bias, no accumulation.

#ifndef LPM_GROUPED_GEMM_WS_MX_RAGGED_CUH
#define LPM_GROUPED_GEMM_WS_MX_RAGGED_CUH

#include "grouped_gemm_ws_mx_persist.cuh"

namespace lpm_gg {

// An entry of the ragged tile table (the launcher's gemm_balance.ragged_tile_table, whose
// word order this mirrors).
constexpr int kWmxGEntryWords = 16;
struct WmxGEntry {
    int g, rc, kt, j0, q0, tail, rv, cv, r0, c0, a, as, b, bs;
    long long out_off;
};
__device__ __forceinline__ WmxGEntry wmx_g_entry(const int* tiles, int T) {
    const int4* p = reinterpret_cast<const int4*>(tiles + kWmxGEntryWords * T);
    const int4 x = __ldg(p), y = __ldg(p + 1), z = __ldg(p + 2), w = __ldg(p + 3);
    WmxGEntry e;
    e.g = x.x;
    e.rc = x.y;
    e.kt = x.z;
    e.j0 = x.w;
    e.q0 = y.x;
    e.tail = y.y;
    e.rv = y.z;
    e.cv = y.w;
    e.r0 = z.x;
    e.c0 = z.y;
    e.a = z.z;
    e.as = z.w;
    e.b = w.x;
    e.bs = w.y;
    e.out_off = static_cast<long long>(
        (static_cast<unsigned long long>(static_cast<unsigned>(w.w)) << 32) |
        static_cast<unsigned>(w.z));
    return e;
}
// (MN-major A and B) the copy-issuing thread's tensor-map rows of an entry's tile
__device__ __forceinline__ WmxRows wmx_g_rows(const WmxGEntry& e) {
    return WmxRows{e.a, e.b, e.as, e.bs, e.r0, e.c0};
}

template <bool AMN, bool BMN>
__device__ __forceinline__ void gemm_ws_mx_g(LPM_GG_PARAMS, const TmaMap* tm_a, const TmaMap* tm_b,
                                             const TmaMap* tm_as, const TmaMap* tm_bs,
                                             LPM_GG_MX_RANGE_PARAMS, int num_tiles) {
    constexpr int BM = 128, BN = 256;
    using L = WmxLayout<AMN, BMN, kWmxPAhead>;  // gemm_ws_mx_p's pipeline and buffers
    constexpr int NSA = L::NSA, NSB = L::NSB, AHEAD = L::AHEAD;
    constexpr int NSG = kWmxScaleSlots, SGT = kWmxScaleTiles;
    constexpr int NW = kWmxGWinSlots;
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)
    constexpr int SMEM = ws_mx_g_smem_bytes();
    constexpr int EPI_B = reg_epi_bytes<BN / 4>();  // a consumer warp's staging buffer
    constexpr int T_EPI = L::T_EXPS, T_WIN = T_EPI + kWmxEpiStaging;
    constexpr int W_RANGE = BM + BN;
    static_assert(AMN && BMN, "wgrad: both operands MN-major");
    static_assert(T_WIN + NW * kWmxWinSlot + 1024 == SMEM && SMEM <= kMaxSmem &&
                      W_RANGE + 16 <= kWmxWinSlot && (NW & (NW - 1)) == 0,
                  "shared memory: gemm_ws_mx's buffers, the staging buffers, the window slots");
    static_assert((kWsConsumers / 32) * EPI_B == kWmxEpiStaging,
                  "one staging buffer per consumer warp");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != 16 || b_ch != 16, s0);

    if (static_cast<int>(blockIdx.x) >= num_tiles) return;  // (the launcher's grid is smaller)
    const int T0 = static_cast<int>(blockIdx.x), TS = static_cast<int>(gridDim.x);
    const int my_tiles = (num_tiles - 1 - T0) / TS + 1;
    auto entry = [&](int ti) { return wmx_g_entry(tiles, T0 + ti * TS); };
    // an entry's line into L1 ahead of its use (no registers held: each role's next entry,
    // and each copy stream's next tiles, are requested a tile before they are read)
    auto prefetch = [&](int ti) {
        if (ti < my_tiles) prefetch_l1(tiles + kWmxGEntryWords * (T0 + ti * TS));
    };
    auto kt_of = [&](int ti) { return __ldg(tiles + kWmxGEntryWords * (T0 + ti * TS) + 2); };
    // the CTA's k-tiles (each role after the register split): its last entry's first k-tile
    // and k-tiles (an entry of no tile holds the totals)
    auto total = [&]() {
        const WmxGEntry e = entry(my_tiles - 1);
        return e.j0 + e.kt;
    };
    auto slot = [&](int ti) { return smem + T_WIN + (ti & (NW - 1)) * kWmxWinSlot; };

    // mbarriers of A's and B's raw stages, the scale slots (one arrival plus the copies' bytes),
    // the scale slots' release (every consumer) and the window slots (full: every producer;
    // empty: every consumer)
    __shared__ __align__(8) unsigned long long ws_bar[NSA + NSB + 2 * NSG + 2 * NW];
    const unsigned abar = smem_u32(ws_bar), bbar = abar + 8 * NSA, sbar = bbar + 8 * NSB;
    const unsigned sfree = sbar + 8 * NSG, wfull = sfree + 8 * NSG, wempty = wfull + 8 * NW;
    if (threadIdx.x == kWsConsumers) {
#pragma unroll
        for (int i = 0; i < NSA + NSB + NSG; ++i) mbar_init(abar + 8 * i, 1);
#pragma unroll
        for (int i = 0; i < NSG; ++i) mbar_init(sfree + 8 * i, kWsConsumers);
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            mbar_init(wfull + 8 * i, kWsProducers / 32);
            mbar_init(wempty + 8 * i, kWsConsumers / 32);
        }
        mbar_init_fence();
    }
    __syncthreads();
    const bool ea5 = a_e5m2 != 0, eb5 = b_e5m2 != 0;
    // the launch's staging mode (gemm_ws_mx_p's, without the k-tile threshold)
    const bool f16m = mx_bf16 == 0 && __ldg(mx_out_of_window) == 0u;

    if (threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups ----------------
        regs_release<WmxRegs<BMN>::PRODUCER>();
        const int J = total();
        const int t = static_cast<int>(threadIdx.x) - kWsConsumers;
        const bool leader = t == 0;
        const int bias_b = mx_s_max(eb5) + LPM_FP16_EXP_BIAS;
        // The copy-issuing thread's streams over the CTA's tiles, in shared memory (as
        // registers, ptxas spilled more in the producers' k-loop): data k-tile d_kt of d_KT in
        // tile d_ti, scale group s_g of s_NG in tile s_ti (s_q: groups requested so far), and
        // the tiles' tensor-map rows.
        struct Streams {
            int d_ti, d_kt, d_KT, s_ti, s_g, s_NG, s_q;
            WmxRows rows_d, rows_s;
        };
        __shared__ Streams S;
        // the next tile with k-tiles from ti on (its count in n), or my_tiles
        auto skip_empty = [&](int& ti, int& n) {
            n = 0;
            while (ti < my_tiles && (n = kt_of(ti)) == 0) ++ti;
            prefetch(ti + 1);  // the stream's next tiles (an empty one skipped)
            prefetch(ti + 2);
        };
        auto rows_at = [&](int ti) { return wmx_g_rows(entry(ti)); };
        auto issue_data = [&](int j) {
            if (S.d_kt == 0) S.rows_d = rows_at(S.d_ti);
            wmx_issue_data<AMN, BMN, L>(s0, abar, bbar, j, S.d_kt, S.rows_d, tm_a, tm_b);
            if (++S.d_kt == S.d_KT) {
                S.d_kt = 0;
                ++S.d_ti;
                skip_empty(S.d_ti, S.d_KT);
            }
        };
        auto issue_scales = [&]() {
            if (S.s_g == 0) S.rows_s = rows_at(S.s_ti);
            wmx_issue_scales<AMN, BMN, L>(s0, sbar, S.s_q, S.s_g, S.rows_s, tm_as, tm_bs);
            ++S.s_q;
            if (++S.s_g == S.s_NG) {
                S.s_g = 0;
                ++S.s_ti;
                int n;
                skip_empty(S.s_ti, n);
                S.s_NG = (n + SGT - 1) / SGT;
            }
        };
        // request every next scale group whose slot is free (the consumers have read the codes
        // of the group it held), waiting for the slot only up to group gq, which k-tile j needs
        // (a group past gq + NSG - 1 would take the slot of a group not yet consumed)
        auto request_scales = [&](int gq) {
            while (S.s_ti < my_tiles && S.s_q <= gq + NSG - 1) {
                const int Q = S.s_q;
                if (Q >= NSG) {
                    const unsigned bar = sfree + 8 * (Q % NSG);
                    const unsigned par = static_cast<unsigned>((Q / NSG) - 1) & 1u;
                    if (Q <= gq) {
                        mbar_wait(bar, par);
                    } else if (!mbar_test(bar, par)) {
                        break;
                    }
                }
                issue_scales();
            }
        };
        if (leader) {
            int n;
            S.d_ti = 0;
            S.d_kt = 0;
            skip_empty(S.d_ti, S.d_KT);
            S.s_ti = 0;
            S.s_g = 0;
            S.s_q = 0;
            skip_empty(S.s_ti, n);
            S.s_NG = (n + SGT - 1) / SGT;
#pragma unroll
            for (int s = 0; s < AHEAD; ++s)
                if (s < J) issue_data(s);
            request_scales(NSG - 1);
        }
        // gemm_ws_mx's refill on the sequence index j, k-tile j in scale group gq
        auto refill = [&](int j, int gq) {
            wmx_refill_sync<L>(j);
            if (leader) {
                if (j + AHEAD < J) issue_data(j + AHEAD);
                request_scales(gq);
            }
            wmx_refill_wait<L>(j, gq, bbar, sbar);
        };
        for (int ti = 0; ti < my_tiles; ++ti) {
            const WmxGEntry e = entry(ti);
            if (t == 64) prefetch(ti + 1);
            unsigned char* const w = slot(ti);
            if (ti >= NW) mbar_wait(wempty + 8 * (ti & (NW - 1)), ((ti / NW) - 1) & 1);
            if (f16m && e.kt > 0) {  // the tile's exponents and their range
                mx_window_check_ranges<BM, BN, kWsProducers, WS_BAR_PROD>(
                    mx_ranges_a(mx_words, e.g, ranges_ra, ranges_rb, e.r0), e.rv,
                    mx_ranges_b(mx_words, e.g, ranges_ra, ranges_rb, e.c0), e.cv, ea5, eb5,
                    true, w, w + BM, static_cast<unsigned>(t),
                    reinterpret_cast<unsigned*>(w + W_RANGE));
            }
            warp_arrive(wfull + 8 * (ti & (NW - 1)));
            if (e.kt > 0) {
                wmx_produce_b<BMN, L, decltype(refill), true>(
                    t, e.kt, s0, e.cv, bias_b, w + BM, f16m, eb5, refill, e.j0, e.q0, abar,
                    static_cast<unsigned>(e.tail));
            }
        }
        return;
    }

    // ---------------- consumer warpgroups ----------------
    regs_claim<WmxRegs<BMN>::CONSUMER>();
    const int J = total();
    const WmxFrag<AMN, L> fr(threadIdx.x);
    float acc[NI * 4];
    float* const accf = acc;
    const int bias_a = mx_s_max(ea5) + LPM_FP16_EXP_BIAS;
    // the epilogue, built once (gemm_ws_mx_p's): the tile's expert enters through its output
    // offset only
    Epilogue ep = LPM_GG_EPILOGUE_OF(desc);
    if (!reg_epi_ok(ep) || ep.scale_mode != 0 || ep.has_bias || ep.has_probs || ep.accumulate)
        __trap();
    ep.init_alpha();
    auto tiles_loop = [&](auto h, auto e5) {
        constexpr bool H = decltype(h)::value;
        for (int ti = 0; ti < my_tiles; ++ti) {
            const int* const ep_words = tiles + kWmxGEntryWords * (T0 + ti * TS);
            if (threadIdx.x == 0) prefetch(ti + 1);
            const int KT = __ldg(ep_words + 2), j = __ldg(ep_words + 3), q = __ldg(ep_words + 4);
            mbar_wait(wfull + 8 * (ti & (NW - 1)), (ti / NW) & 1);  // the tile's window slot
            const unsigned char* const w = slot(ti);
            if (KT == 0) {  // an expert without tokens (+0), or no tile
                warp_arrive(wempty + 8 * (ti & (NW - 1)));
                const WmxGEntry e = entry(ti);
                if (e.g >= 0 && e.rv > 0 && e.cv > 0) {
                    ep.out_off = e.out_off;
                    ep.zero_tile(e.r0, e.c0, e.rv, e.cv, kWsConsumers);
                }
                continue;
            }
#pragma unroll
            for (int i = 0; i < NI * 4; ++i) acc[i] = 0.0f;
            const unsigned fka = H ? mx_window_row(w[fr.ra0], bias_a) : 0u;
            const unsigned fkb = H ? mx_window_row(w[fr.ra1], bias_a) : 0u;
            wmx_consume<AMN, BMN, L, H, decltype(e5)::value, NI * 4, false, true>(
                accf, fr, s0, abar, sbar, 0u, nullptr, fka, fkb, j, j + KT, J, q * SGT - j);
            mbar_arrive(sfree + 8 * ((q + (KT - 1) / SGT) % NSG));  // the tile's last group
            const WmxGEntry e = entry(ti);  // (read before the drain: the loads overlap it)
            wmx_tile_drain<H, AMN, NI>(accf, j + KT - 1, J, w, mx_rescale_shift(ea5, eb5), fr);
            warp_arrive(wempty + 8 * (ti & (NW - 1)));  // done with the window slot
            ep.out_off = e.out_off;
            reg_epi_unscaled<NI, AMN, NI / 4>(ep, s0 + T_EPI + (threadIdx.x >> 5) * EPI_B, accf,
                                              fr.wm0, fr.lane, e.r0, e.c0, e.rv, e.cv);
        }
    };
    with_flags(f16m, ea5, tiles_loop);
}

}  // namespace lpm_gg

// extern "C" entry point NAME of the ragged persistent MXFP8 wgrad kernel (sm_90a; AMN / BMN as
// in LPM_GG_DEFINE_WS_MX, both true): gemm_ws_mx's four tensor maps, then the number of entries
// of the tile list, which the CTAs share (entry blockIdx.x, + gridDim.x, ...). On other
// architectures the wgmma compile to traps; the launcher never selects it there.
#define LPM_GG_DEFINE_WS_MX_G(NAME, AMN, BMN) \
    LPM_GG_WS_MX_PERSISTENT_ENTRY(NAME, gemm_ws_mx_g, AMN, BMN)

#endif  // LPM_GROUPED_GEMM_WS_MX_RAGGED_CUH
