// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// epilogue (struct Epilogue; also used by grouped_gemm_simt.cu). A kernel body's tile set-up,
// fragment layout and accumulator staging are in grouped_gemm_tile.cuh.

#ifndef LPM_GROUPED_GEMM_EPILOGUE_CUH
#define LPM_GROUPED_GEMM_EPILOGUE_CUH

#include "grouped_gemm_base.cuh"
#include "grouped_gemm_pack.cuh"

namespace lpm_gg {

// ==========================================================================================
// Epilogue (NUMERICS §7): NVFP4 scaling, bias (optionally times probs), cast or accumulate.

// Eight consecutive floats of a staged tile (16-byte aligned).
__device__ __forceinline__ void load8(const float* src, float (&v)[8]) {
    const float4 lo = *reinterpret_cast<const float4*>(src);
    const float4 hi = *reinterpret_cast<const float4*>(src + 4);
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
    v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

struct Epilogue {
    void* out;
    long long out_off;  // element offset of the expert's output row 0
    long long n_cols;
    int out_type;
    int accumulate;
    int scale_mode;  // 0 none, 1 per tensor, 2 row-scaled
    float alpha;     // per-tensor factor (scale_mode 1)
    const float* amax_a;
    long long amax_a_base;
    int a_vec;
    const float* amax_b;
    long long amax_b_base;
    int b_vec;
    const float* bias;
    long long bias_base;
    const float* probs;
    long long probs_base;
    int has_bias;
    int has_probs;

    // The epilogue of expert descriptor d (DescWord offsets) with the launch's arguments.
    static __device__ __forceinline__ Epilogue of_expert(
        const long long* d, void* out, long long n_cols, int out_type, int accumulate,
        int scale_mode, const float* amax_a, int a_vec, const float* amax_b, int b_vec,
        const float* bias, const float* probs, int has_bias, int has_probs) {
        Epilogue ep;
        ep.out = out;
        ep.out_off = d[D_OUT_OFF];
        ep.n_cols = n_cols;
        ep.out_type = out_type;
        ep.accumulate = accumulate;
        ep.scale_mode = scale_mode;
        ep.amax_a = amax_a;
        ep.amax_a_base = d[D_AMAX_A];
        ep.a_vec = a_vec;
        ep.amax_b = amax_b;
        ep.amax_b_base = d[D_AMAX_B];
        ep.b_vec = b_vec;
        ep.bias = bias;
        ep.bias_base = d[D_BIAS];
        ep.probs = probs;
        ep.probs_base = d[D_PROBS];
        ep.has_bias = has_bias;
        ep.has_probs = has_probs;
        return ep;
    }

    // The wgrad of an expert without tokens: dW_g = +0 over the tile (all-zero bits; nothing to
    // do when accumulating), written by threads 0..nthreads-1 in 16-byte stores where every row
    // of the tile starts and ends on a 16-byte boundary, else element by element.
    __device__ __forceinline__ void zero_tile(long long r0, long long c0, int rows_valid,
                                              int cols_valid, int nthreads) const {
        if (accumulate) return;
        const int es = out_type == OUT_F32 ? 4 : 2;  // bytes per element
        const int per = 16 / es;                      // elements per 16-byte chunk
        unsigned char* const first =
            static_cast<unsigned char*>(out) + (out_off + r0 * n_cols + c0) * es;
        if ((reinterpret_cast<unsigned long long>(first) & 15u) == 0 && (n_cols * es) % 16 == 0 &&
            cols_valid % per == 0) {
            const int cpr = cols_valid / per;  // chunks per row
            for (int i = threadIdx.x; i < rows_valid * cpr; i += nthreads) {
                const int r = i / cpr;
                *reinterpret_cast<uint4*>(first + r * n_cols * es + (i - r * cpr) * 16) =
                    make_uint4(0u, 0u, 0u, 0u);
            }
            return;
        }
        for (int i = threadIdx.x; i < rows_valid * cols_valid; i += nthreads) {
            write(r0 + i / cols_valid, c0 + i % cols_valid, 0.0f);
        }
    }

    __device__ __forceinline__ void init_alpha() {
        alpha = 0.0f;
        if (scale_mode == 1) {
            alpha = lpm_mul_rn(lpm_mul_rn(amax_a[amax_a_base], amax_b[amax_b_base]),
                               lpm_f32_from_bits(LPM_FP32_INV_NVFP4_GEMM_FACTOR_BITS));
        }
    }

    // Per-row factors: amax of the row (scale_mode 2) and probs of the row.
    __device__ __forceinline__ float row_amax(long long row) const {
        return amax_a[a_vec ? amax_a_base + row : amax_a_base];
    }
    __device__ __forceinline__ float col_amax(long long col) const {
        return amax_b[b_vec ? amax_b_base + col : amax_b_base];
    }

    // Steps 1-2 of NUMERICS §7 epilogue for one element (before the cast / accumulation).
    __device__ __forceinline__ float value(long long col, float acc, float ra, float pr) const {
        float t = acc;
        if (scale_mode == 1) {
            t = lpm_mul_rn(t, alpha);
        } else if (scale_mode == 2) {
            t = lpm_mul_rn(t, lpm_f32_from_bits(LPM_FP32_INV_NVFP4_GEMM_FACTOR_BITS));
            t = lpm_mul_rn(t, lpm_mul_rn(ra, col_amax(col)));
        }
        if (has_bias) {
            float b = bias[bias_base + col];
            if (has_probs) b = lpm_mul_rn(b, pr);
            t = lpm_add_rn(t, b);
        }
        return t;
    }

    __device__ __forceinline__ void store(long long row, long long col, float acc, float ra,
                                          float pr) const {
        write(row, col, value(col, acc, ra, pr));
    }

    __device__ __forceinline__ void write(long long row, long long col, float t) const {
        const long long idx = out_off + row * n_cols + col;
        if (out_type == OUT_F32) {
            float* o = static_cast<float*>(out) + idx;
            if (accumulate) t = lpm_add_rn(*o, t);
            *o = t;
        } else if (out_type == OUT_BF16) {
            static_cast<unsigned short*>(out)[idx] = lpm_f32_to_bf16_bits_rn(t);
        } else {
            static_cast<unsigned short*>(out)[idx] = f32_to_f16_bits_rn(t);
        }
    }

    // Four consecutive columns with one vector access (the element index must be a multiple of 4
    // and the base pointer aligned; see tile()).
    __device__ __forceinline__ void write4(long long row, long long col, float t0, float t1,
                                           float t2, float t3) const {
        const long long idx = out_off + row * n_cols + col;
        if (out_type == OUT_F32) {
            float4* o = reinterpret_cast<float4*>(static_cast<float*>(out) + idx);
            if (accumulate) {
                const float4 prev = *o;
                t0 = lpm_add_rn(prev.x, t0);
                t1 = lpm_add_rn(prev.y, t1);
                t2 = lpm_add_rn(prev.z, t2);
                t3 = lpm_add_rn(prev.w, t3);
            }
            *o = make_float4(t0, t1, t2, t3);
        } else {
            unsigned short h0, h1, h2, h3;
            if (out_type == OUT_BF16) {
                h0 = lpm_f32_to_bf16_bits_rn(t0);
                h1 = lpm_f32_to_bf16_bits_rn(t1);
                h2 = lpm_f32_to_bf16_bits_rn(t2);
                h3 = lpm_f32_to_bf16_bits_rn(t3);
            } else {
                h0 = f32_to_f16_bits_rn(t0);
                h1 = f32_to_f16_bits_rn(t1);
                h2 = f32_to_f16_bits_rn(t2);
                h3 = f32_to_f16_bits_rn(t3);
            }
            *reinterpret_cast<uint2*>(static_cast<unsigned short*>(out) + idx) =
                make_uint2(static_cast<unsigned>(h0) | (static_cast<unsigned>(h1) << 16),
                           static_cast<unsigned>(h2) | (static_cast<unsigned>(h3) << 16));
        }
    }

    // Row factors for one output row (ra unused unless scale_mode 2, pr unless has_probs).
    __device__ __forceinline__ void row_factors(long long row, float& ra, float& pr) const {
        ra = scale_mode == 2 ? row_amax(row) : 0.0f;
        pr = has_probs ? probs[probs_base + row] : 1.0f;
    }

    // Eight consecutive columns of one row from the staged tile, through steps 1-2 of the
    // epilogue (per-tensor or row-scaled factors, bias, probs) and cast to OT with one 16-byte
    // store per 16-bit group (two for fp32, accumulating into the output when asked). Fast path
    // of tile() for 16-byte aligned groups. The flags are uniform, so their branches are taken
    // once per group; the arithmetic per element is value()'s and write()'s. `ca` / `bv`: the
    // column amaxes (row-scaled) and biases of the 8 columns, loaded once by tile8; `ra` / `pr`:
    // the row's amax (row-scaled) and probs (bias with probs), loaded by tile8 ahead of time.
    template <int OT>
    __device__ __forceinline__ void group8(const float* src, long long row, long long col,
                                           const float (&ca)[8], const float (&bv)[8],
                                           float ra, float pr) const {
        float v[8];
        load8(src, v);
        if (scale_mode == 1) {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = lpm_mul_rn(v[j], alpha);
        } else if (scale_mode == 2) {
            const float inv = lpm_f32_from_bits(LPM_FP32_INV_NVFP4_GEMM_FACTOR_BITS);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                v[j] = lpm_mul_rn(lpm_mul_rn(v[j], inv), lpm_mul_rn(ra, ca[j]));
            }
        }
        if (has_bias) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float b = has_probs ? lpm_mul_rn(bv[j], pr) : bv[j];
                v[j] = lpm_add_rn(v[j], b);
            }
        }
        const long long idx = out_off + row * n_cols + col;
        if constexpr (OT == OUT_F32) {
            float4* o = reinterpret_cast<float4*>(static_cast<float*>(out) + idx);
            if (accumulate) {
                const float4 p0 = o[0], p1 = o[1];
                const float p[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
                for (int j = 0; j < 8; ++j) v[j] = lpm_add_rn(p[j], v[j]);
            }
            o[0] = make_float4(v[0], v[1], v[2], v[3]);
            o[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
            unsigned w[4];
            bool nan = false;
            if constexpr (OT == OUT_BF16) {
#pragma unroll
                for (int j = 0; j < 8; ++j) nan |= !(v[j] == v[j]);
            }
            if (OT == OUT_BF16 && !nan) {
                // cvt.rn.bf16x2.f32 rounds like lpm_f32_to_bf16_bits_rn for every non-NaN
                // value (no flush); NaN groups take the per-element path (payload kept).
#pragma unroll
                for (int j = 0; j < 4; ++j) w[j] = pack_bf16x2_rn(v[2 * j], v[2 * j + 1]);
            } else {
                pack8_each<OT>(v, w);
            }
            st_global_v4(static_cast<unsigned short*>(out) + idx, w[0], w[1], w[2], w[3]);
        }
    }

    // tile8 for the plain epilogues (16-bit output; no row scaling, bias or accumulation; times
    // alpha when SCALED): the same values and bits as group8's (pack8), with the flags' branches
    // out of the loop and four rows in flight per thread.
    template <int BN, int LD, int OT, bool SCALED, int NTHR>
    __device__ __forceinline__ void tile8_plain(const float* cs, long long r0, long long c0,
                                                int rows_valid, int cols_valid) const {
        constexpr int C8 = BN / 8, RPI = NTHR / C8;
        const int c = (static_cast<int>(threadIdx.x) % C8) * 8;
        if (c >= cols_valid) return;
        unsigned short* const o =
            static_cast<unsigned short*>(out) + out_off + r0 * n_cols + c0 + c;
#pragma unroll 4
        for (int r = static_cast<int>(threadIdx.x) / C8; r < rows_valid; r += RPI) {
            float v[8];
            load8(cs + r * LD + c, v);
            if constexpr (SCALED) {
#pragma unroll
                for (int j = 0; j < 8; ++j) v[j] = lpm_mul_rn(v[j], alpha);
            }
            unsigned w[4];
            pack8<OT>(v, w);
            st_global_v4(o + static_cast<long long>(r) * n_cols, w[0], w[1], w[2], w[3]);
        }
    }

    template <int BN, int LD, int OT, int NTHR>
    __device__ __forceinline__ void tile8(const float* cs, long long r0, long long c0,
                                          int rows_valid, int cols_valid) const {
        constexpr int C8 = BN / 8;
        static_assert(NTHR % 32 == 0 && 32 % C8 == 0, "a warp covers whole rows");
        constexpr int G = 32 / C8;       // rows of one warp per iteration
        constexpr int RPI = NTHR / C8;   // rows of all threads per iteration
        // Thread t handles rows t / C8, + RPI, ...: always columns c .. c+7, so their column
        // amaxes and biases are read once here rather than once per row.
        const int lane = static_cast<int>(threadIdx.x) & 31;
        const int c = (static_cast<int>(threadIdx.x) % C8) * 8;
        const int rb = static_cast<int>(threadIdx.x) / C8;
        const int wrow = (static_cast<int>(threadIdx.x) >> 5) * G;  // the warp's first row
        const bool col_ok = c < cols_valid;
        float ca[8], bv[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            ca[j] = scale_mode == 2 && col_ok ? col_amax(c0 + c + j) : 0.0f;
            bv[j] = has_bias && col_ok ? bias[bias_base + c0 + c + j] : 0.0f;
        }
        // Per-row factors (row amax when row-scaled, probs with bias): one load per lane
        // fetches those of the warp's next C8 iterations (lane L: row group L % G, iteration
        // L / G ahead), handed out by shuffles, so a tile waits on one load latency per C8
        // iterations rather than on one per row. The loop bound is uniform per warp.
        const bool rs = scale_mode == 2, rp = has_bias && has_probs;
        float ra_l = 0.0f, pr_l = 1.0f;
#pragma unroll 2
        for (int i = 0; wrow + i * RPI < rows_valid; ++i) {
            if ((rs || rp) && i % C8 == 0) {
                const int lr = wrow + lane % G + (i + lane / G) * RPI;
                ra_l = rs && lr < rows_valid ? row_amax(r0 + lr) : 0.0f;
                pr_l = rp && lr < rows_valid ? probs[probs_base + r0 + lr] : 1.0f;
            }
            const int src = (i % C8) * G + lane / C8;
            const float ra = rs ? __shfl_sync(0xffffffffu, ra_l, src) : 0.0f;
            const float pr = rp ? __shfl_sync(0xffffffffu, pr_l, src) : 1.0f;
            const int r = rb + i * RPI;
            if (col_ok && r < rows_valid) {
                group8<OT>(cs + r * LD + c, r0 + r, c0 + c, ca, bv, ra, pr);
            }
        }
    }

    // Apply the epilogue to a staged fp32 tile cs[r * LD + c] (rows r0.., columns c0..),
    // consecutive columns per thread and iteration (coalesced stores), by threads 0..NTHR-1.
    template <int BN, int LD, int NTHR = kThreads>
    __device__ __forceinline__ void tile(const float* cs, long long r0, long long c0,
                                         int rows_valid, int cols_valid) const {
        // Fast path: whole 8-column groups (n_cols % 8 == 0, so cols_valid is a multiple of 8
        // and every group starts 16-byte aligned when the base pointer is).
        if ((n_cols & 7) == 0 && (reinterpret_cast<unsigned long long>(out) & 15ull) == 0) {
            if (out_type != OUT_F32 && scale_mode != 2 && !has_bias) {
#define LPM_GG_TILE8_PLAIN(OT, SCALED) \
    tile8_plain<BN, LD, OT, SCALED, NTHR>(cs, r0, c0, rows_valid, cols_valid)
                if (out_type == OUT_BF16) {
                    if (scale_mode == 1) LPM_GG_TILE8_PLAIN(OUT_BF16, true);
                    else LPM_GG_TILE8_PLAIN(OUT_BF16, false);
                } else {
                    if (scale_mode == 1) LPM_GG_TILE8_PLAIN(OUT_F16, true);
                    else LPM_GG_TILE8_PLAIN(OUT_F16, false);
                }
#undef LPM_GG_TILE8_PLAIN
                return;
            }
            if (out_type == OUT_F32) {
                tile8<BN, LD, OUT_F32, NTHR>(cs, r0, c0, rows_valid, cols_valid);
            } else if (out_type == OUT_BF16) {
                tile8<BN, LD, OUT_BF16, NTHR>(cs, r0, c0, rows_valid, cols_valid);
            } else {
                tile8<BN, LD, OUT_F16, NTHR>(cs, r0, c0, rows_valid, cols_valid);
            }
            return;
        }
        constexpr int C4 = BN / 4;
        // Vector stores need every 4-column group aligned: n_cols % 4 == 0 (then out_off and the
        // column are multiples of 4 too) and an aligned base pointer.
        const bool vec = (n_cols & 3) == 0 &&
                         (reinterpret_cast<unsigned long long>(out) &
                          (out_type == OUT_F32 ? 15ull : 7ull)) == 0;
        // Unrolled by 4: independent shared loads and global stores in flight per thread (one
        // CTA of 8 warps per SM leaves little else to hide their latency).
#pragma unroll 4
        for (int i = threadIdx.x; i < rows_valid * C4; i += NTHR) {
            const int r = i / C4, c = (i % C4) * 4;
            if (c >= cols_valid) continue;
            const float4 v = *reinterpret_cast<const float4*>(cs + r * LD + c);
            const float vv[4] = {v.x, v.y, v.z, v.w};
            float ra, pr;
            row_factors(r0 + r, ra, pr);
            if (vec && c + 4 <= cols_valid) {
                write4(r0 + r, c0 + c, value(c0 + c, vv[0], ra, pr),
                       value(c0 + c + 1, vv[1], ra, pr), value(c0 + c + 2, vv[2], ra, pr),
                       value(c0 + c + 3, vv[3], ra, pr));
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (c + e < cols_valid) store(r0 + r, c0 + c + e, vv[e], ra, pr);
                }
            }
        }
    }

    // Floats per row of a warp's staging buffer (warp_tile): 64 columns and 4 of padding.
    static constexpr int kWarpLd = kEpiWarpLd;
    static constexpr int kWarpBufFloats = 16 * kWarpLd;

    // The epilogue of one consumer warp's 16 x (8 NI) wgmma accumulators, straight from the
    // warp's registers through its own staging buffer `ws` (kWarpBufFloats floats of shared
    // memory), 64 columns at a time, without CTA barriers (the persistent kernel, whose
    // pipeline buffers already hold the next tile): fragment ni holds rows wm0 + lane / 4 and
    // + 8 at columns 8 ni + 2 (lane % 4), + 1 (accf[4 ni .. 4 ni + 1], accf[4 ni + 2 .. + 3])
    // of the tile at (r0, c0). The stores are tile()'s: group8 on whole 8-column groups
    // (n_cols % 8 == 0, 16-byte aligned base), else one element at a time, so the bits are too.
    template <int NI>
    __device__ __forceinline__ void warp_tile(float* ws, const float* accf, int wm0, int lane,
                                              long long r0, long long c0, int rows_valid,
                                              int cols_valid) const {
        if ((n_cols & 7) == 0 && (reinterpret_cast<unsigned long long>(out) & 15ull) == 0) {
            if (out_type == OUT_F32) {
                warp_tile_t<NI, OUT_F32, true>(ws, accf, wm0, lane, r0, c0, rows_valid,
                                               cols_valid);
            } else if (out_type == OUT_BF16) {
                warp_tile_t<NI, OUT_BF16, true>(ws, accf, wm0, lane, r0, c0, rows_valid,
                                                cols_valid);
            } else {
                warp_tile_t<NI, OUT_F16, true>(ws, accf, wm0, lane, r0, c0, rows_valid,
                                               cols_valid);
            }
        } else {
            warp_tile_t<NI, OUT_F32, false>(ws, accf, wm0, lane, r0, c0, rows_valid, cols_valid);
        }
    }

    template <int NI, int OT, bool FAST>
    __device__ __forceinline__ void warp_tile_t(float* ws, const float* accf, int wm0, int lane,
                                                long long r0, long long c0, int rows_valid,
                                                int cols_valid) const {
        static_assert(NI % 8 == 0, "whole 64-column chunks");
        // FAST: lane L stores the 8-column group L % 8 of rows L / 8 + 4i (i < 4) of a chunk;
        // their row factors are loaded once.
        const int cg = (lane & 7) * 8, rl = lane >> 3;
        float ra[4], pr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = wm0 + rl + 4 * i;
            const bool ok = FAST && row < rows_valid;
            ra[i] = scale_mode == 2 && ok ? row_amax(r0 + row) : 0.0f;
            pr[i] = has_bias && has_probs && ok ? probs[probs_base + r0 + row] : 1.0f;
        }
        // (unrolled over the chunks, so that each chunk's accumulators die after it)
#pragma unroll
        for (int ch = 0; ch < NI / 8; ++ch) {
            __syncwarp();  // the previous chunk's stores read the buffer
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const float* f = accf + 4 * (8 * ch + u);
                float* dst = ws + (lane >> 2) * kWarpLd + 8 * u + 2 * (lane & 3);
                *reinterpret_cast<float2*>(dst) = make_float2(f[0], f[1]);
                *reinterpret_cast<float2*>(dst + 8 * kWarpLd) = make_float2(f[2], f[3]);
            }
            __syncwarp();
            if constexpr (FAST) {
                const int col = 64 * ch + cg;
                if (col >= cols_valid) continue;
                float ca[8], bv[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    ca[j] = scale_mode == 2 ? col_amax(c0 + col + j) : 0.0f;
                    bv[j] = has_bias ? bias[bias_base + c0 + col + j] : 0.0f;
                }
#pragma unroll 1
                for (int i = 0; i < 4; ++i) {
                    const int row = rl + 4 * i;
                    if (wm0 + row >= rows_valid) break;
                    const float rai = i == 0 ? ra[0] : i == 1 ? ra[1] : i == 2 ? ra[2] : ra[3];
                    const float pri = i == 0 ? pr[0] : i == 1 ? pr[1] : i == 2 ? pr[2] : pr[3];
                    group8<OT>(ws + row * kWarpLd + cg, r0 + wm0 + row, c0 + col, ca, bv, rai,
                               pri);
                }
            } else {
#pragma unroll 1
                for (int e = lane; e < 16 * 64; e += 32) {
                    const int row = e >> 6, c = 64 * ch + (e & 63);
                    if (wm0 + row >= rows_valid || c >= cols_valid) continue;
                    float rae, pre;
                    row_factors(r0 + wm0 + row, rae, pre);
                    store(r0 + wm0 + row, c0 + c, ws[row * kWarpLd + (e & 63)], rae, pre);
                }
            }
        }
    }
};

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_EPILOGUE_CUH
