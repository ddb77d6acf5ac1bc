// Grouped GEMM on NVFP4 operands (fprop, dgrad and wgrad): every NVFP4 copy the GEMMs use is
// contraction-contiguous (rowwise data, or the columnwise copy stored transposed), so one
// kernel shape serves all three. Packed nibbles and E4M3 block scales are expanded exactly to
// fp16 (e2m1 * e4m3) in shared memory or, for one wgmma operand of the _x and _t kernels,
// straight into registers; tensor-core MMA on fp16 with fp32 accumulation (mma.sync.m16n8k16,
// or wgmma on sm_90a); the per-tensor / row-scaled global factors are applied in the epilogue.
// See grouped_gemm_common.cuh. The warp-specialised kernels (_x, _y, _q, _z, _o) are in
// grouped_gemm_nvfp4_ws.cu: one module per family, each compiled separately on first use, so
// that a call compiles only the family it runs.
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE(lpm_gg_nvfp4_kk_l, 128, 256, 2, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 16)
LPM_GG_DEFINE(lpm_gg_nvfp4_kk_s, 32, 256, 1, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 16)
// 8-byte copies: rows of K/2 bytes that are not 16-byte multiples (e.g. wgrad over an expert whose
// padded token count is an odd multiple of 16).
LPM_GG_DEFINE(lpm_gg_nvfp4_kk_l8, 128, 256, 2, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 8)
LPM_GG_DEFINE(lpm_gg_nvfp4_kk_s8, 32, 256, 1, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 8)
// wgmma (sm_90a only): 128x256 (_w, m64n256k16) and 64x256 (_v, m64n128k16; few tokens per
// expert) tiles.
LPM_GG_DEFINE_WG(lpm_gg_nvfp4_kk_w, 128, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 16)
LPM_GG_DEFINE_WG(lpm_gg_nvfp4_kk_v, 64, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 16)
LPM_GG_DEFINE_WG(lpm_gg_nvfp4_kk_w8, 128, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 8)
LPM_GG_DEFINE_WG(lpm_gg_nvfp4_kk_v8, 64, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 8)
// Few tokens per expert (fprop / dgrad, sm_90a only): 32 tokens x 128 output columns, weights
// on the wgmma M side (grouped_gemm_swap.cuh).
LPM_GG_DEFINE_SWAP(lpm_gg_nvfp4_kk_t, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 16, 3)
LPM_GG_DEFINE_SWAP(lpm_gg_nvfp4_kk_t8, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 8, 3)
// The same with TMA loads of the data tiles (uniform row strides, whole k-tiles; the launcher
// checks).
LPM_GG_DEFINE_SWAP_TMA(lpm_gg_nvfp4_kk_u, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 3)
// ... and the wide build: 32 tokens x 256 output columns, two CTAs per SM (many column tiles).
LPM_GG_DEFINE_SWAP_TMA_WIDE(lpm_gg_nvfp4_kk_r, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true)
// ... and its 16-token form (wgmma m64n16k16) when no expert has more than 16 tokens.
LPM_GG_DEFINE_SWAP_TMA_WIDE16(lpm_gg_nvfp4_kk_p, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true)
