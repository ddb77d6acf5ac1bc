// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): what the
// warp-specialised kernels (gemm_ws, gemm_ws_n256, gemm_ws_mx, gemm_ws_p) share -- the two
// roles' thread counts and register budgets (gemm_ws_n256: its own, from the same formulas),
// the named barriers of their handshake, the consumers' step start and their staged epilogue.
// The roles and the handshake are described in grouped_gemm_ws.cuh.

#ifndef LPM_GROUPED_GEMM_WS_ROLES_CUH
#define LPM_GROUPED_GEMM_WS_ROLES_CUH

#include "grouped_gemm_mma.cuh"
#include "grouped_gemm_tile.cuh"
#include "grouped_gemm_kernel.cuh"  // gemm_smem
#include "grouped_gemm_epi_regs.cuh"

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
// ws_launch_regs: that share for a CTA of `threads` (one CTA per SM, 8-register granules);
// ws_producer_regs: what each producer thread keeps once the consumers claim consumer_regs.
constexpr int ws_launch_regs(int threads) { return 65536 / threads / 8 * 8; }
constexpr int ws_producer_regs(int consumers, int consumer_regs, int producers) {
    return (ws_launch_regs(consumers + producers) * (consumers + producers) -
            consumer_regs * consumers) / producers / 8 * 8;
}
constexpr int kWsLaunchRegs = ws_launch_regs(kWsThreads);  // 128
constexpr int kWsConsumerRegs = 176;
constexpr int kWsProducerRegs =
    ws_producer_regs(kWsConsumers, kWsConsumerRegs, kWsProducers);  // 80
static_assert(kWsProducerRegs % 8 == 0 && kWsProducerRegs >= 24, "setmaxnreg granularity");
// The TMA builds' consumers keep a step's raw words one step ahead: 8 registers more (the
// warp-specialised MXFP8 kernel starts from this count).
constexpr int kWsTmaConsumerRegs = kWsConsumerRegs + 8;
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
// The same with the release decided by the caller (ws_step_begin's rule for one tile's k-tiles;
// the persistent kernel's for a CTA's whole sequence): whether step 1 hands canonical buffer pb,
// the previous k-tile's, back to the producers.
// NT: the CTA's threads (the EMPTY barrier's count; gemm_ws_n256: 384).
template <int NACC, int NT = kWsThreads>
__device__ __forceinline__ void ws_step_wait(int s, bool release, int pb, float* accf) {
    wg_wait<1>();
    wg_fence_acc<NACC>(accf);
    if (s == 1 && release) named_arrive(WS_BAR_EMPTY + pb, NT);
}
template <int NCB, int NACC>
__device__ __forceinline__ void ws_step_begin(int s, int kt, int KT, float* accf) {
    ws_step_wait<NACC>(s, kt >= 1 && kt - 1 + NCB < KT, (kt - 1) % NCB, accf);
}

// The consumers' epilogue (gemm_ws, gemm_ws_mx), after every consumer retired its MMAs: the
// producers finished their last expansion before the last FULL and have no copy in flight, so
// once every consumer is here the shared memory from smem on is free. 16-bit output without
// bias (reg_epi_ok): each warp's register epilogue through its own staging buffer (8 of
// reg_epi_bytes<BN>() from smem on, then 8 column tables of BN floats). Otherwise the staged
// tile (BM x EPI_LD floats; PAIRED: stage_acc's paired rows), then the epilogue's compact loop
// by the kWsConsumers threads.
template <int BN, int NI, int EPI_LD, bool PAIRED = false>
__device__ __forceinline__ void ws_epilogue(unsigned char* smem, const float* accf, int wm0,
                                            int lane, Epilogue& ep, long long r0, long long c0,
                                            int rows_valid, int cols_valid) {
    constexpr int NW = kWsConsumers / 32;
    static_assert(NW * (reg_epi_bytes<BN>() + 4 * BN) <= 128 * EPI_LD * 4,
                  "staging buffers and column tables within the staged tile's bytes");
    named_sync(WS_BAR_EPI, kWsConsumers);
    if (reg_epi_ok(ep)) {
        const unsigned warp = threadIdx.x >> 5, s = smem_u32(smem);
        reg_epi<NI, PAIRED, NI>(ep, s + warp * reg_epi_bytes<BN>(),
                                s + NW * reg_epi_bytes<BN>() + warp * (4 * BN), accf, wm0, lane,
                                r0, c0, rows_valid, cols_valid);
        return;
    }
    float* cs = reinterpret_cast<float*>(smem);
    stage_acc<1, NI, EPI_LD, PAIRED>(cs, accf, wm0, 0, lane);
    named_sync(WS_BAR_EPI, kWsConsumers);
    ep.tile<BN, EPI_LD, kWsConsumers>(cs, r0, c0, rows_valid, cols_valid);
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_WS_ROLES_CUH
