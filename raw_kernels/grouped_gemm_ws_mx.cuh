// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// warp-specialised MXFP8 kernel gemm_ws_mx with TMA loads -- A K-major (x in fprop, dy in dgrad)
// or MN-major (AMN, wgrad: dy's columnwise copy), B K-major (fprop: W's rows) or MN-major (BMN,
// dgrad: W's columnwise copy, wgrad: x's) -- and its entry-point macro LPM_GG_DEFINE_WS_MX.
// 128 x 256 output tile, 512 threads, the roles of gemm_ws:
//   * all threads first check the tile against the fp16 window (mx_window_check, while the
//     first tiles' copies fly): in the window, both operands are widened on fp16 as
//     q * 2^(e - e_max + S_MAX) and the accumulators rescaled before the epilogue (mx_rescale);
//     otherwise (or with fewer than kWmxMinKTiles k-tiles, or mx_bf16) on bf16 as q * 2^(e-127)
//     -- the two staging modes of the plain wgmma kernel, with the same values;
//   * warpgroups 0-1 ("consumers"): per 16-deep step they widen their A fragments straight from
//     the raw stage into registers (rows ar, ar + 8; contraction 2q, 2q+1, 2q+8, 2q+9: half-word
//     q % 2 of words q / 2 and q / 2 + 2 of the step's 16-byte chunk) and issue two m64n128k16
//     with B from a canonical buffer; then the epilogue. An MN-major A (one raw panel of 64
//     lines x 128 rows, 128-byte swizzle) is read with ldmatrix.trans of 16-bit row pairs, two
//     steps per load: fragment rows ar and ar + 8 then hold tile rows 2 (lane/4) and
//     2 (lane/4) + 1 of the warp's 16 (frag_row), a permutation of the rows that the window
//     rescale and the epilogue's staging undo -- each output is the same dot product;
//   * warpgroups 2-3 ("producers"): one thread issues the TMA copies (data tiles per k-tile --
//     K-major rows of 64 bytes with the 64-byte swizzle, the raw layout of the cp.async kernels
//     (swz<2>); MN-major B as two panels of 128 rows with the 128-byte swizzle, MN-major A as
//     one -- and block scales kWmxScaleTiles k-tiles at a time); all of them widen B into a
//     canonical buffer, 64 elements per thread and k-tile (K-major: two 32-element units, rows
//     ur, ur + 128, contraction half uh, one block factor each; MN-major: 8 rows x 8
//     contraction lines of one block, the 8 rows' factors computed from their codes;
//     wmx_produce_b, grouped_gemm_ws_mx_produce.cuh).
// The handshake is gemm_ws's (FULL / EMPTY named barriers, mbarriers for the copies). Every
// output element gets the same products in the same 16-deep steps and order as in gemm_mma, on
// the same 16-bit values, so the results are bitwise those of the plain wgmma kernel in the same
// staging mode (and it chooses the mode by the same rule, except for the k-tile threshold).

#ifndef LPM_GROUPED_GEMM_WS_MX_CUH
#define LPM_GROUPED_GEMM_WS_MX_CUH

#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_tma.cuh"
#include "grouped_gemm_ws_roles.cuh"
#include "grouped_gemm_mxf16.cuh"
#include "grouped_gemm_ws_mx_produce.cuh"

namespace lpm_gg {

// Tiles with fewer k-tiles stay on bf16: the window's fixed costs (a pass over the tile's block
// scales with three CTA barriers, and the rescale of 128 accumulators per consumer thread)
// overlap the first copies here, so the bar is lower than the plain kernel's kMxMinKTiles; at
// 8 k-tiles they still cost 16 % (fine wgrad, bf16 1.685 ms against fp16 1.952).
constexpr int kWmxMinKTiles = 16;

// Registers per thread after the role split (setmaxnreg; the launch share is kWsLaunchRegs),
// per layout: the consumers get kWsTmaConsumerRegs + wmx_extra_regs(BMN). Their k-loop runs in
// groups of three k-tiles (one per canonical buffer), which keeps B's descriptors in uniform
// registers (no R2UR per wgmma) but holds more values: with kWsTmaConsumerRegs the K-major fp16
// loop spilled ~17 local loads and stores per k-tile, with 8 more ~6, with 16 more none (140
// instructions per k-tile, from 178). The producers get what is left: 56 with 16 more, 64 with
// 8 more; the MN-major B builds' producers reload ~8-11 values per k-tile at 56. Measured
// (H200, interleaved A/B, time ratio to the rolled loop, 6 shapes): all K-major (fprop)
// 0.953-0.976 with 16 more, 0.971-0.985 with 8; K-major A, MN-major B (dgrad) 1.018-1.029 with
// 16 more, 0.966-0.975 with 8; both MN-major (wgrad) 0.999-1.045 with 16 more, 0.981-1.004
// with 8.
constexpr int wmx_extra_regs(bool bmn) { return bmn ? 8 : 16; }
template <bool BMN>
struct WmxRegs {
    static constexpr int CONSUMER = kWsTmaConsumerRegs + wmx_extra_regs(BMN);
    static constexpr int PRODUCER = ws_producer_regs(kWsConsumers, CONSUMER, kWsProducers);
    static_assert(PRODUCER % 8 == 0 && PRODUCER >= 24 && CONSUMER % 8 == 0,
                  "setmaxnreg granularity");
};

// The launcher guarantees what gemm_ws's TMA build needs (uniform row strides, multiples of 16
// bytes, for data and scales; experts at whole rows; one contraction length, a multiple of the
// k-tile). Rows past an expert's extent load the next expert's rows (or zeros past the array);
// they only reach outputs that are never stored.
template <bool AMN, bool BMN>
__device__ __forceinline__ void gemm_ws_mx(LPM_GG_PARAMS, const TmaMap* tm_a, const TmaMap* tm_b,
                                           const TmaMap* tm_as, const TmaMap* tm_bs) {
    constexpr int BM = 128, BN = 256;
    constexpr int AKIND = AMN ? KIND_FP8_MN : KIND_FP8_K;
    constexpr int BKIND = BMN ? KIND_FP8_MN : KIND_FP8_K;
    constexpr int NSA = kWmxAStages, NSB = kWmxBStages, NCB = kWmxCanonBuffers;
    constexpr int AHEAD = kWmxAhead;
    constexpr int NSG = kWmxScaleSlots, SGT = kWmxScaleTiles;
    using L = WmxLayout<AMN, BMN>;  // shared-memory layout (grouped_gemm_ws_mx_produce.cuh)
    constexpr int T_DA = L::T_DA, T_DB = L::T_DB, T_B0 = L::T_B0, CANON_B = L::CANON_B;
    constexpr int T_CANON = L::T_CANON, T_SLD = L::T_SLD, T_SC = L::T_SC, T_SLOT = L::T_SLOT;
    constexpr int T_SB = L::T_SB, T_EXPS = L::T_EXPS, P_RAW = L::P_RAW;
    constexpr int EPI_LD = BN + 8;
    constexpr int SMEM = ws_mx_smem_bytes();
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)
    constexpr int B_STEP = BMN ? 16 * 128 : 32;  // bytes of a 16-deep step in a canonical B
    static_assert(T_DA % 1024 == 0 && T_DB % 1024 == 0 && T_CANON % 1024 == 0 &&
                      CANON_B % 1024 == 0 && T_SLOT % 128 == 0 && T_SB % 128 == 0 &&
                      T_SLD == 16,
                  "TMA destinations (64-byte swizzle: 512-byte aligned) and swizzle atoms");
    static_assert(T_EXPS + BM + BN + 1024 <= SMEM && SMEM <= kMaxSmem &&
                      BN * 2 * SGT == T_SLOT - T_SB,
                  "shared memory");
    static_assert(BM * EPI_LD * 4 <= T_EXPS, "the epilogue staging tile spares the exponents");
    static_assert((BM + BN) * 8 <= CANON_B, "window-check scratch in canonical buffer 0");
    static_assert(AHEAD >= 2 && NCB >= 2 && NCB <= 3 && NSA == AHEAD + NCB && NSB == AHEAD + 1 &&
                      kBK == 64 && NSA % NCB == 0,
                  "pipeline depth");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != 16 || b_ch != 16, s0);

    LPM_GG_TILE_SETUP(BM, BN, rows_valid, cols_valid, kWsThreads)
    const int KT = static_cast<int>((len + kBK - 1) / kBK);
    const int NG = (KT + SGT - 1) / SGT;  // scale groups

    // mbarriers of A's and B's raw stages and of the scale slots: one arrival each (the issuing
    // thread's expect_tx) plus the copies' bytes.
    __shared__ __align__(8) unsigned long long ws_bar[NSA + NSB + NSG];
    const unsigned abar = smem_u32(ws_bar), bbar = abar + 8 * NSA, sbar = bbar + 8 * NSB;
    const bool leader = threadIdx.x == kWsConsumers;
    // (MN-major A) the contraction's length in its last k-tile, 1..64
    __shared__ unsigned ws_tail;
    const unsigned tail_len = smem_u32(&ws_tail);
    if (leader) {
#pragma unroll
        for (int i = 0; i < NSA + NSB + NSG; ++i) mbar_init(abar + 8 * i, 1);
        mbar_init_fence();
        ws_tail = static_cast<unsigned>(len - static_cast<long long>(KT - 1) * kBK);
    }
    __syncthreads();
    int a_row = 0, b_row = 0, as_row = 0, bs_row = 0;
    if (leader) {  // MN-major: the first contraction line / block line (columns from r0 / c0)
        a_row = static_cast<int>(d[D_A_OFF] / d[D_A_LD] + (AMN ? 0 : r0));
        b_row = static_cast<int>(d[D_B_OFF] / d[D_B_LD] + (BMN ? 0 : c0));
        as_row = static_cast<int>(d[D_A_SOFF] / d[D_A_SLD] + (AMN ? 0 : r0));
        bs_row = static_cast<int>(d[D_B_SOFF] / d[D_B_SLD] + (BMN ? 0 : c0));
    }
    // MN-major: the tile's first row / column
    const int ac = static_cast<int>(r0), bc = static_cast<int>(c0);
    auto issue_data = [&](int kt) {
        const unsigned sa = s0 + (kt % NSA) * T_DA, ba = abar + 8 * (kt % NSA);
        const unsigned sb = s0 + T_B0 + (kt % NSB) * T_DB, bb = bbar + 8 * (kt % NSB);
        mbar_arrive_expect_tx(ba, T_DA);
        if constexpr (AMN) {  // one 128-row panel
            tma_load_2d(sa, tm_a, ba, ac, a_row + kt * kBK);
        } else {
            tma_load_2d(sa, tm_a, ba, kt * kBK, a_row);
        }
        mbar_arrive_expect_tx(bb, T_DB);
        if constexpr (BMN) {  // two 128-row panels
            tma_load_2d(sb, tm_b, bb, bc, b_row + kt * kBK);
            tma_load_2d(sb + P_RAW, tm_b, bb, bc + 128, b_row + kt * kBK);
        } else {
            tma_load_2d(sb, tm_b, bb, kt * kBK, b_row);
        }
    };
    auto issue_scales = [&](int g) {
        const int sl = g % NSG;
        const unsigned sb = s0 + T_SC + sl * T_SLOT, bar = sbar + 8 * sl;
        mbar_arrive_expect_tx(bar, T_SLOT);
        if constexpr (AMN) {
            tma_load_2d(sb, tm_as, bar, ac, as_row + g * 2 * SGT);
        } else {
            tma_load_2d(sb, tm_as, bar, g * T_SLD, as_row);
        }
        if constexpr (BMN) {
            tma_load_2d(sb + T_SB, tm_bs, bar, bc, bs_row + g * 2 * SGT);
        } else {
            tma_load_2d(sb + T_SB, tm_bs, bar, g * T_SLD, bs_row);
        }
    };
    if (leader) {
#pragma unroll
        for (int s = 0; s < AHEAD; ++s)
            if (s < KT) issue_data(s);
        for (int g = 0; g < NSG && g < NG; ++g) issue_scales(g);
    }

    // The window check (all threads; scratch: canonical buffer 0, first written after it).
    unsigned char* const exps_a = smem + T_EXPS;
    unsigned char* const exps_b = exps_a + BM;
    const bool ea5 = a_e5m2 != 0, eb5 = b_e5m2 != 0;
    const long long a_sld = d[D_A_SLD], b_sld = d[D_B_SLD];
    const bool f16m = mx_window_check<AKIND, BKIND, BM, BN, kWsThreads>(
        a_scale + d[D_A_SOFF] + (AMN ? r0 : r0 * a_sld), a_sld, rows_valid,
        b_scale + d[D_B_SOFF] + (BMN ? c0 : c0 * b_sld), b_sld, cols_valid, len, ea5, eb5,
        mx_bf16 == 0 && KT >= kWmxMinKTiles, reinterpret_cast<unsigned*>(smem + T_CANON),
        exps_a, exps_b, threadIdx.x);

    if (threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups ----------------
        regs_release<WmxRegs<BMN>::PRODUCER>();
        const int t = static_cast<int>(threadIdx.x) - kWsConsumers;
        const int bias_b = mx_s_max(eb5) + LPM_FP16_EXP_BIAS;
        // Tile kt-NCB retired: its canonical buffer, its raw A stage (which tile kt+AHEAD
        // takes) and, after the last tile of a scale group, its slot are free (both layouts).
        // B's raw stage for tile kt+AHEAD last held tile kt-1, which every producer has widened
        // once all of them pass the barrier: EMPTY (consumers and producers), or before the
        // first EMPTY the producers' own barrier.
        auto refill = [&](int kt) {
            if (kt >= NCB) {
                named_sync(WS_BAR_EMPTY + kt % NCB, kWsThreads);
            } else if (kt + AHEAD >= NSB) {
                named_sync(WS_BAR_PROD, kWsProducers);
            }
            if (leader) {
                if (kt + AHEAD < KT) issue_data(kt + AHEAD);
                // group g's slot last held group g - NSG, whose last tile SGT (g - NSG + 1) - 1
                // is kt - NCB
                const int q = kt - NCB + 1;
                if (q > 0 && q % SGT == 0 && q / SGT + NSG - 1 < NG)
                    issue_scales(q / SGT + NSG - 1);
            }
            const int g = kt / SGT;
            mbar_wait(bbar + 8 * (kt % NSB), static_cast<unsigned>(kt / NSB) & 1u);
            mbar_wait(sbar + 8 * (g % NSG), static_cast<unsigned>(g / NSG) & 1u);
        };
        wmx_produce_b<BMN, L>(t, KT, s0, cols_valid, bias_b, exps_b, f16m, eb5, refill);
        return;
    }

    // ---------------- consumer warpgroups ----------------
    // Warpgroup w owns rows 64w..64w+63 x all 256 columns: per 16-deep step two m64n128k16 with
    // A from registers and B from the canonical buffer, one commit group per step (a step's
    // fragments are widened while the previous step's wgmma run).
    regs_claim<WmxRegs<BMN>::CONSUMER>();
    ep.init_alpha();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm0 = 64 * (warp >> 2) + 16 * (warp & 3);
    const int ar = wm0 + (lane >> 2), aq = lane & 3;
    // The tile rows of the thread's fragment rows lane/4 and lane/4 + 8: ar and ar + 8, or for
    // an MN-major A (frag_row<AMN>: ldmatrix.trans hands each thread a pair of adjacent rows)
    // wm0 + 2 (lane/4) and the next; the epilogue and mx_rescale follow the same map.
    const int ra0 = frag_row<AMN>(wm0, lane, 0), ra1 = frag_row<AMN>(wm0, lane, 1);
    float acc[NI * 4];
#pragma unroll
    for (int i = 0; i < NI * 4; ++i) acc[i] = 0.0f;
    float* const accf = acc;
    // Row ar's words in a raw stage: step s reads 16-byte chunk s, stored at chunk s ^ sw,
    // words aq / 2 and aq / 2 + 2 of it; row ar + 8 (the same swizzle) 8 rows further on.
    const unsigned sw = static_cast<unsigned>((ar >> 1) & 3);
    const unsigned a_off = static_cast<unsigned>(ar * kBK + ((aq >> 1) << 2));
    const unsigned sel = (aq & 1) ? 0x7632u : 0x5410u;  // the thread's half-word of each word
    const unsigned s_off = static_cast<unsigned>(AMN ? ra0 : ar * T_SLD);
    // MN-major A (raw panel [64 lines][128 bytes], 128-byte swizzle: chunk c of line l at
    // c ^ (l & 7)): steps 2p and 2p + 1 in one ldmatrix.x4.trans of 16-bit row pairs, lane l
    // addressing line 32p + l at the warp's chunk wm0 / 16 -- the four 8 x 8 matrices are
    // lines 0-7, 8-15 of step 2p and of step 2p + 1; each thread gets rows ra0, ra1 of
    // contraction lines 2 (lane%4) and 2 (lane%4) + 1 (+ 8 in the second matrix).
    const unsigned a_mn = static_cast<unsigned>(lane * 128 + (((wm0 >> 4) ^ (lane & 7)) << 4));
    const int bias_a = mx_s_max(ea5) + LPM_FP16_EXP_BIAS;
    // fp16 window only: the rows' parts of their factor words (mx_window_row; the window check
    // put every code of a valid row in the window, see mx_block_factor)
    const unsigned fka = mx_window_row(exps_a[ra0], bias_a);
    const unsigned fkb = mx_window_row(exps_a[ra1], bias_a);
    // The k-tile count, for the MN-major build read again from the descriptor (a volatile load,
    // which the compiler cannot merge with the first): ptxas spilled the pre-split value there
    // and reloaded it from local memory in every k-tile.
    const int KTc = BMN ? static_cast<int>((ld_volatile_s64(d + D_LEN) + kBK - 1) / kBK) : KT;
    // MN-major A (wgrad: each expert contracts its own tokens, a multiple of 16): in a last
    // k-tile that ends early, the copies read the next expert's lines; the steps past the
    // contraction multiply zero A fragments by zeroed B lines instead, +0 products as in the
    // plain kernel's zero-filled tail. The tail's length sits in shared memory (tail_len, read
    // in the last k-tile only): a register for it through the k-loop spills.
    auto loop = [&](auto h, auto e5) {
        constexpr bool H = decltype(h)::value, E5 = decltype(e5)::value;
        // NCB k-tiles at a time (group c): the canonical buffer is a constant of the unrolled
        // k-tiles, A's stage NCB (c % 2) + u and its phase (c / 2) & 1 (NSA = 2 NCB) bit
        // operations on the group index, so the k-tile head needs no division by 3 or 6
        // (unrolled over A's whole ring instead, ptxas serializes the wgmma: C7512)
        static_assert(NSA == 2 * NCB, "two groups of NCB k-tiles per turn of A's stage ring");
        for (int c = 0; NCB * c < KTc; ++c) {
#pragma unroll
        for (int u = 0; u < NCB; ++u) {
            const int kt = NCB * c + u;
            if (kt >= KTc) break;
            const int cb = u;
            named_sync(WS_BAR_FULL + cb, kWsThreads);  // B of tile kt widened into buffer cb
            const int st = NCB * (c & 1) + u, g = kt / SGT;
            const unsigned ph_a = static_cast<unsigned>(c >> 1) & 1u;
            // A's copies were issued with B's, which the producers waited for before arriving at
            // FULL; the wait makes A's TMA writes visible to this thread (and is usually one
            // try_wait)
            mbar_wait(abar + 8 * st, ph_a);
            mbar_wait(sbar + 8 * (g % NSG), static_cast<unsigned>(g / NSG) & 1u);
            if constexpr (AMN) {
                // a last k-tile that ends early: its B lines from tail_len on (bytes
                // 128 * tail_len on of each 64-column panel) become zeros, so that the steps
                // there multiply zeros by the zero A fragments below, as the plain kernel does
                if (kt == KTc - 1) {
                    const unsigned tail = lds_u32_volatile(tail_len);
                    if (tail < kBK) {
                        const unsigned pb = s0 + T_CANON + cb * CANON_B +
                                            (threadIdx.x >> 6) * (kBK * 128);
                        for (unsigned o = tail * 128 + 16 * (threadIdx.x & 63); o < kBK * 128;
                             o += 64 * 16)
                            sts_v4(pb + o, 0u, 0u, 0u, 0u);
                        fence_proxy_async();
                        named_sync(WS_BAR_EPI, kWsConsumers);
                    }
                }
            }
            // B's canonical buffer (MN-major: 64-row panels 8 KiB apart, a step = 16 lines)
            const unsigned long long db =
                wg_desc(s0 + T_CANON + cb * CANON_B, BMN ? kBK * 128 : 16, 1024);
            const unsigned ra = s0 + st * T_DA + (AMN ? a_mn : a_off);
            const unsigned rsc = s0 + T_SC + (g % NSG) * T_SLOT + (kt % SGT) * 2 * (AMN ? BM : 1) +
                                 s_off;
            // the block codes of rows ra0 (ma*) and ra1 (mb*), blocks 0 and 1 (K-major: one
            // half-word per row; MN-major: one per block line, rows ra0 and ra1 side by side)
            const unsigned ca = lds_u16(rsc), cr = lds_u16(rsc + (AMN ? BM : 8 * T_SLD));
            const unsigned ea0 = ca & 0xFFu, ea1 = (AMN ? cr : ca >> 8) & 0xFFu;
            const unsigned eb0 = AMN ? ca >> 8 : cr & 0xFFu, eb1 = cr >> 8;
            // fp16 window: one IMAD per factor (codes of rows past the valid ones and of blocks
            // past the contraction give other bits: those rows are never stored, those steps'
            // fragments are zeroed below); bf16: 2^(e - 127)
            const unsigned ma0 = mx_block_factor<H>(ea0, fka), ma1 = mx_block_factor<H>(ea1, fka);
            const unsigned mb0 = mx_block_factor<H>(eb0, fkb), mb1 = mx_block_factor<H>(eb1, fkb);
            auto chunk = [&](int s) { return ra + ((static_cast<unsigned>(s) ^ sw) << 4); };
            // each step's words are loaded one step ahead, before the wgmma wait (MN-major:
            // two steps' words per load, the second pair after step 1's decode)
            unsigned wa0, wa1, wb0, wb1;
            if constexpr (AMN) {
                ldsm_x4_t(ra, wa0, wa1, wb0, wb1);
            } else {
                wa0 = lds_u32(chunk(0));
                wa1 = lds_u32(chunk(0) + 8);
                wb0 = lds_u32(chunk(0) + 8 * kBK);
                wb1 = lds_u32(chunk(0) + 8 * kBK + 8);
            }
            unsigned af[2][4];
#pragma unroll
            for (int s = 0; s < kBK / 16; ++s) {
                ws_step_wait<NI * 4>(s, kt >= 1 && kt - 1 + NCB < KTc, (u + NCB - 1) % NCB, accf);
                unsigned* const f = af[s & 1];
                if constexpr (AMN) {
                    // step s: lines 0-7 in x, 8-15 in y; bytes (row ra0, line 2q), (ra1, 2q),
                    // (ra0, 2q + 1), (ra1, 2q + 1) of each
                    const unsigned x = (s & 1) ? wb0 : wa0, y = (s & 1) ? wb1 : wa1;
                    mx_decode4<E5, H>(__byte_perm(x, y, 0x6420u), s < 2 ? ma0 : ma1, f[0], f[2]);
                    mx_decode4<E5, H>(__byte_perm(x, y, 0x7531u), s < 2 ? mb0 : mb1, f[1], f[3]);
                    if (s == 1) ldsm_x4_t(ra + 32 * 128, wa0, wa1, wb0, wb1);
                    if (s > 0 && kt == KTc - 1 && 16 * s >= lds_u32_volatile(tail_len))
                        f[0] = f[1] = f[2] = f[3] = 0u;
                } else {
                    mx_decode4<E5, H>(__byte_perm(wa0, wa1, sel), s < 2 ? ma0 : ma1, f[0], f[2]);
                    mx_decode4<E5, H>(__byte_perm(wb0, wb1, sel), s < 2 ? mb0 : mb1, f[1], f[3]);
                    if (s + 1 < kBK / 16) {
                        const unsigned ch = chunk(s + 1);
                        wa0 = lds_u32(ch);
                        wa1 = lds_u32(ch + 8);
                        wb0 = lds_u32(ch + 8 * kBK);
                        wb1 = lds_u32(ch + 8 * kBK + 8);
                    }
                }
                wg_fence();
#pragma unroll
                for (int n = 0; n < 2; ++n)
                    wgmma_m64n128k16_rs<H, BMN ? 1 : 0>(
                        accf + 64 * n, af[s & 1],
                        static_cast<unsigned>(db) + ((n * (128 * 128) + s * B_STEP) >> 4),
                        static_cast<unsigned>(db >> 32));
                wg_commit();
                wg_fence_acc<NI * 4>(accf);
            }
        }
        }
        // retired inside each staging mode's loop: the modes' accumulators meet only after
        // (ptxas serializes the wgmma when they join with groups in flight)
        wg_wait0();
        wg_fence_acc<NI * 4>(accf);
    };
    with_flags(f16m, ea5, loop);  // one k-loop per staging mode and A format
    if (f16m) {
        mx_rescale<1, NI, AMN>(accf, exps_a, exps_b, mx_rescale_shift(ea5, eb5), wm0, 0, lane);
    }
    // (the staging tile ends below the exponents, which mx_rescale read before)
    ws_epilogue<BN, NI, EPI_LD, AMN>(smem, accf, wm0, lane, ep, r0, c0, rows_valid, cols_valid);
}

}  // namespace lpm_gg

// extern "C" entry point NAME of the warp-specialised MXFP8 kernel (sm_90a; A K-major or, with
// AMN, MN-major; B K-major or, with BMN, MN-major): the tensor maps of A's and B's data (K-major:
// 64-byte swizzle; MN-major: 128-byte swizzle) and block scales follow the common parameters.
// On other architectures the wgmma compile to traps; the launcher never selects it there.
#define LPM_GG_DEFINE_WS_MX(NAME, AMN, BMN)                                                    \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWsThreads, 1)                        \
        NAME(LPM_GG_PARAMS, LPM_GG_WS_TMA_PARAMS) {                                            \
        lpm_gg::gemm_ws_mx<AMN, BMN>(LPM_GG_ARGS, LPM_GG_WS_TMA_ARGS);                         \
    }

#endif  // LPM_GROUPED_GEMM_WS_MX_CUH
