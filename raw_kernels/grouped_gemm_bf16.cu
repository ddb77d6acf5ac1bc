// Grouped GEMM on high-precision bf16 operands: mma.sync.m16n8k16 (bf16), fp32 accumulation.
// See grouped_gemm_common.cuh for the tile machinery, the descriptor table and the epilogue.
//   kk: A and B contraction-contiguous (fprop: x [M, K], W [N, K])
//   kn: A contraction-contiguous, B rows-contiguous (dgrad: dy [M, N], W [N, K] read as W^T)
//   nn: both rows-contiguous (wgrad: dy^T and x^T read from dy [M, N], x [M, K])
//   _l: 128x256 CTA tile (2x4 warps of 64x64); _s: 32x256 (1x8 warps of 32x32) for few tokens;
//   _w / _v: 128x256 / 64x256 tiles on wgmma.m64n128k16 (sm_90a only; two warpgroups).
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE(lpm_gg_bf16_kk_l, 128, 256, 2, lpm_gg::KIND_HP_K, lpm_gg::KIND_HP_K, false, 16)
LPM_GG_DEFINE(lpm_gg_bf16_kk_s, 32, 256, 1, lpm_gg::KIND_HP_K, lpm_gg::KIND_HP_K, false, 16)
LPM_GG_DEFINE(lpm_gg_bf16_kn_l, 128, 256, 2, lpm_gg::KIND_HP_K, lpm_gg::KIND_HP_MN, false, 16)
LPM_GG_DEFINE(lpm_gg_bf16_kn_s, 32, 256, 1, lpm_gg::KIND_HP_K, lpm_gg::KIND_HP_MN, false, 16)
LPM_GG_DEFINE(lpm_gg_bf16_nn_l, 128, 256, 2, lpm_gg::KIND_HP_MN, lpm_gg::KIND_HP_MN, false, 16)
LPM_GG_DEFINE_WG(lpm_gg_bf16_kk_w, 128, lpm_gg::KIND_HP_K, lpm_gg::KIND_HP_K, false, 16)
LPM_GG_DEFINE_WG(lpm_gg_bf16_kk_v, 64, lpm_gg::KIND_HP_K, lpm_gg::KIND_HP_K, false, 16)
LPM_GG_DEFINE_WG(lpm_gg_bf16_kn_w, 128, lpm_gg::KIND_HP_K, lpm_gg::KIND_HP_MN, false, 16)
LPM_GG_DEFINE_WG(lpm_gg_bf16_kn_v, 64, lpm_gg::KIND_HP_K, lpm_gg::KIND_HP_MN, false, 16)
LPM_GG_DEFINE_WG(lpm_gg_bf16_nn_w, 128, lpm_gg::KIND_HP_MN, lpm_gg::KIND_HP_MN, false, 16)
