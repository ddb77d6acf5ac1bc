// Grouped GEMM on MXFP8 operands (E4M3 / E5M2 per operand, chosen at run time): fp8 bytes and
// E8M0 block scales are expanded to bf16 in shared memory (fp8 * 2^(e-127), exact for every
// block whose values are bf16 normals; see grouped_gemm_common.cuh), then mma.sync.m16n8k16 bf16
// with fp32 accumulation. The wgmma tiles (_w, _v) stage tiles inside the fp16 window on fp16
// instead (grouped_gemm_mxf16.cuh). The warp-specialised kernels are in
// grouped_gemm_mxfp8_ws.cu and grouped_gemm_mxfp8_wsp.cu, the range kernel they read in
// grouped_gemm_mx_ranges.cu: one module per family, each compiled separately on first use, so
// that a call compiles only the family it runs.
//   kk: rowwise A and B (fprop)
//   kn: rowwise A, columnwise B ([N, K] row-major, contraction along rows: dgrad's W)
//   nn: columnwise A and B (wgrad's dy and x, [Mp, X] row-major)
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE(lpm_gg_mxfp8_kk_l, 128, 256, 2, lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_K, false, 16)
LPM_GG_DEFINE(lpm_gg_mxfp8_kk_s, 32, 256, 1, lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_K, false, 16)
LPM_GG_DEFINE(lpm_gg_mxfp8_kn_l, 128, 256, 2, lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_MN, false, 16)
LPM_GG_DEFINE(lpm_gg_mxfp8_kn_s, 32, 256, 1, lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_MN, false, 16)
LPM_GG_DEFINE(lpm_gg_mxfp8_nn_l, 128, 256, 2, lpm_gg::KIND_FP8_MN, lpm_gg::KIND_FP8_MN, false, 16)
// wgmma.m64n128k16 (sm_90a only): 128x256 (_w) and 64x256 (_v, few tokens per expert) tiles.
LPM_GG_DEFINE_WG(lpm_gg_mxfp8_kk_w, 128, lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_K, false, 16)
LPM_GG_DEFINE_WG(lpm_gg_mxfp8_kk_v, 64, lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_K, false, 16)
LPM_GG_DEFINE_WG(lpm_gg_mxfp8_kn_w, 128, lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_MN, false, 16)
LPM_GG_DEFINE_WG(lpm_gg_mxfp8_kn_v, 64, lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_MN, false, 16)
LPM_GG_DEFINE_WG(lpm_gg_mxfp8_nn_w, 128, lpm_gg::KIND_FP8_MN, lpm_gg::KIND_FP8_MN, false, 16)
// Few tokens per expert (fprop, sm_90a only): 32 tokens x 128 output columns, weights on the
// wgmma M side (grouped_gemm_swap.cuh).
LPM_GG_DEFINE_SWAP(lpm_gg_mxfp8_kk_t, lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_K, false, 16, 2)
