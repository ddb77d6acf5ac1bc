// MXFP8 device code, part of mxfp8_impl.cuh (design notes there): the launch-time constants and
// flag bits shared with lowprec_moe/backends/cupy/mxfp8.py, input kinds and fp8 formats, small integer
// helpers, the MXFP8 scale rule, and the fp32 <-> fp8 conversions.
#ifndef LPM_MXFP8_FORMATS_CUH
#define LPM_MXFP8_FORMATS_CUH

#include "lpm_formats.cuh"

// ------------------------------------------------------------------------------------------
// Launch-time constants shared with lowprec_moe/backends/cupy/mxfp8.py

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

}  // namespace lpm_mx

#endif  // LPM_MXFP8_FORMATS_CUH
