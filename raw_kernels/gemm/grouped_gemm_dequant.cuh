// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): exact
// in-kernel dequantization -- the NVFP4 / MXFP8 decoders, convert_unit, which expands one
// 32-element unit of a raw tile into the canonical 16-bit tile, and fp4_a_frags, which decodes
// NVFP4 rows straight into wgmma A-fragment registers.

#ifndef LPM_GROUPED_GEMM_DEQUANT_CUH
#define LPM_GROUPED_GEMM_DEQUANT_CUH

#include "grouped_gemm_staging.cuh"

namespace lpm_gg {

// ==========================================================================================
// Conversion of one 32-element unit of a raw tile into the canonical 16-bit tile

// 8 E2M1 nibbles (element 0 in the low nibble of byte 0) -> 4 f16x2 words of e2m1 * scale:
// elements 0-3 (o[0], o[1]) scaled by half H0 of the f16x2 `sc`, elements 4-7 (o[2], o[3]) by
// half H1 (false: low, true: high); each half is a block scale * 64 (fp4_scales_x64).
template <bool H0, bool H1>
__device__ __forceinline__ void fp4_decode8(unsigned w, unsigned sc, unsigned* o) {
    unsigned lo = w & 0x0F0F0F0Fu;         // nibbles of elements 0, 2, 4, 6 (one per byte)
    unsigned hi = (w >> 4) & 0x0F0F0F0Fu;  // elements 1, 3, 5, 7
    // E2M1 s.e1e0.m -> E4M3 byte s.000e1e0.m00 = e2m1 * 2^-6 (exact, subnormal for e = 0).
    lo = ((lo << 2) & 0x1C1C1C1Cu) | ((lo << 4) & 0x80808080u);
    hi = ((hi << 2) & 0x1C1C1C1Cu) | ((hi << 4) & 0x80808080u);
    const unsigned p0 = __byte_perm(lo, hi, 0x5140u);  // elements 0, 1, 2, 3
    const unsigned p1 = __byte_perm(lo, hi, 0x7362u);  // elements 4, 5, 6, 7
    o[0] = hmul2_bcast_rn<H0>(fp8x2_half_to_f16x2<false, false>(p0), sc);
    o[1] = hmul2_bcast_rn<H0>(fp8x2_half_to_f16x2<false, true>(p0), sc);
    o[2] = hmul2_bcast_rn<H1>(fp8x2_half_to_f16x2<false, false>(p1), sc);
    o[3] = hmul2_bcast_rn<H1>(fp8x2_half_to_f16x2<false, true>(p1), sc);
}
// Two E4M3 block scales (s0 in the low byte of s2) -> the f16x2 word (s0 * 64, s1 * 64), the
// `sc` of fp4_decode8: exact (E4M3 <= 448, 448 * 64 = 28672 < 65504); the factor 64 undoes the
// 2^-6 of fp4_decode8's E4M3 intermediate.
__device__ __forceinline__ unsigned fp4_scales_x64(unsigned short s2) {
    return hmul2_rn(fp8x2_to_f16x2<false>(s2), 0x54005400u);  // * (64, 64)
}

// 4 fp8 bytes -> 2 bf16x2 words of fp8 * f (f = 2^(e-127) as fp32, one factor per element).
// cvt.rn.f16x2.{e4m3,e5m2}x2 widens two bytes exactly (subnormals, inf and NaN included),
// cvt.f32.f16 widens each half exactly, and one non-flushing multiply forms fp8 * f, exact
// whenever it is representable in fp32. The high half of that fp32 value is the bf16 value:
// exact whenever it is representable in bf16 (E4M3 scale code >= 3, E5M2 >= 10); below that,
// truncated toward zero. inf and NaN elements, and the NaN scale (f = NaN), give inf / NaN.
// 3 instructions per element (conversion, widening, multiply) plus one byte permute per pair.
template <bool E5M2>
__device__ __forceinline__ void fp8_decode4(unsigned w, float f0, float f1, float f2, float f3,
                                            unsigned& o0, unsigned& o1) {
    const unsigned h01 = fp8x2_half_to_f16x2<E5M2, false>(w);
    const unsigned h23 = fp8x2_half_to_f16x2<E5M2, true>(w);
    const float r0 = lpm_mul_rn(f16_bits_to_f32(h01), f0);
    const float r1 = lpm_mul_rn(f16_bits_to_f32(h01 >> 16), f1);
    const float r2 = lpm_mul_rn(f16_bits_to_f32(h23), f2);
    const float r3 = lpm_mul_rn(f16_bits_to_f32(h23 >> 16), f3);
    o0 = __byte_perm(__float_as_uint(r0), __float_as_uint(r1), 0x7632u);
    o1 = __byte_perm(__float_as_uint(r2), __float_as_uint(r3), 0x7632u);
}

// 4 fp8 bytes -> 2 f16x2 words of fp8 * (m0, m1), m = mul.rn.f16x2 operand of two power-of-two
// fp16 factors (the MXFP8 fp16 window, grouped_gemm_mxf16.cuh): exact inside the window. One
// conversion and one multiply per pair.
template <bool E5M2>
__device__ __forceinline__ void fp8_decode4_f16(unsigned w, unsigned m01, unsigned m23,
                                                unsigned& o0, unsigned& o1) {
    o0 = hmul2_rn(fp8x2_half_to_f16x2<E5M2, false>(w), m01);
    o1 = hmul2_rn(fp8x2_half_to_f16x2<E5M2, true>(w), m23);
}

// The multiplier of block code e in a row whose largest code is e_max. H (fp16 window): the
// f16x2 word (m, m), m = 2^(e - e_max + S_MAX) (mx_factor_bits; code_bias = S_MAX + 15), from
// the row's part fk = mx_window_row(e_max, code_bias) in one IMAD; bf16: the fp32 bits of
// 2^(e - 127) (NaN for code 255), fk unused.
// The fp16 word is exact for a row whose codes all lie in the window (what the window check
// guarantees for valid rows): f = e - e_max + code_bias is then in [code_bias - window,
// code_bias] (E4M3 [1, 22], E5M2 [7, 15]), so the clamp of mx_factor_bits never acts, and f < 32
// keeps f << 10 in the exponent field of each half: (e + code_bias - e_max) * 0x04000400
// (mod 2^32) is that word. Codes outside the window (rows past the valid ones, blocks past a
// contraction's end) give other bits, which the callers never let reach a stored output.
constexpr unsigned kMxPairUnit = 0x00010001u << LPM_FP16_MANT_BITS;  // f -> (f << 10) x 2
__device__ __forceinline__ unsigned mx_window_row(unsigned e_max, int code_bias) {
    return static_cast<unsigned>(code_bias - static_cast<int>(e_max)) * kMxPairUnit;
}
template <bool H>
__device__ __forceinline__ unsigned mx_block_factor(unsigned e, unsigned fk) {
    if constexpr (H) {
        return e * kMxPairUnit + fk;
    } else {
        (void)fk;
        return __float_as_uint(lpm_e8m0_to_f32(e));
    }
}

// 4 fp8 bytes -> 2 words of two 16-bit values times the block factor m (mx_block_factor): fp16
// (fp8_decode4_f16) or bf16 (fp8_decode4), the values the plain kernel stages.
template <bool E5M2, bool H>
__device__ __forceinline__ void mx_decode4(unsigned w, unsigned m, unsigned& o0, unsigned& o1) {
    if constexpr (H) {
        fp8_decode4_f16<E5M2>(w, m, m, o0, o1);
    } else {
        const float f = __uint_as_float(m);
        fp8_decode4<E5M2>(w, f, f, f, f, o0, o1);
    }
}

// Step s's wgmma A fragment of NVFP4 rows r and r + 8 from that step's raw words (wa0, wa1: data
// words 2s and 2s+1 of row r; wb0, wb1: of row r + 8), the rows' scale words sa / sb (byte s:
// the step's block) and sel = q | (q + 4) << 4 (see fp4_a_frags).
__device__ __forceinline__ void fp4_a_step(int s, unsigned wa0, unsigned wa1, unsigned wb0,
                                           unsigned wb1, unsigned sa, unsigned sb, unsigned sel,
                                           unsigned (&af)[4]) {
    // nibbles: row r (16s+2q, +1, 16s+2q+8, +9), then row r+8 (the same)
    const unsigned w =
        __byte_perm(__byte_perm(wa0, wa1, sel), __byte_perm(wb0, wb1, sel), 0x5410u);
    const unsigned s2 = __byte_perm(sa, sb, static_cast<unsigned>(s | ((s + 4) << 4)));
    // row r's scale (low half) for elements 0-3, row r+8's (high half) for 4-7
    const unsigned sc = fp4_scales_x64(static_cast<unsigned short>(s2 & 0xFFFFu));
    unsigned o[4];
    fp4_decode8<false, true>(w, sc, o);
    af[0] = o[0];  // row r,   2q..2q+1
    af[1] = o[2];  // row r+8, 2q..2q+1
    af[2] = o[1];  // row r,   2q+8..2q+9
    af[3] = o[3];  // row r+8, 2q+8..2q+9
}

// wgmma A fragments (m64k16, f16) of NVFP4 rows r and r + 8 for the 16-deep steps S0 ..
// S0 + NS - 1 of a k-tile, decoded straight from a raw stage (rows of 32 data bytes; the 4 E4M3
// scale bytes of row r at rsc + 4r): step s needs byte q of data words 2s and 2s+1 of each row
// (contraction 16s+2q, +1 and 16s+2q+8, +9) and scale byte s; af[i] is step S0 + i. The values
// are those convert_unit writes to the canonical tile (same decoder, same scale product).
// SLD: bytes from one row's scale word to the next (4 in a raw stage; 16 in the TMA scale
// slots of the warp-specialised kernel, which hold 4 k-tiles per row).
template <int S0, int NS, int SLD = 4>
__device__ __forceinline__ void fp4_a_frags(const unsigned char* raw, const unsigned char* rsc,
                                            int r, int q, unsigned (&af)[NS][4]) {
    static_assert(NS >= 1 && S0 + NS <= kBK / 16 && (NS == 1 || (S0 % 2 == 0 && NS % 2 == 0)),
                  "one step (8-byte loads) or whole 16-byte chunks");
    unsigned wa[2 * NS], wb[2 * NS];
    if constexpr (NS == 1) {
        const uint2 a = *reinterpret_cast<const uint2*>(raw + r * (kBK / 2) + S0 * 8);
        const uint2 b = *reinterpret_cast<const uint2*>(raw + (r + 8) * (kBK / 2) + S0 * 8);
        wa[0] = a.x, wa[1] = a.y;
        wb[0] = b.x, wb[1] = b.y;
    } else {
#pragma unroll
        for (int i = 0; i < NS / 2; ++i) {
            const unsigned char* pa = raw + r * (kBK / 2) + (S0 / 2 + i) * 16;
            const uint4 a = *reinterpret_cast<const uint4*>(pa);
            const uint4 b = *reinterpret_cast<const uint4*>(pa + 8 * (kBK / 2));
            wa[4 * i] = a.x, wa[4 * i + 1] = a.y, wa[4 * i + 2] = a.z, wa[4 * i + 3] = a.w;
            wb[4 * i] = b.x, wb[4 * i + 1] = b.y, wb[4 * i + 2] = b.z, wb[4 * i + 3] = b.w;
        }
    }
    const unsigned sa = *reinterpret_cast<const unsigned*>(rsc + r * SLD);
    const unsigned sb = *reinterpret_cast<const unsigned*>(rsc + (r + 8) * SLD);
    const unsigned sel = static_cast<unsigned>(q) | (static_cast<unsigned>(q + 4) << 4);
#pragma unroll
    for (int i = 0; i < NS; ++i)
        fp4_a_step(S0 + i, wa[2 * i], wa[2 * i + 1], wb[2 * i], wb[2 * i + 1], sa, sb, sel,
                   af[i]);
}

// fp4_a_frags of one step s of a raw stage (s a constant once the caller's step loop is
// unrolled: one of the branches remains).
__device__ __forceinline__ void fp4_a_frags_at(int s, const unsigned char* raw,
                                               const unsigned char* rsc, int r, int q,
                                               unsigned (&af)[1][4]) {
    static_assert(kBK / 16 == 4, "four steps per k-tile");
    if (s == 0) fp4_a_frags<0, 1>(raw, rsc, r, q, af);
    if (s == 1) fp4_a_frags<1, 1>(raw, rsc, r, q, af);
    if (s == 2) fp4_a_frags<2, 1>(raw, rsc, r, q, af);
    if (s == 3) fp4_a_frags<3, 1>(raw, rsc, r, q, af);
}

// Expand 8-element word v of a K-major NVFP4 raw tile (row v / 8, contraction 8(v%8)..+7: one
// 16-byte chunk of the canonical row) into the canonical tile: the values and places
// unit_store gives them, at an eighth of a unit's work per thread (the swapped-operand kernel's
// small token tile, whose 32-element units would leave most of the CTA idle). The row's four
// scale bytes are read as one aligned word.
__device__ __forceinline__ void fp4_convert_word(const unsigned char* raw,
                                                 const unsigned char* rsc, unsigned char* canon,
                                                 int v) {
    const int r = v >> 3, c = v & 7;
    const unsigned w = *reinterpret_cast<const unsigned*>(raw + r * (kBK / 2) + c * 4);
    const unsigned sw = *reinterpret_cast<const unsigned*>(rsc + r * 4);
    const unsigned b = static_cast<unsigned>(c >> 1);  // block of this word's 8 elements
    const unsigned sc = fp4_scales_x64(static_cast<unsigned short>(__byte_perm(sw, 0u, b) & 0xFFu));
    unsigned o[4];
    fp4_decode8<false, false>(w, sc, o);
    *reinterpret_cast<uint4*>(canon + k_canon_off(r, c)) =
        make_uint4(o[0], o[1], o[2], o[3]);
}

// Shared address (or byte offset) of chunk c0 + j (j < 4, c0 a multiple of 4) of a canonical
// row / line, given a0 = that of chunk c0; for addresses, the canonical buffer's base is
// 64-byte aligned. Both canonical layouts XOR the 16-byte chunk index with the line's low three
// bits (k_canon_off, mn_canon_off): c0 + j and c0 differ in bits 0-1 only, and a0's bits 4-5
// hold nothing but line & 3 (the base and the rest of the offset are multiples of 64), so chunk
// c0 + j lies at a0 with bits 4-5 XORed by j -- the offset formula's own result, bit for bit.
__device__ __forceinline__ unsigned canon_chunk4(unsigned a0, int j) {
    return a0 ^ (static_cast<unsigned>(j) << 4);
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

// Conversion of a K-major unit in two steps, so that a thread can issue the shared-memory loads
// of all its units before the first store (the compiler cannot move a load across a store to
// the same shared memory): unit_load reads the raw words and block scales of unit u, unit_store
// expands them into the canonical tile exactly as convert_unit does.
template <int KIND>
struct UnitRaw;
template <>
struct UnitRaw<KIND_FP4_K> {
    uint4 w;
    unsigned short s2;
};
template <>
struct UnitRaw<KIND_FP8_K> {
    uint4 w0, w1;
    float f;
};

// SLD (NVFP4): bytes from one row's block scales to the next (see fp4_a_frags).
template <int KIND, int R, int SLD = 4>
__device__ __forceinline__ UnitRaw<KIND> unit_load(const unsigned char* raw,
                                                   const unsigned char* rsc, int u) {
    static_assert(KIND == KIND_FP4_K || KIND == KIND_FP8_K, "K-major quantized kinds");
    const int r = u >> 1, h = u & 1;
    UnitRaw<KIND> x;
    if constexpr (KIND == KIND_FP4_K) {
        x.w = *reinterpret_cast<const uint4*>(raw + r * (kBK / 2) + h * 16);
        x.s2 = *reinterpret_cast<const unsigned short*>(rsc + r * SLD + h * 2);
    } else {
        x.f = reinterpret_cast<const float*>(rsc)[r * 2 + h];
        x.w0 = *reinterpret_cast<const uint4*>(raw + r * kBK + swz<2>(r, (2 * h) * 16));
        x.w1 = *reinterpret_cast<const uint4*>(raw + r * kBK + swz<2>(r, (2 * h + 1) * 16));
    }
    return x;
}

// The 16 f16x2 words an NVFP4 unit expands to (unit_store's values): words 4j..4j+3 are
// canonical chunk 4h + j of the unit's row (h: the unit's contraction half).
__device__ __forceinline__ void fp4_unit_decode(const UnitRaw<KIND_FP4_K>& x,
                                                unsigned (&o)[16]) {
    const unsigned sc = fp4_scales_x64(x.s2);  // the unit's two 16-blocks: low, high half
    fp4_decode8<false, false>(x.w.x, sc, o + 0);
    fp4_decode8<false, false>(x.w.y, sc, o + 4);
    fp4_decode8<true, true>(x.w.z, sc, o + 8);
    fp4_decode8<true, true>(x.w.w, sc, o + 12);
}

// H (MXFP8 only): the fp16 window -- the staged scale word is the f16x2 factor (m, m) of
// ScaleRegs::store_f16 instead of the fp32 factor, and the unit is written as fp16.
// S32: store through 32-bit shared addresses (canon 64-byte aligned); false: through canon's
// generic pointer, the same places -- ptxas gives the warp-specialised cp.async producers
// (80 registers) more spills with the 32-bit stores, the full-register kernels fewer
// instructions (SASS).
template <int KIND, int R, bool E5M2, bool H = false, bool S32 = true>
__device__ __forceinline__ void unit_store(const UnitRaw<KIND>& x, unsigned char* canon, int u) {
    const int r = u >> 1, h = u & 1;
    unsigned o[16];
    if constexpr (KIND == KIND_FP4_K) {
        fp4_unit_decode(x, o);
    } else if constexpr (H) {
        const unsigned m = __float_as_uint(x.f);
        fp8_decode4_f16<E5M2>(x.w0.x, m, m, o[0], o[1]);
        fp8_decode4_f16<E5M2>(x.w0.y, m, m, o[2], o[3]);
        fp8_decode4_f16<E5M2>(x.w0.z, m, m, o[4], o[5]);
        fp8_decode4_f16<E5M2>(x.w0.w, m, m, o[6], o[7]);
        fp8_decode4_f16<E5M2>(x.w1.x, m, m, o[8], o[9]);
        fp8_decode4_f16<E5M2>(x.w1.y, m, m, o[10], o[11]);
        fp8_decode4_f16<E5M2>(x.w1.z, m, m, o[12], o[13]);
        fp8_decode4_f16<E5M2>(x.w1.w, m, m, o[14], o[15]);
    } else {
        const float f = x.f;
        fp8_decode4<E5M2>(x.w0.x, f, f, f, f, o[0], o[1]);
        fp8_decode4<E5M2>(x.w0.y, f, f, f, f, o[2], o[3]);
        fp8_decode4<E5M2>(x.w0.z, f, f, f, f, o[4], o[5]);
        fp8_decode4<E5M2>(x.w0.w, f, f, f, f, o[6], o[7]);
        fp8_decode4<E5M2>(x.w1.x, f, f, f, f, o[8], o[9]);
        fp8_decode4<E5M2>(x.w1.y, f, f, f, f, o[10], o[11]);
        fp8_decode4<E5M2>(x.w1.z, f, f, f, f, o[12], o[13]);
        fp8_decode4<E5M2>(x.w1.w, f, f, f, f, o[14], o[15]);
    }
    // Chunks 4h .. 4h+3 of row r: k_canon_off(r, 4h + j) == k_canon_off(r, 4h) ^ (j << 4) (see
    // canon_chunk4), so one address and three XORs place all four.
    const unsigned o0 = static_cast<unsigned>(k_canon_off(r, 4 * h));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if constexpr (S32) {
            sts_v4(canon_chunk4(smem_u32(canon) + o0, j), o[4 * j], o[4 * j + 1], o[4 * j + 2],
                   o[4 * j + 3]);
        } else {
            *reinterpret_cast<uint4*>(canon + canon_chunk4(o0, j)) =
                make_uint4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
        }
    }
}

// Convert unit u of a raw tile (R rows) into the canonical tile.
//   K kinds: unit u = (row u >> 1, contraction half u & 1) -> 32 elements of one row.
//   MN kind: unit u = (line u & 63, row group u >> 6)      -> 32 rows of one contraction line.
//   H (MXFP8 only): the fp16 window (see unit_store); MN kind: the staged factors are fp16 [2][R].
template <int KIND, int R, bool E5M2, bool H = false>
__device__ __forceinline__ void convert_unit(const unsigned char* raw, const unsigned char* rsc,
                                             unsigned char* canon, int u) {
    if constexpr (KIND == KIND_FP8_MN && H) {
        const int l = u & (kBK - 1), q = u >> 6;
        const uint4* mp = reinterpret_cast<const uint4*>(
            reinterpret_cast<const unsigned short*>(rsc) + (l / LPM_MXFP8_BLOCK) * R + 32 * q);
        unsigned o[16];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = 2 * q + i;
            const uint4 w = *reinterpret_cast<const uint4*>(raw + l * R + swz<1>(l, c * 16));
            const uint4 m0 = mp[2 * i], m1 = mp[2 * i + 1];  // rows 16i..16i+7, 16i+8..+15
            fp8_decode4_f16<E5M2>(w.x, m0.x, m0.y, o[8 * i + 0], o[8 * i + 1]);
            fp8_decode4_f16<E5M2>(w.y, m0.z, m0.w, o[8 * i + 2], o[8 * i + 3]);
            fp8_decode4_f16<E5M2>(w.z, m1.x, m1.y, o[8 * i + 4], o[8 * i + 5]);
            fp8_decode4_f16<E5M2>(w.w, m1.z, m1.w, o[8 * i + 6], o[8 * i + 7]);
        }
        const unsigned a0 = smem_u32(canon) + static_cast<unsigned>(mn_canon_off(l, 4 * q));
#pragma unroll
        for (int j = 0; j < 4; ++j)  // chunk 4q + j (see canon_chunk4)
            sts_v4(canon_chunk4(a0, j), o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
    } else if constexpr (KIND == KIND_FP8_K && H) {
        unit_store<KIND, R, E5M2, true>(unit_load<KIND, R>(raw, rsc, u), canon, u);
    } else if constexpr (KIND == KIND_FP4_K) {
        unit_store<KIND, R, E5M2>(unit_load<KIND, R>(raw, rsc, u), canon, u);
    } else if constexpr (KIND == KIND_FP8_K) {
        // The same values as unit_load + unit_store; written out because folding it into them
        // changes the code of the mma.sync kernels (which call this between their MMAs), and
        // that change has not been timed.
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
            *reinterpret_cast<uint4*>(canon + k_canon_off(r, c)) =
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
        const unsigned a0 = smem_u32(canon) + static_cast<unsigned>(mn_canon_off(l, 4 * q));
#pragma unroll
        for (int j = 0; j < 4; ++j)  // chunk 4q + j (see canon_chunk4)
            sts_v4(canon_chunk4(a0, j), o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
    }
}

// Expand raw stage `rs` (A: RAW bytes of BM rows, then B) into the canonical buffer `cs` (A:
// BM x 64 16-bit, then B), by NT threads (t = this thread's index among them). K-major units
// are loaded first, all of them, then expanded and stored (see unit_load); MN-major units one
// by one (their 32 per-row factors per unit would not fit in registers many times over). Units
// of rows at or beyond rows_valid / cols_valid are not expanded (see unit_live). EA / EB: E5M2
// data (MXFP8 only). WITH_A = false: B only, its canonical tile at cs (the warp-specialised
// kernel, whose consumers decode A into registers). H: MXFP8 in the fp16 window (unit_store).
template <int AKIND, int BKIND, int BM, int BN, int NT, bool EA, bool EB, bool WITH_A = true,
          bool H = false>
__device__ __forceinline__ void convert_stage(const unsigned char* rs, unsigned char* cs,
                                              unsigned t, int rows_valid, int cols_valid) {
    using GA = TileGeo<AKIND, BM>;
    using GB = TileGeo<BKIND, BN>;
    const unsigned char* rsa = rs + round16(raw_data_bytes(AKIND, BM));
    const unsigned char* rb = rs + raw_bytes(AKIND, BM);
    const unsigned char* rsb = rb + round16(raw_data_bytes(BKIND, BN));
    unsigned char* cb = WITH_A ? cs + canon_bytes(BM) : cs;
    constexpr int NA = WITH_A ? (GA::UNITS + NT - 1) / NT : 0, NB = (GB::UNITS + NT - 1) / NT;
    constexpr bool KA = !GA::MN, KB = !GB::MN;
    UnitRaw<KA ? AKIND : KIND_FP4_K> xa[KA && NA > 0 ? NA : 1];
    UnitRaw<KB ? BKIND : KIND_FP4_K> xb[KB ? NB : 1];
    (void)xa;  // unused by MN-major operands
    (void)xb;
    const int t0 = static_cast<int>(t);
    if constexpr (KA) {
#pragma unroll
        for (int i = 0; i < NA; ++i) {
            const int u = t0 + i * NT;
            if (GA::UNITS % NT == 0 || u < GA::UNITS) xa[i] = unit_load<AKIND, BM>(rs, rsa, u);
        }
    }
    if constexpr (KB) {
#pragma unroll
        for (int i = 0; i < NB; ++i) {
            const int u = t0 + i * NT;
            if (GB::UNITS % NT == 0 || u < GB::UNITS) xb[i] = unit_load<BKIND, BN>(rb, rsb, u);
        }
    }
#pragma unroll
    for (int i = 0; i < NA; ++i) {
        const int u = t0 + i * NT;
        if ((GA::UNITS % NT == 0 || u < GA::UNITS) && unit_live<AKIND>(u, rows_valid)) {
            if constexpr (KA) {
                unit_store<AKIND, BM, EA, H>(xa[i], cs, u);
            } else {
                convert_unit<AKIND, BM, EA, H>(rs, rsa, cs, u);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NB; ++i) {
        const int u = t0 + i * NT;
        if ((GB::UNITS % NT == 0 || u < GB::UNITS) && unit_live<BKIND>(u, cols_valid)) {
            if constexpr (KB) {
                unit_store<BKIND, BN, EB, H, WITH_A>(xb[i], cb, u);
            } else {
                convert_unit<BKIND, BN, EB, H>(rb, rsb, cb, u);
            }
        }
    }
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_DEQUANT_CUH
