// Grouped GEMM on NVFP4 operands, the ragged persistent form of the warp-specialised cp.async
// build (grouped_gemm_nvfp4_ws.cu's _kk_x / _kk_x8 for experts of different contraction
// lengths, as wgrad of uneven splits has): one CTA per SM over a balanced list of tiles of any
// length (grouped_gemm_ws_ragged.cuh; sm_90a only). _g / _g8: cp.async copies of 16 / 8 bytes.
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE_WS_G(lpm_gg_nvfp4_kk_g, 16)
LPM_GG_DEFINE_WS_G(lpm_gg_nvfp4_kk_g8, 8)
