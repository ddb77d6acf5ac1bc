// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the block
// code ranges of MXFP8 operand rows, which the warp-specialised MXFP8 kernels check their tiles
// against the fp16 window with.
//
// The window check of a 128 x 256 tile needs, per row of A and column of B, the largest and
// smallest E8M0 code of its blocks along the contraction. Scanning the tile's block scales in
// the GEMM (mx_scan: 384 rows x K / 32 codes, every tile again) costs a few microseconds per
// tile on long contractions, which the persistent kernel cannot hide. Instead a small kernel
// first reduces every operand row once, grouped_gemm_sm90_mxfp8_block_code_ranges, into one 16-bit word per row and
// expert (mx_range_word: largest code in the low byte, smallest in the high byte; over no block
// 0 and 255, mx_scan's initial values), and the GEMM reads 384 words per tile
// (mx_window_check_ranges), with the same verdict and exponents as mx_window_check.
//
// Layout of the words: per expert g, ra words for A's rows (the expert's output rows: tokens in
// fprop / dgrad, dy's columns in wgrad), then rb for B's (the output columns), at
// g (ra + rb) + row; words of rows an expert does not have are never written nor read.

#ifndef LPM_GROUPED_GEMM_MX_RANGES_CUH
#define LPM_GROUPED_GEMM_MX_RANGES_CUH

#include "grouped_gemm_base.cuh"
#include "grouped_gemm_mxf16.cuh"

namespace lpm_gg {

constexpr int kMxRangeThreads = 256;  // rows per CTA of grouped_gemm_sm90_mxfp8_block_code_ranges

__device__ __forceinline__ unsigned short mx_range_word(unsigned hi, unsigned lo) {
    return static_cast<unsigned short>(hi | (lo << 8));
}

// The range of the nb block codes of one row: K-major (MN = false) at p[0 .. nb-1], MN-major at
// p[0], p[sld], ... (line stride sld).
template <bool MN>
__device__ __forceinline__ unsigned short mx_row_range(const unsigned char* p, long long sld,
                                                       int nb) {
    unsigned hi = 0u, lo = LPM_E8M0_NAN;
    if constexpr (MN) {
#pragma unroll 4
        for (int j = 0; j < nb; ++j) {
            const unsigned e = __ldg(p + j * sld);
            hi = max(hi, e);
            lo = min(lo, e);
        }
    } else {
        int j = 0;
        if ((reinterpret_cast<unsigned long long>(p) & 15ull) == 0) {
            uint4 mx = make_uint4(0u, 0u, 0u, 0u), mn = make_uint4(~0u, ~0u, ~0u, ~0u);
            for (; j + 16 <= nb; j += 16) {
                const uint4 w = __ldg(reinterpret_cast<const uint4*>(p + j));
                mx = make_uint4(__vmaxu4(mx.x, w.x), __vmaxu4(mx.y, w.y), __vmaxu4(mx.z, w.z),
                                __vmaxu4(mx.w, w.w));
                mn = make_uint4(__vminu4(mn.x, w.x), __vminu4(mn.y, w.y), __vminu4(mn.z, w.z),
                                __vminu4(mn.w, w.w));
            }
            unsigned a = __vmaxu4(__vmaxu4(mx.x, mx.y), __vmaxu4(mx.z, mx.w));
            unsigned b = __vminu4(__vminu4(mn.x, mn.y), __vminu4(mn.z, mn.w));
            a = __vmaxu4(a, a >> 16);
            b = __vminu4(b, b >> 16);
            hi = max(a & 0xFFu, (a >> 8) & 0xFFu);
            lo = j > 0 ? min(b & 0xFFu, (b >> 8) & 0xFFu) : lo;
        }
        for (; j < nb; ++j) {
            const unsigned e = __ldg(p + j);
            hi = max(hi, e);
            lo = min(lo, e);
        }
    }
    return mx_range_word(hi, lo);
}

// Whether a row with range word w fits the fp16 window of its format (mx_finish's rule: no
// NaN scale, largest minus smallest code within mx_window).
__device__ __forceinline__ bool mx_range_in_window(unsigned w, bool e5m2) {
    const unsigned e = w & 0xFFu;
    return e != LPM_E8M0_NAN && static_cast<int>(e) - static_cast<int>(w >> 8) <= mx_window(e5m2);
}

// The window check of a BM x BN tile from the range words of its rows (ra: A's rows r0 ..,
// rb: B's columns c0 ..), by NT threads on barrier BAR (mx_sync): mx_window_check's verdict,
// exps_a / exps_b and range, with no scan. `allowed` as there (the launch's and the tile's
// conditions, mx_scan_aligned included, so that the verdict is the plain kernel's).
template <int BM, int BN, int NT, int BAR>
__device__ __forceinline__ bool mx_window_check_ranges(const unsigned short* ra, int rows_valid,
                                                       const unsigned short* rb, int cols_valid,
                                                       bool a_e5m2, bool b_e5m2, bool allowed,
                                                       unsigned char* exps_a,
                                                       unsigned char* exps_b, unsigned t,
                                                       unsigned* range) {
    if (!allowed) return false;  // uniform
    if (t < 4) range[t] = (t & 1) ? LPM_E8M0_NAN : 0u;
    mx_sync<BAR, NT>();
    unsigned ahi = 0u, alo = LPM_E8M0_NAN, bhi = 0u, blo = LPM_E8M0_NAN;
    bool ok = true;
    auto fold = [&](const unsigned short* words, int valid, int window, unsigned char* exps,
                    int r, unsigned& hi, unsigned& lo) {
        unsigned e = 0u;
        if (r < valid) {
            const unsigned w = __ldg(words + r);
            e = w & 0xFFu;
            ok = ok && e != LPM_E8M0_NAN && static_cast<int>(e) - static_cast<int>(w >> 8) <= window;
            hi = max(hi, e);
            lo = min(lo, e);
        }
        exps[r] = static_cast<unsigned char>(e);
    };
    for (int r = static_cast<int>(t); r < BM; r += NT)
        fold(ra, rows_valid, mx_window(a_e5m2), exps_a, r, ahi, alo);
    for (int r = static_cast<int>(t); r < BN; r += NT)
        fold(rb, cols_valid, mx_window(b_e5m2), exps_b, r, bhi, blo);
    mx_fold_tile_range(ahi, alo, bhi, blo, t, range);
    return mx_sync_and<BAR, NT>(ok);
}

// The range words of a tile's rows: expert g's block, A's rows from r0 and B's columns from c0.
__device__ __forceinline__ const unsigned short* mx_ranges_a(const unsigned short* words, int g,
                                                            int ra, int rb, long long r0) {
    return words + static_cast<long long>(g) * (ra + rb) + r0;
}
__device__ __forceinline__ const unsigned short* mx_ranges_b(const unsigned short* words, int g,
                                                            int ra, int rb, long long c0) {
    return words + static_cast<long long>(g) * (ra + rb) + ra + c0;
}

}  // namespace lpm_gg

// The range words' parameters of the warp-specialised MXFP8 kernels (after their tensor maps).
#define LPM_GG_MX_RANGE_PARAMS                                                                \
    const unsigned short *__restrict__ mx_words, int ranges_ra, int ranges_rb,               \
        const unsigned *__restrict__ mx_out_of_window
#define LPM_GG_MX_RANGE_ARGS mx_words, ranges_ra, ranges_rb, mx_out_of_window

// extern "C" entry point NAME of the range kernel: grid (row blocks, experts, 2), blockIdx.z = 0
// for A's rows (the expert's D_ROWS; block scales at a_scale + D_A_SOFF, row / line stride
// D_A_SLD, MN-major when a_mn), 1 for B's (n_cols of them; b_scale, D_B_*); each thread one row
// at a time, striding by the grid's rows (with device splits the grid covers a typical expert,
// not the M rows one expert may have), over the expert's ceil(D_LEN / 32) blocks, into words
// (layout above); a row outside the fp16 window of its format (a_e5m2 / b_e5m2) sets
// *out_of_window (zeroed by the caller) to 1 -- the persistent kernel's launch-wide staging mode.
#define LPM_GG_DEFINE_MX_RANGES(NAME)                                                          \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kMxRangeThreads)                      \
        NAME(const long long* __restrict__ desc, const unsigned char* __restrict__ a_scale,   \
             const unsigned char* __restrict__ b_scale, int a_mn, int b_mn, int a_e5m2,       \
             int b_e5m2, long long n_cols, int ra, int rb, unsigned short* __restrict__ words, \
             unsigned* __restrict__ out_of_window) {                                           \
        const int g = static_cast<int>(blockIdx.y);                                            \
        const bool op_b = blockIdx.z != 0;                                                     \
        const long long* d = desc + static_cast<long long>(g) * lpm_gg::kDescWords;            \
        const long long rows = op_b ? n_cols : d[lpm_gg::D_ROWS];                              \
        const int nb = static_cast<int>((d[lpm_gg::D_LEN] + LPM_MXFP8_BLOCK - 1) /             \
                                        LPM_MXFP8_BLOCK);                                      \
        const long long sld = op_b ? d[lpm_gg::D_B_SLD] : d[lpm_gg::D_A_SLD];                  \
        const unsigned char* base =                                                            \
            op_b ? b_scale + d[lpm_gg::D_B_SOFF] : a_scale + d[lpm_gg::D_A_SOFF];              \
        const bool mn = (op_b ? b_mn : a_mn) != 0;                                             \
        const bool e5m2 = (op_b ? b_e5m2 : a_e5m2) != 0;                                       \
        unsigned short* out = words + static_cast<long long>(g) * (ra + rb) + (op_b ? ra : 0); \
        const long long step = static_cast<long long>(gridDim.x) * lpm_gg::kMxRangeThreads;    \
        for (long long r =                                                                     \
                 static_cast<long long>(blockIdx.x) * lpm_gg::kMxRangeThreads + threadIdx.x;   \
             r < rows; r += step) {                                                            \
            const unsigned short w = mn ? lpm_gg::mx_row_range<true>(base + r, sld, nb)        \
                                        : lpm_gg::mx_row_range<false>(base + r * sld, sld, nb); \
            out[r] = w;                                                                        \
            if (!lpm_gg::mx_range_in_window(w, e5m2)) atomicOr(out_of_window, 1u);             \
        }                                                                                      \
    }

#endif  // LPM_GROUPED_GEMM_MX_RANGES_CUH
