// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): what the
// TMA build of the ragged persistent NVFP4 kernel (gemm_ws_g<CH, true>,
// grouped_gemm_ws_ragged.cuh) adds: its raw-stage layout and shared memory, the fence that
// makes device-built tensor maps visible to its copies, and the kernel that builds those maps
// (four per expert, from templates) with its entry-point macro LPM_GG_DEFINE_WS_H_MAPS.

#ifndef LPM_GROUPED_GEMM_WS_RAGGED_TMA_CUH
#define LPM_GROUPED_GEMM_WS_RAGGED_TMA_CUH

#include "grouped_gemm_base.cuh"
#include "grouped_gemm_tma.cuh"

namespace lpm_gg {

// The TMA build's raw stage (gemm_ws_g<CH, true>). A tensor-map box must start 16-byte aligned,
// and an expert's rows are 8-byte aligned only, so each operand has two maps per expert, both
// viewing its rows as pairs (2 ld bytes from one pair to the next, a multiple of 16): the even
// rows' map (inner extent ld: past it the box reads zeros) copies a k-tile's 32 bytes of half the
// tile's rows at inner coordinate x, the odd rows' map (inner extent 2 ld) 48 bytes at x + ld - sh
// (sh = ld % 16: 0 or 8), which hold the k-tile's 32 bytes from byte sh on. Stored: A's even
// rows (row 2i at 32 i), its odd rows (row 2i+1 at 48 i), A's block scales in row order ([128][4],
// ScaleRegs), then B's the same way. Shared memory: AHEAD + kWsCanonBuffers stages (each k-tile's
// data requested AHEAD k-tiles ahead, the stage freed when the consumers retire it), then
// gemm_ws's canonical buffers: ws_g_tma_smem_bytes, 180 KiB.
struct WsgTmaLayout {
    static constexpr int ROW = kBK / 2;   // an even row's box: one k-tile of NVFP4
    static constexpr int OROW = ROW + 16;  // an odd row's box
    static constexpr int A_EVEN = 0, A_ODD = A_EVEN + 64 * ROW, A_SC = A_ODD + 64 * OROW;
    static constexpr int B_EVEN = A_SC + round16(raw_scale_bytes(KIND_FP4_K, 128));
    static constexpr int B_ODD = B_EVEN + 128 * ROW, B_SC = B_ODD + 128 * OROW;
    static constexpr int STAGE = B_SC + round16(raw_scale_bytes(KIND_FP4_K, 256));
    static constexpr int TX = (128 + 256) / 2 * (ROW + OROW);  // a stage's copied bytes
    static constexpr int AHEAD = 2, STAGES = AHEAD + kWsCanonBuffers;
    static constexpr int CANON_OFF = (STAGES * STAGE + 1023) / 1024 * 1024;
    static_assert(A_ODD % 128 == 0 && B_EVEN % 128 == 0 && B_ODD % 128 == 0 &&
                      STAGE % 128 == 0 && A_SC == A_ODD + 64 * OROW,
                  "TMA destinations 128-byte aligned");
};
__host__ __device__ constexpr int ws_g_tma_smem_bytes() {
    return WsgTmaLayout::CANON_OFF + kWsCanonBuffers * canon_bytes(256) + 1024;
}

// Make a tensor map written in global memory by an earlier kernel (the builder below) visible
// to this thread's tensor copies.
__device__ __forceinline__ void tmap_acquire(const TmaMap* map) {
#if LPM_GG_HAS_TMA
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(
                     reinterpret_cast<unsigned long long>(map))
                 : "memory");
#endif
}

// The TMA build's tensor maps, built on the device: thread 4 g + m writes map m of expert g
// (m: A's even rows, A's odd rows, B's even rows, B's odd rows) into maps[4 g + m] from
// template m (the launcher's encoding of the same box, fill and swizzle), replacing its
// address (the expert's rows), extents (inner: ld for the even rows, 2 ld for the odd ones;
// rows / 2 pairs) and pair stride (2 ld); experts without rows or contraction are skipped.
__device__ __forceinline__ void ws_g_build_maps(const TmaMap* tmpl, const long long* desc,
                                                const unsigned char* a_data,
                                                const unsigned char* b_data, long long n_cols,
                                                int num_experts, TmaMap* maps) {
#if LPM_GG_HAS_TMA
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    const int g = i >> 2, m = i & 3;
    if (g >= num_experts) return;
    const long long* d = desc + static_cast<long long>(g) * kDescWords;
    const bool a = m < 2;
    const long long rows = a ? d[D_ROWS] : n_cols, ld = d[a ? D_A_LD : D_B_LD];
    if (rows <= 0 || d[D_LEN] <= 0) return;
    TmaMap* const o = maps + i;
    *o = tmpl[m];
    const unsigned long long base = reinterpret_cast<unsigned long long>(
        (a ? a_data : b_data) + d[a ? D_A_OFF : D_B_OFF]);
    const unsigned inner = static_cast<unsigned>((m & 1) ? 2 * ld : ld);
    const unsigned pairs = static_cast<unsigned>(rows / 2);
    const unsigned long long stride = static_cast<unsigned long long>(2 * ld);
    asm volatile(
        "tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;\n"
        "tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 0, %2;\n"
        "tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 1, %3;\n"
        "tensormap.replace.tile.global_stride.global.b1024.b64 [%0], 0, %4;\n"
        "fence.proxy.tensormap::generic.release.gpu;\n" ::"l"(
            reinterpret_cast<unsigned long long>(o)),
        "l"(base), "r"(inner), "r"(pairs), "l"(stride)
        : "memory");
#else
    __trap();
#endif
}

}  // namespace lpm_gg

// The builder of its maps (ws_g_build_maps): the four templates (a device array), the
// descriptor table, the operands' data, B's rows, the number of experts and the output array.
#define LPM_GG_DEFINE_WS_H_MAPS(NAME)                                                          \
    extern "C" __global__ void NAME(const lpm_gg::TmaMap* tmpl, const long long* desc,         \
                                    const unsigned char* a_data, const unsigned char* b_data,  \
                                    long long n_cols, int num_experts, lpm_gg::TmaMap* maps) { \
        lpm_gg::ws_g_build_maps(tmpl, desc, a_data, b_data, n_cols, num_experts, maps);        \
    }

#endif  // LPM_GROUPED_GEMM_WS_RAGGED_TMA_CUH
