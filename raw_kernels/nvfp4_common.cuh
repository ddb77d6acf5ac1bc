// NVFP4 device code shared by nvfp4.cu and nvfp4_ext.cu (SPEC section 2): global amax,
// quantize (rowwise and columnwise in one pass, 1-D or 16x16 blocks, per-tensor or row-scaled, RHT
// on the columnwise copy, stochastic rounding) and dequantize, for single tensors and for all
// members of a GroupedTensor in one launch. Results are bit-identical to
// lowprec_moe/reference/nvfp4.py.
//
// Bit-exactness under CuPy's -ftz=true: every fp32 operation on the exact path is inline PTX
// without .ftz (lpm_formats.cuh and the helpers below) or integer bit manipulation, and every
// float comparison that matters is made on bit patterns.
//
// Elements -> E2M1, fast path. For a = |x * enc| (not NaN) the E2M1 code is
//     code = RNE(g(a)),   g(a) = 4*sat(a/2) + 2*sat(a/2 - 1) + sat(a/2 - 2)
// (g = 2a on [0,2], a+2 on [2,4], a/2+4 on [4,6], 7 above 6; g is integral exactly at the grid
// points, the integer has the parity of the E2M1 code, so ties-to-even on g is ties-to-even on
// the grid). The saturated terms are FMUL.SAT / FFMA.SAT, exact wherever they are not clamped;
// they are added onto the magic constant 2^23 by three FFMAs. For any a at most one term lies
// strictly between 0 and 1 and only that FFMA rounds, once, to an integer: bits(t) - 0x4B000000
// is the code. Blocks holding a NaN take an exact compare-chain path (.sat maps NaN to 0).
//
// Quantizer tiling: one CTA of 128 threads per 64-row x 256-byte tile of one member (128 columns
// of a 16-bit input, 64 of fp32). Each thread loads whole 16-element row blocks with 16-byte
// loads and quantizes them rowwise from registers; the tile also goes to shared memory (16-byte
// chunks XOR-swizzled), from which each thread reads 16 rows x 8 bytes for the columnwise blocks.
// x is read from global memory once for both directions.
#ifndef LPM_NVFP4_COMMON_CUH
#define LPM_NVFP4_COMMON_CUH

#include "lpm_formats.cuh"

#define LPM_DT_F32 0
#define LPM_DT_F16 1
#define LPM_DT_BF16 2

// quantizer flags (keep in sync with lowprec_moe/cuda/nvfp4.py)
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

// ==========================================================================================
// Element codes
// ==========================================================================================

// Exact E2M1 code of y (RNE, satfinite, sign kept on zero, NaN -> 7), by comparisons on bits.
LPM_DEV unsigned int q_e2m1_exact(float y) {
    const unsigned int u = __float_as_uint(y), a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return LPM_E2M1_MAX_CODE;
    const unsigned int c = (unsigned int)(a > 0x3E800000u) + (unsigned int)(a >= 0x3F400000u) +
                           (unsigned int)(a > 0x3FA00000u) + (unsigned int)(a >= 0x3FE00000u) +
                           (unsigned int)(a > 0x40200000u) + (unsigned int)(a >= 0x40600000u) +
                           (unsigned int)(a > 0x40A00000u);
    return c | ((u >> 28) & LPM_E2M1_SIGN_BIT);
}

// Stochastically rounded E2M1 code of y with random word r (SPEC 2.4).
LPM_DEV unsigned int q_e2m1_sr(float y, unsigned int r) {
    const unsigned int u = __float_as_uint(y), ab = u & 0x7FFFFFFFu;
    if (ab > 0x7F800000u) return LPM_E2M1_MAX_CODE;
    const float a = __uint_as_float(ab);
    const float uu = lpm_mul_rn((float)(r & 0xFFu), 0.00390625f);  // (r & 0xFF) / 256, exact
    const float st = ab < 0x40000000u ? 0.5f : (ab < 0x40800000u ? 1.0f : 2.0f);
    const float t = lpm_add_rn(a, lpm_mul_rn(uu, st));
    const unsigned int tb = __float_as_uint(t);
    // min(floor(t / step(t)) * step(t), 6) as a code: number of thresholds <= t
    const unsigned int c = (unsigned int)(tb >= 0x3F000000u) + (unsigned int)(tb >= 0x3F800000u) +
                           (unsigned int)(tb >= 0x3FC00000u) + (unsigned int)(tb >= 0x40000000u) +
                           (unsigned int)(tb >= 0x40400000u) + (unsigned int)(tb >= 0x40800000u) +
                           (unsigned int)(tb >= 0x40C00000u);
    return c | ((u >> 28) & LPM_E2M1_SIGN_BIT);
}

// Codes (without sign bits) of 8 elements, element 0 in the low nibble: fast path (no NaN among
// v[0..7]).
// Horner sum over j of 16^j * bits(t_j), bits(t_j) = 0x4B000000 + m_j + code_j (mod 2^32): the
// magic constants sum to 0xFB000000 + 80 * 16^5 = 2^32, so no correction is needed. m_5 = 80 is
// even, so ties-to-even on m_5 + g is ties-to-even on g.
LPM_DEV unsigned int q_codes8_fast(const float* v, float enc) {
    unsigned int p = 0u;
#pragma unroll
    for (int j = 7; j >= 0; --j) {
        const float a = lpm_mul_rn(q_abs(v[j]), enc);
        const float s1 = q_mul_sat(a, 0.5f);
        const float s2 = q_fma_sat(a, 0.5f, -1.0f);
        const float s3 = q_fma_sat(a, 0.5f, -2.0f);
        float t = lpm_fma_rn(s1, 4.0f, j == 5 ? 8388688.0f : 8388608.0f);  // 2^23 (+ 80)
        t = lpm_fma_rn(s2, 2.0f, t);
        t = lpm_add_rn(t, s3);
        p = p * 16u + __float_as_uint(t);  // Horner: nibble j = code_j once the constants cancel
    }
    return p;
}

// Sign bits of 8 elements at bit 4j+3 (funnel shifts of the top nibbles, any layout).
LPM_DEV unsigned int q_signs8_funnel(const float* v) {
    unsigned int sg = 0u;
#pragma unroll
    for (int j = 7; j >= 0; --j) sg = q_funnel4(sg, __float_as_uint(v[j]));
    return sg & 0x88888888u;
}

// Sign bits of 8 16-bit elements held as 4 words (element 2i low half, 2i+1 high half of w[i]),
// at bit 4j+3, by byte permutes of the high bytes.
LPM_DEV unsigned int q_signs8_words(unsigned int w0, unsigned int w1, unsigned int w2,
                                    unsigned int w3) {
    const unsigned int e01 = q_prmt(w0, w1, 0x7351u);   // high bytes of e0, e2, e1, e3
    const unsigned int e45 = q_prmt(w2, w3, 0x7351u);   // e4, e6, e5, e7
    const unsigned int ev = q_prmt(e01, e45, 0xDC98u);  // e0 e2 e4 e6, sign-replicated bytes
    const unsigned int od = q_prmt(e01, e45, 0xFEBAu);  // e1 e3 e5 e7
    return (ev & 0x08080808u) | (od & 0x80808080u);
}

// Exact path for blocks holding a NaN (rare): out of line, values passed by value so the caller's
// arrays stay in registers.
static __device__ __noinline__ unsigned int q_pack8_exact(float v0, float v1, float v2, float v3,
                                                          float v4, float v5, float v6, float v7,
                                                          float enc) {
    const float v[8] = {v0, v1, v2, v3, v4, v5, v6, v7};
    unsigned int p = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j) p |= q_e2m1_exact(lpm_mul_rn(v[j], enc)) << (4 * j);
    return p;
}

// (out of line: stochastic rounding is not on the fast path)
static __device__ __noinline__ unsigned int q_pack8_sr(const float* v, float enc,
                                                       unsigned long long seed,
                                                       unsigned long long idx0, unsigned int dir,
                                                       unsigned int member) {
    unsigned int p = 0u;
#pragma unroll 1
    for (int j = 0; j < 8; ++j) {
        const unsigned int r = lpm_sr_random_word(seed, idx0 + (unsigned long long)j, dir, member);
        p |= q_e2m1_sr(lpm_mul_rn(v[j], enc), r) << (4 * j);
    }
    return p;
}

// NaN-ignoring amax of 16 values, from 0.
LPM_DEV float q_amax16(const float (&v)[16]) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) m = lpm_fmax(m, q_abs(v[i]));
    return m;
}

// Packed codes of one block of 16 values, given enc. has_nan: the block holds a NaN (exact
// element path). w: the 8 input words of the block when the signs can be gathered from them
// (16-bit rowwise blocks), else nullptr.
template <bool SR>
LPM_DEV uint2 q_block16(const float (&v)[16], const unsigned int* w, bool has_nan, float enc,
                        unsigned long long seed, unsigned long long idx0, unsigned int dir,
                        unsigned int member) {
    uint2 packed;
    if (SR) {
        packed.x = q_pack8_sr(v, enc, seed, idx0, dir, member);
        packed.y = q_pack8_sr(v + 8, enc, seed, idx0 + 8ull, dir, member);
    } else if (has_nan) {
        packed.x = q_pack8_exact(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], enc);
        packed.y = q_pack8_exact(v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15], enc);
    } else if (w != nullptr) {
        packed.x = q_codes8_fast(v, enc) | q_signs8_words(w[0], w[1], w[2], w[3]);
        packed.y = q_codes8_fast(v + 8, enc) | q_signs8_words(w[4], w[5], w[6], w[7]);
    } else {
        packed.x = q_codes8_fast(v, enc) | q_signs8_funnel(v);
        packed.y = q_codes8_fast(v + 8, enc) | q_signs8_funnel(v + 8);
    }
    return packed;
}

// ==========================================================================================
// Random Hadamard transform of a 16-value chunk (SPEC 2.3)
// ==========================================================================================

// The reference's ordered float64 sum (i = 0..15, from +0), rounded once to bf16. Out of line:
// only chunks with an exponent spread too wide for an exact sum, or with inf / NaN, get here.
static __device__ __noinline__ void q_rht16_ordered(float* v) {
    double x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = q_f32_to_f64(v[i]);
#pragma unroll 1
    for (int j = 0; j < 16; ++j) {
        double acc = 0.0;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const unsigned int neg = ((LPM_RHT_SIGN_MASK >> i) & 1u) ^ (__popc(i & j) & 1u);
            acc = __fma_rn(x[i], neg ? -0.25 : 0.25, acc);
        }
        v[j] = q_bf16_bits_to_f32(q_f64_to_bf16_bits(acc));
    }
}

// In place: v <- bf16(sum_i v_i * s_i * H[i][j] / 4) as fp32, float64 ordered sum rounded once.
// When every partial sum is exact in float64 (exponent spread of the nonzero finite inputs
// <= 49 - PREC, PREC = significant bits of the input format) any summation order gives the exact
// sum, so a 4-stage butterfly is used; otherwise (or with inf / NaN) the ordered sum i = 0..15 of
// the reference is replayed.
template <int PREC>
LPM_DEV void q_rht16(float (&v)[16]) {
    int emax = 0, emin = 255;
    bool special = false;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const unsigned int b = __float_as_uint(v[i]) & 0x7FFFFFFFu;
        int e = (int)(b >> 23);
        if (e == 255) special = true;
        e = e == 0 ? 1 : e;
        if (b != 0u) {
            emax = e > emax ? e : emax;
            emin = e < emin ? e : emin;
        }
    }
    if (!special && emax - emin <= 49 - PREC) {
        double d[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const double x = q_f32_to_f64(v[i]);
            d[i] = ((LPM_RHT_SIGN_MASK >> i) & 1u) ? -x : x;
        }
#pragma unroll
        for (int h = 1; h < 16; h <<= 1) {
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                if ((i & h) == 0) {
                    const double a = d[i], b = d[i + h];
                    d[i] = __dadd_rn(a, b);
                    d[i + h] = __dsub_rn(a, b);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 16; ++j)  // * 1/4 (exact) + 0.0 (turns an exact zero into +0)
            v[j] = q_bf16_bits_to_f32(q_f64_to_bf16_bits(__fma_rn(d[j], 0.25, 0.0)));
    } else {
        q_rht16_ordered(v);
    }
}

// Inverse transform for dequantization: v_i <- f32(s_i / 4 * sum_j H[i][j] w_j), float64.
LPM_DEV void q_rht16_inverse(float (&v)[16]) {
    double d[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) d[i] = q_f32_to_f64(v[i]);
#pragma unroll
    for (int h = 1; h < 16; h <<= 1) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            if ((i & h) == 0) {
                const double a = d[i], b = d[i + h];
                d[i] = __dadd_rn(a, b);
                d[i + h] = __dsub_rn(a, b);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 16; ++i)
        v[i] = q_f64_to_f32(__fma_rn(d[i], ((LPM_RHT_SIGN_MASK >> i) & 1u) ? -0.25 : 0.25, 0.0));
}

// ==========================================================================================
// Input formats and tiles
// ==========================================================================================

constexpr int Q_THREADS = 128;   // threads per quantizer / tile-amax CTA
constexpr int Q_TM = 64;         // tile rows
constexpr int Q_ROW_BYTES = 256; // tile row bytes (16 chunks of 16 bytes)

template <int DT>
struct QCfg {
    static constexpr int BYTES = DT == LPM_DT_F32 ? 4 : 2;
    static constexpr int PREC = DT == LPM_DT_F32 ? 24 : (DT == LPM_DT_F16 ? 11 : 8);
    static constexpr int EPC = 16 / BYTES;                // elements per 16-byte chunk
    static constexpr int TK = Q_ROW_BYTES / BYTES;        // tile columns: 128 or 64
    static constexpr int CPB = 16 / EPC;                  // chunks per 16-element block
    static constexpr int BPR = TK / 16;                   // blocks per tile row: 8 or 4
    static constexpr int RB = Q_TM * BPR / Q_THREADS;     // row blocks per thread: 4 or 2
    static constexpr int WPB = 16 * BYTES / 4;            // 32-bit words per block: 8 or 16
    static constexpr int CPU = 8 / BYTES;                 // columns per column unit: 4 or 2
    static constexpr int LPG = 16 / CPU;                  // lanes per 16-column group: 4 or 8
};

// element e of a word (16-bit formats: e = 0 low half, 1 high half), exact fp32.
template <int DT>
LPM_DEV float q_word_elem(unsigned int w, int e) {
    if (DT == LPM_DT_BF16) return __uint_as_float(e ? (w & 0xFFFF0000u) : (w << 16));
    if (DT == LPM_DT_F16) return lpm_f16_bits_to_f32((unsigned short)(e ? (w >> 16) : (w & 0xFFFFu)));
    return __uint_as_float(w);
}

template <int DT>
LPM_DEV void q_unpack_block(const unsigned int (&w)[QCfg<DT>::WPB], float (&v)[16]) {
#pragma unroll
    for (int e = 0; e < 16; ++e) {
        if (QCfg<DT>::BYTES == 2) v[e] = q_word_elem<DT>(w[e >> 1], e & 1);
        else v[e] = q_word_elem<DT>(w[e], 0);
    }
}

// swizzled byte offset of (row, 16-byte chunk c) in the shared tile (conflict-free stores of the
// row-block layout and loads of the column layout).
LPM_DEV int q_smem_off(int row, int chunk) {
    return row * Q_ROW_BYTES + ((chunk ^ ((chunk >> 3) & 1)) << 4);
}

struct QTile {
    int g;               // member (0 for a single tensor)
    long long M;         // member rows
    long long Mp;        // member rows rounded up to 16
    long long row_base;  // first row of the member in x and in the rowwise outputs
    long long cw_rows;   // sum of Mp over the previous members (columnwise offsets)
    long long row0;      // first member row of the tile
    long long k0;        // first column of the tile
};

LPM_DEV QTile q_tile_rc(long long rt, int ct, long long M_single, const long long* __restrict__ meta,
                        int G, int tile_rows, int tile_cols);

// Tile number `tile` (row tiles x n_ct column tiles). G == 0: a single tensor of M_single rows.
// Otherwise meta (int64) holds
// [row offsets (G+1) | columnwise padded-row prefix (G+1) | row-tile prefix (G+1)].
LPM_DEV QTile q_tile_at(long long tile, long long M_single, const long long* __restrict__ meta,
                        int G, int n_ct, int tile_rows, int tile_cols) {
    long long rt;
    int ct;
    if (tile <= 0x7FFFFFFFll) {  // (always, in practice: a 32-bit division)
        const unsigned int q = (unsigned int)tile / (unsigned int)n_ct;
        rt = (long long)q;
        ct = (int)((unsigned int)tile - q * (unsigned int)n_ct);
    } else {
        rt = tile / n_ct;
        ct = (int)(tile - rt * n_ct);
    }
    return q_tile_rc(rt, ct, M_single, meta, G, tile_rows, tile_cols);
}

// Tile (row tile rt, column tile ct); G, meta as q_tile_at.
LPM_DEV QTile q_tile_rc(long long rt, int ct, long long M_single, const long long* __restrict__ meta,
                        int G, int tile_rows, int tile_cols) {
    QTile t;
    t.k0 = (long long)ct * tile_cols;
    if (G == 0) {
        t.g = 0;
        t.M = M_single;
        t.row_base = 0;
        t.cw_rows = 0;
        t.row0 = rt * tile_rows;
    } else {
        const long long* off = meta;
        const long long* cwp = meta + (G + 1);
        const long long* tp = meta + 2 * (G + 1);
        int lo = 0, hi = G - 1;  // largest g with tp[g] <= rt
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (tp[mid] <= rt) lo = mid;
            else hi = mid - 1;
        }
        t.g = lo;
        t.row0 = (rt - tp[lo]) * tile_rows;
        t.row_base = off[lo];
        t.M = off[lo + 1] - off[lo];
        t.cw_rows = cwp[lo];
    }
    t.Mp = (t.M + 15) & ~15ll;
    return t;
}

// Tile of this CTA. `reverse`: CTA 0 takes the last tile (the quantizer runs right after the amax
// pass, which ends by reading the end of x: that part is still in L2).
LPM_DEV QTile q_resolve_tile(long long M_single, const long long* __restrict__ meta, int G,
                             int n_ct, int tile_rows, int tile_cols, bool reverse = false) {
    const long long tile = reverse ? (long long)gridDim.x - 1 - (long long)blockIdx.x
                                   : (long long)blockIdx.x;
    return q_tile_at(tile, M_single, meta, G, n_ct, tile_rows, tile_cols);
}

// Load this thread's row blocks of the tile (zeros outside the member / matrix) and, when
// `to_smem`, store the whole tile into shared memory.
template <int DT>
LPM_DEV void q_load_tile(const unsigned char* __restrict__ x, long long K, const QTile& ti,
                         unsigned int (&rw)[QCfg<DT>::RB][QCfg<DT>::WPB], unsigned char* s_tile,
                         bool to_smem) {
    typedef QCfg<DT> C;
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < C::RB; ++i) {
        const int b = tid + i * Q_THREADS;
        const int r = b / C::BPR, cb = b % C::BPR;
        const long long m = ti.row0 + r;
        const long long kb = ti.k0 + cb * 16;
        const bool valid = m < ti.M && kb < K;
        const uint4* src = reinterpret_cast<const uint4*>(
            x + ((ti.row_base + m) * K + kb) * (long long)C::BYTES);
#pragma unroll
        for (int q = 0; q < C::CPB; ++q) {
            uint4 c = make_uint4(0u, 0u, 0u, 0u);
            if (valid) c = __ldg(src + q);
            rw[i][4 * q + 0] = c.x;
            rw[i][4 * q + 1] = c.y;
            rw[i][4 * q + 2] = c.z;
            rw[i][4 * q + 3] = c.w;
        }
    }
    if (to_smem) {
#pragma unroll
        for (int i = 0; i < C::RB; ++i) {
            const int b = tid + i * Q_THREADS;
            const int r = b / C::BPR, cb = b % C::BPR;
#pragma unroll
            for (int q = 0; q < C::CPB; ++q) {
                *reinterpret_cast<uint4*>(s_tile + q_smem_off(r, cb * C::CPB + q)) =
                    make_uint4(rw[i][4 * q + 0], rw[i][4 * q + 1], rw[i][4 * q + 2], rw[i][4 * q + 3]);
            }
        }
    }
}

// Column unit of this thread: rows 16*rc .. 16*rc+15 of the tile, 8 bytes (CPU columns) at
// column group cg; cw[i] = the two words of row 16*rc + i.
template <int DT>
LPM_DEV void q_read_cols(const unsigned char* s_tile, int rc, int cg, unsigned int (&cw)[16][2]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const uint2 w = *reinterpret_cast<const uint2*>(
            s_tile + q_smem_off(rc * 16 + i, cg >> 1) + ((cg & 1) << 3));
        cw[i][0] = w.x;
        cw[i][1] = w.y;
    }
}

// column j (0 .. CPU-1) of a column unit as 16 fp32 values.
template <int DT>
LPM_DEV void q_col_values(const unsigned int (&cw)[16][2], int j, float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        if (QCfg<DT>::BYTES == 2) v[i] = q_word_elem<DT>(cw[i][j >> 1], j & 1);
        else v[i] = q_word_elem<DT>(cw[i][j], 0);
    }
}

LPM_DEV unsigned int q_warp_max_u32(unsigned int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

// max over the CTA (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
LPM_DEV unsigned int q_block_max_u32(unsigned int v, unsigned int* s_red) {
    v = q_warp_max_u32(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // s_red may still be read from a previous call
    if (lane == 0) s_red[warp] = v;
    __syncthreads();
    unsigned int r = 0u;
    const int nw = blockDim.x >> 5;
    for (int w = 0; w < nw; ++w) r = max(r, s_red[w]);
    return r;
}

// Block maxima of 16-bit inputs on packed words (two lanes per instruction).
template <int DT>
LPM_DEV unsigned int q_hmax2(unsigned int a, unsigned int b) {
    return DT == LPM_DT_BF16 ? q_hmax2_bf16(a, b) : q_hmax2_f16(a, b);
}

// 16-bit magnitude pattern (sign cleared) -> fp32 value (NaN pattern -> NaN).
template <int DT>
LPM_DEV float q_lane_to_f32(unsigned int lane) {
    if (DT == LPM_DT_BF16) return __uint_as_float(lane << 16);
    return lpm_f16_bits_to_f32((unsigned short)lane);
}

// max |x| of a 16-element row block held as 8 words; NaN if the block holds a NaN.
template <int DT>
LPM_DEV float q_block_max_words(const unsigned int* w) {
    unsigned int a = q_hmax2<DT>(q_hmax2<DT>(q_hmax2<DT>(w[0], w[1]), q_hmax2<DT>(w[2], w[3])),
                                 q_hmax2<DT>(q_hmax2<DT>(w[4], w[5]), q_hmax2<DT>(w[6], w[7])));
    a = q_hmax2<DT>(a, q_prmt(a, a, 0x1032u));  // fold the high lane onto the low one
    return q_lane_to_f32<DT>(a & 0x7FFFu);
}

// ==========================================================================================
// Encode tables (per-tensor scaling)
// ==========================================================================================

// Per member g and direction d (0: rowwise amax, 1: columnwise amax), Q_TAB_STRIDE floats at
// tabs + (2g + d) * Q_TAB_STRIDE: enc[c] = min(1 / (float(c) * S_dec), FLT_MAX) for every E4M3
// byte c < 128, then k6 = S_enc * fp32(1/6). Built once by the last CTA of the amax kernel, read
// by every quantizer CTA of the member.
constexpr int Q_TAB_STRIDE = 132;

LPM_DEV void q_build_tables(const unsigned int* amax_row, const unsigned int* amax_col, int G,
                            float* __restrict__ tabs) {
    const int per_member = 2 * 129;
    for (int idx = threadIdx.x; idx < G * per_member; idx += blockDim.x) {
        const int g = idx / per_member;
        const int rem = idx - g * per_member;
        const int d = rem / 129, c = rem - d * 129;
        const unsigned int ab = __ldcg((d ? amax_col : amax_row) + g);  // L2: written by atomics
        const float se = q_encode_scale(__uint_as_float(ab));
        float* t = tabs + (long long)(2 * g + d) * Q_TAB_STRIDE;
        if (c == 128) t[128] = q_k6(se);
        else t[c] = q_enc((unsigned int)c, lpm_rcp_rn(se));
    }
}

// Whether this CTA is the last of the grid to get here (after its amax atomics).
LPM_DEV bool q_last_cta(unsigned int* counter) {
    __shared__ unsigned int s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int total = gridDim.x * gridDim.y;
        s_last = atomicAdd(counter, 1u) == total - 1u ? 1u : 0u;
    }
    __syncthreads();
    const bool last = s_last != 0u;
    if (last) __threadfence();
    return last;
}

// ==========================================================================================
// Kernel: per-tensor amax (one value per member), grid (X, max(G, 1)); the last CTA builds the
// encode tables of every member.
// ==========================================================================================

template <int DT>
LPM_DEV void amax_tensor_impl(const unsigned char* __restrict__ x, long long K, long long M_single,
                              const long long* __restrict__ row_off, int G,
                              unsigned int* __restrict__ amax, unsigned int* __restrict__ counter,
                              float* __restrict__ tabs) {
    typedef QCfg<DT> C;
    __shared__ unsigned int s_red[32];
    const int g = (int)blockIdx.y;
    long long r0 = 0, r1 = M_single;
    if (G > 0) {
        r0 = row_off[g];
        r1 = row_off[g + 1];
    }
    const long long nchunks = (r1 - r0) * K / C::EPC;
    const uint4* base = reinterpret_cast<const uint4*>(x + r0 * K * (long long)C::BYTES);
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    for (; i + 3 * stride < nchunks; i += 4 * stride) {
        uint4 c[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) c[u] = __ldg(base + i + u * stride);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned int w[4] = {c[u].x, c[u].y, c[u].z, c[u].w};
#pragma unroll
            for (int e = 0; e < C::EPC; ++e) {
                const float v = C::BYTES == 2 ? q_word_elem<DT>(w[e >> 1], e & 1) : q_word_elem<DT>(w[e], 0);
                acc = lpm_fmax(acc, q_abs(v));
            }
        }
    }
    for (; i < nchunks; i += stride) {
        const uint4 c = __ldg(base + i);
        const unsigned int w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
        for (int e = 0; e < C::EPC; ++e) {
            const float v = C::BYTES == 2 ? q_word_elem<DT>(w[e >> 1], e & 1) : q_word_elem<DT>(w[e], 0);
            acc = lpm_fmax(acc, q_abs(v));
        }
    }
    // acc is a non-negative, non-NaN float: its bits order like its values
    const unsigned int r = q_block_max_u32(__float_as_uint(acc), s_red);
    if (threadIdx.x == 0 && r != 0u) atomicMax(amax + g, r);
    if (q_last_cta(counter)) q_build_tables(amax, amax, G > 0 ? G : 1, tabs);
}

// ==========================================================================================
// Kernel: tiled amax for row-scaled (per row + per column) and RHT (plain + transformed)
// ==========================================================================================

// flags: LPM_Q_ROW_SCALED -> out_row[row_base + m] = max_k |x|, out_col[g*K + k] = max_m |x|.
//        LPM_Q_RHT        -> out_row[g] = max |x|, out_col[g] = max |RHT(x^T)| (chunks padded
//                            with zero rows up to Mp); the last CTA builds the encode tables
//                            (n_members of them: G, or 1 for a single tensor).
template <int DT>
LPM_DEV void amax_tiles_impl(const unsigned char* __restrict__ x, long long K, long long M_single,
                             const long long* __restrict__ meta, int G, int n_ct, int flags,
                             unsigned int* __restrict__ out_row, unsigned int* __restrict__ out_col,
                             unsigned int* __restrict__ counter, float* __restrict__ tabs) {
    typedef QCfg<DT> C;
    __shared__ __align__(16) unsigned char s_tile[Q_TM * Q_ROW_BYTES];
    __shared__ unsigned int s_cm[4][C::TK];
    __shared__ unsigned int s_red[32];
    const int tid = threadIdx.x;
    const QTile ti = q_resolve_tile(M_single, meta, G, n_ct, Q_TM, C::TK);
    unsigned int rw[C::RB][C::WPB];
    q_load_tile<DT>(x, K, ti, rw, s_tile, true);
    __syncthreads();
    const int rc = tid >> 5, cg = tid & 31;

    if (flags & LPM_Q_ROW_SCALED) {
        // per row: this thread's blocks, then across the BPR lanes that share the row
#pragma unroll
        for (int i = 0; i < C::RB; ++i) {
            const int b = tid + i * Q_THREADS;
            const int r = b / C::BPR, cb = b % C::BPR;
            float v[16];
            q_unpack_block<DT>(rw[i], v);
            unsigned int m = __float_as_uint(q_amax16(v));
#pragma unroll
            for (int o = 1; o < C::BPR; o <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
            const long long row = ti.row0 + r;
            if (cb == 0 && row < ti.M && m != 0u) atomicMax(out_row + ti.row_base + row, m);
        }
        // per column: 16 rows per thread, then across the 4 row chunks through shared memory
        unsigned int cw[16][2];
        q_read_cols<DT>(s_tile, rc, cg, cw);
#pragma unroll
        for (int j = 0; j < C::CPU; ++j) {
            float v[16];
            q_col_values<DT>(cw, j, v);
            s_cm[rc][cg * C::CPU + j] = __float_as_uint(q_amax16(v));
        }
        __syncthreads();
        for (int c = tid; c < C::TK; c += Q_THREADS) {
            const unsigned int m = max(max(s_cm[0][c], s_cm[1][c]), max(s_cm[2][c], s_cm[3][c]));
            const long long k = ti.k0 + c;
            if (k < K && m != 0u) atomicMax(out_col + (long long)ti.g * K + k, m);
        }
    }
    if (flags & LPM_Q_RHT) {
        float mx = 0.0f;
#pragma unroll
        for (int i = 0; i < C::RB; ++i) {
            float v[16];
            q_unpack_block<DT>(rw[i], v);
            mx = lpm_fmax(mx, q_amax16(v));
        }
        float mt = 0.0f;
        if (ti.row0 + rc * 16 < ti.Mp) {
            unsigned int cw[16][2];
            q_read_cols<DT>(s_tile, rc, cg, cw);
#pragma unroll
            for (int j = 0; j < C::CPU; ++j) {
                float v[16];
                q_col_values<DT>(cw, j, v);
                q_rht16<C::PREC>(v);
                mt = lpm_fmax(mt, q_amax16(v));
            }
        }
        const unsigned int a = q_block_max_u32(__float_as_uint(mx), s_red);
        const unsigned int b = q_block_max_u32(__float_as_uint(mt), s_red);
        if (tid == 0) {
            if (a != 0u) atomicMax(out_row + ti.g, a);
            if (b != 0u) atomicMax(out_col + ti.g, b);
        }
        if (q_last_cta(counter)) q_build_tables(out_row, out_col, G > 0 ? G : 1, tabs);
    }
}

// ==========================================================================================
// Kernel: quantize
// ==========================================================================================

// Per tensor: tabs (built by the amax kernel) holds each member's enc tables and k6 values.
// Row-scaled: amax_row[row_base + m], amax_col[g*K + k]. Outputs: row_data [M_total, K/2],
// row_scale [M_total, K/16]; columnwise data and scales flat, member g at K*cw_rows/2 and
// K*cw_rows/16 bytes, [K, Mp/2] and [K, Mp/16]. Stochastic-rounding member index:
// member_base + g.
template <int DT, bool EXT, bool SR>
LPM_DEV void quantize_phases(const QTile& ti, long long K, int flags, unsigned int member_base,
                             unsigned long long seed, const unsigned int (&rw)[QCfg<DT>::RB][QCfg<DT>::WPB],
                             const unsigned char* s_tile, const float (&s_tamax)[4][8],
                             const float (&s_tab)[2][Q_TAB_STRIDE],
                             const float (&s_rs)[2][Q_TM], const float (&s_cs)[2][128],
                             uint2 (&s_cd)[4][128], unsigned char (&s_csc)[4][128],
                             unsigned char* __restrict__ row_data, unsigned char* __restrict__ row_scale,
                             unsigned char* __restrict__ col_data, unsigned char* __restrict__ col_scale) {
    typedef QCfg<DT> C;
    const int tid = threadIdx.x;
    const bool row_scaled = (flags & LPM_Q_ROW_SCALED) != 0;
    const bool block2d = (flags & LPM_Q_BLOCK2D) != 0;
    const unsigned int member = member_base + (unsigned int)ti.g;
    // rows / columns of the tile inside the member / matrix (small ints: cheap bounds checks)
    const int rows_in = (int)min(ti.M - ti.row0, (long long)Q_TM);
    const int cols_in = (int)min(K - ti.k0, (long long)C::TK);

    if (flags & LPM_Q_ROWWISE) {
        const float k6_r = s_tab[0][128];
#pragma unroll
        for (int i = 0; i < C::RB; ++i) {
            const int b = tid + i * Q_THREADS;
            const int r = b / C::BPR, cb = b % C::BPR;
            if (r >= rows_in || cb * 16 >= cols_in) continue;
            const long long m = ti.row0 + r;
            const long long kb = ti.k0 + cb * 16;
            float v[16];
            q_unpack_block<DT>(rw[i], v);
            float bmn;
            if (C::BYTES == 2) {
                bmn = q_block_max_words<DT>(rw[i]);
            } else {
                bmn = 0.0f;
#pragma unroll
                for (int e = 0; e < 16; ++e) bmn = q_max_nan(bmn, q_abs(v[e]));
            }
            const bool has_nan = lpm_isnan_bits(bmn);
            float bm = bmn;
            if (block2d) bm = s_tamax[r >> 4][cb];
            else if (has_nan) bm = q_amax16(v);
            unsigned int sc;
            float enc;
            if (row_scaled) {
                sc = q_block_scale(bm, s_rs[0][r]);
                enc = q_enc(sc, s_rs[1][r]);
            } else {
                sc = q_block_scale(bm, k6_r);
                enc = s_tab[0][sc];
            }
            const uint2 pk = q_block16<SR>(v, C::BYTES == 2 ? rw[i] : nullptr, has_nan, enc, seed,
                                           (unsigned long long)(m * K + kb), 0u, member);
            const long long row = ti.row_base + m;
            *reinterpret_cast<uint2*>(row_data + row * (K >> 1) + (kb >> 1)) = pk;
            row_scale[row * (K >> 4) + (kb >> 4)] = (unsigned char)sc;
        }
    }

    if (flags & LPM_Q_COLWISE) {
        const int rc = tid >> 5, cg = tid & 31;
        const long long mblk = ti.row0 + rc * 16;  // member row of the column blocks (warp-uniform)
        if (mblk < ti.Mp) {
            const bool rht = EXT && (flags & LPM_Q_RHT) != 0;
            const float k6_c = s_tab[1][128];
            unsigned int cw[16][2];
            q_read_cols<DT>(s_tile, rc, cg, cw);
            // NaN-propagating max |x| of each column block of the untransformed tile
            float cmax[C::CPU];
            if (C::BYTES == 2) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    unsigned int a[8];
#pragma unroll
                    for (int i = 0; i < 8; ++i) a[i] = q_hmax2<DT>(cw[2 * i][q], cw[2 * i + 1][q]);
                    const unsigned int m4 = q_hmax2<DT>(q_hmax2<DT>(q_hmax2<DT>(a[0], a[1]), q_hmax2<DT>(a[2], a[3])),
                                                        q_hmax2<DT>(q_hmax2<DT>(a[4], a[5]), q_hmax2<DT>(a[6], a[7])));
                    cmax[2 * q] = q_lane_to_f32<DT>(m4 & 0x7FFFu);
                    cmax[2 * q + 1] = q_lane_to_f32<DT>((m4 >> 16) & 0x7FFFu);
                }
            } else {
#pragma unroll
                for (int j = 0; j < C::CPU; ++j) {
                    float m = 0.0f;
#pragma unroll
                    for (int i = 0; i < 16; ++i) m = q_max_nan(m, q_abs(q_word_elem<DT>(cw[i][j], 0)));
                    cmax[j] = m;
                }
            }
            float tamax_rht = 0.0f;
            if (block2d && rht) {
                // 16x16 tiles of the transformed matrix: reduce over the LPG lanes of a 16-column group
                float mx = 0.0f;
#pragma unroll
                for (int j = 0; j < C::CPU; ++j) {
                    float v[16];
                    q_col_values<DT>(cw, j, v);
                    q_rht16<C::PREC>(v);
                    mx = lpm_fmax(mx, q_amax16(v));
                }
                unsigned int u = __float_as_uint(mx);
#pragma unroll
                for (int o = 1; o < C::LPG; o <<= 1) u = max(u, __shfl_xor_sync(0xFFFFFFFFu, u, o));
                tamax_rht = __uint_as_float(u);
            }
#pragma unroll
            for (int j = 0; j < C::CPU; ++j) {
                const int cl = cg * C::CPU + j;
                if (cl >= cols_in) continue;
                const long long k = ti.k0 + cl;
                float v[16];
                q_col_values<DT>(cw, j, v);
                float bmn = cmax[j];
                if (rht) {
                    q_rht16<C::PREC>(v);
                    bmn = 0.0f;
#pragma unroll
                    for (int e = 0; e < 16; ++e) bmn = q_max_nan(bmn, q_abs(v[e]));
                }
                const bool has_nan = lpm_isnan_bits(bmn);
                float bm = bmn;
                if (block2d) bm = rht ? tamax_rht : s_tamax[rc][cl >> 4];
                else if (has_nan) bm = q_amax16(v);
                unsigned int sc;
                float enc;
                if (row_scaled) {
                    sc = q_block_scale(bm, s_cs[0][cl]);
                    enc = q_enc(sc, s_cs[1][cl]);
                } else {
                    sc = q_block_scale(bm, k6_c);
                    enc = s_tab[1][sc];
                }
                const unsigned long long idx0 = (unsigned long long)(k * ti.Mp + mblk);
                const uint2 pk = q_block16<SR>(v, nullptr, has_nan, enc, seed, idx0, 1u, member);
                s_cd[rc][cl] = pk;  // staged: written out below in whole 32-byte column runs
                s_csc[rc][cl] = (unsigned char)sc;
            }
        }
        __syncthreads();  // (flags are uniform: every thread of the CTA gets here)
        // Column k of the tile owns 64 consecutive rows = 32 data bytes at k * Mp/2 + row0/2
        // and 4 scale bytes at k * Mp/16 + row0/16 of the member's transposed storage: one
        // thread pair writes the 32 bytes (two 16-byte stores, one full sector per column),
        // one thread the 4 scale bytes, instead of 8-byte / 1-byte stores from four warps.
        const int nrc = (int)min((ti.Mp - ti.row0) >> 4, 4ll);  // valid 16-row chunks
        const long long ld = ti.Mp >> 1, ls = ti.Mp >> 4;
        unsigned char* dbase = col_data + ti.cw_rows * K / 2 + (ti.row0 >> 1) + ti.k0 * ld;
        unsigned char* sbase = col_scale + ti.cw_rows * K / 16 + (ti.row0 >> 4) + ti.k0 * ls;
        const bool vec16 = nrc == 4 && (ld & 15) == 0;
#pragma unroll
        for (int it = 0; it < 2 * C::TK / Q_THREADS; ++it) {
            const int idx = tid + it * Q_THREADS;
            const int c = idx >> 1, h = idx & 1;
            if (c < cols_in) {
                unsigned char* dst = dbase + (long long)c * ld + 16 * h;
                const uint2 a = s_cd[2 * h][c], b = s_cd[2 * h + 1][c];
                if (vec16) {
                    *reinterpret_cast<uint4*>(dst) = make_uint4(a.x, a.y, b.x, b.y);
                } else {
                    if (2 * h < nrc) *reinterpret_cast<uint2*>(dst) = a;
                    if (2 * h + 1 < nrc) *reinterpret_cast<uint2*>(dst + 8) = b;
                }
            }
        }
        for (int c = tid; c < cols_in; c += Q_THREADS) {
            unsigned char* dst = sbase + (long long)c * ls;
            if (nrc == 4 && (ls & 3) == 0) {
                *reinterpret_cast<unsigned int*>(dst) =
                    (unsigned int)s_csc[0][c] | ((unsigned int)s_csc[1][c] << 8) |
                    ((unsigned int)s_csc[2][c] << 16) | ((unsigned int)s_csc[3][c] << 24);
            } else {
                for (int q = 0; q < nrc; ++q) dst[q] = s_csc[q][c];
            }
        }
    }
}

template <int DT, bool EXT>
LPM_DEV void quantize_impl(const unsigned char* __restrict__ x, long long K, long long M_single,
                           const long long* __restrict__ meta, int G, int n_ct, int flags,
                           unsigned int member_base, unsigned long long seed,
                           const float* __restrict__ amax_row, const float* __restrict__ amax_col,
                           const float* __restrict__ tabs,
                           unsigned char* __restrict__ row_data, unsigned char* __restrict__ row_scale,
                           unsigned char* __restrict__ col_data, unsigned char* __restrict__ col_scale) {
    typedef QCfg<DT> C;
    __shared__ __align__(16) unsigned char s_tile[Q_TM * Q_ROW_BYTES];
    __shared__ float s_tamax[4][8];
    __shared__ float s_tab[2][Q_TAB_STRIDE];  // per tensor: the member's two encode tables
    __shared__ float s_rs[2][Q_TM];  // row-scaled: k6, S_dec per tile row
    __shared__ float s_cs[2][128];   // row-scaled: k6, S_dec per tile column
    __shared__ __align__(16) uint2 s_cd[4][128];   // columnwise codes [row chunk][tile column]
    __shared__ unsigned char s_csc[4][128];        // columnwise scales [row chunk][tile column]
    const int tid = threadIdx.x;
    const QTile ti = q_resolve_tile(M_single, meta, G, n_ct, Q_TM, C::TK, true);
    const bool rowwise = (flags & LPM_Q_ROWWISE) != 0;
    const bool colwise = (flags & LPM_Q_COLWISE) != 0;
    const bool block2d = (flags & LPM_Q_BLOCK2D) != 0;
    const bool row_scaled = (flags & LPM_Q_ROW_SCALED) != 0;

    unsigned int rw[C::RB][C::WPB];
    q_load_tile<DT>(x, K, ti, rw, s_tile, colwise || block2d);

    if (!row_scaled) {
        const float* tab = tabs + (long long)(2 * ti.g) * Q_TAB_STRIDE;
        for (int c = tid; c < 2 * Q_TAB_STRIDE; c += Q_THREADS) (&s_tab[0][0])[c] = __ldg(tab + c);
    } else {
        if (tid < Q_TM) {
            const long long m = ti.row0 + tid;
            const float a = (rowwise && m < ti.M) ? amax_row[ti.row_base + m] : 0.0f;
            const float se = q_encode_scale(a);
            s_rs[0][tid] = q_k6(se);
            s_rs[1][tid] = lpm_rcp_rn(se);
        }
        for (int c = tid; c < C::TK; c += Q_THREADS) {
            const long long k = ti.k0 + c;
            const float a = (colwise && k < K) ? amax_col[(long long)ti.g * K + k] : 0.0f;
            const float se = q_encode_scale(a);
            s_cs[0][c] = q_k6(se);
            s_cs[1][c] = lpm_rcp_rn(se);
        }
    }
    __syncthreads();

    if (block2d) {
        // amax of each 16x16 tile of x (NaN ignored), from the column layout
        const int rc = tid >> 5, cg = tid & 31;
        unsigned int cw[16][2];
        q_read_cols<DT>(s_tile, rc, cg, cw);
        float mx = 0.0f;
#pragma unroll
        for (int j = 0; j < C::CPU; ++j) {
            float v[16];
            q_col_values<DT>(cw, j, v);
            mx = lpm_fmax(mx, q_amax16(v));
        }
        unsigned int u = __float_as_uint(mx);
#pragma unroll
        for (int o = 1; o < C::LPG; o <<= 1) u = max(u, __shfl_xor_sync(0xFFFFFFFFu, u, o));
        if ((cg % C::LPG) == 0) s_tamax[rc][cg / C::LPG] = __uint_as_float(u);
        __syncthreads();
    }

    if (EXT && (flags & LPM_Q_SR))
        quantize_phases<DT, EXT, EXT>(ti, K, flags, member_base, seed, rw, s_tile, s_tamax, s_tab,
                                      s_rs, s_cs, s_cd, s_csc, row_data, row_scale, col_data,
                                      col_scale);
    else
        quantize_phases<DT, EXT, false>(ti, K, flags, member_base, seed, rw, s_tile, s_tamax, s_tab,
                                        s_rs, s_cs, s_cd, s_csc, row_data, row_scale, col_data,
                                      col_scale);
}

// ==========================================================================================
// Kernels: dequantize
// ==========================================================================================

// value = e2m1(code) * ((float(scale) * amax) * fp32(1/2688))
LPM_DEV float q_dequant_factor(unsigned int scale8, float amax) {
    return lpm_mul_rn(lpm_mul_rn(q_e4m3_to_f32(scale8), amax),
                      __uint_as_float(LPM_FP32_INV_NVFP4_AMAX_DIVISOR_BITS));
}

LPM_DEV void q_dequant16(uint2 d, float f, float (&v)[16]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        v[j] = lpm_mul_rn(lpm_e2m1_to_f32(d.x >> (4 * j)), f);
        v[8 + j] = lpm_mul_rn(lpm_e2m1_to_f32(d.y >> (4 * j)), f);
    }
}

// Parameters of every quantize kernel (nvfp4.cu, nvfp4_ext.cu).
#define LPM_QUANTIZE_ARGS                                                                   \
    const unsigned char *x, long long K, long long M, const long long *meta, int G, int n_ct, \
        int flags, unsigned int member_base, unsigned long long seed, const float *amax_row,  \
        const float *amax_col, const float *tabs, unsigned char *row_data,                  \
        unsigned char *row_scale, unsigned char *col_data, unsigned char *col_scale
#define LPM_QUANTIZE_CALL                                                                   \
    (x, K, M, meta, G, n_ct, flags, member_base, seed, amax_row, amax_col, tabs, row_data,  \
     row_scale, col_data, col_scale)

#endif  // LPM_NVFP4_COMMON_CUH
