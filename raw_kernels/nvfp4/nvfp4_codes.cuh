// NVFP4 device code, part of nvfp4_common.cuh (design notes there): E2M1 element codes (fast
// path, exact path for blocks holding a NaN, stochastic rounding), packing of a 16-value block,
// and the random Hadamard transform of a 16-value chunk (forward and inverse).
#ifndef LPM_NVFP4_CODES_CUH
#define LPM_NVFP4_CODES_CUH

#include "nvfp4_scalar.cuh"

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

// Stochastically rounded E2M1 code of y with random word r (NUMERICS §2.4).
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

// Out of line (stochastic rounding is not on the fast path), values passed by value so the
// caller's arrays stay in registers; the eight Philox evaluations are independent, so they are
// unrolled to overlap their multiply chains.
static __device__ __noinline__ unsigned int q_pack8_sr(float v0, float v1, float v2, float v3,
                                                       float v4, float v5, float v6, float v7,
                                                       float enc, unsigned long long seed,
                                                       unsigned long long idx0, unsigned int dir,
                                                       unsigned int member) {
    const float v[8] = {v0, v1, v2, v3, v4, v5, v6, v7};
    unsigned int p = 0u;
#pragma unroll
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
        packed.x = q_pack8_sr(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], enc, seed, idx0,
                              dir, member);
        packed.y = q_pack8_sr(v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15], enc, seed,
                              idx0 + 8ull, dir, member);
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
// Random Hadamard transform of a 16-value chunk (NUMERICS §2.3)
// ==========================================================================================

// Unnormalised 16-point Walsh-Hadamard transform: 4 butterfly stages of round-to-nearest adds /
// subtracts (exact whenever every partial sum is). T is float or double.
template <typename T>
LPM_DEV void q_wht16(T (&d)[16]) {
#pragma unroll
    for (int h = 1; h < 16; h <<= 1) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            if ((i & h) == 0) {
                const T a = d[i], b = d[i + h];
                d[i] = q_add_rn(a, b);
                d[i + h] = q_sub_rn(a, b);
            }
        }
    }
}

// 16 values passed by value, so an out-of-line callee leaves the caller's arrays in registers.
struct QVec16 {
    float v[16];
};

// The reference's ordered float64 sum (i = 0..15, from +0), rounded once to bf16. Out of line:
// only chunks with an exponent spread too wide for an exact sum, or with inf / NaN, get here.
static __device__ __noinline__ QVec16 q_rht16_ordered(QVec16 in) {
    double x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = q_f32_to_f64(in.v[i]);
    QVec16 out;
#pragma unroll 1
    for (int j = 0; j < 16; ++j) {
        double acc = 0.0;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const unsigned int neg = ((LPM_RHT_SIGN_MASK >> i) & 1u) ^ (__popc(i & j) & 1u);
            acc = __fma_rn(x[i], neg ? -0.25 : 0.25, acc);
        }
        out.v[j] = q_bf16_bits_to_f32(q_f64_to_bf16_bits(acc));
    }
    return out;
}

// In place: v <- bf16(sum_i v_i * s_i * H[i][j] / 4) as fp32, float64 ordered sum rounded once.
// Inputs carry PREC significant bits, so with an exponent spread D = emax - emin of the nonzero
// finite inputs every input is a multiple of 2^(emin - PREC + 1) below 2^(emax + 1), and every
// partial sum of 16 of them fits in D + PREC + 4 bits. When that is at most 24 the 4-stage
// butterfly is exact in fp32. It is also kept clear of fp32 subnormals: emin >= PREC + 2 keeps
// every input, nonzero partial sum and quarter of one at 2^-126 or above. (An earlier version
// without that bound, which also rounded with the hardware bf16 conversion, gave other bits
// than the reference on chunks of subnormals on an H100; which of the two was at fault was not
// settled.) emax <= 249 keeps the sum below fp32's overflow. When D + PREC + 4 is at most 53 the butterfly is exact in float64.
// An exact sum in any order equals the ordered sum, so both round to the same bf16. Otherwise
// (or with inf / NaN) the ordered sum i = 0..15 of the reference is replayed.
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
    if (!special && emax - emin <= 20 - PREC && emin >= PREC + 2 && emax <= 249) {
        float d[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) d[i] = ((LPM_RHT_SIGN_MASK >> i) & 1u) ? -v[i] : v[i];
        q_wht16(d);
#pragma unroll
        for (int j = 0; j < 16; ++j)  // * 1/4 (exact) + 0.0 (turns an exact zero into +0)
            v[j] = q_bf16_bits_to_f32(q_f32_to_bf16_bits(lpm_add_rn(lpm_mul_rn(d[j], 0.25f), 0.0f)));
    } else if (!special && emax - emin <= 49 - PREC) {
        double d[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const double x = q_f32_to_f64(v[i]);
            d[i] = ((LPM_RHT_SIGN_MASK >> i) & 1u) ? -x : x;
        }
        q_wht16(d);
#pragma unroll
        for (int j = 0; j < 16; ++j)
            v[j] = q_bf16_bits_to_f32(q_f64_to_bf16_bits(__fma_rn(d[j], 0.25, 0.0)));
    } else {
        QVec16 t;
#pragma unroll
        for (int i = 0; i < 16; ++i) t.v[i] = v[i];
        t = q_rht16_ordered(t);
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = t.v[i];
    }
}

// Inverse transform for dequantization: v_i <- f32(s_i / 4 * sum_j H[i][j] w_j), float64.
LPM_DEV void q_rht16_inverse(float (&v)[16]) {
    double d[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) d[i] = q_f32_to_f64(v[i]);
    q_wht16(d);
#pragma unroll
    for (int i = 0; i < 16; ++i)
        v[i] = q_f64_to_f32(__fma_rn(d[i], ((LPM_RHT_SIGN_MASK >> i) & 1u) ? -0.25 : 0.25, 0.0));
}

#endif  // LPM_NVFP4_CODES_CUH
