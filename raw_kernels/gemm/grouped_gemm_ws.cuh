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
#include "grouped_gemm_tile.cuh"
#include "grouped_gemm_tma.cuh"
#include "grouped_gemm_ws_roles.cuh"
#include "grouped_gemm_ws_fp4.cuh"

namespace lpm_gg {

template <int AKIND, int BKIND, bool F16, int CH>
__device__ __forceinline__ void gemm_ws(LPM_GG_PARAMS) {
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
    constexpr int SMEM = ws_smem_bytes(AKIND, BKIND);
    static_assert(CANON_OFF % 1024 == 0 && CANON_B % 1024 == 0, "128-byte swizzle atoms");
    static_assert(CANON_OFF + NCB * CANON_B + 1024 <= SMEM, "shared memory");
    static_assert(BM * EPI_LD * 4 + 1024 <= SMEM, "epilogue staging");
    static_assert(AHEAD >= 2 && NCB >= 2 && NCB <= 3 && kBK == 64, "pipeline depth");
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != CH || b_ch != CH, s0);

    LPM_GG_TILE_SETUP(BM, BN, rows_valid, cols_valid, kWsThreads)
    const int KT = static_cast<int>((len + kBK - 1) / kBK);

    if (threadIdx.x >= kWsConsumers) {
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
    regs_claim<kWsConsumerRegs>();
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
    for (int kt = 0; kt < KT; ++kt) {
        const int cb = kt % NCB;
        named_sync(WS_BAR_FULL + cb, kWsThreads);  // B of tile kt expanded into buffer cb
        const int st = kt % NST;
        const unsigned long long db = wg_desc(s0 + CANON_OFF + cb * CANON_B, 16, 1024);
        const unsigned char* const rs = smem + st * STAGE;  // the raw stage
        const unsigned char* const rsc = rs + A_SC;
        ws_fp4_steps<NI * 4>(
            accf, db, [&](int s) { ws_step_begin<NCB, NI * 4>(s, kt, KT, accf); },
            [&](int s, unsigned (&f)[1][4]) { fp4_a_frags_at(s, rs, rsc, ar, aq, f); });
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
        lpm_gg::gemm_ws<AKIND, BKIND, F16, CH>(LPM_GG_ARGS);                                   \
    }
#endif  // LPM_GROUPED_GEMM_WS_CUH
