// Grouped GEMM on MXFP8 operands, the persistent form of the warp-specialised kernel
// (grouped_gemm_mxfp8_ws.cu): one CTA per SM over many tiles, the producers widening the next
// tile's first k-tiles while the consumers finish the current one, one staging mode per launch
// (grouped_gemm_ws_mx_persist.cuh; sm_90a only).
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE_WS_MX_P(lpm_gg_mxfp8_kk_o, false, false)
LPM_GG_DEFINE_WS_MX_P(lpm_gg_mxfp8_kn_o, false, true)
LPM_GG_DEFINE_WS_MX_P(lpm_gg_mxfp8_nn_o, true, true)
