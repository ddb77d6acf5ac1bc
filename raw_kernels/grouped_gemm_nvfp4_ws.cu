// Grouped GEMM on NVFP4 operands, the warp-specialised kernels (sm_90a only; see
// grouped_gemm_nvfp4.cu for the operands): producer warpgroups copy and expand B into shared
// memory while consumer warpgroups decode A straight into wgmma registers
// (grouped_gemm_ws.cuh). _x / _x8: cp.async copies of 16 / 8 bytes.
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE_WS(lpm_gg_nvfp4_kk_x, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 16)
LPM_GG_DEFINE_WS(lpm_gg_nvfp4_kk_x8, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true, 8)
// The same with TMA loads of the data tiles and block scales (uniform strides; the launcher
// checks).
LPM_GG_DEFINE_WS_TMA(lpm_gg_nvfp4_kk_y, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K, true)
// ... and its 384-thread form: one producer warpgroup, consumers on m64n256k16
// (grouped_gemm_ws_n256.cuh).
LPM_GG_DEFINE_WS_N256(lpm_gg_nvfp4_kk_q)
// ... and its persistent form: one CTA per SM over many tiles, the next tile's copies and
// expansion overlapping the current one's end and epilogue (grouped_gemm_ws_persist.cuh).
LPM_GG_DEFINE_WS_P(lpm_gg_nvfp4_kk_z, lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K)
// ... and the persistent 384-thread form (the same file).
LPM_GG_DEFINE_WS_NP(lpm_gg_nvfp4_kk_o)
