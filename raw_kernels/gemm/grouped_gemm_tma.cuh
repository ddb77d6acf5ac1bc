// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): tensor
// memory accelerator (TMA) tile loads with mbarrier completion, sm_90.
//
// A TmaMap is the driver's 128-byte tensor map (CUtensorMap), encoded on the host by
// lowprec_moe/backends/cupy/tma.py and passed by value as a __grid_constant__ kernel parameter, so the
// bulk copies read it from parameter space (no device buffer, no upload). One thread issues a
// whole tile per copy; the copy's completion is counted in bytes on an mbarrier in shared
// memory, which every consuming thread waits on (phase parity). Elements outside the tensor's
// extents are filled with zeros.

#ifndef LPM_GROUPED_GEMM_TMA_CUH
#define LPM_GROUPED_GEMM_TMA_CUH

namespace lpm_gg {

// CUtensorMap: opaque, 128 bytes, 64-byte aligned.
struct alignas(64) TmaMap {
    unsigned long long words[16];
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LPM_GG_HAS_TMA 1
#else
#define LPM_GG_HAS_TMA 0
#endif

// mbarrier at shared address `bar`, expecting `count` arrivals per phase.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
#if LPM_GG_HAS_TMA
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Make this thread's mbarrier initialisations visible to the async proxy (the TMA unit's
// completions); a CTA barrier must follow before other threads use them.
__device__ __forceinline__ void mbar_init_fence() {
#if LPM_GG_HAS_TMA
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arrive once on `bar` and add `bytes` to the transaction count its current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
#if LPM_GG_HAS_TMA
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
#endif
}
// One plain arrival on `bar` (release: this thread's earlier shared-memory writes are visible to
// the threads that wait for the phase).
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
#if LPM_GG_HAS_TMA
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
                 : "memory");
#endif
}
// ... when `pred` holds (a predicated arrival: no branch in the caller's wgmma pipeline).
__device__ __forceinline__ void mbar_arrive_if(unsigned bar, bool pred) {
#if LPM_GG_HAS_TMA
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 st;\nsetp.ne.u32 p, %1, 0;\n"
        "@p mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar),
        "r"(static_cast<unsigned>(pred))
        : "memory");
#endif
}
// One arrival on `bar` for the calling warp, once all its threads are here (their earlier
// shared-memory accesses ordered before it): an mbarrier counting warps takes one atomic per
// warp instead of 32.
__device__ __forceinline__ void warp_arrive(unsigned bar) {
    __syncwarp();
    if ((threadIdx.x & 31u) == 0u) mbar_arrive(bar);
}
// Whether the phase of `bar` with parity `parity` has completed (no waiting).
__device__ __forceinline__ bool mbar_test(unsigned bar, unsigned parity) {
    unsigned done = 0u;
#if LPM_GG_HAS_TMA
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#endif
    return done != 0u;
}
// Wait until the phase of `bar` with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
#if LPM_GG_HAS_TMA
    asm volatile(
        "{\n.reg .pred done;\n"
        "LPM_MBAR_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra LPM_MBAR_WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
#endif
}
// Copy the box of `map` at coordinates (c0 innermost, c1) to shared address `dst` (128-byte
// aligned); completion is signalled on `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaMap* map, unsigned bar, int c0,
                                            int c1) {
#if LPM_GG_HAS_TMA
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
#else
    __trap();
#endif
}

}  // namespace lpm_gg

// The four tensor maps of the warp-specialised TMA builds (A's and B's data, then their block
// scales), passed by value: as entry-point parameters, and as the pointers the kernels take.
#define LPM_GG_WS_TMA_PARAMS                                                                   \
    const __grid_constant__ lpm_gg::TmaMap tma_a, const __grid_constant__ lpm_gg::TmaMap tma_b, \
        const __grid_constant__ lpm_gg::TmaMap tma_as,                                         \
        const __grid_constant__ lpm_gg::TmaMap tma_bs
#define LPM_GG_WS_TMA_ARGS &tma_a, &tma_b, &tma_as, &tma_bs

#endif  // LPM_GROUPED_GEMM_TMA_CUH
