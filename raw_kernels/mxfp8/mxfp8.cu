// lowprec_moe: MXFP8 kernels (production module): quantize (rowwise / columnwise / 2-D, single
// and grouped, one pass), fused wire rowwise -> columnwise, dequantize. The code lives in
// mxfp8_impl.cuh (device functions) and mxfp8_entry.cuh (extern "C" kernels); this module uses
// the hardware fp32 -> fp8 conversion (cvt.rn.satfinite.{e4m3,e5m2}x2.f32).
#define LPM_MX_HW_CVT true
#include "mxfp8_entry.cuh"
