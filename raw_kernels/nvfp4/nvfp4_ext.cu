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

