// lowprec_moe: format constants and non-flushing fp32 helpers shared by every kernel.
//
// Every constant here mirrors the one of the same name (without the LPM_ prefix) in
// lowprec_moe/formats.py; tests/formats/test_formats.py parses this file and checks that they agree.
// Keep one definition per line in the form
//
//     constexpr <type> LPM_<NAME> = <value>;
//
// (arrays: `__device__ constexpr <type> LPM_<NAME>[<n>] = {<v0>, <v1>, ...};`) so the parser
// can read it.
//
// Why inline PTX: CuPy always compiles with -ftz=true, so plain C++ float arithmetic (and
// fabsf / fmaxf) flushes subnormal inputs and results to zero. The bit-exact quantization path
// must match IEEE fp32 with subnormals, so it uses the helpers below, which emit the PTX forms
// without `.ftz` (or integer bit manipulation).
//
// The file includes no system header so that NVRTC compiles it without any include path but
// its own directory.

#ifndef LPM_FORMATS_CUH
#define LPM_FORMATS_CUH

// ------------------------------------------------------------------------------------------
// Element maxima
constexpr float LPM_FP4_MAX = 6.0f;
constexpr float LPM_E4M3_MAX = 448.0f;
constexpr float LPM_E5M2_MAX = 57344.0f;
constexpr float LPM_FLT_MAX = 3.40282346638528859811704183484516925e+38f;

// FP4_MAX * E4M3_MAX (numerator of the NVFP4 global encode scale S_enc = 2688 / amax).
constexpr float LPM_NVFP4_AMAX_DIVISOR = 2688.0f;
// (FP4_MAX * E4M3_MAX)^2 = 6*6*448*448 (NVFP4 GEMM epilogue divisor).
constexpr float LPM_NVFP4_GEMM_FACTOR = 7225344.0f;

// Raw fp32 bits of exact constants (use with __uint_as_float).
constexpr unsigned int LPM_FP32_ONE_SIXTH_BITS = 0x3E2AAAABu;                // fp32(1/6)
constexpr unsigned int LPM_FP32_INV_NVFP4_AMAX_DIVISOR_BITS = 0x39C30C31u;   // fp32(1/2688)
constexpr unsigned int LPM_FP32_INV_NVFP4_GEMM_FACTOR_BITS = 0x34149B93u;    // fp32(1/7225344)
constexpr unsigned int LPM_FP32_INV_E4M3_MAX_BITS = 0x3B124925u;             // fp32(1/448)
constexpr unsigned int LPM_FP32_INV_E5M2_MAX_BITS = 0x37924925u;             // fp32(1/57344)

// ------------------------------------------------------------------------------------------
// Block sizes
constexpr int LPM_NVFP4_BLOCK = 16;
constexpr int LPM_MXFP8_BLOCK = 32;

// ------------------------------------------------------------------------------------------
// E2M1 (fp4): codes 0..7 are the magnitudes below, bit 3 is the sign, code 8 is -0.
constexpr int LPM_E2M1_NUM_CODES = 16;
constexpr unsigned int LPM_E2M1_SIGN_BIT = 0x8u;
constexpr unsigned int LPM_E2M1_MAX_CODE = 0x7u;  // +6; NaN inputs encode to this code
__device__ constexpr float LPM_E2M1_MAGNITUDES[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// ------------------------------------------------------------------------------------------
// E4M3 / E5M2 byte facts (NaN codes are the canonical bytes the quantizers write)
constexpr unsigned int LPM_E4M3_NAN_CODE = 0x7Fu;
constexpr unsigned int LPM_E5M2_NAN_CODE = 0x7Fu;
constexpr int LPM_E4M3_EXP_BIAS = 7;
constexpr int LPM_E4M3_MANT_BITS = 3;
constexpr int LPM_E5M2_EXP_BIAS = 15;
constexpr int LPM_E5M2_MANT_BITS = 2;

// ------------------------------------------------------------------------------------------
// UE8M0 scale: code e means 2^(e - 127); 255 is NaN; 0 is 2^-127 (not zero).
constexpr int LPM_E8M0_BIAS = 127;
constexpr unsigned int LPM_E8M0_NAN = 255u;
constexpr unsigned int LPM_E8M0_MAX_FINITE = 254u;

// fp32 layout
constexpr int LPM_FP32_EXP_BIAS = 127;
constexpr int LPM_FP32_MANT_BITS = 23;
constexpr unsigned int LPM_FP32_EXP_MASK = 0xFFu;
constexpr unsigned int LPM_FP32_MANT_MASK = 0x7FFFFFu;

// fp16 layout
constexpr int LPM_FP16_EXP_BIAS = 15;
constexpr int LPM_FP16_MANT_BITS = 10;

// ------------------------------------------------------------------------------------------
// Random Hadamard transform (NVFP4 columnwise)
constexpr int LPM_RHT_SIZE = 16;
constexpr unsigned int LPM_RHT_SIGN_MASK = 0xD7E8u;  // bit i set where s_i = -1
constexpr float LPM_RHT_NORM = 4.0f;

// ------------------------------------------------------------------------------------------
// Philox4x32-10 (stochastic rounding)
constexpr unsigned int LPM_PHILOX_M0 = 0xD2511F53u;
constexpr unsigned int LPM_PHILOX_M1 = 0xCD9E8D57u;
constexpr unsigned int LPM_PHILOX_W0 = 0x9E3779B9u;
constexpr unsigned int LPM_PHILOX_W1 = 0xBB67AE85u;
constexpr int LPM_PHILOX_ROUNDS = 10;
constexpr int LPM_SR_RANDOM_BITS = 8;

// ------------------------------------------------------------------------------------------
// Scale layouts (padding and the GEMM-swizzled 128x4 tiles)
constexpr int LPM_SCALE_PAD_ROWS = 128;
constexpr int LPM_SCALE_PAD_COLS = 4;
constexpr int LPM_SWIZZLE_TILE_ROWS = 128;
constexpr int LPM_SWIZZLE_TILE_COLS = 4;
constexpr int LPM_SWIZZLE_TILE_BYTES = 512;
constexpr int LPM_SWIZZLE_SUBTILE_ROWS = 32;

// ==========================================================================================
// Device helpers
// ==========================================================================================

// ---- bit casts and classification -------------------------------------------------------

__device__ __forceinline__ unsigned int lpm_f32_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float lpm_f32_from_bits(unsigned int b) { return __uint_as_float(b); }

// |x| by clearing the sign bit (never flushes; keeps NaN payloads).
__device__ __forceinline__ float lpm_fabs_bits(float x) {
    return __uint_as_float(__float_as_uint(x) & 0x7FFFFFFFu);
}

__device__ __forceinline__ bool lpm_isnan_bits(float x) {
    return (__float_as_uint(x) & 0x7FFFFFFFu) > 0x7F800000u;
}

__device__ __forceinline__ bool lpm_isinf_bits(float x) {
    return (__float_as_uint(x) & 0x7FFFFFFFu) == 0x7F800000u;
}

__device__ __forceinline__ bool lpm_signbit(float x) { return (__float_as_uint(x) >> 31) != 0u; }

// ---- IEEE fp32 arithmetic without flush-to-zero (round to nearest even) ------------------

__device__ __forceinline__ float lpm_mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

__device__ __forceinline__ float lpm_add_rn(float a, float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

__device__ __forceinline__ float lpm_sub_rn(float a, float b) {
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

__device__ __forceinline__ float lpm_fma_rn(float a, float b, float c) {
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
}

// Correctly rounded IEEE division a / b.
__device__ __forceinline__ float lpm_div_rn(float a, float b) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Correctly rounded IEEE reciprocal 1 / a.
__device__ __forceinline__ float lpm_rcp_rn(float a) {
    float r;
    asm("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}

// max / min as IEEE fmax / fmin: a NaN operand is ignored (the other one is returned; NaN only
// when both are NaN). Subnormals are kept (no .ftz). Signed zeros are ordered -0 < +0.
__device__ __forceinline__ float lpm_fmax(float a, float b) {
    float r;
    asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

__device__ __forceinline__ float lpm_fmin(float a, float b) {
    float r;
    asm("min.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Running absolute maximum: max(acc, |x|), NaN x ignored.
__device__ __forceinline__ float lpm_amax_update(float acc, float x) {
    return lpm_fmax(acc, lpm_fabs_bits(x));
}

// min(x, FLT_MAX): +inf becomes FLT_MAX. A NaN x gives FLT_MAX (min.f32 ignores a NaN operand);
// test for NaN first where NaN must survive.
__device__ __forceinline__ float lpm_clamp_flt_max(float x) { return lpm_fmin(x, LPM_FLT_MAX); }

// ---- exact powers of two and format decoders ---------------------------------------------

// 2^k as fp32 for -149 <= k <= 127, built from bits (subnormal for k < -126). Outside that
// range: 0 below, +inf above.
__device__ __forceinline__ float lpm_exp2i(int k) {
    if (k > 127) return __uint_as_float(0x7F800000u);
    if (k >= -126) return __uint_as_float((unsigned int)(k + 127) << 23);
    if (k >= -149) return __uint_as_float(1u << (k + 149));
    return 0.0f;
}

// UE8M0 scale byte -> fp32 value 2^(e - 127) (e = 0 gives the subnormal 2^-127, e = 255 NaN).
__device__ __forceinline__ float lpm_e8m0_to_f32(unsigned int e) {
    e &= 0xFFu;
    if (e == LPM_E8M0_NAN) return __uint_as_float(0x7FC00000u);
    if (e == 0u) return __uint_as_float(0x00400000u);
    return __uint_as_float(e << 23);
}

// E2M1 code (low 4 bits of `code`) -> fp32 value (exact; code 8 gives -0).
__device__ __forceinline__ float lpm_e2m1_to_f32(unsigned int code) {
    // Magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 as fp32 bits, selected without a memory table.
    const unsigned int m = code & 0x7u;
    unsigned int bits;
    if (m == 0u) {
        bits = 0u;
    } else if (m == 1u) {
        bits = 0x3F000000u;  // 0.5
    } else {
        // m = 2..7: exponent (m >> 1) - 1 + 127, one mantissa bit (m & 1).
        bits = (((m >> 1) + 126u) << 23) | ((m & 1u) << 22);
    }
    return __uint_as_float(bits | ((code & LPM_E2M1_SIGN_BIT) << 28));
}

// bf16 / fp16 bit patterns -> fp32 (exact; subnormals kept).
__device__ __forceinline__ float lpm_bf16_bits_to_f32(unsigned short b) {
    return __uint_as_float((unsigned int)b << 16);
}

__device__ __forceinline__ float lpm_f16_bits_to_f32(unsigned short h) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
    return r;
}

// fp32 -> bf16 bits, round to nearest even, NaN kept as a quiet NaN (no flush).
__device__ __forceinline__ unsigned short lpm_f32_to_bf16_bits_rn(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// ---- Philox4x32-10 ------------------------------------------------------------------------

struct lpm_uint4 {
    unsigned int x, y, z, w;
};

// Philox4x32 with LPM_PHILOX_ROUNDS rounds: counter (c0..c3), key (k0, k1). The key is bumped
// by (W0, W1) between rounds.
__device__ __forceinline__ lpm_uint4 lpm_philox4x32_10(unsigned int c0, unsigned int c1,
                                                       unsigned int c2, unsigned int c3,
                                                       unsigned int k0, unsigned int k1) {
#pragma unroll
    for (int r = 0; r < LPM_PHILOX_ROUNDS; ++r) {
        if (r > 0) {
            k0 += LPM_PHILOX_W0;
            k1 += LPM_PHILOX_W1;
        }
        const unsigned int hi0 = __umulhi(LPM_PHILOX_M0, c0);
        const unsigned int lo0 = LPM_PHILOX_M0 * c0;
        const unsigned int hi1 = __umulhi(LPM_PHILOX_M1, c2);
        const unsigned int lo1 = LPM_PHILOX_M1 * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0;
        const unsigned int n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    lpm_uint4 out = {c0, c1, c2, c3};
    return out;
}

// The stochastic-rounding word of one element: key = seed (low, high), counter = (linear index
// low, high, direction, member); the first output word.
__device__ __forceinline__ unsigned int lpm_sr_random_word(unsigned long long seed,
                                                           unsigned long long linear_index,
                                                           unsigned int direction,
                                                           unsigned int member) {
    return lpm_philox4x32_10((unsigned int)linear_index, (unsigned int)(linear_index >> 32),
                             direction, member, (unsigned int)seed, (unsigned int)(seed >> 32))
        .x;
}

// ---- scale layouts -------------------------------------------------------------------------

__host__ __device__ __forceinline__ long long lpm_round_up(long long x, long long m) {
    return (x + m - 1) / m * m;
}

// Byte offset of entry (r, c) of a padded (R, C) scale matrix in the GEMM-swizzled layout
// (128x4 tiles, row-major over (R/128, C/4), 512 bytes each). `padded_cols` is C.
__host__ __device__ __forceinline__ long long lpm_swizzle_offset(long long r, long long c,
                                                                 long long padded_cols) {
    return ((r / LPM_SWIZZLE_TILE_ROWS) * (padded_cols / LPM_SWIZZLE_TILE_COLS) +
            c / LPM_SWIZZLE_TILE_COLS) *
               LPM_SWIZZLE_TILE_BYTES +
           (r % LPM_SWIZZLE_SUBTILE_ROWS) * 16 +
           ((r % LPM_SWIZZLE_TILE_ROWS) / LPM_SWIZZLE_SUBTILE_ROWS) * 4 + c % LPM_SWIZZLE_TILE_COLS;
}

#endif  // LPM_FORMATS_CUH
