// lowprec_moe: per-expert tables from splits that live on the device (NUMERICS §7.5).
//
// The NumPy twin is lowprec_moe/backends/cupy/splits.py and gemm/device_splits.py (the same
// functions run on NumPy arrays in the CPU tests); the launcher is
// lowprec_moe/backends/cupy/splits_kernels.py.
//
// lpm_splits_offsets (one CTA): the splits clamped so that no row outside [0, M) is ever
// addressed -- each count cut to [0, M], the running end cut at M -- as row offsets out[0]
// [G+1] (expert g owns rows out[0][g] .. out[0][g+1]-1) and up to kMaxTileTables tile-offset
// tables out[j+1] [G+1]: the offsets of tiles of rows_j rows (expert g owns tiles
// out[j+1][g] / unit_j .. out[j+1][g+1] / unit_j - 1), times unit_j (the tiles' size in the
// caller's units: rows, bytes). One launch writes every table a call needs. Block scans over G;
// G may exceed the CTA's threads (each thread takes a run of experts).
//
// lpm_gemm_split_tables: from those offsets, the grouped GEMM's descriptor table desc [G, 16] =
// static + row0 * coef[0] + rows * coef[1] (per word), plus blk0 * coef[2] + blks * coef[3] when
// blk_off (the tile offsets of the operands' row blocks) is given, and, when tiles != nullptr,
// its M-grouped
// tile table [entries, 2] of (expert, row tile): real tiles in expert order, then (0, pad) with
// pad * BM >= M (no valid row; the GEMM kernels skip them). One thread per output word.
// All indices are 64-bit; nothing is read back by the host.

#include "lpm_formats.cuh"

namespace {

constexpr int kSplitsThreads = 256;
constexpr int kDescWords = 16;
constexpr int kMaxTileTables = 4;  // tile-offset tables of one lpm_splits_offsets launch

// Exclusive scan of one value per thread over the CTA (serial over the partials: the CTA is
// small and this runs once per call). Every thread of the CTA must call it.
__device__ long long block_exclusive_scan(long long v) {
    __shared__ long long part[kSplitsThreads];
    __syncthreads();  // an earlier scan's reads are done
    part[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long run = 0;
        for (int t = 0; t < kSplitsThreads; ++t) {
            const long long x = part[t];
            part[t] = run;
            run += x;
        }
    }
    __syncthreads();
    return part[threadIdx.x];
}

// Count g cut to [0, M] (so that sums of G of them cannot overflow).
__device__ __forceinline__ long long clamped_split(const void* splits, int is64, long long g,
                                                   long long M) {
    const long long s = is64 ? static_cast<const long long*>(splits)[g]
                             : static_cast<long long>(static_cast<const int*>(splits)[g]);
    return s < 0 ? 0 : (s > M ? M : s);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kSplitsThreads)
    lpm_splits_offsets(const void* __restrict__ splits, int is64, long long G, long long M,
                       int n_tables, long long rows0, long long unit0, long long rows1,
                       long long unit1, long long rows2, long long unit2, long long rows3,
                       long long unit3, long long* __restrict__ out) {
    // thread t takes experts g0 .. g1 - 1
    const long long per = (G + kSplitsThreads - 1) / kSplitsThreads;
    const long long g0 = static_cast<long long>(threadIdx.x) * per;
    const long long g1 = g0 + per < G ? g0 + per : G;
    long long local = 0;
    for (long long g = g0; g < g1; ++g) local += clamped_split(splits, is64, g, M);
    const long long first = block_exclusive_scan(local);  // rows before g0, before the cut
    const long long start = first < M ? first : M;         // where expert g0 starts
    // row offsets: the running end cut at M
    long long* row_off = out;
    long long run = first;
    for (long long g = g0; g < g1; ++g) {
        run += clamped_split(splits, is64, g, M);
        row_off[g + 1] = run < M ? run : M;
    }
    for (int j = 0; j < n_tables && j < kMaxTileTables; ++j) {  // n_tables is uniform
        const long long rows = j == 0 ? rows0 : j == 1 ? rows1 : j == 2 ? rows2 : rows3;
        const long long unit = j == 0 ? unit0 : j == 1 ? unit1 : j == 2 ? unit2 : unit3;
        long long* tile_off = out + (j + 1) * (G + 1);
        long long prev = start, tiles_local = 0;
        for (long long g = g0; g < g1; ++g) {  // (this thread's own row_off writes)
            tiles_local += (row_off[g + 1] - prev + rows - 1) / rows;
            prev = row_off[g + 1];
        }
        long long t = block_exclusive_scan(tiles_local);
        prev = start;
        for (long long g = g0; g < g1; ++g) {
            t += (row_off[g + 1] - prev + rows - 1) / rows;
            tile_off[g + 1] = t * unit;
            prev = row_off[g + 1];
        }
        if (threadIdx.x == 0) tile_off[0] = 0;
    }
    if (threadIdx.x == 0) row_off[0] = 0;
}

extern "C" __global__ void __launch_bounds__(kSplitsThreads)
    lpm_gemm_split_tables(const long long* __restrict__ row_off,
                          const long long* __restrict__ tile_off,
                          const long long* __restrict__ blk_off, long long G, long long M,
                          const long long* __restrict__ static_desc,
                          const long long* __restrict__ coef, long long* __restrict__ desc,
                          int* __restrict__ tiles, long long entries, long long bm) {
    const long long i = static_cast<long long>(blockIdx.x) * kSplitsThreads + threadIdx.x;
    if (i < G * kDescWords) {
        const long long g = i / kDescWords, w = i % kDescWords;
        const long long row0 = row_off[g], rows = row_off[g + 1] - row0;
        long long d = static_desc[i] + row0 * coef[w] + rows * coef[kDescWords + w];
        if (blk_off != nullptr) {
            const long long blk0 = blk_off[g], blks = blk_off[g + 1] - blk0;
            d += blk0 * coef[2 * kDescWords + w] + blks * coef[3 * kDescWords + w];
        }
        desc[i] = d;
    }
    if (tiles != nullptr && i < entries) {
        // the expert whose tiles hold entry i: the last g with tile_off[g] <= i (g < G)
        long long lo = 0, hi = G;
        while (hi - lo > 1) {
            const long long mid = (lo + hi) >> 1;
            if (tile_off[mid] <= i) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        const bool real = i < tile_off[G];
        tiles[2 * i] = real ? static_cast<int>(lo) : 0;
        tiles[2 * i + 1] = real ? static_cast<int>(i - tile_off[lo])
                                : static_cast<int>((M + bm - 1) / bm);
    }
}
