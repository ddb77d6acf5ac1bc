// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): MXFP8 on
// fp16 tensor cores -- the per-tile window check and the epilogue's power-of-two factors.
//
// Widening an MXFP8 element q * 2^(e-127) to bf16 (fp8_decode4) costs a conversion, a widening
// and a multiply per element: as much pipe time as NVFP4's decode. fp16 cannot hold the element
// itself (E8M0 spans 2^-127..2^127), but it holds q * 2^s exactly for s in the window
// [S_MIN, S_MAX] of grouped_gemm_staging.cuh, and widening is then one cvt.rn.f16x2.e4m3x2 /
// e5m2x2 and one mul.rn.f16x2 per pair. So the wgmma kernel (gemm_mma, sm_90a) first scans the
// block codes of its tile: for every valid A row and B column, over the whole contraction, the
// largest code e_max and the smallest e_min. When every row and column has e_max - e_min within
// the window (E4M3 21 codes, E5M2 8) and no NaN scale (255), the tile is staged as
// q * 2^(e - e_max + S_MAX) in fp16 and multiplied with wgmma ...f16; the epilogue first takes
// the fp32 accumulator times 2^(e_max(row) + e_max(col) - 254 - S_MAX(A) - S_MAX(B)), rounded
// once (mx_ldexp). Otherwise the tile takes the bf16 path, as before.
//
// Same results: every fp16-domain product is exact in fp32 and at least 2^-48 (no fp32
// subnormal anywhere in the accumulation), and the fp16 tile is the bf16 tile times a power of
// two per row and per column, so the accumulator is the bf16 path's accumulator times that power
// of two, bit for bit (measured: benchmarks/probe_f16_bf16_mma.py), whenever the bf16 path's
// own products and sums are fp32 normals. Where they are not (blocks of magnitude below ~1e-35,
// which the bf16 path truncates onto bf16's subnormal grid), the fp16 path is exact and the bf16
// path is not; the result then agrees with the float64 reference better, never worse -- but it
// depends on the tile's path there (on the other rows / columns of the tile and on the tile
// shape), so bitwise grouped == per-expert only holds above that range (block scale codes >= 3
// for E4M3, >= 10 for E5M2, and fp32-normal products). Making the check also require that range
// would restore it unconditionally (the two paths then give the same bits).
//
// The scan reads the scales with 16-byte loads: it needs 16-byte aligned scale rows (K-major:
// base, row stride and the number of blocks; MN-major: base and line stride), which compact
// scales have whenever K (or the columns) is a multiple of 512 (16). Tiles whose scales are not
// aligned, tiles of fewer than kMxMinKTiles k-tiles (the check costs ~2 us per tile: a pass over
// the scales and three barriers), and every tile of a launch with mx_bf16 set take the bf16 path.

#ifndef LPM_GROUPED_GEMM_MXF16_CUH
#define LPM_GROUPED_GEMM_MXF16_CUH

#include "grouped_gemm_tile.cuh"  // frag_row
#include "grouped_gemm_staging.cuh"

namespace lpm_gg {

// Tiles with fewer k-tiles than this stay on the bf16 path (the check's fixed cost).
constexpr int kMxMinKTiles = 32;

// The rescale's shift: the accumulator of row r and column c (fp16 window) is the true sum times
// 2^(shift - exps_a[r] - exps_b[c]).
__host__ __device__ constexpr int mx_rescale_shift(bool a_e5m2, bool b_e5m2) {
    return 2 * LPM_E8M0_BIAS + mx_s_max(a_e5m2) + mx_s_max(b_e5m2);
}

// The tile's range of e_max over its valid rows and columns (A's largest, A's smallest, B's
// largest, B's smallest), written by mx_window_check and read by mx_rescale: when every row's and
// column's factor 2^(exps_a[r] + exps_b[c] - shift) is an fp32 normal, the rescale is one integer
// add and one multiply per accumulator (otherwise mx_ldexp's range test and fp64 fallback).
// Static shared memory: the pipeline buffers around it are rewritten while it is still read.
__shared__ unsigned mx_tile_range[4];

// Whether the scan can read an operand's tile scales with 16-byte loads.
template <int KIND>
__device__ __forceinline__ bool mx_scan_aligned(const unsigned char* sbase, long long sld,
                                                long long len) {
    const long long nb = (len + LPM_MXFP8_BLOCK - 1) / LPM_MXFP8_BLOCK;
    const bool base_ok = (reinterpret_cast<unsigned long long>(sbase) & 15ull) == 0 &&
                         (sld & 15ll) == 0;
    return KIND == KIND_FP8_K ? base_ok && (nb & 15ll) == 0 : base_ok;
}

// Largest / smallest byte of a 16-byte chunk (K-major scan).
__device__ __forceinline__ void mx_chunk_range(const uint4& w, unsigned& mx, unsigned& mn) {
    unsigned a = __vmaxu4(__vmaxu4(w.x, w.y), __vmaxu4(w.z, w.w));
    unsigned b = __vminu4(__vminu4(w.x, w.y), __vminu4(w.z, w.w));
    a = __vmaxu4(a, a >> 16);
    b = __vminu4(b, b >> 16);
    mx = max(a & 0xFFu, (a >> 8) & 0xFFu);
    mn = min(b & 0xFFu, (b >> 8) & 0xFFu);
}

// Fold the block codes of the valid rows of one operand tile (R rows; scales at sbase, row /
// line stride sld, mx_scan_aligned) into smax[r] / smin[r] (shared, initialised to 0 / 255) with
// shared-memory atomics, NT threads (t: this thread's index).
//   K-major : row r's nb codes at sbase + r * sld (16-byte chunks, flat over rows x chunks);
//   MN-major: block j of row r at sbase + j * sld + r: each thread keeps one 16-row chunk of
//             every (NT / (R/16))-th line in registers. When the warps divide evenly among the
//             R/16 chunks, each warp takes one chunk (lanes on consecutive lines), folds it
//             across its lanes with shuffles and 16 lanes apply one row each: a few atomics per
//             address (many threads folding the same rows serialize on them, which cost more
//             than a short contraction's whole k-loop); otherwise thread t takes chunk
//             t % (R/16) and folds its own 16 rows. Threads without a line skip the atomics.
template <int KIND, int R, int NT>
__device__ __forceinline__ void mx_scan(const unsigned char* sbase, long long sld, int valid,
                                        long long len, unsigned* smax, unsigned* smin,
                                        unsigned t) {
    const int nb = static_cast<int>((len + LPM_MXFP8_BLOCK - 1) / LPM_MXFP8_BLOCK);
    if constexpr (KIND == KIND_FP8_K) {
        constexpr int U = 4;  // chunks in flight per thread
        const int cpr = nb >> 4;
        const int total = valid * cpr;
        for (int i0 = static_cast<int>(t); i0 < total; i0 += U * NT) {
            uint4 w[U];
            int rr[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = i0 + u * NT;
                rr[u] = -1;
                if (i < total) {
                    const int r = i / cpr, c = i - r * cpr;
                    rr[u] = r;
                    w[u] = __ldg(reinterpret_cast<const uint4*>(sbase + r * sld + c * 16));
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (rr[u] >= 0) {
                    unsigned mx, mn;
                    mx_chunk_range(w[u], mx, mn);
                    atomicMax(smax + rr[u], mx);
                    atomicMin(smin + rr[u], mn);
                }
            }
        }
    } else {
        static_assert(R % 16 == 0 && NT % (R / 16) == 0 && NT % 32 == 0, "MN-major scan chunks");
        constexpr int CPL = R / 16, STEP = NT / CPL;
        constexpr bool WARP = (NT / 32) % CPL == 0;  // one chunk per warp
        const int w = static_cast<int>(t) >> 5, lane = static_cast<int>(t) & 31;
        const int c = WARP ? w % CPL : static_cast<int>(t) % CPL;
        const int j0 = WARP ? 32 * (w / CPL) + lane : static_cast<int>(t) / CPL;
        // (warp-uniform when WARP: the chunk, and whether the warp's first line exists)
        if (c * 16 >= valid || (WARP ? j0 - lane : j0) >= nb) return;
        uint4 mx = make_uint4(0u, 0u, 0u, 0u), mn = make_uint4(~0u, ~0u, ~0u, ~0u);
        const unsigned char* p = sbase + c * 16;
#pragma unroll 4
        for (int j = j0; j < nb; j += STEP) {
            const uint4 w = __ldg(reinterpret_cast<const uint4*>(p + j * sld));
            mx = make_uint4(__vmaxu4(mx.x, w.x), __vmaxu4(mx.y, w.y), __vmaxu4(mx.z, w.z),
                            __vmaxu4(mx.w, w.w));
            mn = make_uint4(__vminu4(mn.x, w.x), __vminu4(mn.y, w.y), __vminu4(mn.z, w.z),
                            __vminu4(mn.w, w.w));
        }
        if constexpr (WARP) {
#pragma unroll
            for (int o = 16; o >= 1; o >>= 1) {
                mx.x = __vmaxu4(mx.x, __shfl_xor_sync(~0u, mx.x, o));
                mx.y = __vmaxu4(mx.y, __shfl_xor_sync(~0u, mx.y, o));
                mx.z = __vmaxu4(mx.z, __shfl_xor_sync(~0u, mx.z, o));
                mx.w = __vmaxu4(mx.w, __shfl_xor_sync(~0u, mx.w, o));
                mn.x = __vminu4(mn.x, __shfl_xor_sync(~0u, mn.x, o));
                mn.y = __vminu4(mn.y, __shfl_xor_sync(~0u, mn.y, o));
                mn.z = __vminu4(mn.z, __shfl_xor_sync(~0u, mn.z, o));
                mn.w = __vminu4(mn.w, __shfl_xor_sync(~0u, mn.w, o));
            }
            // lane k < 16: row c * 16 + k
            const int r = c * 16 + lane, sh = 8 * (lane & 3);
            if (lane < 16 && r < valid) {
                const unsigned wx = (lane >> 2) == 0 ? mx.x : (lane >> 2) == 1 ? mx.y
                                  : (lane >> 2) == 2 ? mx.z : mx.w;
                const unsigned wn = (lane >> 2) == 0 ? mn.x : (lane >> 2) == 1 ? mn.y
                                  : (lane >> 2) == 2 ? mn.z : mn.w;
                atomicMax(smax + r, (wx >> sh) & 0xFFu);
                atomicMin(smin + r, (wn >> sh) & 0xFFu);
            }
            return;
        }
        const unsigned xs[4] = {mx.x, mx.y, mx.z, mx.w}, ns[4] = {mn.x, mn.y, mn.z, mn.w};
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const int r = c * 16 + k;
            if (r < valid) {
                atomicMax(smax + r, (xs[k >> 2] >> (8 * (k & 3))) & 0xFFu);
                atomicMin(smin + r, (ns[k >> 2] >> (8 * (k & 3))) & 0xFFu);
            }
        }
    }
}

// After mx_scan (and a barrier): exps[r] = e_max of row r (0 for rows >= valid); returns
// whether this thread's rows fit the window and carry no NaN scale, and folds their e_max into
// hi / lo.
template <int R, int NT>
__device__ __forceinline__ bool mx_finish(const unsigned* smax, const unsigned* smin, int valid,
                                          int window, unsigned char* exps, unsigned t,
                                          unsigned& hi, unsigned& lo) {
    bool ok = true;
    for (int r = static_cast<int>(t); r < R; r += NT) {
        unsigned e = 0u;
        if (r < valid) {
            e = smax[r];
            ok = ok && e != LPM_E8M0_NAN &&
                 static_cast<int>(e) - static_cast<int>(smin[r]) <= window;
            hi = max(hi, e);
            lo = min(lo, e);
        }
        exps[r] = static_cast<unsigned char>(e);
    }
    return ok;
}

// A window check's last fold: the rows' (ahi / alo) and columns' (bhi / blo) largest and
// smallest e_max of this thread into the tile's range (shared, 4 words, initialised to 0 / NaN
// code before a barrier): folded across the warp, then one atomic per warp and word.
__device__ __forceinline__ void mx_fold_tile_range(unsigned ahi, unsigned alo, unsigned bhi,
                                                   unsigned blo, unsigned t, unsigned* range) {
    ahi = __reduce_max_sync(~0u, ahi);
    alo = __reduce_min_sync(~0u, alo);
    bhi = __reduce_max_sync(~0u, bhi);
    blo = __reduce_min_sync(~0u, blo);
    if ((t & 31u) == 0u) {
        atomicMax(&range[0], ahi);
        atomicMin(&range[1], alo);
        atomicMax(&range[2], bhi);
        atomicMin(&range[3], blo);
    }
}

// A window check's barriers: __syncthreads (BAR = 0, the whole CTA) or named barrier BAR of NT
// threads (the persistent MXFP8 kernel's producers); mx_sync_and also returns whether `ok`
// holds in every participating thread.
template <int BAR, int NT>
__device__ __forceinline__ void mx_sync() {
    if constexpr (BAR == 0) {
        __syncthreads();
    } else {
        asm volatile("bar.sync %0, %1;\n" ::"n"(BAR), "n"(NT) : "memory");
    }
}
template <int BAR, int NT>
__device__ __forceinline__ bool mx_sync_and(bool ok) {
    if constexpr (BAR == 0) {
        return __syncthreads_and(ok) != 0;
    } else {
        unsigned r;
        asm volatile(
            "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n"
            " bar.red.and.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
            : "=r"(r)
            : "r"(static_cast<unsigned>(ok)), "n"(BAR), "n"(NT)
            : "memory");
        return r != 0u;
    }
}

// The whole window check of a BM x BN tile, by all NT threads of the CTA (contains barriers):
// exps_a / exps_b (shared, BM + BN bytes) receive the rows' / columns' e_max, mx_tile_range their
// range over the tile; `scratch` (shared, (BM + BN) * 8 bytes, free until the caller's next
// barrier) holds the running ranges. Returns the CTA-uniform verdict: true = stage this tile in
// the fp16 window. (The warp-specialised kernels check with precomputed row ranges instead:
// mx_window_check_ranges, grouped_gemm_mx_ranges.cuh.)
template <int AKIND, int BKIND, int BM, int BN, int NT>
__device__ __forceinline__ bool mx_window_check(const unsigned char* a_sbase, long long a_sld,
                                                int rows_valid, const unsigned char* b_sbase,
                                                long long b_sld, int cols_valid, long long len,
                                                bool a_e5m2, bool b_e5m2, bool allowed,
                                                unsigned* scratch, unsigned char* exps_a,
                                                unsigned char* exps_b, unsigned t) {
    unsigned* const range = mx_tile_range;
    allowed = allowed && mx_scan_aligned<AKIND>(a_sbase, a_sld, len) &&
              mx_scan_aligned<BKIND>(b_sbase, b_sld, len);
    if (!allowed) return false;  // uniform: launch arguments and the tile's descriptor
    unsigned* const amax_ = scratch;
    unsigned* const amin_ = scratch + BM;
    unsigned* const bmax_ = scratch + 2 * BM;
    unsigned* const bmin_ = scratch + 2 * BM + BN;
    for (int i = static_cast<int>(t); i < BM + BN; i += NT) {
        const bool isa = i < BM;
        (isa ? amax_ : bmax_)[isa ? i : i - BM] = 0u;
        (isa ? amin_ : bmin_)[isa ? i : i - BM] = LPM_E8M0_NAN;
    }
    if (t < 4) range[t] = (t & 1) ? LPM_E8M0_NAN : 0u;
    __syncthreads();
    mx_scan<AKIND, BM, NT>(a_sbase, a_sld, rows_valid, len, amax_, amin_, t);
    mx_scan<BKIND, BN, NT>(b_sbase, b_sld, cols_valid, len, bmax_, bmin_, t);
    __syncthreads();
    unsigned ahi = 0u, alo = LPM_E8M0_NAN, bhi = 0u, blo = LPM_E8M0_NAN;
    bool ok = mx_finish<BM, NT>(amax_, amin_, rows_valid, mx_window(a_e5m2), exps_a, t, ahi, alo);
    ok = mx_finish<BN, NT>(bmax_, bmin_, cols_valid, mx_window(b_e5m2), exps_b, t, bhi, blo) && ok;
    mx_fold_tile_range(ahi, alo, bhi, blo, t, range);
    return __syncthreads_and(ok) != 0;
}

__device__ __forceinline__ double f64_from_f32(float x) {
    double r;
    asm("cvt.f64.f32 %0, %1;\n" : "=d"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float f32_from_f64_rn(double x) {  // no flush to zero
    float r;
    asm("cvt.rn.f32.f64 %0, %1;\n" : "=f"(r) : "d"(x));
    return r;
}

// v * 2^x rounded once to fp32 (no flush): one fp32 multiply when 2^x is an fp32 normal (the
// product of a power of two is then correctly rounded, subnormal results included); otherwise
// (blocks of extreme magnitude) through fp64, where the factor and the product are exact.
__device__ __forceinline__ float mx_ldexp(float v, int x) {
    if (x >= 1 - LPM_FP32_EXP_BIAS && x <= LPM_FP32_EXP_BIAS) {
        return lpm_mul_rn(v, __uint_as_float(static_cast<unsigned>(x + LPM_FP32_EXP_BIAS)
                                             << LPM_FP32_MANT_BITS));
    }
    const double f = __longlong_as_double(static_cast<long long>(x + 1023) << 52);
    return f32_from_f64_rn(f64_from_f32(v) * f);
}

// The accumulators of a tile staged in the fp16 window, back to true scale: acc * 2^(exps_a[row]
// + exps_b[col] - shift), shift = mx_rescale_shift, rounded once (mx_ldexp). Fragment layout of
// stage_acc (PAIRED: its paired rows). When mx_tile_range (CTA-uniform) puts every valid row's
// and column's exponent sum in fp32's normal range, the factor's bits are a row term plus a
// column term and the product is mx_ldexp's first case, bit for bit; rows and columns past the
// valid extent (e_max 0) may get any factor there, and are never stored.
template <int MI, int NI, bool PAIRED = false>
__device__ __forceinline__ void mx_rescale(float* accf, const unsigned char* exps_a,
                                           const unsigned char* exps_b, int shift, int wm0,
                                           int wn0, int lane,
                                           const unsigned* range = mx_tile_range) {
    const int top = static_cast<int>(range[0] + range[2]) - shift;
    const int bottom = static_cast<int>(range[1] + range[3]) - shift;
    if (top <= LPM_FP32_EXP_BIAS && bottom >= 1 - LPM_FP32_EXP_BIAS) {
        unsigned rt[MI][2];  // (e_max(row) + 127 - shift) << 23
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
                rt[mi][hf] =
                    static_cast<unsigned>(
                        static_cast<int>(exps_a[frag_row<PAIRED>(wm0 + mi * 16, lane, hf)]) +
                        LPM_FP32_EXP_BIAS - shift)
                    << LPM_FP32_MANT_BITS;
        }
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const unsigned ct = static_cast<unsigned>(
                                        exps_b[wn0 + ni * 8 + (lane & 3) * 2 + e])
                                    << LPM_FP32_MANT_BITS;
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
                    for (int hf = 0; hf < 2; ++hf) {
                        float& v = accf[(mi * NI + ni) * 4 + 2 * hf + e];
                        v = lpm_mul_rn(v, __uint_as_float(rt[mi][hf] + ct));
                    }
                }
            }
        }
        return;
    }
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int eb = exps_b[wn0 + ni * 8 + (lane & 3) * 2 + e] - shift;
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    float& v = accf[(mi * NI + ni) * 4 + 2 * hf + e];
                    v = mx_ldexp(v, exps_a[frag_row<PAIRED>(wm0 + mi * 16, lane, hf)] + eb);
                }
            }
        }
    }
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_MXF16_CUH
