// Grouped GEMM on NVFP4 operands, the ragged persistent form of the warp-specialised cp.async
// build (grouped_gemm_nvfp4_ws.cu's _kk_x / _kk_x8 for experts of different contraction
// lengths, as wgrad of uneven splits has): one CTA per SM over a balanced list of tiles of any
// length (grouped_gemm_ws_ragged.cuh; sm_90a only). _g / _g8: cp.async copies of 16 / 8 bytes;
// _h / _h8: the TMA build (per-expert row-pair tensor maps), for the same launcher chunks.
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE_WS_G(lpm_gg_nvfp4_kk_g, 16)
LPM_GG_DEFINE_WS_G(lpm_gg_nvfp4_kk_g8, 8)
LPM_GG_DEFINE_WS_H(lpm_gg_nvfp4_kk_h, 16)
LPM_GG_DEFINE_WS_H(lpm_gg_nvfp4_kk_h8, 8)
LPM_GG_DEFINE_WS_H_MAPS(lpm_gg_nvfp4_kk_h_maps)
