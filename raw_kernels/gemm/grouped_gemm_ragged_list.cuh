// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): one entry
// of a ragged persistent kernel's balanced tile list. CTA b runs entries b, b + gridDim.x, ...
// of the tile table; an entry holds everything the kernel needs of a tile (expert, k-tiles, first
// k-tile and scale group in the CTA's sequences, last k-tile's length, extents, tensor-map rows,
// output offset), so a tile costs one 64-byte read instead of chains of dependent loads through
// the descriptors. The launcher (lowprec_moe.backends.cupy.gemm.balance) builds the list:
// longest tiles first, each to the least loaded CTA, padded with entries of no tile (expert -1).

#ifndef LPM_GROUPED_GEMM_RAGGED_LIST_CUH
#define LPM_GROUPED_GEMM_RAGGED_LIST_CUH

#include "grouped_gemm_base.cuh"

namespace lpm_gg {

// An entry of the ragged tile table (the launcher's gemm_balance.ragged_tile_table, whose
// word order this mirrors).
constexpr int kWmxGEntryWords = 16;
struct WmxGEntry {
    int g, rc, kt, j0, q0, tail, rv, cv, r0, c0, a, as, b, bs;
    long long out_off;
};
__device__ __forceinline__ WmxGEntry wmx_g_entry(const int* tiles, int T) {
    const int4* p = reinterpret_cast<const int4*>(tiles + kWmxGEntryWords * T);
    const int4 x = __ldg(p), y = __ldg(p + 1), z = __ldg(p + 2), w = __ldg(p + 3);
    WmxGEntry e;
    e.g = x.x;
    e.rc = x.y;
    e.kt = x.z;
    e.j0 = x.w;
    e.q0 = y.x;
    e.tail = y.y;
    e.rv = y.z;
    e.cv = y.w;
    e.r0 = z.x;
    e.c0 = z.y;
    e.a = z.z;
    e.as = z.w;
    e.b = w.x;
    e.bs = w.y;
    e.out_off = static_cast<long long>(
        (static_cast<unsigned long long>(static_cast<unsigned>(w.w)) << 32) |
        static_cast<unsigned>(w.z));
    return e;
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_RAGGED_LIST_CUH
