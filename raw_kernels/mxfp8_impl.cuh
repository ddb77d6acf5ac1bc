// lowprec_moe: MXFP8 quantization / dequantization, device code shared by the kernel modules
// raw_kernels/mxfp8.cu (production: hardware fp32 -> fp8 conversion) and
// raw_kernels/mxfp8_intcvt.cu (same kernels with a pure integer conversion; tests use it as a
// cross-check and it is the fallback should the hardware conversion ever disagree).
//
// SPEC section 3 (MXFP8) and section 5 (GroupedTensor). Bit-exact with
// lowprec_moe/reference/mxfp8.py. CuPy compiles with -ftz=true, so everything on the bit-exact
// path is integer bit manipulation or PTX without .ftz (lpm_formats.cuh helpers).
//
// Kernels (all extern "C", defined in mxfp8_entry.cuh, launched on CuPy's current stream by
// lowprec_moe/cuda/mxfp8.py):
//
//   lpm_mxfp8_quantize_{f32,f16,bf16}
//       Rowwise and/or columnwise (or 2-D 32x32) quantization of x [M, K] in ONE pass: every
//       warp owns a 32-row x (16*VEC)-column tile in registers (VEC = 16 bytes of input per lane
//       and row: 8 elements of bf16/fp16, 4 of fp32) and produces the rowwise blocks (32 along
//       K) and the columnwise blocks (32 along M) of that tile. Grouped tensors use the same
//       kernel: the tiles are per-member 32-row tiles (a member's last tile is zero padded for
//       the columnwise copy), located through device arrays of member row offsets and
//       columnwise tile offsets. The flat columnwise buffers of a grouped tensor are exactly a
//       row-major [32 * num_row_tiles, K] matrix (data) and [num_row_tiles, K] (scale).
//   lpm_mxfp8_colwise_from_rowwise
//       Fused path of GroupedTensor.with_columnwise(): wire rowwise MXFP8 (data + compact E8M0
//       scale) -> dequantize (fp32) -> round to bf16 (RNE) -> columnwise MXFP8 quantize, per
//       member, one launch; optionally also scatters the rowwise scales into the GEMM-swizzled
//       layout (each member swizzled separately, buffers concatenated).
//   lpm_mxfp8_dequantize
//       Rowwise or columnwise (single or grouped, cropping padding rows) dequantization to
//       float32: q * 2^(e - 127), NaN bytes exactly as the NumPy reference produces them.
//
// fp32 -> fp8 conversion (template parameter HW): the hardware
// `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` (round to nearest even, +-inf and overflow -> +-max).
// Its only possible departures from the reference are (a) the NaN byte, which is canonicalised
// to 0x7F here whenever the tile holds a NaN, and (b) fp32-subnormal inputs, which only come
// from products far below the smallest fp8 subnormal and give a signed zero either way. With
// HW = false a pure integer conversion is used instead.

#ifndef LPM_MXFP8_IMPL_CUH
#define LPM_MXFP8_IMPL_CUH

#include "lpm_formats.cuh"

// ------------------------------------------------------------------------------------------
// Launch-time constants shared with lowprec_moe/cuda/mxfp8.py

constexpr int LPM_MX_WARPS_PER_CTA = 4;    // quantize kernels: 128 threads, one tile per warp
constexpr int LPM_MX_MIN_CTAS_PER_SM = 4;  // quantize kernels: <= 128 registers per thread
constexpr int LPM_MX_ROWS_PER_LANE = 16;   // a warp tile is 32 rows: lanes 0-15 even, 16-31 odd
constexpr int LPM_MX_DEQ_THREADS = 256;    // dequantize kernel block size
constexpr int LPM_MX_DEQ_VEC = 16;         // elements per dequantize thread and step

// `flags` bits of the quantize kernels
constexpr int LPM_MX_FLAG_ROWWISE = 1;
constexpr int LPM_MX_FLAG_COLUMNWISE = 2;
constexpr int LPM_MX_FLAG_BLOCK_2D = 4;
constexpr int LPM_MX_FLAG_E5M2 = 8;        // output element type (0: E4M3)
// extra `flags` bit of the fused kernel
constexpr int LPM_MX_FLAG_WIRE_E5M2 = 16;  // wire (input) element type (0: E4M3)

namespace lpm_mx {

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

constexpr int KIND_F32 = 0;   // one fp32 per 32-bit word
constexpr int KIND_F16 = 1;   // two fp16 per word (element 2i in the low half)
constexpr int KIND_BF16 = 2;  // two bf16 per word

constexpr int FMT_E4M3 = 0;
constexpr int FMT_E5M2 = 1;

// ---- element formats --------------------------------------------------------------------

template <int FMT>
struct Fp8;

template <>
struct Fp8<FMT_E4M3> {
    static constexpr u32 INV_MAX_BITS = LPM_FP32_INV_E4M3_MAX_BITS;
    static constexpr int BIAS = LPM_E4M3_EXP_BIAS;
    static constexpr int MANT = LPM_E4M3_MANT_BITS;
    static constexpr u32 NAN_CODE = LPM_E4M3_NAN_CODE;
    static __device__ __forceinline__ float max_value() { return LPM_E4M3_MAX; }
};

template <>
struct Fp8<FMT_E5M2> {
    static constexpr u32 INV_MAX_BITS = LPM_FP32_INV_E5M2_MAX_BITS;
    static constexpr int BIAS = LPM_E5M2_EXP_BIAS;
    static constexpr int MANT = LPM_E5M2_MANT_BITS;
    static constexpr u32 NAN_CODE = LPM_E5M2_NAN_CODE;
    static __device__ __forceinline__ float max_value() { return LPM_E5M2_MAX; }
};

template <int KIND>
struct Kind {
    // elements per 16-byte chunk (one lane, one row)
    static constexpr int VEC = KIND == KIND_F32 ? 4 : 8;
    // lanes sharing one 32-element row block
    static constexpr int LANES_PER_BLOCK = LPM_MXFP8_BLOCK / VEC;
    // columns of a warp tile (16 lanes side by side)
    static constexpr int TILE_COLS = 16 * VEC;
    static constexpr int ELEM_BYTES = KIND == KIND_F32 ? 4 : 2;
    // |x| bits of +inf in the input format (anything above is NaN)
    static constexpr u32 INF_BITS = KIND == KIND_F32 ? 0x7F800000u
                                    : KIND == KIND_F16 ? 0x7C00u
                                                       : 0x7F80u;
};

// ---- small integer helpers ----------------------------------------------------------------

// Per 16-bit half unsigned max (packed).
__device__ __forceinline__ u32 vmax_u16x2(u32 a, u32 b) {
#if __CUDA_ARCH__ >= 900
    u32 r;
    asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return __vmaxu2(a, b);
#endif
}

__device__ __forceinline__ u32 umax(u32 a, u32 b) { return a > b ? a : b; }
__device__ __forceinline__ u32 umin(u32 a, u32 b) { return a < b ? a : b; }

// |x| bits of every element of a word.
template <int KIND>
__device__ __forceinline__ u32 abs_word(u32 w) {
    return KIND == KIND_F32 ? (w & 0x7FFFFFFFu) : (w & 0x7FFF7FFFu);
}

// |x| bits with NaN elements replaced by 0 (fmax semantics: NaN is ignored).
template <int KIND>
__device__ __forceinline__ u32 abs_word_nonan(u32 w) {
    const u32 a = abs_word<KIND>(w);
    if (KIND == KIND_F32) return a > Kind<KIND>::INF_BITS ? 0u : a;
    const u32 nanmask = __vcmpgtu2(a, Kind<KIND>::INF_BITS * 0x00010001u);
    return a & ~nanmask;
}

template <int KIND>
__device__ __forceinline__ u32 max_word(u32 a, u32 b) {
    return KIND == KIND_F32 ? umax(a, b) : vmax_u16x2(a, b);
}

// A word of |x| maxima -> the scalar maximum of its elements.
template <int KIND>
__device__ __forceinline__ u32 word_scalar_max(u32 w) {
    return KIND == KIND_F32 ? w : umax(w & 0xFFFFu, w >> 16);
}

// Does a word of |x| maxima hold a NaN?
template <int KIND>
__device__ __forceinline__ bool word_has_nan(u32 w) {
    if (KIND == KIND_F32) return w > Kind<KIND>::INF_BITS;
    return (w & 0xFFFFu) > Kind<KIND>::INF_BITS || (w >> 16) > Kind<KIND>::INF_BITS;
}

// Bits of one element (16-bit kinds: the low half when hi == false) -> exact fp32.
template <int KIND>
__device__ __forceinline__ float elem_to_f32(u32 w, bool hi) {
    if (KIND == KIND_F32) return __uint_as_float(w);
    if (KIND == KIND_BF16) return __uint_as_float(hi ? (w & 0xFFFF0000u) : (w << 16));
    return lpm_f16_bits_to_f32((unsigned short)(hi ? (w >> 16) : (w & 0xFFFFu)));
}

// A non-negative, non-NaN |x| bit pattern of the input format -> exact fp32.
template <int KIND>
__device__ __forceinline__ float amax_bits_to_f32(u32 a) {
    if (KIND == KIND_F32) return __uint_as_float(a);
    if (KIND == KIND_BF16) return __uint_as_float(a << 16);
    return lpm_f16_bits_to_f32((unsigned short)a);
}

// ---- the MXFP8 scale rule -------------------------------------------------------------------

// UE8M0 exponent of a block: v = amax * fp32(1/max) (non-flushing), then the ceiling rule of
// reference/mxfp8.py scale_exponent, from the fp32 bits of v.
template <int FMT>
__device__ __forceinline__ u32 scale_exponent(float amax) {
    const float v = lpm_mul_rn(amax, __uint_as_float(Fp8<FMT>::INV_MAX_BITS));
    const u32 b = __float_as_uint(v);
    const u32 ex = (b >> LPM_FP32_MANT_BITS) & LPM_FP32_EXP_MASK;
    const u32 mant = b & LPM_FP32_MANT_MASK;
    // normal v: the biased exponent, plus 1 if the mantissa is nonzero (254 is never increased;
    // an infinite v (ex 255, mantissa 0) gives 254, a NaN 255)
    u32 e = ex + ((mant != 0u && ex < LPM_E8M0_MAX_FINITE) ? 1u : 0u);
    if (ex == LPM_FP32_EXP_MASK) e = mant != 0u ? LPM_E8M0_NAN : LPM_E8M0_MAX_FINITE;
    // subnormal v: v <= 2^-127 (mantissa <= 2^22) gives 0, anything larger 1 (v == 0 gives 0)
    if (ex == 0u) e = mant > (1u << (LPM_FP32_MANT_BITS - 1)) ? 1u : 0u;
    return e;
}

// 2^(127 - e) built from bits: biased exponent 254 - e for e <= 253, the subnormal 2^-127
// (mantissa bit 22) for e = 254, NaN for e = 255.
__device__ __forceinline__ float scale_multiplier(u32 e) {
    u32 bits = (u32)(2 * LPM_E8M0_BIAS - (int)e) << LPM_FP32_MANT_BITS;
    if (e == LPM_E8M0_MAX_FINITE) bits = 1u << (LPM_FP32_MANT_BITS - 1);
    if (e == LPM_E8M0_NAN) bits = 0x7FC00000u;
    return __uint_as_float(bits);
}

// ---- fp32 -> fp8 ------------------------------------------------------------------------------

// Integer conversion of one fp32 to E4M3 / E5M2: round to nearest even, satfinite (+-inf and
// overflow -> +-max), NaN -> the canonical NaN byte, sign kept on zero, subnormal results exact.
template <int FMT>
__device__ __forceinline__ u32 f32_to_fp8_int(float y) {
    constexpr int BIAS = Fp8<FMT>::BIAS;
    constexpr int MANT = Fp8<FMT>::MANT;
    constexpr int SHIFT = LPM_FP32_MANT_BITS - MANT;
    constexpr u32 MIN_NORMAL_BITS = (u32)(LPM_FP32_EXP_BIAS + 1 - BIAS) << LPM_FP32_MANT_BITS;
    const u32 u = __float_as_uint(y);
    const u32 sign = (u >> 24) & 0x80u;
    u32 a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return Fp8<FMT>::NAN_CODE;
    const u32 max_bits = __float_as_uint(Fp8<FMT>::max_value());
    if (a > max_bits) a = max_bits;  // satfinite (inf included)
    u32 code;
    if (a >= MIN_NORMAL_BITS) {
        // round the fp32 bits at the fp8 mantissa width (a carry moves into the exponent),
        // then rebias; values <= max never round above max (max is on the grid)
        const u32 r = a + ((1u << (SHIFT - 1)) - 1u) + ((a >> SHIFT) & 1u);
        code = (r >> SHIFT) - ((u32)(LPM_FP32_EXP_BIAS - BIAS) << MANT);
    } else {
        const u32 fexp = a >> LPM_FP32_MANT_BITS;
        if (fexp == 0u) {
            code = 0u;  // fp32 zero or subnormal: far below half the smallest fp8 subnormal
        } else {
            // fp8 subnormal range: q = RNE(|y| / 2^(1 - BIAS - MANT)); q == 2^MANT is the
            // smallest normal, which the integer encoding represents naturally
            const u32 mm = (a & LPM_FP32_MANT_MASK) | (1u << LPM_FP32_MANT_BITS);
            const u32 sh = (u32)(LPM_FP32_EXP_BIAS + LPM_FP32_MANT_BITS + 1 - BIAS - MANT) - fexp;
            if (sh > 25u) {
                code = 0u;  // mm < 2^24 <= half an ulp
            } else {
                u32 q = mm >> sh;
                const u32 rem = mm & ((1u << sh) - 1u);
                const u32 half = 1u << (sh - 1u);
                if (rem > half || (rem == half && (q & 1u))) ++q;
                code = q;
            }
        }
    }
    return sign | code;
}

// Two fp32 -> two fp8 bytes (lo in bits 0-7, hi in bits 8-15).
template <int FMT, bool HW>
__device__ __forceinline__ u32 cvt_pair(float lo, float hi) {
    if (HW) {
        unsigned short r;
        if (FMT == FMT_E4M3) {
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
        } else {
            asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
        }
        return (u32)r;
    }
    return f32_to_fp8_int<FMT>(lo) | (f32_to_fp8_int<FMT>(hi) << 8);
}

// Replace every NaN byte of a word of four fp8 bytes by the canonical NaN byte (0x7F). A
// satfinite conversion never produces +-inf (E5M2 0x7C) or the E4M3 byte 0x7F / 0xFF from a
// number, so the NaN bytes are exactly those below.
template <int FMT>
__device__ __forceinline__ u32 canonical_nan4(u32 w) {
    const u32 mag = w & 0x7F7F7F7Fu;
    const u32 m = FMT == FMT_E4M3 ? __vcmpeq4(mag, 0x7F7F7F7Fu) : __vcmpgtu4(mag, 0x7C7C7C7Cu);
    return (w & ~m) | (Fp8<FMT>::NAN_CODE * 0x01010101u & m);
}

// ---- fp8 -> fp32 ------------------------------------------------------------------------------

// The fp32 NaN the reference decodes a NaN byte to (ml_dtypes keeps the sign: 0x7FC00000 or
// 0xFFC00000).
__device__ __forceinline__ float reference_nan(u32 byte) {
    return __uint_as_float(0x7FC00000u | ((byte & 0x80u) << 24));
}

// Is this byte a NaN / an infinity of the format?
template <int FMT>
__device__ __forceinline__ bool fp8_is_nan(u32 byte) {
    return FMT == FMT_E4M3 ? (byte & 0x7Fu) == 0x7Fu : (byte & 0x7Fu) > 0x7Cu;
}

// Exact fp32 value of a finite fp8 byte: place the exponent and mantissa fields in the fp32
// fields of the same significance and multiply by 2^(127 - BIAS) (exact; an fp8 subnormal goes
// through an fp32 subnormal, so the multiply must not flush).
template <int FMT>
__device__ __forceinline__ float fp8_finite_to_f32(u32 byte) {
    constexpr int FIELD_SHIFT = LPM_FP32_MANT_BITS - Fp8<FMT>::MANT;
    const u32 bits = ((byte & 0x80u) << 24) | ((byte & 0x7Fu) << FIELD_SHIFT);
    return lpm_mul_rn(__uint_as_float(bits),
                      __uint_as_float((u32)(2 * LPM_FP32_EXP_BIAS - Fp8<FMT>::BIAS) << 23));
}

// Exact fp32 value of any fp8 byte; NaN as the reference decodes it.
template <int FMT>
__device__ __forceinline__ float fp8_to_f32(u32 byte) {
    if (fp8_is_nan<FMT>(byte)) return reference_nan(byte);
    if (FMT == FMT_E5M2 && (byte & 0x7Fu) == 0x7Cu)
        return __uint_as_float(0x7F800000u | ((byte & 0x80u) << 24));
    return fp8_finite_to_f32<FMT>(byte);
}

// q * 2^(e - 127) exactly as reference dequantize_mxfp8 computes `vals * f` in NumPy: a NaN q
// stays itself, otherwise a NaN scale (e = 255) gives 0x7FC00000, otherwise one IEEE multiply.
template <int FMT>
__device__ __forceinline__ float dequant_elem(u32 byte, u32 e) {
    const float q = fp8_to_f32<FMT>(byte);
    if (fp8_is_nan<FMT>(byte)) return q;
    if (e == LPM_E8M0_NAN) return __uint_as_float(0x7FC00000u);
    return lpm_mul_rn(q, lpm_e8m0_to_f32(e));
}

// fp32 -> nearest bf16 (RNE, subnormals kept, overflow -> inf), returned as fp32 (low 16 bits
// zero). A NaN stays a NaN.
__device__ __forceinline__ u32 round_f32_to_bf16_bits32(u32 u) {
    return (u32)lpm_f32_to_bf16_bits_rn(__uint_as_float(u)) << 16;
}

// ---- tile location --------------------------------------------------------------------------

// Largest g in [0, n) with offs[g] <= v (offs nondecreasing, offs[0] <= v < offs[n]).
__device__ __forceinline__ int find_member(const long long* __restrict__ offs, int n, long long v) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (__ldg(offs + mid) <= v) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

struct TileRows {
    long long in_row0;  // first input (and rowwise output) row of the tile
    int valid;          // rows of the tile inside its member (1..32)
};

// Row tile `rt` of the grouped layout: member g owns columnwise tiles
// [tile_off[g], tile_off[g+1]) and input rows [row_off[g], row_off[g+1]). Without offsets (a
// single tensor) tile rt covers rows [32 rt, 32 rt + 32) of m_total.
__device__ __forceinline__ TileRows locate_tile(long long rt, long long m_total,
                                                const long long* __restrict__ row_off,
                                                const long long* __restrict__ tile_off,
                                                int num_groups) {
    TileRows t;
    long long base, end;
    if (row_off == nullptr) {
        base = rt * LPM_MXFP8_BLOCK;
        end = m_total;
    } else {
        const int g = find_member(tile_off, num_groups, rt);
        base = __ldg(row_off + g) + (rt - __ldg(tile_off + g)) * LPM_MXFP8_BLOCK;
        end = __ldg(row_off + g + 1);
    }
    const long long v = end - base;
    t.in_row0 = base;
    t.valid = (int)(v < LPM_MXFP8_BLOCK ? v : LPM_MXFP8_BLOCK);
    return t;
}

// ---- the tile pipeline ------------------------------------------------------------------------

struct TileOut {
    u8* __restrict__ row_data;
    u8* __restrict__ row_scale;
    u8* __restrict__ col_data;
    u8* __restrict__ col_scale;
};

// Column maxima (per word, over the lane's 16 rows) and row maxima (per row, over the lane's
// VEC columns) of |x|; MASK_NAN ignores NaN elements.
template <int KIND, bool MASK_NAN>
__device__ __forceinline__ void lane_maxes(const u32 (&raw)[LPM_MX_ROWS_PER_LANE][4],
                                           u32 (&colmax)[4], u32 (&rowmax)[LPM_MX_ROWS_PER_LANE],
                                           bool want_rows) {
#pragma unroll
    for (int w = 0; w < 4; ++w) colmax[w] = 0u;
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
        u32 a[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            a[w] = MASK_NAN ? abs_word_nonan<KIND>(raw[j][w]) : abs_word<KIND>(raw[j][w]);
            colmax[w] = max_word<KIND>(colmax[w], a[w]);
        }
        if (want_rows) {
            const u32 m = max_word<KIND>(max_word<KIND>(a[0], a[1]), max_word<KIND>(a[2], a[3]));
            rowmax[j] = word_scalar_max<KIND>(m);
        }
    }
}

// Reduce the lane maxima across the warp: columns over the two row halves (lanes l, l ^ 16),
// rows over the lanes of one 32-element block.
template <int KIND>
__device__ __forceinline__ void warp_maxes(u32 (&colmax)[4], u32 (&rowmax)[LPM_MX_ROWS_PER_LANE],
                                           bool want_rows) {
#pragma unroll
    for (int w = 0; w < 4; ++w)
        colmax[w] = max_word<KIND>(colmax[w], __shfl_xor_sync(0xFFFFFFFFu, colmax[w], 16));
    if (want_rows) {
#pragma unroll
        for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
#pragma unroll
            for (int s = 1; s < Kind<KIND>::LANES_PER_BLOCK; s <<= 1)
                rowmax[j] = umax(rowmax[j], __shfl_xor_sync(0xFFFFFFFFu, rowmax[j], s));
        }
    }
}

// Quantize VEC values with per-element multipliers into VEC fp8 bytes (VEC / 4 words).
template <int FMT, bool HW, int VEC>
__device__ __forceinline__ void quantize_vec(const float (&xv)[VEC], const float (&mult)[VEC],
                                             bool fix_nan, u32 (&out)[VEC / 4]) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
        const u32 p0 = cvt_pair<FMT, HW>(lpm_mul_rn(xv[4 * q + 0], mult[4 * q + 0]),
                                         lpm_mul_rn(xv[4 * q + 1], mult[4 * q + 1]));
        const u32 p1 = cvt_pair<FMT, HW>(lpm_mul_rn(xv[4 * q + 2], mult[4 * q + 2]),
                                         lpm_mul_rn(xv[4 * q + 3], mult[4 * q + 3]));
        u32 w = __byte_perm(p0, p1, 0x5410);
        if (fix_nan) w = canonical_nan4<FMT>(w);
        out[q] = w;
    }
}

template <int NWORDS>
__device__ __forceinline__ void store_words(u8* p, const u32 (&w)[NWORDS]) {
    if (NWORDS == 2) {
        uint2 v;
        v.x = w[0];
        v.y = w[NWORDS - 1];
        *reinterpret_cast<uint2*>(p) = v;
    } else {
        *reinterpret_cast<u32*>(p) = w[0];
    }
}

// Scale exponent of a NaN-free block maximum (the tile pipeline masks NaNs before taking
// maxima, so amax is finite or +inf): the ceiling rule of scale_exponent in a few integer ops.
// v = amax * fp32(1/max) >= 0 with bits b: b <= 0x400000 (v <= 2^-127, zero included) gives 0;
// otherwise (b + 0x7FFFFF) >> 23 is the biased exponent plus 1 when the mantissa is nonzero
// (a subnormal v above 2^-127 gives 1), clamped to 254 (exponent 254 is never increased, +inf
// gives 254). Equal to scale_exponent for every non-NaN amax >= 0.
template <int FMT>
__device__ __forceinline__ u32 scale_exponent_nonan(float amax) {
    const u32 b = __float_as_uint(lpm_mul_rn(amax, __uint_as_float(Fp8<FMT>::INV_MAX_BITS)));
    const u32 e = umin((b + LPM_FP32_MANT_MASK) >> LPM_FP32_MANT_BITS, LPM_E8M0_MAX_FINITE);
    return b > (1u << (LPM_FP32_MANT_BITS - 1)) ? e : 0u;
}

// scale_multiplier for e <= 254.
__device__ __forceinline__ float scale_multiplier_finite(u32 e) {
    return __uint_as_float(e == LPM_E8M0_MAX_FINITE ? (1u << (LPM_FP32_MANT_BITS - 1))
                                                    : (u32)(2 * LPM_E8M0_BIAS - (int)e)
                                                          << LPM_FP32_MANT_BITS);
}

// The 16 rows of a lane: quantize (rowwise and / or columnwise) and store. FIXNAN: the tile
// holds a NaN, canonicalise the NaN bytes (a uniform branch picks the instantiation, so NaN-free
// tiles carry no fix-up instructions). Store addresses advance by two rows per step.
template <int KIND, int FMT, bool HW, bool FIXNAN>
__device__ __forceinline__ void emit_rows(const u32 (&raw)[LPM_MX_ROWS_PER_LANE][4],
                                          const TileOut& o, long long k, long long rt,
                                          const TileRows& tr, long long c0, bool col_ok,
                                          int rsub, int chunk, bool do_row, bool do_col,
                                          bool block_2d, const u32 (&ecol)[Kind<KIND>::VEC],
                                          const float (&mcol)[Kind<KIND>::VEC],
                                          const u32 (&rowmax)[LPM_MX_ROWS_PER_LANE]) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    const long long kb = k / LPM_MXFP8_BLOCK;  // row scale columns
    const long long r0 = tr.in_row0 + rsub;
    u8* rdp = do_row ? o.row_data + r0 * k + c0 : nullptr;
    u8* rsp = do_row ? o.row_scale + r0 * kb + c0 / LPM_MXFP8_BLOCK : nullptr;
    u8* cdp = do_col ? o.col_data + (rt * LPM_MXFP8_BLOCK + rsub) * k + c0 : nullptr;
    const long long step_d = 2 * k, step_s = 2 * kb;
    const bool scale_lane = (chunk % LB) == 0;
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
        const int r = rsub + 2 * j;
        float xv[VEC];
#pragma unroll
        for (int c = 0; c < VEC; ++c)
            xv[c] = KIND == KIND_F32 ? elem_to_f32<KIND>(raw[j][c], false)
                                     : elem_to_f32<KIND>(raw[j][c / 2], (c & 1) != 0);
        u32 rbytes[VEC / 4];
        if (do_row) {
            u32 erow;
            float mrow[VEC];
            if (block_2d) {
                erow = ecol[0];
#pragma unroll
                for (int c = 0; c < VEC; ++c) mrow[c] = mcol[0];
            } else {
                erow = scale_exponent_nonan<FMT>(amax_bits_to_f32<KIND>(rowmax[j]));
                const float m = scale_multiplier_finite(erow);
#pragma unroll
                for (int c = 0; c < VEC; ++c) mrow[c] = m;
            }
            quantize_vec<FMT, HW, VEC>(xv, mrow, FIXNAN, rbytes);
            if (col_ok && r < tr.valid) {
                store_words<VEC / 4>(rdp, rbytes);
                if (scale_lane) *rsp = (u8)erow;
            }
        }
        if (do_col && col_ok) {
            u32 cbytes[VEC / 4];
            if (block_2d && do_row) {
#pragma unroll
                for (int q = 0; q < VEC / 4; ++q) cbytes[q] = rbytes[q];  // same scale, same bytes
            } else {
                quantize_vec<FMT, HW, VEC>(xv, mcol, FIXNAN, cbytes);
            }
            store_words<VEC / 4>(cdp, cbytes);
        }
        rdp += step_d;
        rsp += step_s;
        cdp += step_d;
    }
}

// Everything after the loads: maxima, scales, both quantized copies, stores.
//
// raw[j] holds row (rsub + 2 j) of the tile, VEC columns starting at c0 (zeros for rows past
// `valid` and for lanes past K). Rowwise outputs go to rows in_row0 + r (r < valid); columnwise
// outputs to rows 32 rt + r (all 32 rows, padding rows quantize to 0) and scale row rt.
template <int KIND, int FMT, bool HW>
__device__ __forceinline__ void process_tile(const u32 (&raw)[LPM_MX_ROWS_PER_LANE][4],
                                             const TileOut& o, long long k, long long rt,
                                             const TileRows& tr, long long c0, bool col_ok,
                                             int rsub, int chunk, bool do_row, bool do_col,
                                             bool block_2d) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    const bool want_rows = do_row && !block_2d;

    u32 colmax[4];
    u32 rowmax[LPM_MX_ROWS_PER_LANE];
    lane_maxes<KIND, false>(raw, colmax, rowmax, want_rows);
    // The column maxima cover every element of the tile: a NaN anywhere shows up here.
    bool nan_here = false;
#pragma unroll
    for (int w = 0; w < 4; ++w) nan_here |= word_has_nan<KIND>(colmax[w]);
    const bool has_nan = __any_sync(0xFFFFFFFFu, nan_here);
    if (has_nan) lane_maxes<KIND, true>(raw, colmax, rowmax, want_rows);  // rare slow path
    warp_maxes<KIND>(colmax, rowmax, want_rows);
    // From here on every maximum is NaN-free (finite or +inf).

    // Column scales (or the 2-D tile scale).
    u32 ecol[VEC];
    float mcol[VEC];
    if (block_2d) {
        const u32 m01 = max_word<KIND>(colmax[0], colmax[1]);
        const u32 m23 = max_word<KIND>(colmax[2], colmax[3]);
        u32 m = word_scalar_max<KIND>(max_word<KIND>(m01, m23));
#pragma unroll
        for (int s = 1; s < LB; s <<= 1) m = umax(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
        const u32 e = scale_exponent_nonan<FMT>(amax_bits_to_f32<KIND>(m));
        const float mult = scale_multiplier_finite(e);
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
            ecol[c] = e;
            mcol[c] = mult;
        }
    } else {
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
            const u32 w = colmax[KIND == KIND_F32 ? c : c / 2];
            const u32 a = KIND == KIND_F32 ? w : ((c & 1) ? (w >> 16) : (w & 0xFFFFu));
            ecol[c] = do_col ? scale_exponent_nonan<FMT>(amax_bits_to_f32<KIND>(a)) : 0u;
            mcol[c] = scale_multiplier_finite(ecol[c]);
        }
    }

    if (has_nan) {
        emit_rows<KIND, FMT, HW, true>(raw, o, k, rt, tr, c0, col_ok, rsub, chunk, do_row, do_col,
                                       block_2d, ecol, mcol, rowmax);
    } else {
        emit_rows<KIND, FMT, HW, false>(raw, o, k, rt, tr, c0, col_ok, rsub, chunk, do_row,
                                        do_col, block_2d, ecol, mcol, rowmax);
    }
    if (do_col && col_ok && rsub == 0) {
        u32 sw[VEC / 4];
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q)
            sw[q] = ecol[4 * q] | (ecol[4 * q + 1] << 8) | (ecol[4 * q + 2] << 16) |
                    (ecol[4 * q + 3] << 24);
        store_words<VEC / 4>(o.col_scale + rt * k + c0, sw);
    }
}

// ---- quantize kernel body ---------------------------------------------------------------------

template <int KIND, int FMT, bool HW>
__device__ __forceinline__ void quantize_body(const u8* __restrict__ x, long long m_total,
                                              long long k, const long long* __restrict__ row_off,
                                              const long long* __restrict__ tile_off,
                                              int num_groups, long long num_row_tiles,
                                              const TileOut& o, int flags) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int TILE_COLS = Kind<KIND>::TILE_COLS;
    constexpr int EB = Kind<KIND>::ELEM_BYTES;
    const int lane = threadIdx.x & 31;
    const long long k_tiles = (k + TILE_COLS - 1) / TILE_COLS;
    const long long warp_id =
        (long long)blockIdx.x * LPM_MX_WARPS_PER_CTA + (long long)(threadIdx.x >> 5);
    if (warp_id >= num_row_tiles * k_tiles) return;  // whole warp
    const long long rt = warp_id / k_tiles;
    const long long kt = warp_id - rt * k_tiles;
    const TileRows tr = locate_tile(rt, m_total, row_off, tile_off, num_groups);

    const int rsub = lane >> 4;
    const int chunk = lane & 15;
    const long long c0 = kt * TILE_COLS + (long long)chunk * VEC;
    const bool col_ok = c0 < k;

    u32 raw[LPM_MX_ROWS_PER_LANE][4];
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
        const int r = rsub + 2 * j;
        if (col_ok && r < tr.valid) {
            const uint4 v =
                __ldg(reinterpret_cast<const uint4*>(x + ((tr.in_row0 + r) * k + c0) * EB));
            raw[j][0] = v.x;
            raw[j][1] = v.y;
            raw[j][2] = v.z;
            raw[j][3] = v.w;
        } else {
            raw[j][0] = raw[j][1] = raw[j][2] = raw[j][3] = 0u;
        }
    }
    process_tile<KIND, FMT, HW>(raw, o, k, rt, tr, c0, col_ok, rsub, chunk,
                                (flags & LPM_MX_FLAG_ROWWISE) != 0,
                                (flags & LPM_MX_FLAG_COLUMNWISE) != 0,
                                (flags & LPM_MX_FLAG_BLOCK_2D) != 0);
}

template <int KIND, bool HW>
__device__ __forceinline__ void quantize_dispatch(const u8* x, long long m_total, long long k,
                                                  const long long* row_off,
                                                  const long long* tile_off, int num_groups,
                                                  long long num_row_tiles, const TileOut& o,
                                                  int flags) {
    if ((flags & LPM_MX_FLAG_E5M2) != 0) {
        quantize_body<KIND, FMT_E5M2, HW>(x, m_total, k, row_off, tile_off, num_groups,
                                          num_row_tiles, o, flags);
    } else {
        quantize_body<KIND, FMT_E4M3, HW>(x, m_total, k, row_off, tile_off, num_groups,
                                          num_row_tiles, o, flags);
    }
}

// ---- fused wire rowwise -> columnwise ---------------------------------------------------------

// Decode 4 wire bytes of one row (scale exponent e) to fp32 values rounded to bf16, exactly as
// the reference's dequantize (fp32) + astype(bfloat16) does, as fp32 bit patterns.
template <int WFMT>
__device__ __forceinline__ void decode_wire4(u32 w, u32 e, u32 (&out)[4]) {
    const u32 mag = w & 0x7F7F7F7Fu;
    const bool special = WFMT == FMT_E4M3 ? __vcmpeq4(mag, 0x7F7F7F7Fu) != 0u
                                          : __vcmpgeu4(mag, 0x7C7C7C7Cu) != 0u;
    if (!special && e != LPM_E8M0_NAN) {
        const float s = lpm_e8m0_to_f32(e);
        // Products are q * 2^(e-127) with q of at most 4 significant bits: exactly
        // representable in bf16 unless they fall below the fp32 normal range, so the bf16
        // rounding is needed only for small scales (at most 2^(10-127) for E4M3, 2^(17-127)
        // for E5M2, covering the smallest fp8 subnormal).
        const bool need_round = e < (WFMT == FMT_E4M3 ? 10u : 17u);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const u32 v = __float_as_uint(
                lpm_mul_rn(fp8_finite_to_f32<WFMT>((w >> (8 * b)) & 0xFFu), s));
            out[b] = need_round ? round_f32_to_bf16_bits32(v) : v;
        }
    } else {
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const float v = dequant_elem<WFMT>((w >> (8 * b)) & 0xFFu, e);
            out[b] = round_f32_to_bf16_bits32(__float_as_uint(v));
        }
    }
}

template <int WFMT, int FMT, bool HW>
__device__ __forceinline__ void colwise_from_rowwise_body(
    const u8* __restrict__ wire_data, const u8* __restrict__ wire_scale, long long m_total,
    long long k, const long long* __restrict__ row_off, const long long* __restrict__ tile_off,
    const long long* __restrict__ swz_off, int num_groups, long long num_row_tiles,
    u8* __restrict__ col_data, u8* __restrict__ col_scale, u8* __restrict__ swz_scale) {
    constexpr int KIND = KIND_F32;  // decoded values are kept as fp32 (bf16-rounded)
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    constexpr int TILE_COLS = Kind<KIND>::TILE_COLS;
    const int lane = threadIdx.x & 31;
    const long long k_tiles = (k + TILE_COLS - 1) / TILE_COLS;
    const long long warp_id =
        (long long)blockIdx.x * LPM_MX_WARPS_PER_CTA + (long long)(threadIdx.x >> 5);
    if (warp_id >= num_row_tiles * k_tiles) return;
    const long long rt = warp_id / k_tiles;
    const long long kt = warp_id - rt * k_tiles;

    // member of this tile (needed here also for the swizzled scale offset)
    int g = 0;
    if (row_off != nullptr) g = find_member(tile_off, num_groups, rt);
    const TileRows tr = locate_tile(rt, m_total, row_off, tile_off, num_groups);
    const long long member_row0 = row_off != nullptr ? __ldg(row_off + g) : 0;

    const int rsub = lane >> 4;
    const int chunk = lane & 15;
    const long long c0 = kt * TILE_COLS + (long long)chunk * VEC;
    const bool col_ok = c0 < k;
    const long long kb = k / LPM_MXFP8_BLOCK;
    const long long cblk = c0 / LPM_MXFP8_BLOCK;

    u32 wdat[LPM_MX_ROWS_PER_LANE];
    u32 wsc[LPM_MX_ROWS_PER_LANE];
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
        const int r = rsub + 2 * j;
        if (col_ok && r < tr.valid) {
            const long long row = tr.in_row0 + r;
            wdat[j] = __ldg(reinterpret_cast<const u32*>(wire_data + row * k + c0));
            wsc[j] = __ldg(wire_scale + row * kb + cblk);
        } else {
            wdat[j] = 0u;
            wsc[j] = 0u;
        }
    }
    if (swz_scale != nullptr && col_ok && (chunk % LB) == 0) {
        const long long cp = lpm_round_up(kb, LPM_SWIZZLE_TILE_COLS);
        u8* dst = swz_scale + (row_off != nullptr ? __ldg(swz_off + g) : 0);
#pragma unroll
        for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
            const int r = rsub + 2 * j;
            if (r < tr.valid) {
                const long long rl = tr.in_row0 + r - member_row0;  // row inside the member
                dst[lpm_swizzle_offset(rl, cblk, cp)] = (u8)wsc[j];
            }
        }
    }
    u32 raw[LPM_MX_ROWS_PER_LANE][4];
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) decode_wire4<WFMT>(wdat[j], wsc[j], raw[j]);

    TileOut o;
    o.row_data = nullptr;
    o.row_scale = nullptr;
    o.col_data = col_data;
    o.col_scale = col_scale;
    process_tile<KIND, FMT, HW>(raw, o, k, rt, tr, c0, col_ok, rsub, chunk, false, true, false);
}

// ---- dequantize -------------------------------------------------------------------------------

template <int FMT>
__device__ __forceinline__ void dequantize_body(const u8* __restrict__ data,
                                                const u8* __restrict__ scale,
                                                float* __restrict__ out, long long rows_out,
                                                long long k, int columnwise,
                                                const long long* __restrict__ row_off,
                                                const long long* __restrict__ tile_off,
                                                int num_groups, int tpr_log2) {
    const int tpr = 1 << tpr_log2;  // threads per row (power of two, <= block size)
    const int rows_per_cta = LPM_MX_DEQ_THREADS >> tpr_log2;
    const int tx = threadIdx.x & (tpr - 1);
    const long long chunks = k / LPM_MX_DEQ_VEC;
    const long long kb = k / LPM_MXFP8_BLOCK;
    for (long long row = (long long)blockIdx.x * rows_per_cta + (threadIdx.x >> tpr_log2);
         row < rows_out; row += (long long)gridDim.x * rows_per_cta) {
        long long src_row, scale_row;  // byte offsets of the data row and the scale row
        if (columnwise) {
            long long tile, r;
            if (row_off == nullptr) {
                tile = row / LPM_MXFP8_BLOCK;
                r = row % LPM_MXFP8_BLOCK;
            } else {
                const int g = find_member(row_off, num_groups, row);
                const long long rl = row - __ldg(row_off + g);
                tile = __ldg(tile_off + g) + rl / LPM_MXFP8_BLOCK;
                r = rl % LPM_MXFP8_BLOCK;
            }
            src_row = (tile * LPM_MXFP8_BLOCK + r) * k;
            scale_row = tile * k;
        } else {
            src_row = row * k;
            scale_row = row * kb;
        }
        for (long long ch = tx; ch < chunks; ch += tpr) {
            const long long c = ch * LPM_MX_DEQ_VEC;
            const uint4 d = __ldg(reinterpret_cast<const uint4*>(data + src_row + c));
            const u32 dw[4] = {d.x, d.y, d.z, d.w};
            u32 sw[4];
            if (columnwise) {
                const uint4 s = __ldg(reinterpret_cast<const uint4*>(scale + scale_row + c));
                sw[0] = s.x;
                sw[1] = s.y;
                sw[2] = s.z;
                sw[3] = s.w;
            } else {
                const u32 e = __ldg(scale + scale_row + c / LPM_MXFP8_BLOCK);
                sw[0] = sw[1] = sw[2] = sw[3] = e * 0x01010101u;
            }
            float4* dst = reinterpret_cast<float4*>(out + row * k + c);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float4 v;
                v.x = dequant_elem<FMT>(dw[q] & 0xFFu, sw[q] & 0xFFu);
                v.y = dequant_elem<FMT>((dw[q] >> 8) & 0xFFu, (sw[q] >> 8) & 0xFFu);
                v.z = dequant_elem<FMT>((dw[q] >> 16) & 0xFFu, (sw[q] >> 16) & 0xFFu);
                v.w = dequant_elem<FMT>(dw[q] >> 24, sw[q] >> 24);
                dst[q] = v;
            }
        }
    }
}

}  // namespace lpm_mx

#endif  // LPM_MXFP8_IMPL_CUH
