// Grouped GEMM on MXFP8 operands, the ragged persistent form of the warp-specialised wgrad
// kernel (grouped_gemm_mxfp8_wsp.cu's _nn_o for experts of different token counts): one CTA
// per SM over a balanced list of tiles of any contraction length, each tile starting its own
// scale group (grouped_gemm_ws_mx_ragged.cuh; sm_90a only).
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE_WS_MX_G(lpm_gg_mxfp8_nn_g, true, true)
