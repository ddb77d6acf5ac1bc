// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the k-tile
// steps of the 384-thread warp-specialised NVFP4 TMA kernel, shared by its one-tile-per-CTA
// form (gemm_ws_n256, grouped_gemm_ws_n256.cuh) and its persistent form (gemm_ws_p,
// grouped_gemm_ws_persist.cuh): the shared-memory layout, a producer thread's k-tile (copy
// requests on the scale-slot schedule, B expansion, FULL), a consumer thread's k-tile (A
// decode into registers, wgmma) and the tensor-map rows of a tile.

#ifndef LPM_GROUPED_GEMM_WS_FP4_CUH
#define LPM_GROUPED_GEMM_WS_FP4_CUH

#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_staging.cuh"
#include "grouped_gemm_tma.cuh"
#include "grouped_gemm_ws_roles.cuh"

namespace lpm_gg {

// The TMA build's expansion of one k-tile's B half by one producer thread (gemm_ws_n256,
// gemm_ws_p): its two units' raw words at rb and rb + 128 rows, their block-scale pairs at rsb
// and rsb + 128 scale rows (a slot holds kWsScaleTiles k-tiles per row), decoded and stored at
// the canonical offsets o_cn (second unit: 128 rows further on); units past the tile's columns
// (live0 / live1 false) are skipped.
__device__ __forceinline__ void ws_fp4_expand_b(unsigned rb, unsigned rsb, unsigned cbb,
                                                const unsigned (&o_cn)[4], bool live0,
                                                bool live1) {
    constexpr unsigned D_RAW = 128 * (kBK / 2), D_CN = 128 * kBK * 2;
    constexpr unsigned D_SC = 128 * kWsScaleTiles * (kBK / LPM_NVFP4_BLOCK);
    UnitRaw<KIND_FP4_K> x0, x1;
    x0.w = lds_v4(rb);
    x1.w = lds_v4(rb + D_RAW);
    x0.s2 = lds_u16(rsb);
    x1.s2 = lds_u16(rsb + D_SC);
    unsigned o[16];
    if (live0) {
        fp4_unit_decode(x0, o);
#pragma unroll
        for (int jc = 0; jc < 4; ++jc)
            sts_v4(cbb + o_cn[jc], o[4 * jc], o[4 * jc + 1], o[4 * jc + 2], o[4 * jc + 3]);
    }
    if (live1) {
        fp4_unit_decode(x1, o);
#pragma unroll
        for (int jc = 0; jc < 4; ++jc)
            sts_v4(cbb + D_CN + o_cn[jc], o[4 * jc], o[4 * jc + 1], o[4 * jc + 2],
                   o[4 * jc + 3]);
    }
}

// One unit of the same (gemm_ws_n256's consumers: one unit of the next k-tile's B each): raw
// words at rb, block-scale pair at rsb, decoded a chunk at a time (fp4_unit_decode's values)
// into canonical chunk j at cn ^ (j << 4) (cn: the address of the unit's first chunk, its
// buffer 1024-byte aligned, so the XOR acts on k_canon_off's swizzled chunk bits only).
__device__ __forceinline__ void ws_fp4_expand_unit(unsigned rb, unsigned rsb, unsigned cn) {
    const uint4 w = lds_v4(rb);
    const unsigned sc = fp4_scales_x64(lds_u16(rsb));
    unsigned o[4];
    fp4_decode8<false, false>(w.x, sc, o);
    sts_v4(cn, o[0], o[1], o[2], o[3]);
    fp4_decode8<false, false>(w.y, sc, o);
    sts_v4(cn ^ 16u, o[0], o[1], o[2], o[3]);
    fp4_decode8<true, true>(w.z, sc, o);
    sts_v4(cn ^ 32u, o[0], o[1], o[2], o[3]);
    fp4_decode8<true, true>(w.w, sc, o);
    sts_v4(cn ^ 48u, o[0], o[1], o[2], o[3]);
}

// No work between a consumer's steps (ws_fp4_consume's default hook).
struct WsNoHook {
    __device__ __forceinline__ void operator()(int) const {}
};

// The four 16-deep steps of an NVFP4 consumer's k-tile whose A fragments come from frag
// (gemm_ws; gemm_ws_g): per step s, wait(s) (the previous step's wgmma,
// and at step 1 the previous buffer's release), frag(s, f) (step s's fragment into f, one step
// of fp4_a_frags' layout), then two m64n128k16 with B from the canonical buffer of descriptor
// db, one commit group per step.
template <int NACC, class Wait, class Frag>
__device__ __forceinline__ void ws_fp4_steps(float* accf, unsigned long long db, const Wait& wait,
                                             const Frag& frag) {
    unsigned af[2][1][4];  // fragments of the step in flight and of the next one
#pragma unroll
    for (int s = 0; s < kBK / 16; ++s) {
        wait(s);
        frag(s, af[s & 1]);
        wg_fence();
        // B's descriptor as two words: the steps and halves add to the low word only
#pragma unroll
        for (int n = 0; n < 2; ++n)
            wgmma_m64n128k16_rs(accf + 64 * n, af[s & 1][0],
                                static_cast<unsigned>(db) + ((n * (128 * 128) + s * 32) >> 4),
                                static_cast<unsigned>(db >> 32));
        wg_commit();
        wg_fence_acc<NACC>(accf);
    }
}

// One k-tile of an NVFP4 consumer thread, TMA build (gemm_ws_n256, gemm_ws_p), after its FULL
// barrier and copy waits: per 16-deep step the A fragment of rows ar, ar + 8 decoded from the
// raw words at ra_s (row ar; row ar + 8 eight rows further on) and the rows' scale words at
// rsc_s, then two m64n128k16 with B from the canonical buffer of descriptor db. Each step's raw
// words are loaded one step ahead, before the wgmma wait, so that only the decode stands
// between that wait and the next wgmma (the rows' scale words once per k-tile). `release`:
// whether step 1 hands the previous k-tile's canonical buffer (pb) back to the producers.
// N256 (gemm_ws_n256, NT = its 384 threads): one m64n256k16 per step instead of two
// m64n128k16, the same products in the same order. hook(s) runs after step s's wgmma are
// committed, while they run (gemm_ws_n256: the next k-tile's B unit).
template <int NACC, int NT = kWsThreads, bool N256 = false, class Hook = WsNoHook>
__device__ __forceinline__ void ws_fp4_consume(float* accf, unsigned ra_s, unsigned rsc_s,
                                               unsigned long long db, int aq, bool release,
                                               int pb, const Hook& hook = Hook{}) {
    constexpr int T_SLD = kWsScaleTiles * (kBK / LPM_NVFP4_BLOCK);
    unsigned af[2][4];  // fragments of the step in flight and of the next one
    const unsigned sel = static_cast<unsigned>(aq) | (static_cast<unsigned>(aq + 4) << 4);
    const unsigned sa = lds_u32(rsc_s), sb = lds_u32(rsc_s + 8 * T_SLD);
    uint2 wa = lds_v2(ra_s), wb = lds_v2(ra_s + 8 * (kBK / 2));
#pragma unroll
    for (int s = 0; s < kBK / 16; ++s) {
        ws_step_wait<NACC, NT>(s, release, pb, accf);
        fp4_a_step(s, wa.x, wa.y, wb.x, wb.y, sa, sb, sel, af[s & 1]);
        if (s + 1 < kBK / 16) {  // the next step's words, in flight across the wait
            wa = lds_v2(ra_s + (s + 1) * 8);
            wb = lds_v2(ra_s + 8 * (kBK / 2) + (s + 1) * 8);
        }
        wg_fence();
        // B's descriptor as two words: the steps and halves add to the low word only
        if constexpr (N256) {
            wgmma_m64n256k16_rs(accf, af[s & 1], static_cast<unsigned>(db) + ((s * 32) >> 4),
                                static_cast<unsigned>(db >> 32));
        } else {
#pragma unroll
            for (int n = 0; n < 2; ++n)
                wgmma_m64n128k16_rs(
                    accf + 64 * n, af[s & 1],
                    static_cast<unsigned>(db) + ((n * (128 * 128) + s * 32) >> 4),
                    static_cast<unsigned>(db >> 32));
        }
        wg_commit();
        wg_fence_acc<NACC>(accf);
        hook(s);
    }
}

// The TMA build's shared-memory layout (gemm_ws, gemm_ws_p): kWsStages raw stages of the two
// data tiles, kWsCanonBuffers canonical B buffers, kWsScaleSlots scale slots (row r's 16 scale
// bytes -- 4 per k-tile -- at 16 r; A's 128 rows, then B's 256).
struct WsTmaLayout {
    static constexpr int T_DA = raw_data_bytes(KIND_FP4_K, 128);
    static constexpr int T_STAGE = T_DA + raw_data_bytes(KIND_FP4_K, 256);
    static constexpr int CANON_B = canon_bytes(256);
    static constexpr int T_CANON = kWsStages * T_STAGE;
    static constexpr int T_SLD = kWsScaleTiles * (kBK / LPM_NVFP4_BLOCK);  // 16
    static constexpr int T_SC = T_CANON + kWsCanonBuffers * CANON_B;
    static constexpr int T_SLOT = ws_tma_scale_slot_bytes();
    static constexpr int T_SB = 128 * T_SLD;  // B's rows in a slot
    // scratch: gemm_ws_n256's consumers' B-unit addresses
    static constexpr int T_FRAG = T_SC + kWsScaleSlots * T_SLOT;
    static constexpr int T_END = T_FRAG;
    static_assert(T_STAGE % 128 == 0 && T_DA % 128 == 0 && T_CANON % 1024 == 0 &&
                      T_SLOT % 128 == 0 && T_SB % 128 == 0 && T_SLD == 16,
                  "TMA destinations: 128-byte aligned; canonical buffers: 1 KiB swizzle atoms");
    static_assert(T_FRAG + kWsCanonBuffers * kWsFragBytes + 1024 <= ws_tma_smem_bytes(),
                  "the TMA build's shared memory");
};

// A producer thread's two B units (thread t of the producers: rows ur = t / 2 and ur + 128,
// contraction half t % 2; unit_load / unit_store's places) as offsets into a raw stage's B
// half, a scale slot's B rows and a canonical buffer, computed once; the second unit's are the
// first's plus constants (ws_fp4_expand_b). gemm_ws / gemm_ws_p: 256 producer threads, all of
// B; gemm_ws_n256: 128, rows 0-63 and 128-191 (its consumers expand the rest).
struct WsFp4Units {
    int ur;
    unsigned o_raw, o_sc, o_cn[4];
    __device__ __forceinline__ explicit WsFp4Units(unsigned t) {
        static_assert(TileGeo<KIND_FP4_K, 256>::UNITS == 2 * kWsProducers,
                      "gemm_ws: two B units per producer thread");
        ur = static_cast<int>(t) >> 1;
        const int uh = static_cast<int>(t) & 1;
        o_raw = static_cast<unsigned>(ur * (kBK / 2) + uh * 16);
        o_sc = static_cast<unsigned>(ur * WsTmaLayout::T_SLD + uh * 2);
#pragma unroll
        for (int jc = 0; jc < 4; ++jc)
            o_cn[jc] = static_cast<unsigned>(k_canon_off(ur, 4 * uh + jc));
    }
};

// Consumer thread c's A row ar (the TMA build's consumer rows) as offsets into a raw stage
// (a_off) and a scale slot (s_off).
struct WsARow {
    unsigned a_off, s_off;
    __device__ __forceinline__ explicit WsARow(unsigned c) {
        const unsigned warp = c >> 5, lane = c & 31;
        const unsigned ar = 64 * (warp >> 2) + 16 * (warp & 3) + (lane >> 2);
        a_off = ar * (kBK / 2);
        s_off = ar * WsTmaLayout::T_SLD;
    }
};

// The first rows of an output tile in the four tensor maps (A data, B data, A scales, B scales).
struct WsRows {
    int a, b, as, bs;
};

// ... from the expert's descriptor words d and the tile origin (r0, c0)
__device__ __forceinline__ WsRows ws_rows(const long long* d, long long r0, long long c0) {
    WsRows r;
    r.a = static_cast<int>(d[D_A_OFF] / d[D_A_LD] + r0);
    r.b = static_cast<int>(d[D_B_OFF] / d[D_B_LD] + c0);
    r.as = static_cast<int>(d[D_A_SOFF] / d[D_A_SLD] + r0);
    r.bs = static_cast<int>(d[D_B_SOFF] / d[D_B_SLD] + c0);
    return r;
}
// ... of output tile `tile`
template <int BM, int BN>
__device__ __forceinline__ WsRows ws_rows_of(int tile, const int* tiles, int n_col_tiles,
                                             const long long* desc, long long n_cols) {
    const CtaTile t = locate_tile_at<BM, BN>(tile, tiles, n_col_tiles, desc, n_cols);
    return ws_rows(t.d, t.r0, t.c0);
}

// The copy-issuing thread's requests: data k-tile kt of a tile (tensor-map rows rw) into raw
// stage st, and scale group gl of a tile into scale slot sl, each on its mbarrier.
__device__ __forceinline__ void ws_fp4_issue_data(unsigned s0, unsigned dbar, int st, int kt,
                                                  const WsRows& rw, const TmaMap* tm_a,
                                                  const TmaMap* tm_b) {
    using L = WsTmaLayout;
    const unsigned sb = s0 + st * L::T_STAGE, bar = dbar + 8 * st;
    const int kb = kt * (kBK / 2);  // NVFP4: two elements per byte
    mbar_arrive_expect_tx(bar, L::T_STAGE);
    tma_load_2d(sb, tm_a, bar, kb, rw.a);
    tma_load_2d(sb + L::T_DA, tm_b, bar, kb, rw.b);
}
__device__ __forceinline__ void ws_fp4_issue_scales(unsigned s0, unsigned sbar, int sl, int gl,
                                                    const WsRows& rw, const TmaMap* tm_as,
                                                    const TmaMap* tm_bs) {
    using L = WsTmaLayout;
    const unsigned sb = s0 + L::T_SC + sl * L::T_SLOT, bar = sbar + 8 * sl;
    mbar_arrive_expect_tx(bar, L::T_SLOT);
    tma_load_2d(sb, tm_as, bar, gl * L::T_SLD, rw.as);
    tma_load_2d(sb + L::T_SB, tm_bs, bar, gl * L::T_SLD, rw.bs);
}

// The copy-issuing thread's first requests (J k-tiles and NG scale groups in the CTA's
// sequence): data k-tiles 0 .. kWsAhead - 1 and scale groups 0 and 1; ws_fp4_produce issues the
// rest on the schedule.
template <class IssueData, class IssueScales>
__device__ __forceinline__ void ws_fp4_issue_first(int J, int NG, const IssueData& issue_data,
                                                   const IssueScales& issue_scales) {
#pragma unroll
    for (int s = 0; s < kWsAhead; ++s)
        if (s < J) issue_data(s);
    for (int g = 0; g < 2 && g < NG; ++g) issue_scales(g);
}

// k-tile j of a TMA-build producer thread (gemm_ws, gemm_ws_p; J k-tiles and NG scale groups
// in the CTA's sequence): once k-tile j - kWsCanonBuffers retired, its canonical buffer, its
// raw stage (which k-tile j + kWsAhead takes) and, after a scale group's last k-tile, its slot
// are free; the leader requests that data k-tile (issue_data) and, on schedule, scale group
// (j + 6) / 4 (issue_scales: group q's slot last held group q - 3, whose last k-tile 4q - 9 is
// j - 3). Then the thread waits for k-tile j's copies, expands its two units of B (u; the
// tile has `cols` columns: units past them are skipped) and arrives at FULL.
// NT: the CTA's threads, the FULL / EMPTY barriers' count (gemm_ws_n256: 384).
template <int NT = kWsThreads, class IssueData, class IssueScales>
__device__ __forceinline__ void ws_fp4_produce(int j, int J, int NG, bool leader, unsigned s0,
                                               unsigned dbar, unsigned sbar,
                                               const WsFp4Units& u, int cols,
                                               const IssueData& issue_data,
                                               const IssueScales& issue_scales) {
    using L = WsTmaLayout;
    constexpr int NST = kWsStages, NCB = kWsCanonBuffers, NSG = kWsScaleSlots;
    constexpr int SGT = kWsScaleTiles, AHEAD = kWsAhead;
    static_assert(AHEAD == 3 && NCB == 3 && NSG == 3 && SGT == 4,
                  "scale-slot schedule: group q issued at k-tile 4q - 6");
    const int cb = j % NCB;
    if (j >= NCB) named_sync(WS_BAR_EMPTY + cb, NT);
    if (leader) {
        if (j + AHEAD < J) issue_data(j + AHEAD);
        if (j % SGT == 2 && (j + 6) / SGT < NG) issue_scales((j + 6) / SGT);
    }
    const int st = j % NST, g = j / SGT;
    mbar_wait(dbar + 8 * st, static_cast<unsigned>(j / NST) & 1u);
    mbar_wait(sbar + 8 * (g % NSG), static_cast<unsigned>(g / NSG) & 1u);
    ws_fp4_expand_b(s0 + st * L::T_STAGE + L::T_DA + u.o_raw,
                    s0 + L::T_SC + (g % NSG) * L::T_SLOT + L::T_SB + (j % SGT) * 4 + u.o_sc,
                    s0 + L::T_CANON + cb * L::CANON_B, u.o_cn, u.ur < cols, u.ur + 128 < cols);
    fence_proxy_async();
    named_arrive(WS_BAR_FULL + cb, NT);
}

// The TMA build's mbarriers (gemm_ws, gemm_ws_n256, gemm_ws_p): kWsStages raw stages from
// dbar on, then kWsScaleSlots scale slots (sbar = dbar + 8 kWsStages), one arrival each (the
// issuing thread's expect_tx) plus the copies' bytes; set up by the thread with `init`, then
// a CTA barrier.
__device__ __forceinline__ void ws_fp4_bars_init(unsigned dbar, bool init) {
    if (init) {
#pragma unroll
        for (int i = 0; i < kWsStages + kWsScaleSlots; ++i) mbar_init(dbar + 8 * i, 1);
        mbar_init_fence();
    }
    __syncthreads();
}

// The rings of the TMA build repeat every kWsRingPeriod k-tiles: 3 canonical buffers, 6 raw
// stages (their mbarrier phase flips every 6) and 3 scale slots of 4 k-tiles each.
constexpr int kWsRingPeriod = 12;

// k-tiles k0 .. k0 + kWsRingPeriod - 1 (those below KT) of a gemm_ws TMA-build consumer, k0 a
// multiple of kWsRingPeriod: ws_fp4_consume_ktile's steps with every ring index a constant of
// the unrolled loop -- buffer u % 3, stage u % 6 and its phase (u / 6) & 1, scale slot u / 4
// and k-tile u % 4 in it -- except the scale slots' phase, (k0 / 12) & 1. The k-tile head then
// needs no divisions, and B's descriptors become immediates (SASS: 158 instructions per warp
// and k-tile instead of 212). ptxas serializes this loop's wgmma groups (C7511; it checks wgmma
// against the 512-thread launch's 128-register target, not the consumers' setmaxnreg count),
// so each step waits for its own group; the two consumer warpgroups still keep the tensor
// cores fed in turn, and the build measured 1-2 % faster than the rolled loop with one group
// in flight. `me`: this thread's A row offsets (WsARow).
// gemm_ws_n256 (N256, NT = 384) takes the
// same loop with m64n256k16, which ptxas keeps one group in flight (its 168-register target).
// khook(u, kt, s): ws_fp4_consume's hook at step s of k-tile kt (ring position u).
struct WsNoKtileHook {
    __device__ __forceinline__ void operator()(int, int, int) const {}
};
// The span form (gemm_ws_p<..., N256>, whose CTA runs its tiles as one flattened sequence of
// J k-tiles): only the k-tiles kt of the period with kbeg <= kt < kend, where kfirst <= kbeg
// is the first k-tile of the current output tile (a tile's first k-tile hands no buffer back:
// the previous tile's last one went back at that tile's end). GROUPS: kbeg and kend are
// multiples of the scale group (kWsScaleTiles k-tiles; the persistent forms' condition), so
// the bounds are checked once per group.
template <int NACC, int NT = kWsThreads, bool N256 = false, bool GROUPS = false,
          class KHook = WsNoKtileHook>
__device__ __forceinline__ void ws_fp4_consume_span(float* accf, int k0, int kbeg, int kfirst,
                                                    int kend, int J, unsigned s0, unsigned dbar,
                                                    unsigned sbar, const WsARow& me, int aq,
                                                    const KHook& khook = KHook{}) {
    using L = WsTmaLayout;
    constexpr int NST = kWsStages, NCB = kWsCanonBuffers, NSG = kWsScaleSlots;
    constexpr int SGT = kWsScaleTiles, P = kWsRingPeriod;
    static_assert(P % NCB == 0 && P % NST == 0 && P == SGT * NSG && (P / NST) % 2 == 0,
                  "every ring's position (and the stages' phase) repeats after P k-tiles");
    const unsigned ph_s = static_cast<unsigned>(k0 / P) & 1u;
    // k-tile kt = k0 + u (u: a constant of the unrolled loops below)
    const auto ktile = [&](int u) {
        const int kt = k0 + u;
        const int cb = u % NCB, st = u % NST, sl = u / SGT;
        named_sync(WS_BAR_FULL + cb, NT);  // B of k-tile kt expanded into buffer cb
        mbar_wait(dbar + 8 * st, static_cast<unsigned>((u / NST) & 1));
        mbar_wait(sbar + 8 * sl, ph_s);
        const unsigned long long db = wg_desc(s0 + L::T_CANON + cb * L::CANON_B, 16, 1024);
        ws_fp4_consume<NACC, NT, N256>(
            accf, s0 + st * L::T_STAGE + me.a_off,
            s0 + L::T_SC + sl * L::T_SLOT + (u % SGT) * 4 + me.s_off, db, aq,
            kt > kfirst && kt - 1 + NCB < J, (u + NCB - 1) % NCB,
            [&](int s) { khook(u, kt, s); });
    };
    if constexpr (GROUPS) {
#pragma unroll
        for (int q = 0; q < P / SGT; ++q) {
            if (k0 + q * SGT < kbeg) continue;
            if (k0 + q * SGT >= kend) break;
#pragma unroll
            for (int v = 0; v < SGT; ++v) ktile(q * SGT + v);
        }
    } else {
#pragma unroll
        for (int u = 0; u < P; ++u) {
            if (k0 + u < kbeg) continue;
            if (k0 + u >= kend) break;
            ktile(u);
        }
    }
}
// One output tile's k-tiles k0 .. KT - 1 of the period (gemm_ws, gemm_ws_n256).
template <int NACC, int NT = kWsThreads, bool N256 = false, class KHook = WsNoKtileHook>
__device__ __forceinline__ void ws_fp4_consume_period(float* accf, int k0, int KT, unsigned s0,
                                                      unsigned dbar, unsigned sbar,
                                                      const WsARow& me, int aq,
                                                      const KHook& khook = KHook{}) {
    ws_fp4_consume_span<NACC, NT, N256>(accf, k0, k0, 0, KT, KT, s0, dbar, sbar, me, aq,
                                        khook);
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_WS_FP4_CUH
