// lowprec_moe: block-scale swizzle / unswizzle (NUMERICS §4).
//
// A "row" scale matrix (R, C) (the compact matrix, or its transpose for MXFP8 columnwise
// scales) is zero-padded to (Rp, Cp) = (round_up(R, 128), round_up(C, 4)) and stored as 128x4
// tiles, row-major over (Rp/128, Cp/4), 512 bytes each; entry (r, c) lives at
// lpm_swizzle_offset(r, c, Cp) (lpm_formats.cuh). The NumPy reference is
// lowprec_moe/backends/numpy/layouts.py.
//
// Compact source addressing: with transpose == 0 the compact matrix is the row matrix itself,
// stored row-major [R, C], entry (r, c) at r * C + c. With transpose != 0 the compact matrix is
// its transpose (MXFP8 columnwise scales [M/32, K], so R = K and C = M/32), stored row-major
// [C, R], entry (r, c) at c * R + r.
//
// Swizzle: one thread per 4 output bytes. Four consecutive swizzled bytes are the columns
// c0..c0+3 of one row r of a tile, so each thread writes one aligned 32-bit word (the
// destination must be 4-byte aligned; every member's swizzled size is a multiple of 512).
// Unswizzle: one thread per compact output byte (coalesced writes, gathered reads).
// All indices are 64-bit.

#include "lpm_formats.cuh"

namespace {

constexpr int kSwizzleThreads = 256;

// Row matrix entry (r, c) of the compact source, or 0 in the padding.
__device__ __forceinline__ unsigned int lpm_scale_at(const unsigned char* __restrict__ src,
                                                     long long r, long long c, long long rows,
                                                     long long cols, int transpose) {
    if (r >= rows || c >= cols) return 0u;
    return transpose ? src[c * rows + r] : src[r * cols + c];
}

// Write swizzled words [first, n_words) with stride `stride` of one matrix.
__device__ __forceinline__ void lpm_swizzle_words(const unsigned char* __restrict__ src,
                                                  unsigned char* __restrict__ dst,
                                                  long long rows, long long cols,
                                                  long long padded_cols, int transpose,
                                                  long long first, long long stride) {
    const long long tiles_c = padded_cols / LPM_SWIZZLE_TILE_COLS;
    const long long words_per_tile = LPM_SWIZZLE_TILE_BYTES / LPM_SWIZZLE_TILE_COLS;  // 128
    const long long n_words = lpm_round_up(rows, LPM_SCALE_PAD_ROWS) * padded_cols /
                              LPM_SWIZZLE_TILE_COLS;
    unsigned int* __restrict__ out = reinterpret_cast<unsigned int*>(dst);
    for (long long w = first; w < n_words; w += stride) {
        const long long tile = w / words_per_tile;
        const int in_tile = (int)(w - tile * words_per_tile);  // = (r % 32) * 4 + sub
        const int sub = in_tile % (LPM_SWIZZLE_TILE_ROWS / LPM_SWIZZLE_SUBTILE_ROWS);
        const int r32 = in_tile / (LPM_SWIZZLE_TILE_ROWS / LPM_SWIZZLE_SUBTILE_ROWS);
        const long long tile_r = tile / tiles_c;
        const long long tile_c = tile - tile_r * tiles_c;
        const long long r = tile_r * LPM_SWIZZLE_TILE_ROWS + sub * LPM_SWIZZLE_SUBTILE_ROWS + r32;
        const long long c0 = tile_c * LPM_SWIZZLE_TILE_COLS;
        unsigned int word = 0u;
#pragma unroll
        for (int k = 0; k < LPM_SWIZZLE_TILE_COLS; ++k) {
            word |= lpm_scale_at(src, r, c0 + k, rows, cols, transpose) << (8 * k);
        }
        out[w] = word;
    }
}

// Write compact bytes [first, rows * cols) with stride `stride` of one matrix.
__device__ __forceinline__ void lpm_unswizzle_bytes(const unsigned char* __restrict__ src,
                                                    unsigned char* __restrict__ dst,
                                                    long long rows, long long cols,
                                                    long long padded_cols, int transpose,
                                                    long long first, long long stride) {
    const long long n = rows * cols;
    // Stored compact matrix: [rows, cols], or [cols, rows] when transposed.
    const long long stored_cols = transpose ? rows : cols;
    for (long long i = first; i < n; i += stride) {
        const long long a = i / stored_cols;
        const long long b = i - a * stored_cols;
        const long long r = transpose ? b : a;
        const long long c = transpose ? a : b;
        dst[i] = src[lpm_swizzle_offset(r, c, padded_cols)];
    }
}

}  // namespace

// Swizzle one compact scale matrix.
//   src        compact matrix: [rows, cols] (transpose == 0) or [cols, rows] (transpose != 0)
//   dst        swizzled buffer of padded_rows * padded_cols bytes, 4-byte aligned
//   rows, cols row-matrix shape (R, C); padded_rows = round_up(R, 128), padded_cols =
//              round_up(C, 4)
// Launch with blockDim.x = 256 and any gridDim.x (grid-stride over padded_rows*padded_cols/4).
extern "C" __global__ void __launch_bounds__(kSwizzleThreads)
lpm_swizzle_scales(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                   long long rows, long long cols, long long padded_rows, long long padded_cols,
                   int transpose) {
    (void)padded_rows;  // implied by rows; kept so both kernels share one parameter list
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    lpm_swizzle_words(src, dst, rows, cols, padded_cols, transpose, first, stride);
}

// Unswizzle one matrix: the inverse of lpm_swizzle_scales, cropping the padding.
//   src        swizzled buffer of padded_rows * padded_cols bytes
//   dst        compact matrix, [rows, cols] (transpose == 0) or [cols, rows] (transpose != 0)
// Launch with blockDim.x = 256 and any gridDim.x (grid-stride over rows * cols).
extern "C" __global__ void __launch_bounds__(kSwizzleThreads)
lpm_unswizzle_scales(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                     long long rows, long long cols, long long padded_rows,
                     long long padded_cols, int transpose) {
    (void)padded_rows;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    lpm_unswizzle_bytes(src, dst, rows, cols, padded_cols, transpose, first, stride);
}

// Grouped swizzle: every member in one launch.
//   meta       int64 [num_groups, 4]: per member (src byte offset of its compact matrix,
//              dst byte offset of its swizzled buffer (a multiple of 4), rows R, cols C of its
//              row matrix); the padded shape is derived from R and C
// Member g is handled by blocks blockIdx.y = g, g + gridDim.y, ...; the blocks of one member
// grid-stride over its words with blockIdx.x.
extern "C" __global__ void __launch_bounds__(kSwizzleThreads)
lpm_swizzle_scales_grouped(const unsigned char* __restrict__ src,
                           unsigned char* __restrict__ dst, const long long* __restrict__ meta,
                           int num_groups, int transpose) {
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int g = blockIdx.y; g < num_groups; g += gridDim.y) {
        const long long* m = meta + 4LL * g;
        const long long rows = m[2];
        const long long cols = m[3];
        lpm_swizzle_words(src + m[0], dst + m[1], rows, cols,
                          lpm_round_up(cols, LPM_SCALE_PAD_COLS), transpose, first, stride);
    }
}

// Grouped unswizzle: every member in one launch.
//   meta       int64 [num_groups, 4]: per member (src byte offset of its swizzled buffer,
//              dst byte offset of its compact matrix, rows R, cols C of its row matrix)
extern "C" __global__ void __launch_bounds__(kSwizzleThreads)
lpm_unswizzle_scales_grouped(const unsigned char* __restrict__ src,
                             unsigned char* __restrict__ dst, const long long* __restrict__ meta,
                             int num_groups, int transpose) {
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int g = blockIdx.y; g < num_groups; g += gridDim.y) {
        const long long* m = meta + 4LL * g;
        const long long rows = m[2];
        const long long cols = m[3];
        lpm_unswizzle_bytes(src + m[0], dst + m[1], rows, cols,
                            lpm_round_up(cols, LPM_SCALE_PAD_COLS), transpose, first, stride);
    }
}
