// Grouped GEMM on MXFP8 operands, the warp-specialised kernel with TMA loads (fprop, dgrad and
// wgrad, 128x256; uniform strides, the launcher checks): producers widen B, consumers widen A
// into wgmma registers, each tile on fp16 (fp16 window) or bf16 (grouped_gemm_ws_mx.cuh; sm_90a
// only). The layouts are grouped_gemm_mxfp8.cu's: kk fprop, kn dgrad, nn wgrad.
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE_WS_MX(lpm_gg_mxfp8_kk_y, false, false)
LPM_GG_DEFINE_WS_MX(lpm_gg_mxfp8_kn_y, false, true)
LPM_GG_DEFINE_WS_MX(lpm_gg_mxfp8_nn_y, true, true)
