// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// warp-specialised wgmma kernel body gemm_ws for quantized operands and its entry-point macro
// LPM_GG_DEFINE_WS. The library instantiates it for NVFP4 only: with MXFP8 the producers' 88
// registers spill and it is slower than the plain wgmma kernel (benchmarks/RESULTS.md).
//
// 512 threads per CTA, one 128 x 256 output tile, the shared-memory layout of the wgmma
// CONVERT path of gemm_mma (4 raw stages, NCB canonical buffers; gemm_smem_bytes):
//   * warpgroups 0-1 (threads 0-255, "consumers") only issue the wgmma of each k-tile and run
//     the epilogue, with the accumulators of gemm_mma's wgmma path;
//   * warpgroups 2-3 (threads 256-511, "producers") issue the cp.async copies of the raw tiles,
//     stage the block scales and expand each raw tile into a canonical buffer.
// setmaxnreg gives the consumers 168 registers and the producers the rest (88).
// So the expansion of tile k+1 (and k+2 with three buffers) runs while the tensor cores work on
// tile k, instead of sharing the warps that issue and wait for the MMAs. The handshake uses
// named barriers: FULL[b] (the producers arrive after expanding into buffer b, the consumers
// wait) and EMPTY[b] (the consumers arrive once the wgmma that read buffer b retired, the
// producers wait before expanding into it again); a further barrier orders the producers' own
// cp.async copies, another the consumers' epilogue. Every k-tile issues the same wgmma, on the
// same canonical values, in the same order as gemm_mma, so the results are bitwise those of the
// other wgmma kernels (and grouped == per-expert holds across the family).

#ifndef LPM_GROUPED_GEMM_WS_CUH
#define LPM_GROUPED_GEMM_WS_CUH

#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_mma.cuh"
#include "grouped_gemm_epilogue.cuh"

namespace lpm_gg {

constexpr int kWsConsumers = 256;  // two warpgroups: wgmma and the epilogue
constexpr int kWsProducers = 256;  // two warpgroups: copies, block scales, expansion
constexpr int kWsThreads = kWsConsumers + kWsProducers;
// Registers per thread after the role split (setmaxnreg): the consumers hold 128 fp32
// accumulators each. setmaxnreg only moves registers within the CTA's launch allocation
// (kWsLaunchRegs per thread, the __launch_bounds__ share; here the whole file): the consumers
// would block forever in setmaxnreg.inc if the producers released less than they claim.
constexpr int kWsLaunchRegs = 65536 / kWsThreads / 8 * 8;  // 128
constexpr int kWsConsumerRegs = 168;
constexpr int kWsProducerRegs =
    (kWsLaunchRegs * kWsThreads - kWsConsumerRegs * kWsConsumers) / kWsProducers / 8 * 8;  // 88
static_assert(kWsProducerRegs % 8 == 0 && kWsProducerRegs >= 24, "setmaxnreg granularity");
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

template <int AKIND, int BKIND, bool F16, int CH>
__device__ __forceinline__ void gemm_ws(LPM_GG_PARAMS) {
    constexpr int BM = 128, BN = 256;
    constexpr bool AMN = kind_is_mn(AKIND), BMN = kind_is_mn(BKIND);
    static_assert(!kind_is_hp(AKIND) && !kind_is_hp(BKIND), "quantized operands only");
    using GA = TileGeo<AKIND, BM>;
    using GB = TileGeo<BKIND, BN>;
    constexpr int CANON_A = canon_bytes(BM), CANON_B = canon_bytes(BN);
    constexpr int NST = pipeline_stages(AKIND, BKIND, BM, BN, true);
    constexpr int NCB = canon_buffers(AKIND, BKIND, BM, BN, true);
    constexpr int RAW_A = raw_bytes(AKIND, BM), RAW_B = raw_bytes(BKIND, BN);
    constexpr int STAGE = RAW_A + RAW_B;
    constexpr int CANON_OFF = (NST * STAGE + 1023) / 1024 * 1024;
    constexpr int EPI_LD = BN + 8;
    constexpr int SMEM = gemm_smem_bytes(AKIND, BKIND, BM, BN, true);
    static_assert(CANON_OFF == raw_ring_bytes(AKIND, BKIND, BM, BN), "raw ring");
    static_assert(CANON_OFF + NCB * (CANON_A + CANON_B) + 1024 <= SMEM, "shared memory");
    static_assert(NST >= 3 && NCB >= 2 && NCB <= 3, "pipeline depth");
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
        const unsigned char* a_base =
            a_data + d[D_A_OFF] + (AMN ? r0 * GA::ES_NUM / GA::ES_DEN : r0 * a_ld);
        const unsigned char* b_base =
            b_data + d[D_B_OFF] + (BMN ? c0 * GB::ES_NUM / GB::ES_DEN : c0 * b_ld);
        const long long a_sld = d[D_A_SLD], b_sld = d[D_B_SLD];
        const unsigned char* a_sbase = a_scale + d[D_A_SOFF] + (AMN ? r0 : r0 * a_sld);
        const unsigned char* b_sbase = b_scale + d[D_B_SOFF] + (BMN ? c0 : c0 * b_sld);
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
            sra.store(sb + round16(raw_data_bytes(AKIND, BM)), t);
            srb.store(sb + RAW_A + round16(raw_data_bytes(BKIND, BN)), t);
        };
        auto convert = [&](int stage, int cb, auto ea, auto eb) {
            convert_stage<AKIND, BKIND, BM, BN, kWsProducers, decltype(ea)::value,
                          decltype(eb)::value>(smem + stage * STAGE,
                                               smem + CANON_OFF + cb * (CANON_A + CANON_B), t,
                                               rows_valid, cols_valid);
        };
        // Prologue: tiles 0..NST-2 requested, their scales stored; scales of NST-1 in registers.
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) {
            if (s < KT) issue(s, s);
            cp_async_commit();
        }
        prologue_scales<NST - 1>(scopy_a, rows_valid, scopy_b, cols_valid, len, KT, smem, STAGE,
                                 round16(raw_data_bytes(AKIND, BM)),
                                 RAW_A + round16(raw_data_bytes(BKIND, BN)), t);
        if (NST - 1 < KT) load_scales(NST - 1);
        constexpr bool QA = AKIND != KIND_FP4_K, QB = BKIND != KIND_FP4_K;  // fp8 operands
        const bool e5a = QA && a_e5m2, e5b = QB && b_e5m2;
        for (int kt = 0; kt < KT; ++kt) {
            // Invariants: raw tiles kt..kt+NST-2 requested (one commit group each), scales of
            // tiles kt..kt+NST-2 stored, those of kt+NST-1 in registers.
            cp_async_wait<NST - 2>();  // this thread's copies of tile kt landed
            named_sync(WS_BAR_PROD, kWsProducers);  // everyone's; stage (kt-1)%NST is free
            const int nt = kt + NST - 1;
            if (nt < KT) {
                issue(nt % NST, nt);
                store_scales(nt % NST);
            }
            cp_async_commit();
            if (nt + 1 < KT) load_scales(nt + 1);
            const int cb = kt % NCB;
            if (kt >= NCB) named_sync(WS_BAR_EMPTY + cb, kWsThreads);  // tile kt-NCB retired
            with_e5m2(e5a, e5b, [&](auto ea, auto eb) { convert(kt % NST, cb, ea, eb); });
            fence_proxy_async();
            named_arrive(WS_BAR_FULL + cb, kWsThreads);
        }
        cp_async_wait<0>();
        return;
    }

    // ---------------- consumer warpgroups ----------------
    regs_claim<kWsConsumerRegs>();
    ep.init_alpha();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm0 = 64 * (warp >> 2) + 16 * (warp & 3);
    float acc[1][NI][4];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][ni][e] = 0.0f;
    float* const accf = &acc[0][0][0];
    for (int kt = 0; kt < KT; ++kt) {
        const int cb = kt % NCB;
        named_sync(WS_BAR_FULL + cb, kWsThreads);  // tile kt expanded into buffer cb
        const unsigned sa = s0 + CANON_OFF + cb * (CANON_A + CANON_B);
        wg_ktile<BM, F16, AMN, BMN, NI * 4, false>(accf, sa, sa + CANON_A, warp >> 2);
        wg_wait<1>();  // tile kt-1 retired by this warpgroup
        wg_fence_acc<NI * 4>(accf);
        if (kt >= 1 && kt - 1 + NCB < KT) named_arrive(WS_BAR_EMPTY + (kt - 1) % NCB, kWsThreads);
    }
    wg_wait0();
    wg_fence_acc<NI * 4>(accf);
    // Every consumer retired its MMAs, and the producer finished its last expansion before the
    // last FULL: the whole shared memory is free for the staged accumulators.
    named_sync(WS_BAR_EPI, kWsConsumers);
    float* cs = reinterpret_cast<float*>(smem);
    stage_acc<1, NI, EPI_LD>(cs, accf, wm0, 0, lane);
    named_sync(WS_BAR_EPI, kWsConsumers);
    ep.tile<BN, EPI_LD, kWsConsumers>(cs, r0, c0, rows_valid, cols_valid);
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
