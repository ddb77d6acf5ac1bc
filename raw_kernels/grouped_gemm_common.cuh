// lowprec_moe: grouped (MoE) GEMM machinery shared by raw_kernels/grouped_gemm_*.cu.
//
// One launch covers every expert. The host (lowprec_moe/cuda/gemm.py) uploads
//   * a tile table  int32 [entries][2] = (expert g, row tile of that expert); the grid is
//     entries * n_col_tiles CTAs, column tile fastest (CTAs that share an A row tile run together);
//   * a descriptor table int64 [G][16] (DescWord below) holding, per expert, the byte offsets and
//     leading dimensions of both operands and their block scales, the valid output rows, the
//     contraction length, and the bases into the output / amax / bias / probs arrays.
// All layout logic lives on the host; the kernel only knows two operand orientations:
//   K-major : element (row r, contraction k) at off + r*ld + k*size     (contraction contiguous)
//   MN-major: element (row r, contraction k) at off + k*ld + r*size     (rows contiguous)
//
// Canonical GEMM: out[r][c] = sum_k A[r][k] * B[c][k] for r < rows(g), c < n_cols, k < len(g).
//
// Tensor-core kernels, fp32 accumulation, 256 threads, BK = 64: mma.sync.m16n8k16 per warp
// (ldmatrix fragments; sm_89 and newer), or on sm_90a wgmma.m64n128k16 per warpgroup reading both
// operands straight from the shared-memory tiles. Operand staging is common to both:
//   * high-precision bf16 / fp16 operands ("DIRECT"): cp.async straight into the canonical
//     shared-memory tile (3-5 stage ring, see pipeline_stages);
//   * NVFP4 / MXFP8 operands ("CONVERT"): cp.async of the packed bytes into a 4-stage raw ring,
//     block scales through registers one tile ahead; every k-tile the CTA expands the next raw tile
//     into a 16-bit canonical tile (2-3 buffers, see canon_buffers) while the tensor cores work
//     on the current one.
//     No dequantized copy of an operand ever exists in global memory.
// Canonical tiles (16-bit): K-major [R][64] (128-byte rows, 16-byte chunk c of row r stored at
// chunk c ^ (r & 7)), or MN-major [64 lines][R] stored as R/64 panels of [64][128 bytes] with the
// same XOR on the line index. These are exactly wgmma's 128-byte-swizzle K-major / MN-major
// layouts (8-row atoms of 1024 bytes), and ldmatrix (.trans for MN-major) reads them without
// bank conflicts.
//
// Exact in-kernel dequantization:
//   * NVFP4: e2m1 * e4m3 has at most 6 significant bits and lies in [2^-10, 2688]: exact in fp16.
//     A nibble is re-encoded as the E4M3 byte of e2m1 * 2^-6, widened by cvt.rn.f16x2.e4m3x2, and
//     multiplied (mul.rn.f16x2, exact) by the block scale * 2^6 (exact in fp16: <= 28672). The MMA
//     runs on fp16.
//   * MXFP8: fp8 * 2^(e-127) formed in fp32 with integer and non-flushing multiply instructions
//     only (the fp8 byte shifted into an fp32 pattern is fp8 * 2^-120 exactly, subnormals included;
//     times 2^120, times the block factor), and its high half taken as bf16. Exact whenever the
//     value is representable in bf16: every block with E4M3 scale code e >= 3 (block amax above
//     ~1e-35; E5M2: e >= 10), up to the largest finite-input scale. Blocks of even smaller magnitude
//     are truncated toward zero onto bf16's subnormal grid -- the one documented deviation from
//     exact dequantization. Words holding NaN / inf elements take a cvt-based path, so NaN / inf
//     elements and the NaN scale (255) propagate. The E8M0 scales are expanded to fp32 factors when
//     they are staged in shared memory. The MMA runs on bf16.
// The epilogue (NVFP4 scaling, bias, probs, cast / accumulate) uses non-flushing PTX (mul.rn.f32,
// add.rn.f32), so it reproduces the NumPy reference bit for bit given the same accumulator.
// Determinism: every output element is owned by one thread of one CTA and accumulated in a fixed
// order (k-tiles, then 16-wide MMA steps); no atomics, no split-K. Grouped == per-expert calls:
// row tiles start at each expert's first row, and every tile shape of one family issues the same
// MMA instruction on the same k-steps, so an expert's results do not depend on its neighbours.

#ifndef LPM_GROUPED_GEMM_COMMON_CUH
#define LPM_GROUPED_GEMM_COMMON_CUH

#include "lpm_formats.cuh"

namespace lpm_gg {

constexpr int kThreads = 256;
constexpr int kBK = 64;         // contraction depth of one k-tile
constexpr int kDescWords = 16;  // int64 words per expert in the descriptor table

// Descriptor words (mirrored in lowprec_moe/cuda/gemm.py).
enum DescWord {
    D_A_OFF = 0,   // byte offset of expert g's A operand (row 0, contraction 0) in a_data
    D_A_LD = 1,    // bytes between rows (K-major) / contraction lines (MN-major) of A
    D_A_SOFF = 2,  // byte offset of A's block scales in a_scale
    D_A_SLD = 3,   // bytes between scale rows (K-major) / scale block-lines (MN-major)
    D_B_OFF = 4,
    D_B_LD = 5,
    D_B_SOFF = 6,
    D_B_SLD = 7,
    D_ROWS = 8,     // valid output rows of expert g
    D_LEN = 9,      // contraction length (elements; padded length for quantized wgrad)
    D_OUT_OFF = 10, // element offset of expert g's output row 0
    D_AMAX_A = 11,  // index into amax_a (+ row when a_vec)
    D_AMAX_B = 12,  // index into amax_b (+ column when b_vec)
    D_BIAS = 13,    // index into bias (+ column)
    D_PROBS = 14,   // index into probs (+ row)
};

// Operand kinds of the tensor-core kernel.
constexpr int KIND_HP_K = 0;    // bf16 / fp16, contraction contiguous
constexpr int KIND_HP_MN = 1;   // bf16 / fp16, rows contiguous
constexpr int KIND_FP4_K = 2;   // NVFP4 packed nibbles + E4M3 scales per 16 (contraction contiguous)
constexpr int KIND_FP8_K = 3;   // MXFP8 bytes + E8M0 scales per 32 along the contraction (rowwise)
constexpr int KIND_FP8_MN = 4;  // MXFP8 columnwise: [Mp, X] row-major, scales [Mp/32, X]

// Output types.
constexpr int OUT_F32 = 0;
constexpr int OUT_BF16 = 1;
constexpr int OUT_F16 = 2;

__host__ __device__ constexpr bool kind_is_mn(int kind) {
    return kind == KIND_HP_MN || kind == KIND_FP8_MN;
}
__host__ __device__ constexpr bool kind_is_hp(int kind) {
    return kind == KIND_HP_K || kind == KIND_HP_MN;
}
__host__ __device__ constexpr int round16(int x) { return (x + 15) / 16 * 16; }

// Shared-memory footprint of one tile of R rows (mirrored in lowprec_moe/cuda/gemm.py).
__host__ __device__ constexpr int canon_bytes(int rows) { return rows * kBK * 2; }
__host__ __device__ constexpr int raw_data_bytes(int kind, int rows) {
    return kind == KIND_FP4_K ? rows * (kBK / 2)
           : kind == KIND_FP8_K || kind == KIND_FP8_MN ? rows * kBK
                                                       : canon_bytes(rows);
}
// Block scales per tile (entries); NVFP4 keeps the E4M3 bytes, MXFP8 stores each E8M0 scale
// expanded to its fp32 factor 2^(e-127) (4 bytes).
__host__ __device__ constexpr int raw_scale_count(int kind, int rows) {
    return kind == KIND_FP4_K ? rows * (kBK / LPM_NVFP4_BLOCK)
           : kind == KIND_FP8_K || kind == KIND_FP8_MN ? rows * (kBK / LPM_MXFP8_BLOCK)
                                                       : 0;
}
__host__ __device__ constexpr int raw_scale_bytes(int kind, int rows) {
    return raw_scale_count(kind, rows) * (kind == KIND_FP4_K ? 1 : 4);
}
__host__ __device__ constexpr int raw_bytes(int kind, int rows) {
    return round16(raw_data_bytes(kind, rows)) + round16(raw_scale_bytes(kind, rows));
}

// Dynamic shared memory of gemm_mma<BM, BN, ..., AKIND, BKIND, ..., WG> (mirrored by _smem_bytes
// in lowprec_moe/cuda/gemm.py): the pipeline buffers or the fp32 epilogue staging tile, whichever
// is larger, plus 1024 bytes to align the base to the 1024-byte swizzle atoms.
//   DIRECT (bf16 / fp16): NST canonical stages; wgmma keeps one k-tile's MMAs in flight across
//     the barrier, so it prefetches NST - 2 tiles ahead (5 stages when a stage is <= 40 KiB, else 4);
//     mma.sync prefetches NST - 1 ahead (4 / 3 stages).
//   CONVERT (NVFP4 / MXFP8): 4 raw stages + NCB canonical buffers: 3 with wgmma when they fit
//     (the MMAs of tile k stay in flight while tile k+1 is expanded), else 2.
constexpr int kMaxSmem = 227 * 1024;  // opt-in shared memory per block on sm_90
__host__ __device__ constexpr int pipeline_stages(int akind, int bkind, int bm, int bn, bool wg) {
    return kind_is_hp(akind) && kind_is_hp(bkind)
               ? (canon_bytes(bm) + canon_bytes(bn) <= 40 * 1024 ? 4 : 3) + (wg ? 1 : 0)
               : 4;
}
__host__ __device__ constexpr int raw_ring_bytes(int akind, int bkind, int bm, int bn) {
    return (4 * (raw_bytes(akind, bm) + raw_bytes(bkind, bn)) + 1023) / 1024 * 1024;
}
__host__ __device__ constexpr int canon_buffers(int akind, int bkind, int bm, int bn, bool wg) {
    return wg && raw_ring_bytes(akind, bkind, bm, bn) + 3 * (canon_bytes(bm) + canon_bytes(bn)) +
                         1024 <= kMaxSmem
               ? 3
               : 2;
}
__host__ __device__ constexpr int gemm_smem_bytes(int akind, int bkind, int bm, int bn, bool wg) {
    const bool direct = kind_is_hp(akind) && kind_is_hp(bkind);
    const int nst = pipeline_stages(akind, bkind, bm, bn, wg);
    const int canon = canon_bytes(bm) + canon_bytes(bn);
    const int main = direct ? nst * canon
                            : raw_ring_bytes(akind, bkind, bm, bn) +
                                  canon_buffers(akind, bkind, bm, bn, wg) * canon;
    const int epi = bm * (bn + 8) * 4;
    return (main > epi ? main : epi) + 1024;
}

// ==========================================================================================
// PTX wrappers

// threadIdx.x read through volatile asm: values derived from it cannot be hoisted out of the
// k-loop, so the per-chunk copy addresses are recomputed each tile instead of pinning registers.
__device__ __forceinline__ int tid_volatile() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
    return t;
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <int CH>
__device__ __forceinline__ void cp_async(unsigned dst, const void* src, int src_bytes) {
    if constexpr (CH == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "r"(src_bytes));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                     "n"(CH), "r"(src_bytes));
    }
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                        unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                          unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// D = A * B + D, m16n8k16, fp32 accumulation. A: 4 regs (row-major 16x16), B: 2 regs (16x8).
template <bool F16>
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
    if constexpr (F16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two fp8 bytes (low byte = first element) -> f16x2 (low half = first element), exact.
template <bool E5M2>
__device__ __forceinline__ unsigned fp8x2_to_f16x2(unsigned short v) {
    unsigned r;
    if constexpr (E5M2) {
        asm("cvt.rn.f16x2.e5m2x2 %0, %1;\n" : "=r"(r) : "h"(v));
    } else {
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(v));
    }
    return r;
}

__device__ __forceinline__ unsigned hmul2_rn(unsigned a, unsigned b) {
    unsigned r;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ float f16_bits_to_f32(unsigned h) {
    return lpm_f16_bits_to_f32(static_cast<unsigned short>(h & 0xFFFFu));
}

// (hi, lo) fp32 -> bf16x2 bits (lo in the low half), round to nearest even, no flush.
__device__ __forceinline__ unsigned pack_bf16x2_rn(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ unsigned short f32_to_f16_bits_rn(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
    return h;
}

// E4M3 byte -> fp32 (exact).
__device__ __forceinline__ float e4m3_to_f32(unsigned b) {
    return f16_bits_to_f32(fp8x2_to_f16x2<false>(static_cast<unsigned short>(b & 0xFFu)));
}

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

// ==========================================================================================
// Conversion of one 32-element unit of a raw tile into the canonical 16-bit tile

// 8 E2M1 nibbles (element 0 in the low nibble of byte 0) -> 4 f16x2 words of e2m1 * scale,
// `sc` = f16x2 (scale * 64, scale * 64).
__device__ __forceinline__ void fp4_decode8(unsigned w, unsigned sc, unsigned* o) {
    unsigned lo = w & 0x0F0F0F0Fu;         // nibbles of elements 0, 2, 4, 6 (one per byte)
    unsigned hi = (w >> 4) & 0x0F0F0F0Fu;  // elements 1, 3, 5, 7
    // E2M1 s.e1e0.m -> E4M3 byte s.000e1e0.m00 = e2m1 * 2^-6 (exact, subnormal for e = 0).
    lo = ((lo << 2) & 0x1C1C1C1Cu) | ((lo << 4) & 0x80808080u);
    hi = ((hi << 2) & 0x1C1C1C1Cu) | ((hi << 4) & 0x80808080u);
    const unsigned p0 = __byte_perm(lo, hi, 0x5140u);  // elements 0, 1, 2, 3
    const unsigned p1 = __byte_perm(lo, hi, 0x7362u);  // elements 4, 5, 6, 7
    o[0] = hmul2_rn(fp8x2_to_f16x2<false>(static_cast<unsigned short>(p0 & 0xFFFFu)), sc);
    o[1] = hmul2_rn(fp8x2_to_f16x2<false>(static_cast<unsigned short>(p0 >> 16)), sc);
    o[2] = hmul2_rn(fp8x2_to_f16x2<false>(static_cast<unsigned short>(p1 & 0xFFFFu)), sc);
    o[3] = hmul2_rn(fp8x2_to_f16x2<false>(static_cast<unsigned short>(p1 >> 16)), sc);
}

// 4 fp8 bytes -> 2 bf16x2 words of fp8 * f (f = 2^(e-127) as fp32), through the conversion
// unit (cvt): exact, round to nearest even where a value falls below bf16's normal range. Used
// for words holding NaN / inf elements.
template <bool E5M2>
__device__ __forceinline__ void fp8_decode4_cvt(unsigned w, float f0, float f1, float f2, float f3,
                                                unsigned& o0, unsigned& o1) {
    const unsigned h01 = fp8x2_to_f16x2<E5M2>(static_cast<unsigned short>(w & 0xFFFFu));
    const unsigned h23 = fp8x2_to_f16x2<E5M2>(static_cast<unsigned short>(w >> 16));
    o0 = pack_bf16x2_rn(lpm_mul_rn(f16_bits_to_f32(h01), f0),
                        lpm_mul_rn(f16_bits_to_f32(h01 >> 16), f1));
    o1 = pack_bf16x2_rn(lpm_mul_rn(f16_bits_to_f32(h23), f2),
                        lpm_mul_rn(f16_bits_to_f32(h23 >> 16), f3));
}

// Whether a word of 4 fp8 bytes holds a NaN (E4M3 x111 1111) or an inf / NaN (E5M2 x111 11xx).
template <bool E5M2>
__device__ __forceinline__ bool fp8x4_special(unsigned w) {
    constexpr unsigned M = E5M2 ? 0x7C7C7C7Cu : 0x7F7F7F7Fu;
    constexpr unsigned INC = E5M2 ? 0x04040404u : 0x01010101u;  // carries into bit 7 only there
    return (((w & M) + INC) & 0x80808080u) != 0u;
}

// 4 fp8 bytes -> 2 bf16x2 words of fp8 * f with integer and fp32 multiply instructions only.
// Byte i, placed in the top byte and arithmetically shifted, is the fp32 value fp8 * 2^-120
// (E4M3; E5M2: * 2^-112) -- fp8 subnormals become fp32 subnormals, exactly. Two non-flushing
// multiplies (by 2^120 / 2^112, then by f) give the exact fp32 value, whose high half is the
// bf16 value: exact whenever it is representable (E4M3 scale code >= 3, E5M2 >= 10); below that,
// truncated toward zero. Finite elements only (see fp8x4_special).
template <bool E5M2>
__device__ __forceinline__ void fp8_decode4_int(unsigned w, float f0, float f1, float f2,
                                                float f3, unsigned& o0, unsigned& o1) {
    constexpr int SH = E5M2 ? 3 : 4;
    constexpr unsigned MASK = E5M2 ? 0x8FE00000u : 0x87F00000u;
    const float up = __uint_as_float(E5M2 ? (112u + 127u) << 23 : (120u + 127u) << 23);
    const float v0 = __uint_as_float(static_cast<unsigned>(static_cast<int>(w << 24) >> SH) & MASK);
    const float v1 = __uint_as_float(static_cast<unsigned>(static_cast<int>(w << 16) >> SH) & MASK);
    const float v2 = __uint_as_float(static_cast<unsigned>(static_cast<int>(w << 8) >> SH) & MASK);
    const float v3 = __uint_as_float(static_cast<unsigned>(static_cast<int>(w) >> SH) & MASK);
    const unsigned r0 = __float_as_uint(lpm_mul_rn(lpm_mul_rn(v0, up), f0));
    const unsigned r1 = __float_as_uint(lpm_mul_rn(lpm_mul_rn(v1, up), f1));
    const unsigned r2 = __float_as_uint(lpm_mul_rn(lpm_mul_rn(v2, up), f2));
    const unsigned r3 = __float_as_uint(lpm_mul_rn(lpm_mul_rn(v3, up), f3));
    o0 = __byte_perm(r0, r1, 0x7632u);
    o1 = __byte_perm(r2, r3, 0x7632u);
}

template <bool E5M2>
__device__ __forceinline__ void fp8_decode4(unsigned w, float f0, float f1, float f2, float f3,
                                            unsigned& o0, unsigned& o1) {
    if (fp8x4_special<E5M2>(w)) {
        fp8_decode4_cvt<E5M2>(w, f0, f1, f2, f3, o0, o1);
    } else {
        fp8_decode4_int<E5M2>(w, f0, f1, f2, f3, o0, o1);
    }
}

// Whether conversion unit u (see convert_unit) covers a row below `valid`. Rows at or beyond
// the valid extent are not expanded: the accumulators they feed belong to output rows / columns
// that are never stored, so whatever their canonical rows hold cannot reach the output.
template <int KIND>
__device__ __forceinline__ bool unit_live(int u, int valid) {
    if constexpr (KIND == KIND_FP8_MN) {
        return (u >> 6) * 32 < valid;
    } else {
        return (u >> 1) < valid;
    }
}

// Convert unit u of a raw tile (R rows) into the canonical tile.
//   K kinds: unit u = (row u >> 1, contraction half u & 1) -> 32 elements of one row.
//   MN kind: unit u = (line u & 63, row group u >> 6)      -> 32 rows of one contraction line.
template <int KIND, int R, bool E5M2>
__device__ __forceinline__ void convert_unit(const unsigned char* raw, const unsigned char* rsc,
                                             unsigned char* canon, int u) {
    if constexpr (KIND == KIND_FP4_K) {
        const int r = u >> 1, h = u & 1;
        const uint4 w = *reinterpret_cast<const uint4*>(raw + r * (kBK / 2) + h * 16);
        const unsigned short s2 = *reinterpret_cast<const unsigned short*>(rsc + r * 4 + h * 2);
        // (s0, s1) -> f16x2 * 64: exact (E4M3 <= 448, 448 * 64 = 28672 < 65504).
        const unsigned sc = hmul2_rn(fp8x2_to_f16x2<false>(s2), 0x54005400u);
        const unsigned sc0 = __byte_perm(sc, sc, 0x1010u);
        const unsigned sc1 = __byte_perm(sc, sc, 0x3232u);
        unsigned o[16];
        fp4_decode8(w.x, sc0, o + 0);
        fp4_decode8(w.y, sc0, o + 4);
        fp4_decode8(w.z, sc1, o + 8);
        fp4_decode8(w.w, sc1, o + 12);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = 4 * h + j;
            *reinterpret_cast<uint4*>(canon + r * (kBK * 2) + ((c ^ (r & 7)) << 4)) =
                make_uint4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
        }
    } else if constexpr (KIND == KIND_FP8_K) {
        const int r = u >> 1, h = u & 1;
        const float f = reinterpret_cast<const float*>(rsc)[r * 2 + h];
        unsigned o[16];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = 2 * h + i;
            const uint4 w = *reinterpret_cast<const uint4*>(raw + r * kBK + swz<2>(r, c * 16));
            fp8_decode4<E5M2>(w.x, f, f, f, f, o[8 * i + 0], o[8 * i + 1]);
            fp8_decode4<E5M2>(w.y, f, f, f, f, o[8 * i + 2], o[8 * i + 3]);
            fp8_decode4<E5M2>(w.z, f, f, f, f, o[8 * i + 4], o[8 * i + 5]);
            fp8_decode4<E5M2>(w.w, f, f, f, f, o[8 * i + 6], o[8 * i + 7]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = 4 * h + j;
            *reinterpret_cast<uint4*>(canon + r * (kBK * 2) + ((c ^ (r & 7)) << 4)) =
                make_uint4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
        }
    } else if constexpr (KIND == KIND_FP8_MN) {
        const int l = u & (kBK - 1), q = u >> 6;
        const float* sp = reinterpret_cast<const float*>(rsc) + (l / LPM_MXFP8_BLOCK) * R + 32 * q;
        unsigned o[16];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = 2 * q + i;
            const uint4 w = *reinterpret_cast<const uint4*>(raw + l * R + swz<1>(l, c * 16));
            const unsigned ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const float4 f = *reinterpret_cast<const float4*>(sp + 16 * i + 4 * t);
                fp8_decode4<E5M2>(ww[t], f.x, f.y, f.z, f.w, o[8 * i + 2 * t],
                                  o[8 * i + 2 * t + 1]);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = 4 * q + j;
            *reinterpret_cast<uint4*>(canon + mn_canon_off(l, c)) =
                make_uint4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
        }
    }
}

// ==========================================================================================
// Warp-level MMA over one 16-deep slice (ks) of the canonical tiles

// ldmatrix address of the A fragment (rows m0..m0+15, contraction 16*ks..16*ks+15).
template <bool MN, int R>
__device__ __forceinline__ unsigned a_frag_addr(unsigned base, int m0, int ks, int lane) {
    const int j = lane >> 3, i = lane & 7;
    if constexpr (!MN) {
        const int row = m0 + (j & 1) * 8 + i;
        const int kc = ks * 2 + (j >> 1);
        return base + row * (kBK * 2) + ((kc ^ (row & 7)) << 4);
    } else {
        const int line = ks * 16 + (j >> 1) * 8 + i;
        const int mc = (m0 >> 3) + (j & 1);
        return base + mn_canon_off(line, mc);
    }
}

// ldmatrix address of the B fragments of two n8 tiles (rows n0..n0+15).
template <bool MN, int R>
__device__ __forceinline__ unsigned b_frag_addr(unsigned base, int n0, int ks, int lane) {
    const int j = lane >> 3, i = lane & 7;
    if constexpr (!MN) {
        const int row = n0 + (j >> 1) * 8 + i;
        const int kc = ks * 2 + (j & 1);
        return base + row * (kBK * 2) + ((kc ^ (row & 7)) << 4);
    } else {
        const int line = ks * 16 + (j & 1) * 8 + i;
        const int nc = (n0 >> 3) + (j >> 1);
        return base + mn_canon_off(line, nc);
    }
}

template <int MI, int NI, bool AMN, bool BMN, int BM, int BN, bool F16>
__device__ __forceinline__ void warp_mma_ks(unsigned sa, unsigned sb, float (&acc)[MI][NI][4],
                                            int wm0, int wn0, int ks, int lane) {
    unsigned bfr[NI][2];
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj) {
        const unsigned addr = b_frag_addr<BMN, BN>(sb, wn0 + nj * 16, ks, lane);
        if constexpr (BMN) {
            ldsm_x4_t(addr, bfr[2 * nj][0], bfr[2 * nj][1], bfr[2 * nj + 1][0], bfr[2 * nj + 1][1]);
        } else {
            ldsm_x4(addr, bfr[2 * nj][0], bfr[2 * nj][1], bfr[2 * nj + 1][0], bfr[2 * nj + 1][1]);
        }
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
        unsigned af[4];
        const unsigned addr = a_frag_addr<AMN, BM>(sa, wm0 + mi * 16, ks, lane);
        if constexpr (AMN) {
            ldsm_x4_t(addr, af[0], af[1], af[2], af[3]);
        } else {
            ldsm_x4(addr, af[0], af[1], af[2], af[3]);
        }
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma16816<F16>(acc[mi][ni], af, bfr[ni][0], bfr[ni][1]);
    }
}

// ==========================================================================================
// wgmma (sm_90a): m64n128k16 per warpgroup, both operands from shared memory

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LPM_GG_HAS_WGMMA 1
#else
#define LPM_GG_HAS_WGMMA 0
#endif

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading / stride byte offsets.
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return static_cast<unsigned long long>((addr & 0x3FFFFu) >> 4) |
           (static_cast<unsigned long long>((lbo >> 4) & 0x3FFFu) << 16) |
           (static_cast<unsigned long long>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() {
#if LPM_GG_HAS_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if LPM_GG_HAS_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_wait0() {
#if LPM_GG_HAS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// Wait until at most N committed wgmma groups of this warpgroup are still pending.
template <int N>
__device__ __forceinline__ void wg_wait() {
#if LPM_GG_HAS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy shared-memory writes (st.shared, cp.async) -> visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
#if LPM_GG_HAS_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keep the compiler from moving accumulator accesses across the asynchronous wgmma window.
template <int N>
__device__ __forceinline__ void wg_fence_acc(float* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D(64x128, fp32) += A(64x16) * B(16x128); TA / TB: 1 = operand stored MN-major. Every wgmma
// of the library has this one shape, so tile configurations never change the arithmetic.
template <bool F16, int TA, int TB>
__device__ __forceinline__ void wgmma_m64n128k16(float* d, unsigned long long da,
                                                 unsigned long long db) {
#if LPM_GG_HAS_WGMMA
    if constexpr (F16) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
            "%64, %65, p, 1, 1, %67, %68;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
    } else {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
            "%64, %65, p, 1, 1, %67, %68;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
    }
#else
    __trap();
#endif
}

// ==========================================================================================
// Epilogue (SPEC 7): NVFP4 scaling, bias (optionally times probs), cast or accumulate.

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

    // Steps 1-2 of the SPEC 7 epilogue for one element (before the cast / accumulation).
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

    // Apply the epilogue to a staged fp32 tile cs[r * LD + c] (rows r0.., columns c0..), four
    // consecutive columns per thread and iteration (coalesced stores).
    template <int BN, int LD>
    __device__ __forceinline__ void tile(const float* cs, long long r0, long long c0,
                                         int rows_valid, int cols_valid) const {
        constexpr int C4 = BN / 4;
        // Vector stores need every 4-column group aligned: n_cols % 4 == 0 (then out_off and the
        // column are multiples of 4 too) and an aligned base pointer.
        const bool vec = (n_cols & 3) == 0 &&
                         (reinterpret_cast<unsigned long long>(out) &
                          (out_type == OUT_F32 ? 15ull : 7ull)) == 0;
        // Unrolled by 4: independent shared loads and global stores in flight per thread (one
        // CTA of 8 warps per SM leaves little else to hide their latency).
#pragma unroll 4
        for (int i = threadIdx.x; i < rows_valid * C4; i += blockDim.x) {
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
};

__device__ __forceinline__ void trap_if_smem_short(unsigned need) {
    unsigned have;
    asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(have));
    if (have < need) __trap();
}

// ==========================================================================================
// The tensor-core kernel body

// WG = false: mma.sync.m16n8k16 per warp (ldmatrix fragments), warps arranged WARPS_M x WARPS_N.
// WG = true : wgmma.m64n128k16 (sm_90a), BN = 256, two warpgroups:
//             BM = 128: warpgroup w owns rows 64w..64w+63 x all 256 columns (two wgmma per step);
//             BM = 64 : warpgroup w owns rows 0..63 x columns 128w..128w+127 (one wgmma per step).
//             Warp v of a warpgroup holds rows 16v..16v+15 of the warpgroup's block in the
//             mma.sync C layout, so the accumulator array and the epilogue serve both paths.
template <int BM, int BN, int WARPS_M, int AKIND, int BKIND, bool F16, int ACH, int BCH, bool WG>
__device__ __forceinline__ void gemm_mma(
    const int* __restrict__ tiles, int n_col_tiles, const long long* __restrict__ desc,
    long long n_cols, const unsigned char* __restrict__ a_data,
    const unsigned char* __restrict__ a_scale, int a_ch, int a_e5m2,
    const unsigned char* __restrict__ b_data, const unsigned char* __restrict__ b_scale, int b_ch,
    int b_e5m2, const float* __restrict__ amax_a, const float* __restrict__ amax_b, int a_vec,
    int b_vec, int scale_mode, const float* __restrict__ bias, const float* __restrict__ probs,
    int has_bias, int has_probs, void* __restrict__ out, int out_type, int accumulate,
    int zero_if_empty) {
    constexpr int WARPS_N = (kThreads / 32) / WARPS_M;
    constexpr int TM = WG ? 16 : BM / WARPS_M, TN = WG ? (BM == 128 ? BN : BN / 2) : BN / WARPS_N;
    constexpr int MI = TM / 16, NI = TN / 8;
    static_assert(MI >= 1 && NI >= 2 && NI % 2 == 0, "warp tile");
    static_assert(!WG || ((BM == 128 || BM == 64) && BN == 256), "wgmma tiles: 128x256, 64x256");
    constexpr bool AMN = kind_is_mn(AKIND), BMN = kind_is_mn(BKIND);
    static_assert(!AMN || BM % 64 == 0, "an MN-major A tile is made of 64-row panels");
    static_assert(!BMN || BN % 64 == 0, "an MN-major B tile is made of 64-row panels");
    constexpr bool DIRECT = kind_is_hp(AKIND) && kind_is_hp(BKIND);
    static_assert(DIRECT || (!kind_is_hp(AKIND) && !kind_is_hp(BKIND)), "operand mix");
    using GA = TileGeo<AKIND, BM>;
    using GB = TileGeo<BKIND, BN>;
    constexpr int CANON_A = canon_bytes(BM), CANON_B = canon_bytes(BN);
    constexpr int NST = pipeline_stages(AKIND, BKIND, BM, BN, WG);
    constexpr int NCB = DIRECT ? 0 : canon_buffers(AKIND, BKIND, BM, BN, WG);
    constexpr int RAW_A = raw_bytes(AKIND, BM), RAW_B = raw_bytes(BKIND, BN);
    constexpr int STAGE = DIRECT ? CANON_A + CANON_B : RAW_A + RAW_B;
    constexpr int CANON_OFF = (NST * STAGE + 1023) / 1024 * 1024;  // 1024-byte swizzle atoms
    constexpr int EPI_LD = BN + 8;  // padded row of the accumulator staging tile (floats)
    constexpr int MAIN_SMEM = DIRECT ? NST * STAGE : CANON_OFF + NCB * (CANON_A + CANON_B);
    constexpr int EPI_SMEM = BM * EPI_LD * 4;
    // + 1024: the kernel aligns its shared-memory base to 1024 bytes (wgmma swizzle atoms).
    constexpr int SMEM = (MAIN_SMEM > EPI_SMEM ? MAIN_SMEM : EPI_SMEM) + 1024;
    static_assert(SMEM <= kMaxSmem, "shared memory");
    static_assert(SMEM == gemm_smem_bytes(AKIND, BKIND, BM, BN, WG), "shared-memory formula");
    static_assert(DIRECT || CANON_OFF == raw_ring_bytes(AKIND, BKIND, BM, BN), "raw ring");
    static_assert((ACH == 16 || ACH == 8) && (BCH == 16 || BCH == 8), "copy chunk");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    if (threadIdx.x == 0) {
        trap_if_smem_short(SMEM);
        if (a_ch != ACH || b_ch != BCH) __trap();  // launcher / kernel mismatch
    }
    const unsigned raw_u32 = smem_u32(smem_raw);
    const unsigned s0 = (raw_u32 + 1023u) & ~1023u;
    unsigned char* const smem = smem_raw + (s0 - raw_u32);

    const int entry = static_cast<int>(blockIdx.x) / n_col_tiles;
    const int ct = static_cast<int>(blockIdx.x) % n_col_tiles;
    const int g = tiles[2 * entry];
    const int rt = tiles[2 * entry + 1];
    const long long* d = desc + static_cast<long long>(g) * kDescWords;
    const long long rows = d[D_ROWS];
    const long long len = d[D_LEN];
    const long long r0 = static_cast<long long>(rt) * BM;
    const long long c0 = static_cast<long long>(ct) * BN;
    const long long rv = rows - r0, cv = n_cols - c0;
    if (rv <= 0 || cv <= 0) return;
    const int rows_valid = static_cast<int>(rv < BM ? rv : BM);
    const int cols_valid = static_cast<int>(cv < BN ? cv : BN);

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

    if (len <= 0 && zero_if_empty) {  // wgrad of an expert without tokens: dW_g = 0
        if (!accumulate) {
            for (int i = threadIdx.x; i < rows_valid * cols_valid; i += kThreads) {
                ep.write(r0 + i / cols_valid, c0 + i % cols_valid, 0.0f);
            }
        }
        return;
    }
    ep.init_alpha();

    // Operand bases at (tile row 0, contraction 0).
    const long long a_ld = d[D_A_LD], b_ld = d[D_B_LD];
    const unsigned char* a_base =
        a_data + d[D_A_OFF] + (AMN ? r0 * GA::ES_NUM / GA::ES_DEN : r0 * a_ld);
    const unsigned char* b_base =
        b_data + d[D_B_OFF] + (BMN ? c0 * GB::ES_NUM / GB::ES_DEN : c0 * b_ld);
    const long long a_sld = d[D_A_SLD], b_sld = d[D_B_SLD];
    const unsigned char* a_sbase = a_scale + d[D_A_SOFF] + (AMN ? r0 : r0 * a_sld);
    const unsigned char* b_sbase = b_scale + d[D_B_SOFF] + (BMN ? c0 : c0 * b_sld);

    const int KT = static_cast<int>((len + kBK - 1) / kBK);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm0 = WG ? (BM == 128 ? 64 * (warp >> 2) : 0) + 16 * (warp & 3)
                       : (warp % WARPS_M) * TM;
    const int wn0 = WG ? (BM == 128 ? 0 : 128 * (warp >> 2)) : (warp / WARPS_M) * TN;

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    auto issue = [&](int stage, int kt) {
        const long long k0 = static_cast<long long>(kt) * kBK;
        const unsigned sb = s0 + stage * STAGE;
        issue_operand<AKIND, BM, ACH>(sb, a_base, a_ld, k0, rows_valid, len - k0, a_data);
        issue_operand<BKIND, BN, BCH>(sb + (DIRECT ? CANON_A : RAW_A), b_base, b_ld, k0,
                                      cols_valid, len - k0, b_data);
    };

    // wgmma over one 64-deep k-tile held in canonical tiles sa (A, BM rows) / sb (B, BN rows).
    // K-major: 8-row atoms 1024 B apart (SBO), LBO unused; a 16-deep step = +32 B.
    // MN-major: 8-line atoms 1024 B apart (SBO), 64-row panels 8 KiB apart (LBO); a 16-deep
    // step = +16 lines = +2 KiB. 64 rows of A / 128 rows of B start 8 KiB / 16 KiB further on in
    // both layouts.
    float* const accf = &acc[0][0][0];
    auto wg_tile = [&](unsigned sa, unsigned sb) {
        if constexpr (WG) {
            constexpr unsigned A_LBO = AMN ? kBK * 128 : 16, B_LBO = BMN ? kBK * 128 : 16;
            constexpr unsigned A_STEP = AMN ? 16 * 128 : 32, B_STEP = BMN ? 16 * 128 : 32;
            constexpr int HALVES = BM == 128 ? 2 : 1;  // n128 blocks per warpgroup
            const int wg = warp >> 2;
            const unsigned a_addr = sa + (BM == 128 ? wg * (64 * 128) : 0);
            const unsigned b_addr = sb + (BM == 128 ? 0 : wg * (128 * 128));
            wg_fence_acc<MI * NI * 4>(accf);
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < kBK / 16; ++ks) {
#pragma unroll
                for (int h = 0; h < HALVES; ++h) {
                    wgmma_m64n128k16<F16, AMN ? 1 : 0, BMN ? 1 : 0>(
                        accf + h * 64, wg_desc(a_addr + ks * A_STEP, A_LBO, 1024),
                        wg_desc(b_addr + h * (128 * 128) + ks * B_STEP, B_LBO, 1024));
                }
            }
            wg_commit();
            wg_fence_acc<MI * NI * 4>(accf);
        }
    };

    if constexpr (DIRECT && WG) {
        // wgmma: the MMAs of tile kt stay in flight while tile kt+NST-2 is requested and the
        // barrier of iteration kt+1 passes; stage (kt-2)%NST is refilled once every warpgroup
        // has retired tile kt-2 (wg_wait<1> of iteration kt-1, then the barrier).
        static_assert(NST >= 3, "pipeline depth");
#pragma unroll
        for (int s = 0; s < NST - 2; ++s) {
            if (s < KT) issue(s, s);
            cp_async_commit();
        }
        for (int kt = 0; kt < KT; ++kt) {
            cp_async_wait<NST - 3>();  // tile kt landed (this thread's copies)
            fence_proxy_async();
            __syncthreads();
            const unsigned sa = s0 + (kt % NST) * STAGE;
            wg_tile(sa, sa + CANON_A);
            const int nt = kt + NST - 2;
            if (nt < KT) issue(nt % NST, nt);
            cp_async_commit();
            wg_wait<1>();  // tile kt-1 retired by this warpgroup
            wg_fence_acc<MI * NI * 4>(accf);
        }
        wg_wait0();
        wg_fence_acc<MI * NI * 4>(accf);
    } else if constexpr (DIRECT) {
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) {
            if (s < KT) issue(s, s);
            cp_async_commit();
        }
        for (int kt = 0; kt < KT; ++kt) {
            cp_async_wait<NST - 2>();
            __syncthreads();
            const int nt = kt + NST - 1;
            if (nt < KT) issue(nt % NST, nt);
            cp_async_commit();
            const unsigned sa = s0 + (kt % NST) * STAGE;
#pragma unroll
            for (int ks = 0; ks < kBK / 16; ++ks) {
                warp_mma_ks<MI, NI, AMN, BMN, BM, BN, F16>(sa, sa + CANON_A, acc, wm0, wn0, ks,
                                                           lane);
            }
        }
    } else {
        static_assert(NST >= 3, "pipeline depth");
        ScaleRegs<AKIND, BM> sra;
        ScaleRegs<BKIND, BN> srb;
        auto load_scales = [&](int kt) {
            const long long k0 = static_cast<long long>(kt) * kBK;
            sra.load(a_sbase, a_sld, k0, rows_valid, len);
            srb.load(b_sbase, b_sld, k0, cols_valid, len);
        };
        auto store_scales = [&](int stage) {
            unsigned char* sb = smem + stage * STAGE;
            sra.store(sb + round16(raw_data_bytes(AKIND, BM)));
            srb.store(sb + RAW_A + round16(raw_data_bytes(BKIND, BN)));
        };
        // Convert part p (of 4) of raw stage `stage` into canonical buffer `cb`.
        auto convert_part = [&](int p, int stage, int cb) {
            const unsigned char* rs = smem + stage * STAGE;
            unsigned char* cs = smem + CANON_OFF + cb * (CANON_A + CANON_B);
#pragma unroll
            for (int idx = 0; idx < GA::UNITS_PER_THREAD + GB::UNITS_PER_THREAD; ++idx) {
                if (idx % 4 != p) continue;
                if (idx < GA::UNITS_PER_THREAD) {
                    const int u = static_cast<int>(threadIdx.x) + idx * kThreads;
                    if (u < GA::UNITS && unit_live<AKIND>(u, rows_valid)) {
                        const unsigned char* raw = rs;
                        const unsigned char* rsc = rs + round16(raw_data_bytes(AKIND, BM));
                        if (AKIND != KIND_FP4_K && a_e5m2) {
                            convert_unit<AKIND, BM, true>(raw, rsc, cs, u);
                        } else {
                            convert_unit<AKIND, BM, false>(raw, rsc, cs, u);
                        }
                    }
                } else {
                    const int u =
                        static_cast<int>(threadIdx.x) + (idx - GA::UNITS_PER_THREAD) * kThreads;
                    if (u < GB::UNITS && unit_live<BKIND>(u, cols_valid)) {
                        const unsigned char* raw = rs + RAW_A;
                        const unsigned char* rsc = raw + round16(raw_data_bytes(BKIND, BN));
                        if (BKIND != KIND_FP4_K && b_e5m2) {
                            convert_unit<BKIND, BN, true>(raw, rsc, cs + CANON_A, u);
                        } else {
                            convert_unit<BKIND, BN, false>(raw, rsc, cs + CANON_A, u);
                        }
                    }
                }
            }
        };

        // Prologue: tiles 0..NST-2 in flight, their scales stored; scales of NST-1 in registers.
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) {
            if (s < KT) issue(s, s);
            cp_async_commit();
        }
        {
            // all prologue scale loads in flight before the first store (one memory latency)
            ScaleRegs<AKIND, BM> pra[NST - 1];
            ScaleRegs<BKIND, BN> prb[NST - 1];
#pragma unroll
            for (int s = 0; s < NST - 1; ++s) {
                if (s < KT) {
                    const long long k0 = static_cast<long long>(s) * kBK;
                    pra[s].load(a_sbase, a_sld, k0, rows_valid, len);
                    prb[s].load(b_sbase, b_sld, k0, cols_valid, len);
                }
            }
#pragma unroll
            for (int s = 0; s < NST - 1; ++s) {
                if (s < KT) {
                    unsigned char* sb = smem + s * STAGE;
                    pra[s].store(sb + round16(raw_data_bytes(AKIND, BM)));
                    prb[s].store(sb + RAW_A + round16(raw_data_bytes(BKIND, BN)));
                }
            }
        }
        if (NST - 1 < KT) load_scales(NST - 1);
        cp_async_wait<NST - 3>();  // tiles 0 and 1 landed (this thread's copies)
        __syncthreads();
        if (KT > 0) {
#pragma unroll
            for (int p = 0; p < 4; ++p) convert_part(p, 0, 0);
            if constexpr (WG) fence_proxy_async();
        }
        if constexpr (WG) {
            for (int kt = 0; kt < KT; ++kt) {
                // Invariants: canonical buffer kt%NCB holds tile kt (this thread's part); raw
                // tile kt+1 landed (this thread's copies); raw stage (kt-1)%NST is free; scale
                // registers hold tile kt+NST-1. NCB = 3: tile kt-1 may still be in flight.
                __syncthreads();
                const unsigned sa = s0 + CANON_OFF + (kt % NCB) * (CANON_A + CANON_B);
                wg_tile(sa, sa + CANON_A);  // asynchronous: expand the next tile meanwhile
                const int nt = kt + NST - 1;
                if (nt < KT) issue(nt % NST, nt);
                cp_async_commit();
                if (kt + 1 < KT) {
                    // Buffer (kt+1)%NCB last held tile kt+1-NCB, retired by every warpgroup
                    // before this iteration's barrier.
#pragma unroll
                    for (int p = 0; p < 4; ++p) convert_part(p, (kt + 1) % NST, (kt + 1) % NCB);
                    fence_proxy_async();
                }
                // Scales of tile nt go to shared memory only now, a whole iteration after
                // their loads were issued (tile nt is expanded in iteration nt-1 >= kt+2).
                if (nt < KT) store_scales(nt % NST);
                if (nt + 1 < KT) load_scales(nt + 1);
                if constexpr (NCB >= 3) {
                    wg_wait<1>();  // tile kt-1 retired by this warpgroup
                } else {
                    wg_wait0();  // canonical buffer kt%2 is rewritten next iteration
                }
                wg_fence_acc<MI * NI * 4>(accf);
                cp_async_wait<NST - 3>();  // raw tile kt+2 landed (this thread's copies)
            }
            wg_wait0();
            wg_fence_acc<MI * NI * 4>(accf);
        } else {
            for (int kt = 0; kt < KT; ++kt) {
                // Invariants: canonical buffer kt&1 holds tile kt; raw tile kt+1 landed (all threads);
                // raw stage (kt-1)%NST is free; scale registers hold tile kt+NST-1.
                __syncthreads();
                const int nt = kt + NST - 1;
                if (nt < KT) {
                    issue(nt % NST, nt);
                    store_scales(nt % NST);
                }
                cp_async_commit();
                if (nt + 1 < KT) load_scales(nt + 1);
                const unsigned sa = s0 + CANON_OFF + (kt & 1) * (CANON_A + CANON_B);
                const bool next = kt + 1 < KT;
#pragma unroll
                for (int ks = 0; ks < kBK / 16; ++ks) {
                    warp_mma_ks<MI, NI, AMN, BMN, BM, BN, F16>(sa, sa + CANON_A, acc, wm0, wn0,
                                                               ks, lane);
                    if (next) convert_part(ks, (kt + 1) % NST, (kt + 1) & 1);
                }
                cp_async_wait<NST - 3>();  // raw tile kt+2 landed (this thread's copies)
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the operand tiles: reuse shared memory

    // ---- epilogue: stage the fp32 accumulators through shared memory ([BM][BN + 8]), then
    // apply the epilogue in a compact loop with coalesced stores. Fragment (mi, ni): rows
    // wm0 + 16 mi + lane/4 (+8), columns wn0 + 8 ni + 2 (lane%4) (+1).
    float* cs = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = wm0 + mi * 16 + (lane >> 2) + hf * 8;
                const int c = wn0 + ni * 8 + (lane & 3) * 2;
                *reinterpret_cast<float2*>(cs + r * EPI_LD + c) =
                    make_float2(acc[mi][ni][2 * hf], acc[mi][ni][2 * hf + 1]);
            }
        }
    }
    __syncthreads();
    ep.tile<BN, EPI_LD>(cs, r0, c0, rows_valid, cols_valid);
}

}  // namespace lpm_gg

// Parameter list shared by every tensor-core kernel entry point.
#define LPM_GG_PARAMS                                                                          \
    const int *__restrict__ tiles, int n_col_tiles, const long long *__restrict__ desc,       \
        long long n_cols, const unsigned char *__restrict__ a_data,                           \
        const unsigned char *__restrict__ a_scale, int a_ch, int a_e5m2,                      \
        const unsigned char *__restrict__ b_data, const unsigned char *__restrict__ b_scale,  \
        int b_ch, int b_e5m2, const float *__restrict__ amax_a,                               \
        const float *__restrict__ amax_b, int a_vec, int b_vec, int scale_mode,               \
        const float *__restrict__ bias, const float *__restrict__ probs, int has_bias,        \
        int has_probs, void *__restrict__ out, int out_type, int accumulate, int zero_if_empty

#define LPM_GG_ARGS                                                                            \
    tiles, n_col_tiles, desc, n_cols, a_data, a_scale, a_ch, a_e5m2, b_data, b_scale, b_ch,   \
        b_e5m2, amax_a, amax_b, a_vec, b_vec, scale_mode, bias, probs, has_bias, has_probs,   \
        out, out_type, accumulate, zero_if_empty

// extern "C" entry point NAME for one mma.sync configuration (CH: cp.async chunk, 16 or 8).
#define LPM_GG_DEFINE(NAME, BM, BN, WARPS_M, AKIND, BKIND, F16, CH)                            \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kThreads, 1) NAME(LPM_GG_PARAMS) {    \
        lpm_gg::gemm_mma<BM, BN, WARPS_M, AKIND, BKIND, F16, CH, CH, false>(LPM_GG_ARGS);      \
    }

// extern "C" entry point NAME of a wgmma (sm_90a) configuration: BM x 256 tile (BM = 128 or
// 64), two warpgroups. On other architectures it compiles to a trap; the launcher never selects
// it there.
#define LPM_GG_DEFINE_WG(NAME, BM, AKIND, BKIND, F16, CH)                                      \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kThreads, 1) NAME(LPM_GG_PARAMS) {    \
        lpm_gg::gemm_mma<BM, 256, 2, AKIND, BKIND, F16, CH, CH, true>(LPM_GG_ARGS);            \
    }

#endif  // LPM_GROUPED_GEMM_COMMON_CUH
