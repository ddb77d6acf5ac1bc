// The block-code range of every MXFP8 GEMM operand row, once per call, which the warp-specialised
// MXFP8 kernels (grouped_gemm_mxfp8_ws.cu, grouped_gemm_mxfp8_wsp.cu) check their tiles against
// the fp16 window with (grouped_gemm_mx_ranges.cuh).
#include "grouped_gemm_common.cuh"

LPM_GG_DEFINE_MX_RANGES(lpm_gg_mx_ranges)
