// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): operand
// staging -- swizzled shared-memory tile offsets, cp.async tile loads, per-kind tile geometry
// (TileGeo), OperandCopy (per-thread cp.async set-up), and the block-scale registers (ScaleRegs).

#ifndef LPM_GROUPED_GEMM_STAGING_CUH
#define LPM_GROUPED_GEMM_STAGING_CUH

#include "grouped_gemm_base.cuh"

namespace lpm_gg {

// ==========================================================================================
// Tile loads (cp.async; zero fill outside the valid region, except issue_split's whole k-tiles)

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

// Canonical K-major tile [R rows][64 contraction] of 16-bit elements, 128-byte rows with the
// 16-byte chunks swizzled by (row & 7) (the wgmma K-major 128-byte-swizzle layout): byte offset
// of chunk `c` (contraction 8c..8c+7) of row `r`.
__device__ __forceinline__ int k_canon_off(int r, int c) {
    return r * (kBK * 2) + ((c ^ (r & 7)) << 4);
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
    static constexpr int UNITS = 2 * R;  // 32-element conversion units per tile
    static constexpr int UNITS_PER_THREAD = (UNITS + kThreads - 1) / kThreads;
};

// The place of an output tile in the grouped problem (a CTA's: tile-table entry blockIdx.x /
// n_col_tiles, column tile blockIdx.x % n_col_tiles), the expert's descriptor words, the
// contraction length, the tile origin and the rows / columns left from it (rv <= 0 or cv <= 0:
// the tile holds no output and the CTA has nothing to do; rows_valid / cols_valid: the
// extents clamped to the tile).
struct CtaTile {
    const long long* d;
    long long len, r0, c0, rv, cv;

    template <int BM>
    __device__ __forceinline__ int rows_valid() const {
        return static_cast<int>(rv < BM ? rv : BM);
    }
    template <int BN>
    __device__ __forceinline__ int cols_valid() const {
        return static_cast<int>(cv < BN ? cv : BN);
    }
};

// Output tile `tile` (tile-table entry tile / n_col_tiles, column tile tile % n_col_tiles).
template <int BM, int BN>
__device__ __forceinline__ CtaTile locate_tile_at(int tile, const int* tiles, int n_col_tiles,
                                                  const long long* desc, long long n_cols) {
    CtaTile t;
    const int entry = tile / n_col_tiles;
    const int ct = tile % n_col_tiles;
    const int g = tiles[2 * entry];
    const int rt = tiles[2 * entry + 1];
    t.d = desc + static_cast<long long>(g) * kDescWords;
    const long long rows = t.d[D_ROWS];
    t.len = t.d[D_LEN];
    t.r0 = static_cast<long long>(rt) * BM;
    t.c0 = static_cast<long long>(ct) * BN;
    t.rv = rows - t.r0;
    t.cv = n_cols - t.c0;
    return t;
}

// A persistent kernel's copy stream, requested in order: (t, q) = its next tile (of the CTA's)
// and place in it (ti, p: a k-tile or a scale group, `per` of them per tile), then advance.
// Counters, not a division by the run-time contraction per request (that made the persistent
// NVFP4 form 15 % slower per k-tile).
__device__ __forceinline__ void stream_next(int& ti, int& p, int per, int& t, int& q) {
    t = ti;
    q = p;
    if (++p == per) {
        p = 0;
        ++ti;
    }
}

// A persistent kernel's schedule: this CTA's tiles T0 = blockIdx.x, + TS = gridDim.x, ...
// (my_tiles of them, of num_tiles), KT k-tiles each (every expert contracts the same length, a
// multiple of SGT k-tiles of BK): J k-tiles and NG scale groups in all.
template <int BM, int BN, int SGT>
__device__ __forceinline__ void persist_schedule(int num_tiles, const int* tiles, int n_col_tiles,
                                                 const long long* desc, long long n_cols,
                                                 int& T0, int& TS, int& my_tiles, int& KT,
                                                 int& J, int& NG) {
    T0 = static_cast<int>(blockIdx.x);
    TS = static_cast<int>(gridDim.x);
    my_tiles = (num_tiles - 1 - T0) / TS + 1;
    KT = static_cast<int>(
        (locate_tile_at<BM, BN>(T0, tiles, n_col_tiles, desc, n_cols).len + kBK - 1) / kBK);
    J = my_tiles * KT;
    NG = J / SGT;
}

// The CTA's own tile, blockIdx.x (one tile per CTA).
template <int BM, int BN>
__device__ __forceinline__ CtaTile locate_tile(const int* tiles, int n_col_tiles,
                                               const long long* desc, long long n_cols) {
    return locate_tile_at<BM, BN>(static_cast<int>(blockIdx.x), tiles, n_col_tiles, desc,
                                  n_cols);
}

// The cp.async copies of one operand's k-tiles. A raw (or, for high precision, canonical)
// tile is OUTER lines x INNER bytes: byte b of line o comes from line_base + o*ld + b and lands at
// tile_off(o, b). Thread t (of the NT threads that copy) copies chunk b = (t % CPL)*CH of lines
// o0 + STEP*i (o0 = t / CPL, STEP = NT / CPL), so its source pointer, line stride and tile offset are set up once per
// CTA and every k-tile costs a pointer add, a compare and the copy per chunk. Chunks with
// o >= outer_valid or b >= inner_valid are zero-filled by issue(); issue_split skips them on
// whole k-tiles (see there). The host guarantees that CH divides the valid extents, so no chunk
// straddles them.
//   K-major : lines are rows; a k-tile starts k0 * ES_NUM / ES_DEN bytes further on.
//   MN-major: lines are contraction indices; a k-tile starts k0 lines further on.
template <int KIND, int R, int CH, int NT = kThreads>
struct OperandCopy {
    using G = TileGeo<KIND, R>;
    static constexpr int CPL = G::INNER / CH;  // chunks per line
    static_assert(CPL >= 1 && CPL <= NT && (CPL & (CPL - 1)) == 0, "chunks per line");
    static constexpr int STEP = NT / CPL;  // lines per pass
    static constexpr int PASSES = (G::OUTER + STEP - 1) / STEP;
    // tile_off(o + 8j, b) = tile_off(o, b) + 8j * SLOPE for every swizzle, so passes of a
    // multiple of 8 lines (or no swizzle) have constant tile offsets.
    static constexpr bool LINEAR = G::SWZ == 0 || STEP % 8 == 0;
    static constexpr int SLOPE = G::SWZ == 3 ? 128 : G::INNER;
    const unsigned char* src;  // line o0, chunk b of k-tile 0
    long long step;            // STEP lines
    long long ld;
    unsigned soff;  // tile_off(o0, b)
    int o0, b;

    // base: the operand's global bytes at (tile row 0, contraction 0); ld: line stride (bytes);
    // t: this thread's index among the NT copying threads.
    __device__ __forceinline__ OperandCopy(const unsigned char* base, long long line_stride,
                                           unsigned t) {
        o0 = static_cast<int>(t / CPL);
        b = static_cast<int>(t % CPL) * CH;
        ld = line_stride;
        src = base + static_cast<long long>(o0) * ld + b;
        step = static_cast<long long>(STEP) * ld;
        soff = static_cast<unsigned>(tile_off<G::SWZ, G::INNER>(o0, b));
    }

    // Issue k-tile k0 (first contraction index) into the tile at shared address sdst.
    //   rows_valid: valid rows of the tile; len_left: contraction elements left from k0.
    // Chunks outside the valid rows / contraction are zero-filled, so the contraction tail
    // adds exact zeros.
    __device__ __forceinline__ void issue(unsigned sdst, long long k0, int rows_valid,
                                          long long len_left, const unsigned char* safe) const {
        issue_part<false>(sdst, k0, rows_valid, len_left, safe);
    }
    // The same with a second branch for whole k-tiles (len_left >= kBK: every k-tile but the
    // last of a ragged contraction), without the contraction bounds arithmetic; their chunks
    // outside the valid rows are not copied at all: those shared-memory bytes only ever meet
    // the accumulators of output rows / columns that are never stored (each wgmma output
    // element reads its own A row and B column only). Used by the swapped-operand kernel, whose
    // k-loop is bound by integer work (membound NVFP4 dgrad -10 %); the 128 x 256 kernels lost
    // 10-20 % with it (bf16 dgrad / wgrad), so they keep issue().
    __device__ __forceinline__ void issue_split(unsigned sdst, long long k0, int rows_valid,
                                                long long len_left,
                                                const unsigned char* safe) const {
        if (len_left >= kBK)
            issue_part<true>(sdst, k0, rows_valid, len_left, safe);
        else
            issue_part<false>(sdst, k0, rows_valid, len_left, safe);
    }
    template <bool FULL>
    __device__ __forceinline__ void issue_part(unsigned sdst, long long k0, int rows_valid,
                                               long long len_left,
                                               const unsigned char* safe) const {
        if constexpr (FULL) len_left = kBK;
        int outer_valid, inner_valid;
        const unsigned char* p;
        if constexpr (G::MN) {
            outer_valid = static_cast<int>(len_left < kBK ? len_left : kBK);
            inner_valid = rows_valid * G::ES_NUM / G::ES_DEN;
            p = src + k0 * ld;
        } else {
            const long long bytes_left = len_left * G::ES_NUM / G::ES_DEN;
            outer_valid = rows_valid;
            inner_valid = static_cast<int>(bytes_left < G::INNER ? bytes_left : G::INNER);
            p = src + k0 * G::ES_NUM / G::ES_DEN;
        }
        const bool b_ok = b < inner_valid;
#pragma unroll
        for (int i = 0; i < PASSES; ++i) {
            const int o = o0 + i * STEP;
            if (PASSES * STEP == G::OUTER || o < G::OUTER) {
                const bool ok = b_ok && o < outer_valid;
                const unsigned off = LINEAR ? soff + static_cast<unsigned>(i * STEP * SLOPE)
                                            : static_cast<unsigned>(
                                                  tile_off<G::SWZ, G::INNER>(o, b));
                if constexpr (FULL) {
                    if (ok) cp_async_full<CH>(sdst + off, p);
                } else {
                    cp_async<CH>(sdst + off, ok ? p : safe, ok ? CH : 0);
                }
            }
            p += step;
        }
    }
};

// Block scales of one k-tile, loaded into registers (one tile ahead) and stored to shared memory.
//   FP4_K : [R][4] bytes   scale (r, b) at sbase + r*sld + k0/16 + b
//   FP8_K : [R][2] floats  scale (r, b) at sbase + r*sld + k0/32 + b   (fp16 window: f16x2 words)
//   FP8_MN: [2][R] floats  scale (b, r) at sbase + (k0/32 + b)*sld + r (fp16 window: [2][R] fp16)
// Entry i of a tile (shared-memory index i) is loaded by thread i % NT of the NT copying
// threads; the row and block of its j-th entry are (r0 + R_OF(j), b0 + B_OF(j)), compile-time
// offsets from the thread's first entry, whose address is set up once per CTA (ScaleCopy).
template <int KIND, int R, int NT = kThreads>
struct ScaleCopy {
    static constexpr int BLK = KIND == KIND_FP4_K ? LPM_NVFP4_BLOCK : LPM_MXFP8_BLOCK;
    static constexpr int NB = kBK / BLK;  // scale blocks per k-tile
    static constexpr bool MN = KIND == KIND_FP8_MN;
    static constexpr int SCALE_COUNT = raw_scale_count(KIND, R);
    static constexpr int PER_THREAD = (SCALE_COUNT + NT - 1) / NT;
    static_assert(MN ? (NT % R == 0 || R % NT == 0) : NT % NB == 0, "scale entries per pass");
    static __host__ __device__ constexpr int R_OF(int j) {
        return MN ? (R <= NT ? 0 : (j % (R / NT)) * NT) : j * (NT / NB);
    }
    static __host__ __device__ constexpr int B_OF(int j) {
        return MN ? (R <= NT ? j * (NT / R) : j / (R / NT)) : 0;
    }
    const unsigned char* src;  // the thread's first entry of k-tile 0
    long long sld;
    int r0, b0;

    __device__ __forceinline__ ScaleCopy(const unsigned char* sbase, long long scale_ld,
                                         unsigned t) {
        sld = scale_ld;
        r0 = static_cast<int>(MN ? t % R : t / NB);
        b0 = static_cast<int>(MN ? t / R : t % NB);
        src = sbase + (MN ? static_cast<long long>(b0) * sld + r0
                          : static_cast<long long>(r0) * sld + b0);
    }
    // Entries advance by a constant step, except MN-major tiles wider than NT rows.
    static constexpr bool UNIFORM = !MN || R <= NT;
    // Byte offset of entry j from the thread's first entry (step: offset of entry 1, UNIFORM).
    __device__ __forceinline__ long long offset(int j) const {
        return MN ? B_OF(j) * sld + R_OF(j) : R_OF(j) * sld + B_OF(j);
    }
};

// ---- MXFP8 fp16 window (grouped_gemm_mxf16.cuh has the reasoning) ----
// fp8 element v = q * 2^(e - 127) is multiplied on fp16 as q * 2^s, s = e - e_max + S_MAX (e_max:
// the largest block code of its row over the whole contraction). fp16 holds q * 2^s exactly for
// S_MIN <= s <= S_MAX: the largest fp8 magnitude stays below fp16's (same leading significand,
// exponent 15), the smallest fp8 subnormal stays on fp16's subnormal grid, and 2^s is an fp16
// normal. E4M3: [-14, 7] (window 21 codes), E5M2: [-8, 0] (window 8).
__host__ __device__ constexpr int fp8_max_exp(bool e5m2) {  // exponent of the largest finite value
    return e5m2 ? (1 << (7 - LPM_E5M2_MANT_BITS)) - 2 - LPM_E5M2_EXP_BIAS
                : (1 << (7 - LPM_E4M3_MANT_BITS)) - 1 - LPM_E4M3_EXP_BIAS;
}
__host__ __device__ constexpr int fp8_min_exp(bool e5m2) {  // exponent of the smallest subnormal
    return e5m2 ? 1 - LPM_E5M2_EXP_BIAS - LPM_E5M2_MANT_BITS
                : 1 - LPM_E4M3_EXP_BIAS - LPM_E4M3_MANT_BITS;
}
__host__ __device__ constexpr int mx_s_max(bool e5m2) {
    return LPM_FP16_EXP_BIAS - fp8_max_exp(e5m2);
}
__host__ __device__ constexpr int mx_s_min(bool e5m2) {
    return 1 - LPM_FP16_EXP_BIAS > 1 - LPM_FP16_EXP_BIAS - LPM_FP16_MANT_BITS - fp8_min_exp(e5m2)
               ? 1 - LPM_FP16_EXP_BIAS
               : 1 - LPM_FP16_EXP_BIAS - LPM_FP16_MANT_BITS - fp8_min_exp(e5m2);
}
__host__ __device__ constexpr int mx_window(bool e5m2) { return mx_s_max(e5m2) - mx_s_min(e5m2); }
static_assert(mx_window(false) == 21 && mx_window(true) == 8, "MXFP8 fp16 windows");
// fp16 bits of the factor 2^(e - e_max + S_MAX); code_bias = S_MAX + fp16 exponent bias. Codes
// outside the window (only rows / k-tiles whose data are zero-filled) clamp to a finite factor
// (+0 below, 2^15 above).
__device__ __forceinline__ unsigned mx_factor_bits(unsigned e, unsigned e_max, int code_bias) {
    int f = static_cast<int>(e) - static_cast<int>(e_max) + code_bias;
    f = f < 0 ? 0 : (f > 2 * LPM_FP16_EXP_BIAS ? 2 * LPM_FP16_EXP_BIAS : f);
    return static_cast<unsigned>(f) << LPM_FP16_MANT_BITS;
}

template <int KIND, int R, int NT = kThreads>
struct ScaleRegs {
    using SC = ScaleCopy<KIND, R, NT>;
    unsigned v[SC::PER_THREAD > 0 ? SC::PER_THREAD : 1];

    __device__ __forceinline__ void load(const SC& sc, long long k0, int rows_valid,
                                         long long len, unsigned t) {
        const long long kb0 = k0 / SC::BLK;
        const int blocks_left = static_cast<int>((len + SC::BLK - 1) / SC::BLK - kb0);
        const unsigned char* p = sc.src + (SC::MN ? kb0 * sc.sld : kb0);
        const long long step = SC::UNIFORM ? sc.offset(1) : 0;
#pragma unroll
        for (int j = 0; j < SC::PER_THREAD; ++j) {
            const int r = sc.r0 + SC::R_OF(j), b = sc.b0 + SC::B_OF(j);
            unsigned val = 0u;
            if ((SC::SCALE_COUNT % NT == 0 || j * NT + static_cast<int>(t) < SC::SCALE_COUNT) &&
                r < rows_valid && b < blocks_left) {
                val = __ldg(SC::UNIFORM ? p : p + sc.offset(j));
            }
            v[j] = val;
            if (SC::UNIFORM) p += step;
        }
    }

    // NVFP4: the E4M3 bytes; MXFP8: the fp32 factors 2^(e-127) (e = 0: 2^-127, e = 255: NaN).
    __device__ __forceinline__ void store(unsigned char* sdst, unsigned t) const {
#pragma unroll
        for (int j = 0; j < SC::PER_THREAD; ++j) {
            const int i = static_cast<int>(t) + j * NT;
            if (SC::SCALE_COUNT % NT == 0 || i < SC::SCALE_COUNT) {
                if constexpr (KIND == KIND_FP4_K) {
                    sdst[i] = static_cast<unsigned char>(v[j]);
                } else {
                    reinterpret_cast<float*>(sdst)[i] = lpm_e8m0_to_f32(v[j]);
                }
            }
        }
    }

    // MXFP8 in the fp16 window: the factors 2^(e - e_max(row) + S_MAX) (mx_factor_bits; e_max
    // of row r: exps[r]) -- K-major as the f16x2 word (f, f) in the fp32 factor's slot, MN-major
    // as fp16 [2][R] (one halfword per entry, row pairs in one word).
    __device__ __forceinline__ void store_f16(unsigned char* sdst, unsigned t,
                                              const unsigned char* exps, int code_bias) const {
        static_assert(KIND == KIND_FP8_K || KIND == KIND_FP8_MN, "MXFP8 only");
#pragma unroll
        for (int j = 0; j < SC::PER_THREAD; ++j) {
            const int i = static_cast<int>(t) + j * NT;
            if (SC::SCALE_COUNT % NT == 0 || i < SC::SCALE_COUNT) {
                if constexpr (KIND == KIND_FP8_K) {
                    const unsigned f = mx_factor_bits(v[j], exps[i / SC::NB], code_bias);
                    reinterpret_cast<unsigned*>(sdst)[i] = f | (f << 16);
                } else {
                    reinterpret_cast<unsigned short*>(sdst)[i] =
                        static_cast<unsigned short>(mx_factor_bits(v[j], exps[i % R], code_bias));
                }
            }
        }
    }
};

// Block scales of the pipeline prologue, loads only: k-tiles 0..NS-1 (those below KT) into
// pra[s] / prb[s], all in flight at once (gemm_mma stores them once its staging mode is known).
template <int NS, int AKIND, int RA, int BKIND, int RB, int NT>
__device__ __forceinline__ void prologue_scale_loads(ScaleRegs<AKIND, RA, NT> (&pra)[NS],
                                                     ScaleRegs<BKIND, RB, NT> (&prb)[NS],
                                                     const ScaleCopy<AKIND, RA, NT>& sa,
                                                     int a_valid,
                                                     const ScaleCopy<BKIND, RB, NT>& sb,
                                                     int b_valid, long long len, int KT,
                                                     unsigned t) {
#pragma unroll
    for (int s = 0; s < NS; ++s) {
        if (s < KT) {
            const long long k0 = static_cast<long long>(s) * kBK;
            pra[s].load(sa, k0, a_valid, len, t);
            prb[s].load(sb, k0, b_valid, len, t);
        }
    }
}

// Block scales of the pipeline prologue: k-tiles 0..NS-1 (those below KT) into their raw stages
// (stage s at raw + s * stage_bytes; A's scales at a_off, B's at b_off inside a stage). All
// loads are in flight before the first store: one memory latency for the whole prologue.
template <int NS, int AKIND, int RA, int BKIND, int RB, int NT>
__device__ __forceinline__ void prologue_scales(const ScaleCopy<AKIND, RA, NT>& sa, int a_valid,
                                                const ScaleCopy<BKIND, RB, NT>& sb, int b_valid,
                                                long long len, int KT, unsigned char* raw,
                                                int stage_bytes, int a_off, int b_off,
                                                unsigned t) {
    ScaleRegs<AKIND, RA, NT> pra[NS];
    ScaleRegs<BKIND, RB, NT> prb[NS];
    prologue_scale_loads<NS>(pra, prb, sa, a_valid, sb, b_valid, len, KT, t);
#pragma unroll
    for (int s = 0; s < NS; ++s) {
        if (s < KT) {
            pra[s].store(raw + s * stage_bytes + a_off, t);
            prb[s].store(raw + s * stage_bytes + b_off, t);
        }
    }
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_STAGING_CUH
