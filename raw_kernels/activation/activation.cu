// lowprec_moe: GroupedMLP activation kernels (forward and backward), optionally fused with the
// MXFP8 quantization of their output. Launched by lowprec_moe/backends/cupy/activation.py.
//
// Semantics (NUMERICS §8; lowprec_moe/backends/numpy/activations.py is the definition): fp32 math,
// every operation one IEEE round-to-nearest-even step without flush-to-zero, in the order the
// reference writes it, and an exponential built from such operations (Cody-Waite reduction, a
// degree-7 Horner polynomial, exact power-of-two scaling), so that every activation value and
// element gradient is bit-identical to the NumPy reference. CuPy compiles with -ftz=true: all
// arithmetic here goes through the non-flushing helpers of lpm_formats.cuh, comparisons through
// setp without .ftz, negation through the sign bit.
//
// Kernels
//   lpm_act_fwd_{f32,f16,bf16}      z = round(act(h) * p) -> z [M, F] of the layer dtype
//   lpm_act_fwd_mx_{f32,f16,bf16}   the same values quantized to MXFP8 rowwise and/or columnwise
//                                   (z never written); bytes equal to quantizing z
//   lpm_act_bwd_{f32,f16,bf16}      dh = round(act'(h) * (dz * p)) -> dh [M, W] (optional),
//                                   per-row dprobs partials, per-tile column sums of dh
//   lpm_act_bwd_mx_{f32,f16,bf16}   the same with dh quantized to MXFP8 (E4M3 / E5M2)
//   lpm_act_row_sum                 per-row sums of the dprobs partials
//
// Work decomposition (shared by all modes, so that fused and unfused runs sum in the same order):
// one warp per (32-row tile of one expert, TILE_COLS output features), the tile shape of the
// MXFP8 quantizer (mxfp8_impl.cuh): lane = (rsub, chunk), rows rsub + 2j (j < 16), features
// f0 = tile start + chunk * VEC .. + VEC. The values a lane computes are packed exactly as the
// quantizer would have loaded them from memory, and the fused stage performs lpm_mx::process_tile's
// arithmetic on them (see "per-warp staging" in activation_stage.cuh), which is why the fused
// output equals the unfused chain bit for bit. The _amax kernels take the NVFP4 amax of the
// values they write with the NaN rule and the RHT code of the NVFP4 quantizer (nvfp4_common.cuh).
// In the backward, a warp writes the gate gradients (phase 0) then the linear gradients (phase 1)
// of its features; with MXFP8 output every aligned 32-column block of dh must be all gate or all
// linear (glu_interleave % 32 == 0).
//
// Reductions: dprobs partial of (row, feature tile) = fp32 sum over the lane's VEC features in
// order, then a butterfly over the 16 lanes of the row (xor 1, 2, 4, 8); lpm_act_row_sum adds
// the partials of a row in order. Column sums: fp32 sum of the lane's 16 rows in order, plus the
// other row parity (xor 16); per expert, lpm_segment_sum_tiles
// (raw_kernels/reduce/reduce.cu) adds the tiles in order.
// Deterministic and independent of the other experts (grouped == per expert, bitwise); not the
// NumPy summation order.
//
// Sources: this file holds the launch-time constants and the extern "C" kernels; the device
// code is in its parts, included below in this order:
//   activation_math.cuh   exponential constants, comparisons, exp, activations and their
//                         gradients, element formats
//   activation_tile.cuh   GLU column layout, tile set-up, row loads / stores
//   activation_stage.cuh  per-warp staging: fused MXFP8 quantization, NVFP4 amax outputs
//   activation_body.cuh   forward and backward bodies

#include "mxfp8_impl.cuh"
#include "nvfp4_common.cuh"  // q_rht16, q_amax16: the NVFP4 quantizer's RHT amax arithmetic

// ------------------------------------------------------------------------------------------
// Launch-time constants shared with lowprec_moe/backends/cupy/activation.py
constexpr int LPM_ACT_WARPS_PER_CTA = 4;
constexpr int LPM_ACT_FWD_MX_MIN_CTAS_PER_SM = 4;  // lpm_act_fwd_mx_*: <= 128 registers (uses ~96)
#ifndef LPM_ACT_BWD_MX_MINB
#define LPM_ACT_BWD_MX_MINB 4
#endif
// 4: <= 128 registers (the kernel would take ~160; the ~170 bytes of spills cost less than the
// occupancy of 3 CTAs / SM: measured 1.72 vs 1.92 ms at the DeepSeek-like size)
constexpr int LPM_ACT_BWD_MX_MIN_CTAS_PER_SM = LPM_ACT_BWD_MX_MINB;
// Row loops load the inputs of row j + 1 before computing row j (vector path).
#ifndef LPM_ACT_PREFETCH
#define LPM_ACT_PREFETCH 1
#endif
constexpr int LPM_ACT_COLSUM_THREADS = 256;
constexpr int LPM_ACT_SWIGLU = 0;
constexpr int LPM_ACT_CLAMPED_SWIGLU = 1;
constexpr int LPM_ACT_SRELU = 2;
static_assert(LPM_ACT_SRELU != LPM_ACT_SWIGLU && LPM_ACT_SRELU != LPM_ACT_CLAMPED_SWIGLU,
              "activation ids must differ (act_values / act_grads: srelu, clamped_swiglu, else swiglu)");
// `flags`: LPM_MX_FLAG_ROWWISE (1), LPM_MX_FLAG_COLUMNWISE (2), LPM_MX_FLAG_E5M2 (8) and
constexpr int LPM_ACT_FLAG_VEC = 64;  // 16-byte vector loads / stores allowed (host-checked)
// NVFP4 amax outputs of the _amax kernels (atomicMax on the fp32 bits of |v|, NaN ignored):
constexpr int LPM_ACT_FLAG_AMAX = 128;       // amax_a[g] = max |out| of member g
constexpr int LPM_ACT_FLAG_AMAX_RHT = 256;   // also amax_b[g] = max |RHT columnwise chunks| (bf16)
constexpr int LPM_ACT_FLAG_AMAX_ROWS = 512;  // amax_a[row] per row, amax_b[g * width + col]

#include "activation_math.cuh"
#include "activation_tile.cuh"
#include "activation_stage.cuh"
#include "activation_body.cuh"

// ================================================================================================
// extern "C" entry points
// ================================================================================================

// Forward. h [m_total, h_width] (h_width = 2 f_dim for GLU, f_dim for srelu; dtype in the name),
// probs fp32 [m_total] or nullptr, il = glu_interleave (0: none). Row tiles: the per-member
// 32-row tiles (row_off / tile_off: device int64 [num_groups + 1]). Plain kernels write
// z [m_total, f_dim]; _amax kernels write z and its NVFP4 amax (flags LPM_ACT_FLAG_AMAX*; amax_a /
// amax_b zero-filled uint32 views of the fp32 outputs); _mx kernels write MXFP8 of z as the grouped
// quantizer lays it out (flags: rowwise / columnwise / e5m2). Grid: ceil(num_row_tiles *
// ceil(f_dim / TILE_COLS) / 4) CTAs of 128 threads.
#define LPM_ACT_FWD_KERNEL(NAME, KIND, MODE, MINB)                                                 \
    extern "C" __global__ void __launch_bounds__(LPM_ACT_WARPS_PER_CTA * 32, MINB)                 \
        NAME(const void* __restrict__ h, const float* __restrict__ probs, long long f_dim,         \
             long long h_width, int glu, int il, int act, float limit, float alpha,                \
             long long m_total, const long long* __restrict__ row_off,                             \
             const long long* __restrict__ tile_off, int num_groups, long long num_row_tiles,      \
             void* __restrict__ z, unsigned char* __restrict__ row_data,                           \
             unsigned char* __restrict__ row_scale, unsigned char* __restrict__ col_data,          \
             unsigned char* __restrict__ col_scale, int flags, unsigned int* __restrict__ amax_a,  \
             unsigned int* __restrict__ amax_b) {                                                  \
        __shared__ lpm_act::Stage st;                                                              \
        const lpm_act::Params P = {act, limit, alpha};                                             \
        lpm_act::TileOut o;                                                                        \
        o.row_data = row_data;                                                                     \
        o.row_scale = row_scale;                                                                   \
        o.col_data = col_data;                                                                     \
        o.col_scale = col_scale;                                                                   \
        const unsigned char* hb = static_cast<const unsigned char*>(h);                            \
        unsigned char* zb = static_cast<unsigned char*>(z);                                        \
        if (MODE == lpm_act::MODE_MX && (flags & LPM_MX_FLAG_E5M2) != 0) {                         \
            lpm_act::fwd_body<KIND, MODE, lpm_act::FMT_E5M2>(                                      \
                hb, probs, f_dim, h_width, glu, il, P, m_total, row_off, tile_off, num_groups,     \
                num_row_tiles, zb, o, flags, amax_a, amax_b, st);                                  \
        } else {                                                                                   \
            lpm_act::fwd_body<KIND, MODE, lpm_act::FMT_E4M3>(                                      \
                hb, probs, f_dim, h_width, glu, il, P, m_total, row_off, tile_off, num_groups,     \
                num_row_tiles, zb, o, flags, amax_a, amax_b, st);                                  \
        }                                                                                          \
    }

LPM_ACT_FWD_KERNEL(lpm_act_fwd_f32, lpm_act::KIND_F32, lpm_act::MODE_PLAIN, 1)
LPM_ACT_FWD_KERNEL(lpm_act_fwd_f16, lpm_act::KIND_F16, lpm_act::MODE_PLAIN, 1)
LPM_ACT_FWD_KERNEL(lpm_act_fwd_bf16, lpm_act::KIND_BF16, lpm_act::MODE_PLAIN, 1)
LPM_ACT_FWD_KERNEL(lpm_act_fwd_amax_f32, lpm_act::KIND_F32, lpm_act::MODE_AMAX, 1)
LPM_ACT_FWD_KERNEL(lpm_act_fwd_amax_f16, lpm_act::KIND_F16, lpm_act::MODE_AMAX, 1)
LPM_ACT_FWD_KERNEL(lpm_act_fwd_amax_bf16, lpm_act::KIND_BF16, lpm_act::MODE_AMAX, 1)
LPM_ACT_FWD_KERNEL(lpm_act_fwd_mx_f32, lpm_act::KIND_F32, lpm_act::MODE_MX,
                   LPM_ACT_FWD_MX_MIN_CTAS_PER_SM)
LPM_ACT_FWD_KERNEL(lpm_act_fwd_mx_f16, lpm_act::KIND_F16, lpm_act::MODE_MX,
                   LPM_ACT_FWD_MX_MIN_CTAS_PER_SM)
LPM_ACT_FWD_KERNEL(lpm_act_fwd_mx_bf16, lpm_act::KIND_BF16, lpm_act::MODE_MX,
                   LPM_ACT_FWD_MX_MIN_CTAS_PER_SM)

#undef LPM_ACT_FWD_KERNEL

// Backward. dz [m_total, f_dim] and h [m_total, h_width] of the same dtype; probs as above.
// Optional outputs (nullptr: skipped): dh [m_total, h_width] (layer dtype); the MXFP8 copies of
// dh (_mx kernels, flags); the NVFP4 amax of dh (_amax kernels, flags, amax_a / amax_b; dh must be
// written); dprobs_part fp32 [m_total, ceil(f_dim / TILE_COLS)] (needs probs); colsum_part fp32
// [num_row_tiles, h_width]. Grid as the forward.
#define LPM_ACT_BWD_KERNEL(NAME, KIND, MODE, MINB)                                                 \
    extern "C" __global__ void __launch_bounds__(LPM_ACT_WARPS_PER_CTA * 32, MINB)                 \
        NAME(const void* __restrict__ dz, const void* __restrict__ h,                              \
             const float* __restrict__ probs, long long f_dim, long long h_width, int glu,         \
             int il, int act, float limit, float alpha, long long m_total,                         \
             const long long* __restrict__ row_off, const long long* __restrict__ tile_off,        \
             int num_groups, long long num_row_tiles, void* __restrict__ dh,                       \
             unsigned char* __restrict__ row_data, unsigned char* __restrict__ row_scale,          \
             unsigned char* __restrict__ col_data, unsigned char* __restrict__ col_scale,          \
             int flags, float* __restrict__ dprobs_part, float* __restrict__ colsum_part,          \
             unsigned int* __restrict__ amax_a, unsigned int* __restrict__ amax_b) {               \
        __shared__ lpm_act::Stage st;                                                              \
        const lpm_act::Params P = {act, limit, alpha};                                             \
        lpm_act::TileOut o;                                                                        \
        o.row_data = row_data;                                                                     \
        o.row_scale = row_scale;                                                                   \
        o.col_data = col_data;                                                                     \
        o.col_scale = col_scale;                                                                   \
        const unsigned char* dzb = static_cast<const unsigned char*>(dz);                          \
        const unsigned char* hb = static_cast<const unsigned char*>(h);                            \
        unsigned char* dhb = static_cast<unsigned char*>(dh);                                      \
        if (MODE == lpm_act::MODE_MX && (flags & LPM_MX_FLAG_E5M2) != 0) {                         \
            lpm_act::bwd_body<KIND, MODE, lpm_act::FMT_E5M2>(                                      \
                dzb, hb, probs, f_dim, h_width, glu, il, P, m_total, row_off, tile_off,            \
                num_groups, num_row_tiles, dhb, o, flags, dprobs_part, colsum_part, amax_a,        \
                amax_b, st);                                                                       \
        } else {                                                                                   \
            lpm_act::bwd_body<KIND, MODE, lpm_act::FMT_E4M3>(                                      \
                dzb, hb, probs, f_dim, h_width, glu, il, P, m_total, row_off, tile_off,            \
                num_groups, num_row_tiles, dhb, o, flags, dprobs_part, colsum_part, amax_a,        \
                amax_b, st);                                                                       \
        }                                                                                          \
    }

LPM_ACT_BWD_KERNEL(lpm_act_bwd_f32, lpm_act::KIND_F32, lpm_act::MODE_PLAIN, 1)
LPM_ACT_BWD_KERNEL(lpm_act_bwd_f16, lpm_act::KIND_F16, lpm_act::MODE_PLAIN, 1)
LPM_ACT_BWD_KERNEL(lpm_act_bwd_bf16, lpm_act::KIND_BF16, lpm_act::MODE_PLAIN, 1)
LPM_ACT_BWD_KERNEL(lpm_act_bwd_amax_f32, lpm_act::KIND_F32, lpm_act::MODE_AMAX, 1)
LPM_ACT_BWD_KERNEL(lpm_act_bwd_amax_f16, lpm_act::KIND_F16, lpm_act::MODE_AMAX, 1)
LPM_ACT_BWD_KERNEL(lpm_act_bwd_amax_bf16, lpm_act::KIND_BF16, lpm_act::MODE_AMAX, 1)
LPM_ACT_BWD_KERNEL(lpm_act_bwd_mx_f32, lpm_act::KIND_F32, lpm_act::MODE_MX,
                   LPM_ACT_BWD_MX_MIN_CTAS_PER_SM)
LPM_ACT_BWD_KERNEL(lpm_act_bwd_mx_f16, lpm_act::KIND_F16, lpm_act::MODE_MX,
                   LPM_ACT_BWD_MX_MIN_CTAS_PER_SM)
LPM_ACT_BWD_KERNEL(lpm_act_bwd_mx_bf16, lpm_act::KIND_BF16, lpm_act::MODE_MX,
                   LPM_ACT_BWD_MX_MIN_CTAS_PER_SM)

#undef LPM_ACT_BWD_KERNEL

// out[r] = sum over c < n_cols of part[r, c], in column order (fp32, non-flushing): the per-row
// dprobs from the per-(row, feature tile) partials. One thread per row; the order does not depend
// on the number of rows, so a grouped call and one call per expert give the same bits.
extern "C" __global__ void __launch_bounds__(LPM_ACT_COLSUM_THREADS)
    lpm_act_row_sum(const float* __restrict__ part, long long n_cols, long long rows,
                    float* __restrict__ out) {
    const long long r = (long long)blockIdx.x * LPM_ACT_COLSUM_THREADS + threadIdx.x;
    if (r >= rows) return;
    float s = 0.0f;
    for (long long c = 0; c < n_cols; ++c) s = lpm_add_rn(s, __ldg(part + r * n_cols + c));
    out[r] = s;
}
