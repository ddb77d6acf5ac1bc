// NVFP4 device code, part of nvfp4_common.cuh (design notes there): the dtype and quantizer-flag
// macros, LPM_DEV, and the non-flushing scalar helpers (abs / max / saturating PTX, packed
// 16-bit maxima, float64 <-> bf16, E4M3 scale bytes, encode scale and block-scale formula).
#ifndef LPM_NVFP4_SCALAR_CUH
#define LPM_NVFP4_SCALAR_CUH

#include "lpm_formats.cuh"

#define LPM_DT_F32 0
#define LPM_DT_F16 1
#define LPM_DT_BF16 2

// quantizer flags (keep in sync with lowprec_moe/backends/cupy/nvfp4.py)
#define LPM_Q_ROWWISE 1
#define LPM_Q_COLWISE 2
#define LPM_Q_ROW_SCALED 4
#define LPM_Q_BLOCK2D 8
#define LPM_Q_RHT 16
#define LPM_Q_SR 32

#define LPM_DEV static __device__ __forceinline__

// ==========================================================================================
// Scalar helpers (non-flushing)
// ==========================================================================================

// |x| as abs.f32 without .ftz (ptxas folds it into the operand of FMUL / FMNMX).
LPM_DEV float q_abs(float x) {
    float r;
    asm("abs.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// max that propagates NaN (used to detect a NaN in a block for free).
LPM_DEV float q_max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

LPM_DEV float q_mul_sat(float a, float b) {
    float r;
    asm("mul.rn.sat.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

LPM_DEV float q_fma_sat(float a, float b, float c) {
    float r;
    asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
}

// (hi << 4) | (lo >> 28): funnel shift that collects sign nibbles.
LPM_DEV unsigned int q_funnel4(unsigned int hi, unsigned int lo) {
    unsigned int r;
    asm("shf.l.wrap.b32 %0, %1, %2, 4;" : "=r"(r) : "r"(lo), "r"(hi));
    return r;
}

LPM_DEV unsigned int q_prmt(unsigned int a, unsigned int b, unsigned int sel) {
    unsigned int r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// Per 16-bit lane: max(|a|, |b|), NaN if either is NaN (sign bit = xor of the signs: mask it).
// Exact (no rounding, subnormals kept). Before sm_86: the integer max of the magnitudes, which is
// the same value and still a NaN pattern (> inf) when either lane is NaN.
LPM_DEV unsigned int q_hmax2_int(unsigned int a, unsigned int b) {
    const unsigned int la = a & 0x7FFFu, lb = b & 0x7FFFu;
    const unsigned int ha = (a >> 16) & 0x7FFFu, hb = (b >> 16) & 0x7FFFu;
    return (la > lb ? la : lb) | ((ha > hb ? ha : hb) << 16);
}

LPM_DEV unsigned int q_hmax2_bf16(unsigned int a, unsigned int b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
    unsigned int r;
    asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return q_hmax2_int(a, b);
#endif
}

LPM_DEV unsigned int q_hmax2_f16(unsigned int a, unsigned int b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
    unsigned int r;
    asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return q_hmax2_int(a, b);
#endif
}

LPM_DEV double q_f32_to_f64(float x) {
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(x));
    return r;
}

LPM_DEV float q_f64_to_f32(double x) {
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(x));
    return r;
}

// float64 -> bfloat16 bits, one round to nearest even (subnormals kept, overflow to inf).
LPM_DEV unsigned int q_f64_to_bf16_bits(double x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned short r;
    asm("cvt.rn.bf16.f64 %0, %1;" : "=h"(r) : "d"(x));
    return (unsigned int)r;
#else
    const unsigned long long u = (unsigned long long)__double_as_longlong(x);
    const unsigned int sign = (unsigned int)(u >> 48) & 0x8000u;
    const unsigned long long a = u & 0x7FFFFFFFFFFFFFFFull;
    if (a > 0x7FF0000000000000ull) return sign | 0x7FC0u;  // NaN
    const int e = (int)(a >> 52) - 1023;                    // unbiased exponent (a != 0 below)
    if (a == 0ull) return sign;
    if (e >= 128) return sign | 0x7F80u;                    // >= 2^128: inf
    if (e >= -126) {
        // rebias to bf16 and keep 7 mantissa bits (RNE); a carry may reach the exponent (inf).
        const unsigned long long r = a - ((unsigned long long)(1023 - 127) << 52);
        unsigned long long q = r >> 45;
        const unsigned long long rem = r & ((1ull << 45) - 1ull);
        const unsigned long long half = 1ull << 44;
        if (rem > half || (rem == half && (q & 1ull))) ++q;
        return sign | (unsigned int)q;
    }
    // bf16 subnormal: units of 2^-133
    const unsigned long long sig = (a & 0xFFFFFFFFFFFFFull) | (e > -1023 ? (1ull << 52) : 0ull);
    const int sh = -81 - (e > -1023 ? e : -1022);  // value = sig * 2^(e-52); /2^-133
    if (sh > 63) return sign;
    unsigned long long q = sig >> sh;
    const unsigned long long rem = sig & ((1ull << sh) - 1ull);
    const unsigned long long half = 1ull << (sh - 1);
    if (rem > half || (rem == half && (q & 1ull))) ++q;
    return sign | (unsigned int)q;
#endif
}

LPM_DEV float q_bf16_bits_to_f32(unsigned int b) { return __uint_as_float(b << 16); }

// finite fp32 -> bfloat16 bits, one round to nearest even on the bits (subnormals kept,
// overflow to inf), as the reference rounds.
LPM_DEV unsigned int q_f32_to_bf16_bits(float x) { return (unsigned int)lpm_f32_to_bf16_bits_rn(x); }

// Round-to-nearest add / subtract of float or double (never contracted into an FMA).
LPM_DEV float q_add_rn(float a, float b) { return lpm_add_rn(a, b); }
LPM_DEV float q_sub_rn(float a, float b) { return lpm_sub_rn(a, b); }
LPM_DEV double q_add_rn(double a, double b) { return __dadd_rn(a, b); }
LPM_DEV double q_sub_rn(double a, double b) { return __dsub_rn(a, b); }

// fp32 (finite, >= 0) -> E4M3 byte, round to nearest even, satfinite (>= 448 -> 0x7E).
LPM_DEV unsigned int q_e4m3_from_f32(float s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(LPM_NVFP4_INTEGER_E4M3)
    // value of the second operand lands in the low byte. fp32 subnormal inputs (even if the
    // hardware flushed them) give 0 either way: they are far below half the E4M3 minimum.
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(s));
    return (unsigned int)r & 0xFFu;
#else
    const unsigned int b = __float_as_uint(s);
    if (b >= 0x43E00000u) return 0x7Eu;  // >= 448
    if (b >= 0x3C800000u) {              // >= 2^-6: normal E4M3
        const unsigned int r = b - (120u << 23);
        unsigned int q = r >> 20;
        const unsigned int rem = r & 0xFFFFFu;
        if (rem > 0x80000u || (rem == 0x80000u && (q & 1u))) ++q;
        return q;
    }
    const unsigned int E = b >> 23;
    const unsigned int M = (b & 0x7FFFFFu) | (E ? 0x800000u : 0u);
    const int sh = 141 - (int)(E ? E : 1u);  // s * 2^9 = M * 2^-(sh)
    if (sh > 24) return 0u;
    unsigned int q = M >> sh;
    const unsigned int rem = M & ((1u << sh) - 1u);
    const unsigned int half = 1u << (sh - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return q;
#endif
}

// E4M3 byte -> fp32 (exact; 0x7F / 0xFF are NaN).
LPM_DEV float q_e4m3_to_f32(unsigned int c) {
    const unsigned int sign = (c & 0x80u) << 24;
    const unsigned int e = (c >> 3) & 0xFu, m = c & 7u;
    if (e == 0xFu && m == 7u) return __uint_as_float(0x7FC00000u);
    if (e != 0u) return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
    if (m == 0u) return __uint_as_float(sign);
    const int p = 31 - __clz((int)m);  // 0..2
    return __uint_as_float(sign | ((unsigned int)(p + 118) << 23) | ((m << (23 - p)) & 0x7FFFFFu));
}

// S_enc = 2688 / amax, min FLT_MAX, 1 when amax == 0 or S_enc == 0 (amax >= 0, not NaN).
LPM_DEV float q_encode_scale(float amax) {
    float s = lpm_div_rn(LPM_NVFP4_AMAX_DIVISOR, amax);
    s = lpm_fmin(s, LPM_FLT_MAX);
    if ((__float_as_uint(amax) & 0x7FFFFFFFu) == 0u || (__float_as_uint(s) & 0x7FFFFFFFu) == 0u)
        s = 1.0f;
    return s;
}

// S_enc * fp32(1/6): the factor of the block-scale formula.
LPM_DEV float q_k6(float s_enc) {
    return lpm_mul_rn(s_enc, __uint_as_float(LPM_FP32_ONE_SIXTH_BITS));
}

// enc = min(1 / (float(scale) * S_dec), FLT_MAX)
LPM_DEV float q_enc(unsigned int scale8, float s_dec) {
    return lpm_fmin(lpm_rcp_rn(lpm_mul_rn(q_e4m3_to_f32(scale8), s_dec)), LPM_FLT_MAX);
}

// scale byte of a block from its amax: E4M3(min(bamax * k6, FLT_MAX)).
LPM_DEV unsigned int q_block_scale(float bamax, float k6) {
    return q_e4m3_from_f32(lpm_fmin(lpm_mul_rn(bamax, k6), LPM_FLT_MAX));
}

#endif  // LPM_NVFP4_SCALAR_CUH
