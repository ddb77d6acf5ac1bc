// nvfp4.cu built with the integer fp32 -> E4M3 conversion instead of cvt.rn.satfinite.e4m3x2.f32
// (tests compare both against the reference).
#define LPM_NVFP4_INTEGER_E4M3
#include "nvfp4.cu"
