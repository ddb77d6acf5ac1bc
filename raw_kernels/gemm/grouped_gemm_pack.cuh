// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): 16-bit
// output words from fp32 values with the reference's rounding (pack8_each, element by element;
// pack8, by pairs where that gives the same bits), for the epilogues (grouped_gemm_epilogue.cuh,
// grouped_gemm_epi_regs.cuh).

#ifndef LPM_GROUPED_GEMM_PACK_CUH
#define LPM_GROUPED_GEMM_PACK_CUH

#include "grouped_gemm_base.cuh"

namespace lpm_gg {

// Eight floats to four words of 16-bit OT values (low half first), element by element:
// lpm_f32_to_bf16_bits_rn (NaN payload kept) or cvt.rn.f16.f32.
template <int OT>
__device__ __forceinline__ void pack8_each(const float (&v)[8], unsigned (&w)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const unsigned h0 = OT == OUT_BF16 ? lpm_f32_to_bf16_bits_rn(v[2 * j])
                                           : f32_to_f16_bits_rn(v[2 * j]);
        const unsigned h1 = OT == OUT_BF16 ? lpm_f32_to_bf16_bits_rn(v[2 * j + 1])
                                           : f32_to_f16_bits_rn(v[2 * j + 1]);
        w[j] = h0 | (h1 << 16);
    }
}

// Eight floats to four words of 16-bit OT values, the bits of pack8_each. bf16: cvt.rn.bf16x2.f32
// per pair, which rounds like lpm_f32_to_bf16_bits_rn for every non-NaN value; a NaN input is the
// only one that packs to a NaN pattern (|h| > 0x7F80), and a group holding one converts element
// by element (lpm_f32_to_bf16_bits_rn keeps the payload).
// pack8_bf16: the cvt.rn.bf16x2.f32 half, OR-ing into `bad` each word's test; a group with
// (bad & kPackNaN) != 0 holds a NaN and takes pack8_each.
constexpr unsigned kPackNaN = 0x80008000u;
__device__ __forceinline__ void pack8_bf16(const float (&v)[8], unsigned (&w)[4], unsigned& bad) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        w[j] = pack_bf16x2_rn(v[2 * j], v[2 * j + 1]);
        bad |= (w[j] & 0x7FFF7FFFu) + 0x007F007Fu;
    }
}
template <int OT>
__device__ __forceinline__ void pack8(const float (&v)[8], unsigned (&w)[4]) {
    if constexpr (OT == OUT_BF16) {
        unsigned bad = 0u;
        pack8_bf16(v, w, bad);
        if (bad & kPackNaN) pack8_each<OT>(v, w);
    } else {
        pack8_each<OT>(v, w);
    }
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_PACK_CUH
