// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// 384-thread form of the warp-specialised NVFP4 kernel's TMA build, gemm_ws_n256, and its
// entry-point macro LPM_GG_DEFINE_WS_N256. 128 x 256 output tile, like gemm_ws:
//   * warpgroups 0-1 (threads 0-255, consumers): warpgroup w owns rows 64w..64w+63; per 16-deep
//     step it decodes its A fragments from the raw stage into registers and issues ONE
//     m64n256k16 with A from registers and B from a canonical buffer, keeping one wgmma group in
//     flight while it decodes the next step; then the epilogue;
//   * warpgroup 2 (threads 256-383, producers): thread 0 issues the TMA copies (gemm_ws's
//     schedule); every thread expands two units of B (rows ur, ur + 128; ur < 64) into a
//     canonical buffer, the consumers the other 256 units (rows 64-127, 192-255), one each, of
//     the k-tile after the one they multiply.
// Why 384 threads: __launch_bounds__(512, 1) fixes a 128-register target, and ptxas checks each
// wgmma against it (not against setmaxnreg's counts, although it allocates the consumer code
// up to them): with 512 threads it refuses m64n256k16 with A from registers and serializes
// gemm_ws's m64n128k16 groups (C7511). With 384 threads the target is 168, and setmaxnreg
// gives the consumers kWnConsumerRegs (their code uses registers up to R192).
// The consumers also expand half of B (see WsNextUnit): with the producers expanding all
// of it, skipping their decode made the kernel 10-14 % faster, skipping the consumers' A decode
// 2-5 %. The handshake (FULL / EMPTY named barriers, mbarriers of the raw stages and scale
// slots), the shared-memory layout (WsTmaLayout; its fragment buffers hold the consumers'
// B-unit addresses instead) and the k-tile steps are gemm_ws's, so every output element gets
// the same products in the same order: the results are bitwise gemm_ws's.

#ifndef LPM_GROUPED_GEMM_WS_N256_CUH
#define LPM_GROUPED_GEMM_WS_N256_CUH

#include "grouped_gemm_ws_fp4.cuh"
#include "grouped_gemm_ws_roles.cuh"

namespace lpm_gg {

constexpr int kWnConsumers = kWsConsumers;  // two warpgroups: wgmma and the epilogue
constexpr int kWnProducers = 128;           // one warpgroup: TMA requests, B expansion
constexpr int kWnThreads = kWnConsumers + kWnProducers;
constexpr int kWnLaunchRegs = ws_launch_regs(kWnThreads);  // 168
// The consumers hold 128 accumulators, the fragments of two steps, a step's raw words, their
// B unit's offsets and the decoder's temporaries; the producers their two units' offsets and
// decodes (ptxas: consumer code up to R192, producer code up to R33).
constexpr int kWnConsumerRegs = 224;
constexpr int kWnProducerRegs =
    ws_producer_regs(kWnConsumers, kWnConsumerRegs, kWnProducers);  // 56
static_assert(kWnProducerRegs % 8 == 0 && kWnProducerRegs >= 24, "setmaxnreg granularity");
static_assert(kWnLaunchRegs >= 160, "ptxas: m64n256k16 with A from registers");

// The B units of a k-tile (512: 256 rows x 2 contraction halves) are split between the roles:
// producer thread t expands rows ur = t / 2 and ur + 128 (WsFp4Units: rows 0-63 and 128-191;
// its k-tile is ws_fp4_produce's, without the A fragments, on 384-thread barriers), consumer
// thread c one unit of rows 64-127 and 192-255 (WsNextUnit), for the k-tile after the one it
// multiplies. With all four units per producer thread, skipping the producers' decode made the
// kernel 10-14 % faster; the split measured 0.6-2.0 % faster than four units.

// Consumer thread c's unit of B (c < 128: row 64 + c / 2; else row 128 + c / 2; contraction
// half c % 2): its shared-memory addresses in raw stage 0's B half, scale slot 0's B rows and
// canonical buffer 0 (the ring positions add constants: see ws_n256_consumer_unit), kept in
// shared memory at `at` (gemm_ws_n256: thread c's 16 bytes in the unused A-fragment buffers)
// and loaded per unit: held in registers, ptxas recomputes them from the thread index every
// k-tile instead (~16 instructions on the consumers' critical path).
struct WsNextUnit {
    unsigned at = 0;
    __device__ __forceinline__ WsNextUnit() {}
    // thread c's addresses, kept at `at`
    __device__ __forceinline__ WsNextUnit(unsigned c, unsigned s0, unsigned at_) : at(at_) {
        store(c, s0);
    }
    // (again: gemm_ws_p<..., N256> keeps them in a staging buffer, which its epilogue
    // overwrites)
    __device__ __forceinline__ void store(unsigned c, unsigned s0) const {
        using L = WsTmaLayout;
        static_assert(2 * kWnProducers + kWnConsumers == TileGeo<KIND_FP4_K, 256>::UNITS,
                      "two B units per producer thread, one per consumer thread");
        const int row = 64 + static_cast<int>(c >> 1) + (c >= 128 ? 64 : 0);
        const int h = static_cast<int>(c) & 1;
        sts_v4(at, s0 + L::T_DA + static_cast<unsigned>(row * (kBK / 2) + h * 16),
               s0 + L::T_SC + L::T_SB + static_cast<unsigned>(row * L::T_SLD + h * 2),
               s0 + L::T_CANON + static_cast<unsigned>(k_canon_off(row, 4 * h)), 0u);
    }
};

// A consumer thread's unit of B for k-tile j = k0 + v (its copies waited for here; the
// producers' waits do not cover this thread) into canonical buffer j % 3, which the consumers
// may write once both warpgroups passed FULL of k-tile j - 1 (every wgmma of k-tile j - 3, its
// last reader, retired by then: each warpgroup waits for all but one group at k-tile j - 2's
// step 1), and the fence that, with FULL of k-tile j, hands it to the wgmma.
// k0 is a multiple of kWsRingPeriod, so every ring index is a function of v (a constant of the
// consumers' unrolled period, 1..kWsRingPeriod) -- except the scale slots' phase, ph_s ^ (that
// of v): ph_s = (k0 / kWsRingPeriod) & 1, as in ws_fp4_consume_period.
__device__ __forceinline__ void ws_n256_consumer_unit(int v, unsigned ph_s, unsigned dbar,
                                                      unsigned sbar, const WsNextUnit& nu) {
    using L = WsTmaLayout;
    constexpr int NST = kWsStages, NCB = kWsCanonBuffers, NSG = kWsScaleSlots;
    constexpr int SGT = kWsScaleTiles, P = kWsRingPeriod;
    static_assert(P % NCB == 0 && P % NST == 0 && P == SGT * NSG && (P / NST) % 2 == 0,
                  "ring positions and stage phases of k0 + v are those of v");
    const int st = v % NST, sl = (v / SGT) % NSG;
    const uint4 a = lds_v4(nu.at);  // raw, scale and canonical addresses (see WsNextUnit)
    mbar_wait(dbar + 8 * st, static_cast<unsigned>(v / NST) & 1u);
    mbar_wait(sbar + 8 * sl, ph_s ^ (static_cast<unsigned>(v / P) & 1u));
    // every unit, also those of columns past the tile's extent: a B row feeds only its own
    // output column, and those columns are never stored (the skip's branch cost more than the
    // rare partial tile's decode saves)
    ws_fp4_expand_unit(a.x + st * L::T_STAGE, a.y + sl * L::T_SLOT + (v % SGT) * 4,
                       a.z + (v % NCB) * L::CANON_B);
    fence_proxy_async();
}

// The kernel body (NVFP4, both operands K-major, TMA loads; the launcher's conditions are
// gemm_ws's TMA build's).
__device__ __forceinline__ void gemm_ws_n256(LPM_GG_PARAMS, const TmaMap* tm_a,
                                             const TmaMap* tm_b, const TmaMap* tm_as,
                                             const TmaMap* tm_bs) {
    constexpr int BM = 128, BN = 256, CH = 16;
    constexpr int NST = kWsStages, NSG = kWsScaleSlots, SGT = kWsScaleTiles;
    constexpr int EPI_LD = BN + 8;
    constexpr int SMEM = ws_tma_smem_bytes();
    static_assert(BM * EPI_LD * 4 + 1024 <= SMEM, "epilogue staging");
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != CH || b_ch != CH, s0);

    LPM_GG_TILE_SETUP(BM, BN, rows_valid, cols_valid, kWnThreads)
    const int KT = static_cast<int>((len + kBK - 1) / kBK);
    const int NG = (KT + SGT - 1) / SGT;  // scale groups

    __shared__ __align__(8) unsigned long long wn_bar[NST + NSG];
    const unsigned dbar = smem_u32(wn_bar), sbar = dbar + 8 * NST;
    ws_fp4_bars_init(dbar, threadIdx.x == kWnConsumers);

    if (threadIdx.x >= kWnConsumers) {
        // ---------------- producer warpgroup ----------------
        regs_release<kWnProducerRegs>();
        // gemm_ws's TMA producers without the A fragments (sharing this block as a function
        // changes both kernels' prologue scheduling: kept inline while the GPU cannot re-check)
        const unsigned t = threadIdx.x - kWnConsumers;
        const bool leader = t == 0;
        const WsRows rw = leader ? ws_rows(d, r0, c0) : WsRows{0, 0, 0, 0};
        auto issue_data = [&](int kt) {
            ws_fp4_issue_data(s0, dbar, kt % NST, kt, rw, tm_a, tm_b);
        };
        auto issue_scales = [&](int g) {
            ws_fp4_issue_scales(s0, sbar, g % NSG, g, rw, tm_as, tm_bs);
        };
        if (leader) ws_fp4_issue_first(KT, NG, issue_data, issue_scales);
        const WsFp4Units u(t);
        for (int kt = 0; kt < KT; ++kt)
            ws_fp4_produce<kWnThreads>(kt, KT, NG, leader, s0, dbar, sbar, u, cols_valid,
                                       issue_data, issue_scales);
        return;
    }

    // ---------------- consumer warpgroups ----------------
    regs_claim<kWnConsumerRegs>();
    ep.init_alpha();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm0 = 64 * (warp >> 2) + 16 * (warp & 3);
    float acc[1][NI][4];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][ni][e] = 0.0f;
    float* const accf = &acc[0][0][0];
    const WsARow me(threadIdx.x);  // this thread's A row in a raw stage and a scale slot
    // this thread's unit of B
    static_assert(16 * kWnConsumers <= kWsCanonBuffers * kWsFragBytes,
                  "the consumers' unit addresses fit the fragment buffers");
    const WsNextUnit nu(threadIdx.x, s0, s0 + WsTmaLayout::T_FRAG + 16 * threadIdx.x);
    if (KT > 0) ws_n256_consumer_unit(0, 0u, dbar, sbar, nu);
    // after step 1 of k-tile kt = k0 + u: the unit of k-tile kt + 1 (v = u + 1). After step 0
    // or step 2 instead, ptxas serializes the wgmma (C7513: it defines A-fragment registers
    // between a wgmma and its wait; after step 2 measured 13-18 % slower).
    unsigned ph_s = 0u;  // (k0 / kWsRingPeriod) & 1
    const auto next_unit = [&](int u, int kt, int s) {
        if (s == 1 && kt + 1 < KT)
            ws_n256_consumer_unit(u + 1, ph_s, dbar, sbar, nu);
    };
    for (int k0 = 0; k0 < KT; k0 += kWsRingPeriod, ph_s ^= 1u)
        ws_fp4_consume_period<NI * 4, kWnThreads, true>(accf, k0, KT, s0, dbar, sbar, me,
                                                        lane & 3, next_unit);
    wg_wait0();
    wg_fence_acc<NI * 4>(accf);
    ws_epilogue<BN, NI, EPI_LD>(smem, accf, wm0, lane, ep, r0, c0, rows_valid, cols_valid);
}

}  // namespace lpm_gg

// extern "C" entry point NAME of the 384-thread warp-specialised NVFP4 TMA build (sm_90a; see
// gemm_ws_n256): gemm_ws's TMA parameters.
#define LPM_GG_DEFINE_WS_N256(NAME)                                                            \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWnThreads, 1)                        \
        NAME(LPM_GG_PARAMS, LPM_GG_WS_TMA_PARAMS) {                                            \
        lpm_gg::gemm_ws_n256(LPM_GG_ARGS, LPM_GG_WS_TMA_ARGS);                                 \
    }

#endif  // LPM_GROUPED_GEMM_WS_N256_CUH
