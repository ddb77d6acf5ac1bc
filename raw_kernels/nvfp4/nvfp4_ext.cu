// NVFP4 quantize kernels with stochastic rounding and / or the random Hadamard transform of the
// columnwise copy (flags LPM_Q_SR, LPM_Q_RHT). Device code: nvfp4_common.cuh (parts nvfp4_*.cuh).
#include "nvfp4_common.cuh"

// Extended kernels: also stochastic rounding and the RHT of the columnwise copy.
extern "C" __global__ void __launch_bounds__(Q_THREADS) lpm_nvfp4_quantize_ext_f32(LPM_QUANTIZE_ARGS) {
    quantize_impl<LPM_DT_F32, true> LPM_QUANTIZE_CALL;
}
extern "C" __global__ void __launch_bounds__(Q_THREADS) lpm_nvfp4_quantize_ext_f16(LPM_QUANTIZE_ARGS) {
    quantize_impl<LPM_DT_F16, true> LPM_QUANTIZE_CALL;
}
extern "C" __global__ void __launch_bounds__(Q_THREADS) lpm_nvfp4_quantize_ext_bf16(LPM_QUANTIZE_ARGS) {
    quantize_impl<LPM_DT_BF16, true> LPM_QUANTIZE_CALL;
}


// The RHT of n 16-value bf16 chunks (in, out: [n, 16] bf16 bits), one chunk per thread: lets the
// tests compare every summation path of q_rht16 with the reference value by value.
extern "C" __global__ void lpm_nvfp4_rht16_bf16(const unsigned short* __restrict__ in,
                                                unsigned short* __restrict__ out, long long n) {
    const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = q_bf16_bits_to_f32(in[16 * c + i]);
    q_rht16<8>(v);
#pragma unroll
    for (int i = 0; i < 16; ++i) out[16 * c + i] = (unsigned short)(__float_as_uint(v[i]) >> 16);
}
