// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// warp-specialised wgmma kernel body gemm_ws for quantized operands and its entry-point macro
// LPM_GG_DEFINE_WS. Instantiated for NVFP4 (both operands K-major), 128 x 256 output tile,
// 512 threads:
//   * warpgroups 0-1 (threads 0-255, "consumers"): warpgroup w owns rows 64w..64w+63. Each
//     16-deep step it decodes its A fragments straight from the raw stage into registers
//     (fp4_a_frags: the same values the canonical tile would hold) and issues two
//     m64n128k16 with A from registers and B from a canonical buffer; then the epilogue;
//   * warpgroups 2-3 (threads 256-511, "producers"): the cp.async copies of both raw tiles,
//     the block scales, and the expansion of the B tile into a canonical buffer.
// setmaxnreg gives the consumers 176 registers (128 accumulators, the fragments of two steps,
// the decoder) and the producers the rest (80).
// Only B is expanded into shared memory, so a k-tile costs the producers a third less work and
// the shared memory a third fewer stores and a third fewer wgmma operand reads (A comes from
// registers); the A decode runs on the consumers, overlapped with their own wgmma (one commit
// group per step: step s is decoded while step s-1 runs).
// The handshake uses named barriers: FULL[b] (the producers arrive after expanding B into buffer
// b; the raw stage's A half and scales landed before), EMPTY[b] (the consumers arrive once the
// wgmma of the tile in buffer b retired; the producers wait before expanding into b again and
// before refilling that tile's raw stage, whose A half the consumers read until then), a
// barrier for the producers' own cp.async copies and one for the consumers' epilogue. Raw
// tiles are requested kWsAhead tiles ahead of the one being expanded (kWsStages raw stages,
// ws_smem_bytes). Every output element gets the same products in the same 16-deep steps and
// order as in gemm_mma, so the results are bitwise those of the other wgmma kernels (and
// grouped == per-expert holds across the family).

#ifndef LPM_GROUPED_GEMM_WS_CUH
#define LPM_GROUPED_GEMM_WS_CUH

#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_mma.cuh"
#include "grouped_gemm_epilogue.cuh"
#include "grouped_gemm_tma.cuh"

namespace lpm_gg {

constexpr int kWsConsumers = 256;  // two warpgroups: wgmma and the epilogue
constexpr int kWsProducers = 256;  // two warpgroups: copies, block scales, B expansion
constexpr int kWsThreads = kWsConsumers + kWsProducers;
// Registers per thread after the role split (setmaxnreg): the consumers hold 128 fp32
// accumulators each, the A fragments of two steps and the decoder's temporaries (with fewer,
// ptxas serializes the wgmma). setmaxnreg only moves registers within the CTA's launch
// allocation (kWsLaunchRegs per thread, the __launch_bounds__ share; here the whole file): the
// consumers would block forever in setmaxnreg.inc if the producers released less than they
// claim.
constexpr int kWsLaunchRegs = 65536 / kWsThreads / 8 * 8;  // 128
constexpr int kWsConsumerRegs = 176;
constexpr int kWsProducerRegs =
    (kWsLaunchRegs * kWsThreads - kWsConsumerRegs * kWsConsumers) / kWsProducers / 8 * 8;  // 80
static_assert(kWsProducerRegs % 8 == 0 && kWsProducerRegs >= 24, "setmaxnreg granularity");
// The TMA build's producers hold no copy state, and its consumers keep a step's raw words one
// step ahead: 8 registers move from the producers to the consumers.
constexpr int kWsTmaConsumerRegs = kWsConsumerRegs + 8;
constexpr int kWsTmaProducerRegs =
    (kWsLaunchRegs * kWsThreads - kWsTmaConsumerRegs * kWsConsumers) / kWsProducers / 8 * 8;  // 72
static_assert(kWsTmaProducerRegs % 8 == 0 && kWsTmaProducerRegs >= 24, "setmaxnreg granularity");
// Named barriers (0 is __syncthreads).
constexpr int WS_BAR_PROD = 1;   // the producer warpgroups
constexpr int WS_BAR_EPI = 2;    // the consumer warpgroups
constexpr int WS_BAR_FULL = 3;   // + buffer (3 buffers at most)
constexpr int WS_BAR_EMPTY = 6;  // + buffer

__device__ __forceinline__ void named_sync(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int nthreads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
// Per-warpgroup register budget (sm_90a): release registers (producer) / claim them (consumer).
template <int N>
__device__ __forceinline__ void regs_release() {
#if LPM_GG_HAS_WGMMA
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void regs_claim() {
#if LPM_GG_HAS_WGMMA
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// The start of a consumer's 16-deep step s of k-tile kt (gemm_ws, gemm_ws_mx; one commit group
// per step, NCB canonical buffers, NACC accumulator floats per thread): at most one group stays
// pending, so step s-2's A fragments are free; at s = 1 the whole of tile kt-1 retired and its
// canonical buffer goes back to the producers (unless no later tile takes it).
template <int NCB, int NACC>
__device__ __forceinline__ void ws_step_begin(int s, int kt, int KT, float* accf) {
    wg_wait<1>();
    wg_fence_acc<NACC>(accf);
    if (s == 1 && kt >= 1 && kt - 1 + NCB < KT)
        named_arrive(WS_BAR_EMPTY + (kt - 1) % NCB, kWsThreads);
}

// The TMA build's expansion of one k-tile's B half by one producer thread (gemm_ws,
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

// One k-tile of an NVFP4 consumer thread, TMA build (gemm_ws, gemm_ws_p), after its FULL
// barrier and copy waits: per 16-deep step the A fragment of rows ar, ar + 8 decoded from the
// raw words at ra_s (row ar; row ar + 8 eight rows further on) and the rows' scale words at
// rsc_s, then two m64n128k16 with B from the canonical buffer of descriptor db. Each step's raw
// words are loaded one step ahead, before the wgmma wait, so that only the decode stands
// between that wait and the next wgmma (the rows' scale words once per k-tile). `release`:
// whether step 1 hands the previous k-tile's canonical buffer (pb) back to the producers.
template <int NACC>
__device__ __forceinline__ void ws_fp4_consume(float* accf, unsigned ra_s, unsigned rsc_s,
                                               unsigned long long db, int aq, bool release,
                                               int pb) {
    constexpr int T_SLD = kWsScaleTiles * (kBK / LPM_NVFP4_BLOCK);
    unsigned af[2][4];  // fragments of the step in flight and of the next one
    const unsigned sel = static_cast<unsigned>(aq) | (static_cast<unsigned>(aq + 4) << 4);
    const unsigned sa = lds_u32(rsc_s), sb = lds_u32(rsc_s + 8 * T_SLD);
    uint2 wa = lds_v2(ra_s), wb = lds_v2(ra_s + 8 * (kBK / 2));
#pragma unroll
    for (int s = 0; s < kBK / 16; ++s) {
        wg_wait<1>();
        wg_fence_acc<NACC>(accf);
        if (s == 1 && release) named_arrive(WS_BAR_EMPTY + pb, kWsThreads);
        fp4_a_step(s, wa.x, wa.y, wb.x, wb.y, sa, sb, sel, af[s & 1]);
        if (s + 1 < kBK / 16) {  // the next step's words, in flight across the wait
            wa = lds_v2(ra_s + (s + 1) * 8);
            wb = lds_v2(ra_s + 8 * (kBK / 2) + (s + 1) * 8);
        }
        wg_fence();
        // B's descriptor as two words: the steps and halves add to the low word only
#pragma unroll
        for (int n = 0; n < 2; ++n)
            wgmma_m64n128k16_rs(accf + 64 * n, af[s & 1],
                                static_cast<unsigned>(db) + ((n * (128 * 128) + s * 32) >> 4),
                                static_cast<unsigned>(db >> 32));
        wg_commit();
        wg_fence_acc<NACC>(accf);
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
    static constexpr int T_END = T_SC + kWsScaleSlots * T_SLOT;
};

// k-tile j of a TMA-build producer thread (gemm_ws, gemm_ws_p; J k-tiles and NG scale groups
// in the CTA's sequence): once k-tile j - kWsCanonBuffers retired, its canonical buffer, its
// raw stage (which k-tile j + kWsAhead takes) and, after a scale group's last k-tile, its slot
// are free; the leader requests that data k-tile (issue_data) and, on schedule, scale group
// (j + 6) / 4 (issue_scales: group q's slot last held group q - 3, whose last k-tile 4q - 9 is
// j - 3). Then the thread waits for k-tile j's copies, expands its two units of B (o_raw,
// o_sc, o_cn: ws_fp4_expand_b's offsets; live0 / live1) and arrives at FULL.
template <class IssueData, class IssueScales>
__device__ __forceinline__ void ws_fp4_produce(int j, int J, int NG, bool leader, unsigned s0,
                                               unsigned dbar, unsigned sbar, unsigned o_raw,
                                               unsigned o_sc, const unsigned (&o_cn)[4],
                                               bool live0, bool live1,
                                               const IssueData& issue_data,
                                               const IssueScales& issue_scales) {
    using L = WsTmaLayout;
    constexpr int NST = kWsStages, NCB = kWsCanonBuffers, NSG = kWsScaleSlots;
    constexpr int SGT = kWsScaleTiles, AHEAD = kWsAhead;
    static_assert(AHEAD == 3 && NCB == 3 && NSG == 3 && SGT == 4,
                  "scale-slot schedule: group q issued at k-tile 4q - 6");
    const int cb = j % NCB;
    if (j >= NCB) named_sync(WS_BAR_EMPTY + cb, kWsThreads);
    if (leader) {
        if (j + AHEAD < J) issue_data(j + AHEAD);
        if (j % SGT == 2 && (j + 6) / SGT < NG) issue_scales((j + 6) / SGT);
    }
    const int st = j % NST, g = j / SGT;
    mbar_wait(dbar + 8 * st, static_cast<unsigned>(j / NST) & 1u);
    mbar_wait(sbar + 8 * (g % NSG), static_cast<unsigned>(g / NSG) & 1u);
    ws_fp4_expand_b(s0 + st * L::T_STAGE + L::T_DA + o_raw,
                    s0 + L::T_SC + (g % NSG) * L::T_SLOT + L::T_SB + (j % SGT) * 4 + o_sc,
                    s0 + L::T_CANON + cb * L::CANON_B, o_cn, live0, live1);
    fence_proxy_async();
    named_arrive(WS_BAR_FULL + cb, kWsThreads);
}

// k-tile j of a TMA-build consumer thread (gemm_ws, gemm_ws_p): wait for FULL and for the
// copies (the producers waited for them before arriving; waiting here too makes the TMA writes
// visible to this thread: one try_wait), then ws_fp4_consume on this thread's A row (a_off in a
// raw stage, s_off in a scale slot); `release` as there.
template <int NACC>
__device__ __forceinline__ void ws_fp4_consume_ktile(float* accf, int j, bool release,
                                                     unsigned s0, unsigned dbar, unsigned sbar,
                                                     unsigned a_off, unsigned s_off, int aq) {
    using L = WsTmaLayout;
    constexpr int NST = kWsStages, NCB = kWsCanonBuffers, NSG = kWsScaleSlots;
    constexpr int SGT = kWsScaleTiles;
    const int cb = j % NCB;
    named_sync(WS_BAR_FULL + cb, kWsThreads);  // B of k-tile j expanded into buffer cb
    const int st = j % NST, g = j / SGT;
    mbar_wait(dbar + 8 * st, static_cast<unsigned>(j / NST) & 1u);
    mbar_wait(sbar + 8 * (g % NSG), static_cast<unsigned>(g / NSG) & 1u);
    const unsigned long long db = wg_desc(s0 + L::T_CANON + cb * L::CANON_B, 16, 1024);
    ws_fp4_consume<NACC>(accf, s0 + st * L::T_STAGE + a_off,
                         s0 + L::T_SC + (g % NSG) * L::T_SLOT + (j % SGT) * 4 + s_off, db, aq,
                         release, (j + NCB - 1) % NCB);
}

// The consumers' epilogue (gemm_ws, gemm_ws_mx), after every consumer retired its MMAs: the
// producers finished their last expansion before the last FULL and have no copy in flight, so
// the shared memory from smem on (BM x EPI_LD floats, the front of the pipeline buffers) takes
// the staged accumulators; then the epilogue's compact loop by the kWsConsumers threads.
template <int BN, int NI, int EPI_LD>
__device__ __forceinline__ void ws_epilogue(unsigned char* smem, const float* accf, int wm0,
                                            int lane, Epilogue& ep, long long r0, long long c0,
                                            int rows_valid, int cols_valid) {
    named_sync(WS_BAR_EPI, kWsConsumers);
    float* cs = reinterpret_cast<float*>(smem);
    stage_acc<1, NI, EPI_LD>(cs, accf, wm0, 0, lane);
    named_sync(WS_BAR_EPI, kWsConsumers);
    ep.tile<BN, EPI_LD, kWsConsumers>(cs, r0, c0, rows_valid, cols_valid);
}

// TMA build (TMA = true; LPM_GG_DEFINE_WS_TMA): one producer thread loads each k-tile's two data
// tiles with one tensor-map copy each into the raw stage, and the block scales of
// kWsScaleTiles k-tiles at a time (a 16-byte box per row) into one of kWsScaleSlots scale
// slots; both complete on mbarriers that the producers wait on before expanding B and the
// consumers before decoding A. The other producer threads only expand. A scale slot is refilled
// at the same point of the loop as a raw stage, once the consumers retired the last tile that
// reads it. Rows past an expert's extent load the next expert's rows (or zeros past the
// array); they only reach outputs that are never stored. The launcher guarantees uniform row
// strides (multiples of 16 bytes) for data and scales, experts starting at whole rows and one
// contraction length that is a multiple of the k-tile.
template <int AKIND, int BKIND, bool F16, int CH, bool TMA>
__device__ __forceinline__ void gemm_ws(LPM_GG_PARAMS, const TmaMap* tm_a, const TmaMap* tm_b,
                                        const TmaMap* tm_as, const TmaMap* tm_bs) {
    constexpr int BM = 128, BN = 256;
    static_assert(AKIND == KIND_FP4_K && BKIND == KIND_FP4_K && F16, "NVFP4 operands only");
    constexpr int CANON_B = canon_bytes(BN);
    constexpr int NST = kWsStages, NCB = kWsCanonBuffers, AHEAD = kWsAhead;
    constexpr int RAW_A = raw_bytes(AKIND, BM), RAW_B = raw_bytes(BKIND, BN);
    constexpr int STAGE = RAW_A + RAW_B;
    constexpr int A_SC = round16(raw_data_bytes(AKIND, BM));          // in a stage
    constexpr int B_SC = RAW_A + round16(raw_data_bytes(BKIND, BN));  // in a stage
    constexpr int CANON_OFF = raw_ring_bytes(AKIND, BKIND, BM, BN, NST);
    constexpr int EPI_LD = BN + 8;
    constexpr int SMEM = TMA ? ws_tma_smem_bytes() : ws_smem_bytes(AKIND, BKIND);
    static_assert(CANON_OFF % 1024 == 0 && CANON_B % 1024 == 0, "128-byte swizzle atoms");
    static_assert(CANON_OFF + NCB * CANON_B + 1024 <= SMEM, "shared memory");
    static_assert(BM * EPI_LD * 4 + 1024 <= SMEM, "epilogue staging");
    static_assert(AHEAD >= 2 && NCB >= 2 && NCB <= 3 && kBK == 64, "pipeline depth");
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)
    // TMA build: raw stages of data only, then the canonical buffers, then the scale slots
    // (row r's 16 scale bytes -- 4 per k-tile -- at 16 r; A's 128 rows, then B's 256).
    constexpr int T_DA = raw_data_bytes(AKIND, BM), T_STAGE = T_DA + raw_data_bytes(BKIND, BN);
    constexpr int T_CANON = NST * T_STAGE;
    constexpr int NSG = kWsScaleSlots, SGT = kWsScaleTiles;
    constexpr int T_SLD = SGT * (kBK / LPM_NVFP4_BLOCK);  // 16
    constexpr int T_SC = T_CANON + NCB * CANON_B, T_SLOT = ws_tma_scale_slot_bytes();
    constexpr int T_SB = BM * T_SLD;  // B's rows in a slot
    static_assert(!TMA || (T_STAGE % 128 == 0 && T_DA % 128 == 0 && T_CANON % 1024 == 0 &&
                           T_SLOT % 128 == 0 && T_SB % 128 == 0 && T_SLD == 16),
                  "TMA destinations must be 128-byte aligned");
    static_assert(!TMA || (T_SC + NSG * T_SLOT + 1024 <= SMEM &&
                           SMEM == ws_tma_smem_bytes()),
                  "TMA shared memory");
    static_assert(!TMA || (AHEAD == 3 && NCB == 3 && NSG == 3 && SGT == 4),
                  "scale-slot schedule below: group g issued at k-tile 4g - 6");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != CH || b_ch != CH, s0);

    LPM_GG_TILE_SETUP(BM, BN, rows_valid, cols_valid, kWsThreads)
    const int KT = static_cast<int>((len + kBK - 1) / kBK);
    const int NG = (KT + SGT - 1) / SGT;  // scale groups (TMA build)

    // TMA build: mbarriers of the raw stages (data) and of the scale slots, one arrival each
    // (the issuing thread's expect_tx) plus the copies' bytes.
    __shared__ __align__(8) unsigned long long ws_bar[TMA ? NST + NSG : 1];
    const unsigned dbar = smem_u32(ws_bar), sbar = dbar + 8 * NST;
    if constexpr (TMA) {
        if (threadIdx.x == kWsConsumers) {
#pragma unroll
            for (int i = 0; i < NST + NSG; ++i) mbar_init(dbar + 8 * i, 1);
            mbar_init_fence();
        }
        __syncthreads();
    }

    if (TMA && threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups, TMA build ----------------
        regs_release<kWsTmaProducerRegs>();
        const unsigned t = threadIdx.x - kWsConsumers;
        const bool leader = t == 0;
        int a_row = 0, b_row = 0, as_row = 0, bs_row = 0;
        if (leader) {
            a_row = static_cast<int>(d[D_A_OFF] / d[D_A_LD] + r0);
            b_row = static_cast<int>(d[D_B_OFF] / d[D_B_LD] + c0);
            as_row = static_cast<int>(d[D_A_SOFF] / d[D_A_SLD] + r0);
            bs_row = static_cast<int>(d[D_B_SOFF] / d[D_B_SLD] + c0);
        }
        auto issue_data = [&](int kt) {
            const int st = kt % NST;
            const unsigned sb = s0 + st * T_STAGE, bar = dbar + 8 * st;
            const int kb = kt * (kBK / 2);  // NVFP4: two elements per byte
            mbar_arrive_expect_tx(bar, T_STAGE);
            tma_load_2d(sb, tm_a, bar, kb, a_row);
            tma_load_2d(sb + T_DA, tm_b, bar, kb, b_row);
        };
        auto issue_scales = [&](int g) {
            const int sl = g % NSG;
            const unsigned sb = s0 + T_SC + sl * T_SLOT, bar = sbar + 8 * sl;
            mbar_arrive_expect_tx(bar, T_SLOT);
            tma_load_2d(sb, tm_as, bar, g * T_SLD, as_row);
            tma_load_2d(sb + T_SB, tm_bs, bar, g * T_SLD, bs_row);
        };
        if (leader) {
#pragma unroll
            for (int s = 0; s < AHEAD; ++s)
                if (s < KT) issue_data(s);
            for (int g = 0; g < 2 && g < NG; ++g) issue_scales(g);
        }
        using GB = TileGeo<BKIND, BN>;
        static_assert(GB::UNITS == 2 * kWsProducers, "two B units per producer thread");
        // This thread's units t and t + kWsProducers (unit_load / unit_store's places: rows
        // r and r + 128, contraction half h) as offsets into a raw stage's B half, a scale
        // slot's B rows and a canonical buffer, computed once; the second unit's are the
        // first's plus constants.
        const int ur = static_cast<int>(t) >> 1, uh = static_cast<int>(t) & 1;
        const unsigned o_raw = static_cast<unsigned>(ur * (kBK / 2) + uh * 16);
        const unsigned o_sc = static_cast<unsigned>(ur * T_SLD + uh * 2);
        unsigned o_cn[4];
#pragma unroll
        for (int jc = 0; jc < 4; ++jc)
            o_cn[jc] = static_cast<unsigned>(k_canon_off(ur, 4 * uh + jc));
        const bool live0 = ur < cols_valid, live1 = ur + 128 < cols_valid;
        for (int kt = 0; kt < KT; ++kt)
            ws_fp4_produce(kt, KT, NG, leader, s0, dbar, sbar, o_raw, o_sc, o_cn, live0, live1,
                           issue_data, issue_scales);
        return;
    }

    if (!TMA && threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups ----------------
        regs_release<kWsProducerRegs>();
        const unsigned t = threadIdx.x - kWsConsumers;
        const long long a_ld = d[D_A_LD], b_ld = d[D_B_LD];
        const unsigned char* a_base = a_data + d[D_A_OFF] + r0 * a_ld;
        const unsigned char* b_base = b_data + d[D_B_OFF] + c0 * b_ld;
        const long long a_sld = d[D_A_SLD], b_sld = d[D_B_SLD];
        const unsigned char* a_sbase = a_scale + d[D_A_SOFF] + r0 * a_sld;
        const unsigned char* b_sbase = b_scale + d[D_B_SOFF] + c0 * b_sld;
        const OperandCopy<AKIND, BM, CH, kWsProducers> copy_a(a_base, a_ld, t);
        const OperandCopy<BKIND, BN, CH, kWsProducers> copy_b(b_base, b_ld, t);
        const ScaleCopy<AKIND, BM, kWsProducers> scopy_a(a_sbase, a_sld, t);
        const ScaleCopy<BKIND, BN, kWsProducers> scopy_b(b_sbase, b_sld, t);
        ScaleRegs<AKIND, BM, kWsProducers> sra;
        ScaleRegs<BKIND, BN, kWsProducers> srb;
        auto issue = [&](int stage, int kt) {
            const long long k0 = static_cast<long long>(kt) * kBK;
            const unsigned sb = s0 + stage * STAGE;
            copy_a.issue(sb, k0, rows_valid, len - k0, a_data);
            copy_b.issue(sb + RAW_A, k0, cols_valid, len - k0, b_data);
        };
        auto load_scales = [&](int kt) {
            const long long k0 = static_cast<long long>(kt) * kBK;
            sra.load(scopy_a, k0, rows_valid, len, t);
            srb.load(scopy_b, k0, cols_valid, len, t);
        };
        auto store_scales = [&](int stage) {
            unsigned char* sb = smem + stage * STAGE;
            sra.store(sb + A_SC, t);
            srb.store(sb + B_SC, t);
        };
        // Prologue: tiles 0..AHEAD-1 requested, their scales stored; scales of AHEAD in registers.
#pragma unroll
        for (int s = 0; s < AHEAD; ++s) {
            if (s < KT) issue(s, s);
            cp_async_commit();
        }
        prologue_scales<AHEAD>(scopy_a, rows_valid, scopy_b, cols_valid, len, KT, smem, STAGE,
                               A_SC, B_SC, t);
        if (AHEAD < KT) load_scales(AHEAD);
        for (int kt = 0; kt < KT; ++kt) {
            // Invariants: raw tiles kt..kt+AHEAD-1 requested (one commit group each), their
            // scales stored, those of kt+AHEAD in registers.
            const int cb = kt % NCB;
            cp_async_wait<AHEAD - 1>();  // this thread's copies of tile kt landed
            named_sync(WS_BAR_PROD, kWsProducers);  // everyone's; tile kt-1 expanded
            // Tile kt-NCB retired: its canonical buffer is free, and so is its raw stage (the
            // consumers read its A half until then), which tile kt+AHEAD takes.
            if (kt >= NCB) named_sync(WS_BAR_EMPTY + cb, kWsThreads);
            const int nt = kt + AHEAD;
            if (nt < KT) {
                issue(nt % NST, nt);
                store_scales(nt % NST);
            }
            cp_async_commit();
            if (nt + 1 < KT) load_scales(nt + 1);
            // Expand tile kt's B half into canonical buffer cb.
            convert_stage<AKIND, BKIND, BM, BN, kWsProducers, false, false, false>(
                smem + (kt % NST) * STAGE, smem + CANON_OFF + cb * CANON_B, t, rows_valid,
                cols_valid);
            fence_proxy_async();
            named_arrive(WS_BAR_FULL + cb, kWsThreads);
        }
        cp_async_wait<0>();
        return;
    }

    // ---------------- consumer warpgroups ----------------
    // Warpgroup w owns rows 64w..64w+63 x all 256 columns: per 16-deep step two
    // m64n128k16 with A from registers (this thread's fragment rows ar, ar + 8, decoded from the
    // raw stage) and B from the canonical buffer. Each step is one commit group, so a step's
    // fragments are decoded while the previous step's wgmma run.
    regs_claim<TMA ? kWsTmaConsumerRegs : kWsConsumerRegs>();
    ep.init_alpha();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm0 = 64 * (warp >> 2) + 16 * (warp & 3);
    const int ar = wm0 + (lane >> 2), aq = lane & 3;
    float acc[1][NI][4];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][ni][e] = 0.0f;
    float* const accf = &acc[0][0][0];
    // TMA build: this thread's A row in a raw stage and in a scale slot, as shared offsets
    const unsigned a_off = static_cast<unsigned>(ar * (kBK / 2));
    const unsigned s_off = static_cast<unsigned>(ar * T_SLD);
    for (int kt = 0; kt < KT; ++kt) {
        if constexpr (TMA) {
            ws_fp4_consume_ktile<NI * 4>(accf, kt, kt >= 1 && kt - 1 + NCB < KT, s0, dbar, sbar,
                                         a_off, s_off, aq);
            continue;
        }
        const int cb = kt % NCB;
        named_sync(WS_BAR_FULL + cb, kWsThreads);  // B of tile kt expanded into buffer cb
        const int st = kt % NST;
        const unsigned long long db = wg_desc(s0 + CANON_OFF + cb * CANON_B, 16, 1024);
        const unsigned char* const rs = smem + st * STAGE;  // the raw stage
        const unsigned char* const rsc = rs + A_SC;
        unsigned af[2][1][4];  // fragments of the step in flight and of the next one
#pragma unroll
        for (int s = 0; s < kBK / 16; ++s) {
            ws_step_begin<NCB, NI * 4>(s, kt, KT, accf);
            if (s == 0) fp4_a_frags<0, 1>(rs, rsc, ar, aq, af[0]);
            if (s == 1) fp4_a_frags<1, 1>(rs, rsc, ar, aq, af[1]);
            if (s == 2) fp4_a_frags<2, 1>(rs, rsc, ar, aq, af[0]);
            if (s == 3) fp4_a_frags<3, 1>(rs, rsc, ar, aq, af[1]);
            wg_fence();
            // B's descriptor as two words: the steps and halves add to the low word only
#pragma unroll
            for (int n = 0; n < 2; ++n)
                wgmma_m64n128k16_rs(accf + 64 * n, af[s & 1][0],
                                    static_cast<unsigned>(db) + ((n * (128 * 128) + s * 32) >> 4),
                                    static_cast<unsigned>(db >> 32));
            wg_commit();
            wg_fence_acc<NI * 4>(accf);
        }
    }
    wg_wait0();
    wg_fence_acc<NI * 4>(accf);
    ws_epilogue<BN, NI, EPI_LD>(smem, accf, wm0, lane, ep, r0, c0, rows_valid, cols_valid);
}

}  // namespace lpm_gg

// extern "C" entry point NAME of a warp-specialised wgmma (sm_90a) configuration: 128 x 256
// tile, 512 threads (see gemm_ws). On other architectures it compiles to a trap; the launcher
// never selects it there.
#define LPM_GG_DEFINE_WS(NAME, AKIND, BKIND, F16, CH)                                          \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWsThreads, 1) NAME(LPM_GG_PARAMS) {  \
        lpm_gg::gemm_ws<AKIND, BKIND, F16, CH, false>(LPM_GG_ARGS, nullptr, nullptr, nullptr,  \
                                                      nullptr);                               \
    }
// The same with TMA loads (NVFP4, 16-byte rows): four more parameters, the tensor maps of A's and
// B's data and block scales, passed by value.
#define LPM_GG_DEFINE_WS_TMA(NAME, AKIND, BKIND, F16)                                          \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWsThreads, 1)                        \
        NAME(LPM_GG_PARAMS, const __grid_constant__ lpm_gg::TmaMap tma_a,                      \
             const __grid_constant__ lpm_gg::TmaMap tma_b,                                     \
             const __grid_constant__ lpm_gg::TmaMap tma_as,                                    \
             const __grid_constant__ lpm_gg::TmaMap tma_bs) {                                  \
        lpm_gg::gemm_ws<AKIND, BKIND, F16, 16, true>(LPM_GG_ARGS, &tma_a, &tma_b, &tma_as,      \
                                                     &tma_bs);                                 \
    }

#endif  // LPM_GROUPED_GEMM_WS_CUH
