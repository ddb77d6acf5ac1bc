// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// warp-specialised MXFP8 kernel gemm_ws_mx with TMA loads -- A K-major (x in fprop, dy in dgrad)
// or MN-major (AMN, wgrad: dy's columnwise copy), B K-major (fprop: W's rows) or MN-major (BMN,
// dgrad: W's columnwise copy, wgrad: x's) -- and its entry-point macro LPM_GG_DEFINE_WS_MX.
// 128 x 256 output tile, 512 threads, the roles of gemm_ws:
//   * all threads first check the tile against the fp16 window from its rows' precomputed
//     block-code ranges (mx_window_check_ranges, grouped_gemm_mx_ranges.cuh, while the first
//     tiles' copies fly; the same verdict as the plain kernel's mx_window_check): in the
//     window, both operands are widened on fp16 as
//     q * 2^(e - e_max + S_MAX) and the accumulators rescaled before the epilogue (mx_rescale);
//     otherwise (or with fewer than kWmxMinKTiles k-tiles, or mx_bf16) on bf16 as q * 2^(e-127)
//     -- the two staging modes of the plain wgmma kernel, with the same values;
//   * warpgroups 0-1 ("consumers"): per 16-deep step they widen their A fragments straight from
//     the raw stage into registers and issue two m64n128k16 with B from a canonical buffer
//     (wmx_consume, grouped_gemm_ws_mx_consume.cuh; an MN-major A through ldmatrix.trans, whose
//     row permutation the window rescale and the epilogue's staging undo); then the epilogue;
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
#include "grouped_gemm_ws_mx_consume.cuh"
#include "grouped_gemm_mx_ranges.cuh"

namespace lpm_gg {

// Tiles with fewer k-tiles stay on bf16: with the range words the window's fixed costs (two
// barriers and 384 loads, overlapping the first copies, and the rescale of 128 accumulators
// per consumer thread) are small, and on the H200 a widened k-tile costs ~1.10 us on fp16
// against ~1.55 us on bf16 (wgrad, both operands MN-major), but tiles of one or two k-tiles
// measured 11 % and 5 % slower on fp16, four 4 % faster, eight 12 %.
constexpr int kWmxMinKTiles = 4;

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
                                           const TmaMap* tm_as, const TmaMap* tm_bs,
                                           LPM_GG_MX_RANGE_PARAMS) {
    constexpr int BM = 128, BN = 256;
    constexpr int AKIND = AMN ? KIND_FP8_MN : KIND_FP8_K;
    constexpr int BKIND = BMN ? KIND_FP8_MN : KIND_FP8_K;
    constexpr int NSA = kWmxAStages, NSB = kWmxBStages, NCB = kWmxCanonBuffers;
    constexpr int AHEAD = kWmxAhead;
    constexpr int NSG = kWmxScaleSlots, SGT = kWmxScaleTiles;
    using L = WmxLayout<AMN, BMN>;  // shared-memory layout (grouped_gemm_ws_mx_produce.cuh)
    constexpr int T_DA = L::T_DA, T_DB = L::T_DB, CANON_B = L::CANON_B;
    constexpr int T_CANON = L::T_CANON, T_SLD = L::T_SLD, T_SLOT = L::T_SLOT;
    constexpr int T_SB = L::T_SB, T_EXPS = L::T_EXPS;
    constexpr int EPI_LD = BN + 8;
    constexpr int SMEM = ws_mx_smem_bytes();
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)
    static_assert(T_DA % 1024 == 0 && T_DB % 1024 == 0 && T_CANON % 1024 == 0 &&
                      CANON_B % 1024 == 0 && T_SLOT % 128 == 0 && T_SB % 128 == 0 &&
                      T_SLD == 16,
                  "TMA destinations (64-byte swizzle: 512-byte aligned) and swizzle atoms");
    static_assert(T_EXPS + BM + BN + 1024 <= SMEM && SMEM <= kMaxSmem &&
                      BN * 2 * SGT == T_SLOT - T_SB,
                  "shared memory");
    static_assert(BM * EPI_LD * 4 <= T_EXPS, "the epilogue staging tile spares the exponents");
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
    // the copy-issuing thread's tensor-map rows of the tile
    const WmxRows rw = leader ? wmx_rows<AMN, BMN>(d, r0, c0) : WmxRows{};
    auto issue_data = [&](int kt) {
        wmx_issue_data<AMN, BMN, L>(s0, abar, bbar, kt, kt, rw, tm_a, tm_b);
    };
    auto issue_scales = [&](int g) {
        wmx_issue_scales<AMN, BMN, L>(s0, sbar, g, g, rw, tm_as, tm_bs);
    };
    if (leader) {
#pragma unroll
        for (int s = 0; s < AHEAD; ++s)
            if (s < KT) issue_data(s);
        for (int g = 0; g < NSG && g < NG; ++g) issue_scales(g);
    }

    // The window check (all threads) from the rows' range words (grouped_gemm_mx_ranges.cuh)
    unsigned char* const exps_a = smem + T_EXPS;
    unsigned char* const exps_b = exps_a + BM;
    const bool ea5 = a_e5m2 != 0, eb5 = b_e5m2 != 0;
    const long long a_sld = d[D_A_SLD], b_sld = d[D_B_SLD];
    const int g = static_cast<int>((d - desc) / kDescWords);
    const bool f16m = mx_window_check_ranges<BM, BN, kWsThreads, 0>(
        mx_ranges_a(mx_words, g, ranges_ra, ranges_rb, r0), rows_valid,
        mx_ranges_b(mx_words, g, ranges_ra, ranges_rb, c0), cols_valid, ea5, eb5,
        mx_bf16 == 0 && KT >= kWmxMinKTiles &&
            mx_scan_aligned<AKIND>(a_scale + d[D_A_SOFF] + (AMN ? r0 : r0 * a_sld), a_sld, len) &&
            mx_scan_aligned<BKIND>(b_scale + d[D_B_SOFF] + (BMN ? c0 : c0 * b_sld), b_sld, len),
        exps_a, exps_b, threadIdx.x, mx_tile_range);

    if (threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups ----------------
        regs_release<WmxRegs<BMN>::PRODUCER>();
        const int t = static_cast<int>(threadIdx.x) - kWsConsumers;
        const int bias_b = mx_s_max(eb5) + LPM_FP16_EXP_BIAS;
        auto refill = [&](int kt) {
            wmx_refill<L>(kt, KT, NG, leader, bbar, sbar, issue_data, issue_scales);
        };
        wmx_produce_b<BMN, L>(t, KT, s0, cols_valid, bias_b, exps_b, f16m, eb5, refill, 0);
        return;
    }

    // ---------------- consumer warpgroups ----------------
    // Warpgroup w owns rows 64w..64w+63 x all 256 columns: per 16-deep step two m64n128k16 with
    // A from registers and B from the canonical buffer, one commit group per step (a step's
    // fragments are widened while the previous step's wgmma run).
    regs_claim<WmxRegs<BMN>::CONSUMER>();
    ep.init_alpha();
    const WmxFrag<AMN, L> fr(threadIdx.x);
    float acc[NI * 4];
#pragma unroll
    for (int i = 0; i < NI * 4; ++i) acc[i] = 0.0f;
    float* const accf = acc;
    const int bias_a = mx_s_max(ea5) + LPM_FP16_EXP_BIAS;
    // fp16 window only: the rows' parts of their factor words (mx_window_row; the window check
    // put every code of a valid row in the window, see mx_block_factor)
    const unsigned fka = mx_window_row(exps_a[fr.ra0], bias_a);
    const unsigned fkb = mx_window_row(exps_a[fr.ra1], bias_a);
    // The k-tile count, for the MN-major build read again from the descriptor (a volatile load,
    // which the compiler cannot merge with the first): ptxas spilled the pre-split value there
    // and reloaded it from local memory in every k-tile.
    const int KTc = BMN ? static_cast<int>((ld_volatile_s64(d + D_LEN) + kBK - 1) / kBK) : KT;
    // MN-major A (wgrad: each expert contracts its own tokens, padded to the 32-token block):
    // in a last k-tile that ends early, the copies read the next expert's lines; wmx_consume
    // zeroes them (and B's) so that the steps past the contraction give +0 products, as the
    // plain kernel's zero-filled tail. The tail's length sits in shared memory (tail_len, read
    // in the last k-tile only): a register for it through the k-loop spills.
    auto loop = [&](auto h, auto e5) {
        wmx_consume<AMN, BMN, L, decltype(h)::value, decltype(e5)::value, NI * 4>(
            accf, fr, s0, abar, sbar, tail_len, exps_a, fka, fkb, 0, KTc, KTc);
        // retired inside each staging mode's loop: the modes' accumulators meet only after
        // (ptxas serializes the wgmma when they join with groups in flight)
        wg_wait0();
        wg_fence_acc<NI * 4>(accf);
    };
    with_flags(f16m, ea5, loop);  // one k-loop per staging mode and A format
    if (f16m) {
        mx_rescale<1, NI, AMN>(accf, exps_a, exps_b, mx_rescale_shift(ea5, eb5), fr.wm0, 0,
                               fr.lane);
    }
    // (the staging tile ends below the exponents, which mx_rescale read before)
    ws_epilogue<BN, NI, EPI_LD, AMN>(smem, accf, fr.wm0, fr.lane, ep, r0, c0, rows_valid, cols_valid);
}

}  // namespace lpm_gg

// extern "C" entry point NAME of the warp-specialised MXFP8 kernel (sm_90a; A K-major or, with
// AMN, MN-major; B K-major or, with BMN, MN-major): the tensor maps of A's and B's data (K-major:
// 64-byte swizzle; MN-major: 128-byte swizzle) and block scales follow the common parameters.
// On other architectures the wgmma compile to traps; the launcher never selects it there.
#define LPM_GG_DEFINE_WS_MX(NAME, AMN, BMN)                                                    \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWsThreads, 1)                        \
        NAME(LPM_GG_PARAMS, LPM_GG_WS_TMA_PARAMS, LPM_GG_MX_RANGE_PARAMS) {                    \
        lpm_gg::gemm_ws_mx<AMN, BMN>(LPM_GG_ARGS, LPM_GG_WS_TMA_ARGS, LPM_GG_MX_RANGE_ARGS);   \
    }

#endif  // LPM_GROUPED_GEMM_WS_MX_CUH
