// lowprec_moe: MXFP8 kernels with a pure integer fp32 -> fp8 conversion. Same kernels and names
// as raw_kernels/mxfp8/mxfp8.cu (see mxfp8_impl.cuh); the tests compare the two modules and the NumPy
// reference, and lowprec_moe/backends/cupy/mxfp8.py can be pointed at this module should the hardware
// conversion ever disagree with the reference. Also holds a conversion probe kernel.
#define LPM_MX_HW_CVT false
#include "mxfp8_entry.cuh"

// Element conversion probe (tests): for each i < n, out[i] bits 0-7 = the raw byte of the
// hardware conversion of x[i] (before NaN canonicalisation), bits 8-15 = the integer path.
extern "C" __global__ void lpm_mxfp8_cvt_probe(const float* __restrict__ x,
                                               unsigned short* __restrict__ out, long long n,
                                               int e5m2) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    unsigned int hw, in;
    if (e5m2) {
        hw = lpm_mx::cvt_pair<lpm_mx::FMT_E5M2, true>(v, 0.0f) & 0xFFu;
        in = lpm_mx::f32_to_fp8_int<lpm_mx::FMT_E5M2>(v);
    } else {
        hw = lpm_mx::cvt_pair<lpm_mx::FMT_E4M3, true>(v, 0.0f) & 0xFFu;
        in = lpm_mx::f32_to_fp8_int<lpm_mx::FMT_E4M3>(v);
    }
    out[i] = (unsigned short)(hw | (in << 8));
}
