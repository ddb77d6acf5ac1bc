// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): operand
// staging -- swizzled shared-memory tile offsets, cp.async tile loads, per-kind tile geometry
// (TileGeo), issue_operand, and the block-scale registers (ScaleRegs).

#ifndef LPM_GROUPED_GEMM_STAGING_CUH
#define LPM_GROUPED_GEMM_STAGING_CUH

#include "grouped_gemm_base.cuh"

namespace lpm_gg {

// ==========================================================================================
// Tile loads (cp.async, zero fill outside the valid region)

// Byte offset `b` inside line `o` of a tile, after the 16-byte-chunk XOR swizzle.
//   SWZ 0: none; 1: chunk ^= (o & 7) (128-byte or longer lines); 2: chunk ^= (o >> 1) & 3 (64-byte rows).
template <int SWZ>
__device__ __forceinline__ int swz(int o, int b) {
    if constexpr (SWZ == 1) {
        return b ^ ((o & 7) << 4);
    } else if constexpr (SWZ == 2) {
        return b ^ (((o >> 1) & 3) << 4);
    } else {
        return b;
    }
}

// Canonical MN-major tile [64 lines][R rows] of 16-bit elements, stored as R/64 panels of
// [64 lines][128 bytes] (the wgmma MN-major 128-byte-swizzle layout; ldmatrix.trans reads it too):
// byte offset of 16-byte chunk `c` (rows 8c..8c+7) of contraction line `l`.
__device__ __forceinline__ int mn_canon_off(int l, int c) {
    return (c >> 3) * (kBK * 128) + l * 128 + (((c & 7) ^ (l & 7)) << 4);
}

// Byte offset inside a tile of OUTER lines x INNER bytes, for layout SWZ (0-2 above, or 3: the
// panelled MN-major canonical layout).
template <int SWZ, int INNER>
__device__ __forceinline__ int tile_off(int o, int b) {
    if constexpr (SWZ == 3) {
        return mn_canon_off(o, b >> 4) + (b & 15);
    } else {
        return o * INNER + swz<SWZ>(o, b);
    }
}

// Copy an OUTER x INNER-byte tile: byte b of line o comes from g + o*g_ld + b and lands at
// sdst + o*INNER + swz(o, b). Chunks of CH bytes with o >= outer_valid or b >= inner_valid are
// zero-filled (the host guarantees CH divides the valid extents, so no chunk straddles them).
template <int CH, int OUTER, int INNER, int SWZ>
__device__ __forceinline__ void load_tile_ch(unsigned sdst, const unsigned char* g, long long g_ld,
                                             int outer_valid, int inner_valid,
                                             const unsigned char* safe) {
    constexpr int CPL = INNER / CH;
    constexpr int TOTAL = OUTER * CPL;
    const int tid = tid_volatile();
#pragma unroll
    for (int it = 0; it < (TOTAL + kThreads - 1) / kThreads; ++it) {
        const int i = tid + it * kThreads;
        if (TOTAL % kThreads == 0 || i < TOTAL) {
            const int o = i / CPL;
            const int b = (i % CPL) * CH;
            const bool ok = (o < outer_valid) && (b < inner_valid);
            const unsigned char* src = ok ? g + static_cast<long long>(o) * g_ld + b : safe;
            cp_async<CH>(sdst + tile_off<SWZ, INNER>(o, b), src, ok ? CH : 0);
        }
    }
}


// Per-kind tile geometry.
template <int KIND, int R>
struct TileGeo {
    static constexpr bool MN = kind_is_mn(KIND);
    // raw (or, for high precision, canonical) tile: lines x bytes per line
    static constexpr int OUTER = MN ? kBK : R;
    static constexpr int INNER = KIND == KIND_FP4_K   ? kBK / 2
                                 : KIND == KIND_FP8_K  ? kBK
                                 : KIND == KIND_FP8_MN ? R
                                 : KIND == KIND_HP_K   ? kBK * 2
                                                       : R * 2;
    // FP4_K raw: plain; FP8_K raw: 64-byte rows; FP8_MN raw and HP_K canonical: (o & 7);
    // HP_MN canonical: panels (3)
    static constexpr int SWZ = KIND == KIND_FP4_K   ? 0
                               : KIND == KIND_FP8_K  ? 2
                               : KIND == KIND_HP_MN ? 3
                                                     : 1;
    // bytes per element along the contiguous dimension, as numerator / denominator
    static constexpr int ES_NUM = KIND == KIND_FP4_K ? 1 : kind_is_hp(KIND) ? 2 : 1;
    static constexpr int ES_DEN = KIND == KIND_FP4_K ? 2 : 1;
    static constexpr int SCALE_COUNT = raw_scale_count(KIND, R);
    static constexpr int SCALES_PER_THREAD = (SCALE_COUNT + kThreads - 1) / kThreads;
    static constexpr int UNITS = 2 * R;  // 32-element conversion units per tile
    static constexpr int UNITS_PER_THREAD = (UNITS + kThreads - 1) / kThreads;
};

// Issue the cp.async copies of one operand's k-tile (k0 = first contraction index).
//   base: the operand's global bytes at (tile row 0, contraction 0); ld: line stride;
//   rows_valid: valid rows of the tile; len_left: contraction elements left from k0.
template <int KIND, int R, int CH>
__device__ __forceinline__ void issue_operand(unsigned sdst, const unsigned char* base,
                                              long long ld, long long k0, int rows_valid,
                                              long long len_left, const unsigned char* safe) {
    using G = TileGeo<KIND, R>;
    if constexpr (G::MN) {
        const int lines = static_cast<int>(len_left < kBK ? len_left : kBK);
        load_tile_ch<CH, G::OUTER, G::INNER, G::SWZ>(sdst, base + k0 * ld, ld, lines,
                                              rows_valid * G::ES_NUM / G::ES_DEN, safe);
    } else {
        long long bytes_left = len_left * G::ES_NUM / G::ES_DEN;
        const int inner_valid = static_cast<int>(bytes_left < G::INNER ? bytes_left : G::INNER);
        load_tile_ch<CH, G::OUTER, G::INNER, G::SWZ>(sdst, base + k0 * G::ES_NUM / G::ES_DEN,
                                                     ld, rows_valid, inner_valid, safe);
    }
}

// Block scales of one k-tile, loaded into registers (one tile ahead) and stored to shared memory.
//   FP4_K : [R][4] bytes   scale (r, b) at sbase + r*sld + k0/16 + b
//   FP8_K : [R][2] floats  scale (r, b) at sbase + r*sld + k0/32 + b
//   FP8_MN: [2][R] floats  scale (b, r) at sbase + (k0/32 + b)*sld + r
template <int KIND, int R>
struct ScaleRegs {
    unsigned v[TileGeo<KIND, R>::SCALES_PER_THREAD > 0 ? TileGeo<KIND, R>::SCALES_PER_THREAD : 1];

    __device__ __forceinline__ void load(const unsigned char* sbase, long long sld, long long k0,
                                         int rows_valid, long long len) {
        using G = TileGeo<KIND, R>;
        constexpr int BLK = KIND == KIND_FP4_K ? LPM_NVFP4_BLOCK : LPM_MXFP8_BLOCK;
        constexpr int NB = kBK / BLK;  // scale blocks per k-tile
        const long long kb0 = k0 / BLK;
        const long long nkb = (len + BLK - 1) / BLK;
        const int tid = tid_volatile();
#pragma unroll
        for (int j = 0; j < G::SCALES_PER_THREAD; ++j) {
            const int i = tid + j * kThreads;
            unsigned val = 0u;
            if (i < G::SCALE_COUNT) {
                int r, b;
                if constexpr (KIND == KIND_FP8_MN) {
                    b = i / R;
                    r = i % R;
                } else {
                    r = i / NB;
                    b = i % NB;
                }
                if (r < rows_valid && kb0 + b < nkb) {
                    const unsigned char* p =
                        KIND == KIND_FP8_MN ? sbase + (kb0 + b) * sld + r
                                            : sbase + static_cast<long long>(r) * sld + kb0 + b;
                    val = __ldg(p);
                }
            }
            v[j] = val;
        }
    }

    // NVFP4: the E4M3 bytes; MXFP8: the fp32 factors 2^(e-127) (e = 0: 2^-127, e = 255: NaN).
    __device__ __forceinline__ void store(unsigned char* sdst) const {
        using G = TileGeo<KIND, R>;
#pragma unroll
        for (int j = 0; j < G::SCALES_PER_THREAD; ++j) {
            const int i = static_cast<int>(threadIdx.x) + j * kThreads;
            if (i < G::SCALE_COUNT) {
                if constexpr (KIND == KIND_FP4_K) {
                    sdst[i] = static_cast<unsigned char>(v[j]);
                } else {
                    reinterpret_cast<float*>(sdst)[i] = lpm_e8m0_to_f32(v[j]);
                }
            }
        }
    }
};

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_STAGING_CUH
