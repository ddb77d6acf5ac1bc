// lowprec_moe: extern "C" MXFP8 kernels. Included once by raw_kernels/mxfp8/mxfp8.cu and once by
// raw_kernels/mxfp8/mxfp8_intcvt.cu, which define LPM_MX_HW_CVT (true: hardware fp32 -> fp8
// conversion, false: integer conversion) first. Both modules export the same kernel names.

#ifndef LPM_MX_HW_CVT
#error "define LPM_MX_HW_CVT (true or false) before including mxfp8_entry.cuh"
#endif

#include "mxfp8_impl.cuh"

// ================================================================================================
// extern "C" entry points
// ================================================================================================

// Quantize x [m_total, k] (k % 32 == 0; element type in the kernel name). Grid: one warp per
// (row tile, column tile), LPM_MX_WARPS_PER_CTA warps per CTA; row tiles are
// ceil(m_total / 32) for a single tensor (row_off == tile_off == nullptr) or the per-member
// 32-row tiles of a grouped tensor (row_off / tile_off: device int64 [num_groups + 1]).
// Outputs that are not requested by `flags` may be nullptr. col_sums (nullable): fp32
// [num_row_tiles, k], each row tile's column sums of x (times probs [m_total], nullable).
#define LPM_MX_QUANTIZE_KERNEL(NAME, KIND)                                                       \
    extern "C" __global__ void                                                                  \
    __launch_bounds__(LPM_MX_WARPS_PER_CTA * 32, LPM_MX_MIN_CTAS_PER_SM)                        \
        NAME(const void* __restrict__ x, long long m_total, long long k,                        \
             const long long* __restrict__ row_off, const long long* __restrict__ tile_off,     \
             int num_groups, long long num_row_tiles, unsigned char* __restrict__ row_data,     \
             unsigned char* __restrict__ row_scale, unsigned char* __restrict__ col_data,       \
             unsigned char* __restrict__ col_scale, int flags, float* __restrict__ col_sums,    \
             const float* __restrict__ probs) {                                                 \
        lpm_mx::TileOut o;                                                                       \
        o.row_data = row_data;                                                                   \
        o.row_scale = row_scale;                                                                 \
        o.col_data = col_data;                                                                   \
        o.col_scale = col_scale;                                                                 \
        lpm_mx::quantize_dispatch<KIND, LPM_MX_HW_CVT>(static_cast<const unsigned char*>(x),    \
                                                       m_total, k, row_off, tile_off,            \
                                                       num_groups, num_row_tiles, o, flags,      \
                                                       col_sums, probs);                         \
    }

LPM_MX_QUANTIZE_KERNEL(lpm_mxfp8_quantize_f32, lpm_mx::KIND_F32)
LPM_MX_QUANTIZE_KERNEL(lpm_mxfp8_quantize_f16, lpm_mx::KIND_F16)
LPM_MX_QUANTIZE_KERNEL(lpm_mxfp8_quantize_bf16, lpm_mx::KIND_BF16)

#undef LPM_MX_QUANTIZE_KERNEL

// Fused GroupedTensor.with_columnwise(): wire data [m_total, k] + compact scale [m_total, k/32]
// -> columnwise data / scale of every member (flat, as the grouped quantize kernel writes them)
// and, when swz_scale != nullptr, the rowwise scales in the GEMM-swizzled layout (member g at
// byte swz_off[g], padding bytes left untouched: the caller zero-fills the buffer). Grid as
// the quantize kernels with the fp32 tile shape (64 columns per warp tile).
extern "C" __global__ void __launch_bounds__(LPM_MX_WARPS_PER_CTA * 32, LPM_MX_MIN_CTAS_PER_SM)
    lpm_mxfp8_colwise_from_rowwise(const unsigned char* __restrict__ wire_data,
                                   const unsigned char* __restrict__ wire_scale,
                                   long long m_total, long long k,
                                   const long long* __restrict__ row_off,
                                   const long long* __restrict__ tile_off,
                                   const long long* __restrict__ swz_off, int num_groups,
                                   long long num_row_tiles, unsigned char* __restrict__ col_data,
                                   unsigned char* __restrict__ col_scale,
                                   unsigned char* __restrict__ swz_scale, int flags) {
    using namespace lpm_mx;
    const bool wire_e5m2 = (flags & LPM_MX_FLAG_WIRE_E5M2) != 0;
    const bool e5m2 = (flags & LPM_MX_FLAG_E5M2) != 0;
#define LPM_MX_FUSED_CALL(W, F)                                                                  \
    colwise_from_rowwise_body<W, F, LPM_MX_HW_CVT>(wire_data, wire_scale, m_total, k, row_off,  \
                                                   tile_off, swz_off, num_groups,              \
                                                   num_row_tiles, col_data, col_scale,         \
                                                   swz_scale)
    if (!wire_e5m2) {
        if (!e5m2) LPM_MX_FUSED_CALL(FMT_E4M3, FMT_E4M3);
        else LPM_MX_FUSED_CALL(FMT_E4M3, FMT_E5M2);
    } else {
        if (!e5m2) LPM_MX_FUSED_CALL(FMT_E5M2, FMT_E4M3);
        else LPM_MX_FUSED_CALL(FMT_E5M2, FMT_E5M2);
    }
#undef LPM_MX_FUSED_CALL
}

// Dequantize to float32 out [rows_out, k] (k % 32 == 0).
//   columnwise == 0: data [rows_out, k], scale [rows_out, k/32].
//   columnwise != 0: flat columnwise buffers; output row i of member g (row_off, device int64
//   [num_groups + 1]) reads tile tile_off[g] + (i - row_off[g]) / 32; without offsets
//   (nullptr) output row i reads data row i and scale row i / 32 (padding rows cropped).
// Block LPM_MX_DEQ_THREADS threads: 2^tpr_log2 threads per row, each 16 elements per step;
// grid-stride over rows.
extern "C" __global__ void __launch_bounds__(LPM_MX_DEQ_THREADS)
    lpm_mxfp8_dequantize(const unsigned char* __restrict__ data,
                         const unsigned char* __restrict__ scale, float* __restrict__ out,
                         long long rows_out, long long k, int columnwise,
                         const long long* __restrict__ row_off,
                         const long long* __restrict__ tile_off, int num_groups, int e5m2,
                         int tpr_log2) {
    if (e5m2) {
        lpm_mx::dequantize_body<lpm_mx::FMT_E5M2>(data, scale, out, rows_out, k, columnwise,
                                                  row_off, tile_off, num_groups, tpr_log2);
    } else {
        lpm_mx::dequantize_body<lpm_mx::FMT_E4M3>(data, scale, out, rows_out, k, columnwise,
                                                  row_off, tile_off, num_groups, tpr_log2);
    }
}
