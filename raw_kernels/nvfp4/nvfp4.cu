// NVFP4 kernels: global amax, quantize (per-tensor / row-scaled, 1-D or 16x16 blocks, rowwise
// and columnwise in one pass), dequantize. Stochastic rounding and the RHT of the columnwise
// copy live in nvfp4_ext.cu. Device code and the design notes: nvfp4_common.cuh
// (parts nvfp4_*.cuh).
#include "nvfp4_common.cuh"

// ---- per-tensor amax, one value per member; grid (X, max(G, 1)), 256 threads ----
extern "C" __global__ void __launch_bounds__(256)
lpm_nvfp4_amax_tensor_f32(const unsigned char* x, long long K, long long M, const long long* row_off,
                          int G, unsigned int* amax, unsigned int* counter, float* tabs) {
    amax_tensor_impl<LPM_DT_F32>(x, K, M, row_off, G, amax, counter, tabs);
}
extern "C" __global__ void __launch_bounds__(256)
lpm_nvfp4_amax_tensor_f16(const unsigned char* x, long long K, long long M, const long long* row_off,
                          int G, unsigned int* amax, unsigned int* counter, float* tabs) {
    amax_tensor_impl<LPM_DT_F16>(x, K, M, row_off, G, amax, counter, tabs);
}
extern "C" __global__ void __launch_bounds__(256)
lpm_nvfp4_amax_tensor_bf16(const unsigned char* x, long long K, long long M, const long long* row_off,
                           int G, unsigned int* amax, unsigned int* counter, float* tabs) {
    amax_tensor_impl<LPM_DT_BF16>(x, K, M, row_off, G, amax, counter, tabs);
}


// ---- tiled amax: row-scaled vectors, or plain + RHT scalars ----
#define LPM_AMAX_TILES_ARGS                                                                       \
    const unsigned char *x, long long K, long long M, const long long *meta, int G, int n_ct,     \
        int flags, unsigned int *out_row, unsigned int *out_col, unsigned int *counter, float *tabs
extern "C" __global__ void __launch_bounds__(Q_THREADS) lpm_nvfp4_amax_tiles_f32(LPM_AMAX_TILES_ARGS) {
    amax_tiles_impl<LPM_DT_F32>(x, K, M, meta, G, n_ct, flags, out_row, out_col, counter, tabs);
}
extern "C" __global__ void __launch_bounds__(Q_THREADS) lpm_nvfp4_amax_tiles_f16(LPM_AMAX_TILES_ARGS) {
    amax_tiles_impl<LPM_DT_F16>(x, K, M, meta, G, n_ct, flags, out_row, out_col, counter, tabs);
}
extern "C" __global__ void __launch_bounds__(Q_THREADS) lpm_nvfp4_amax_tiles_bf16(LPM_AMAX_TILES_ARGS) {
    amax_tiles_impl<LPM_DT_BF16>(x, K, M, meta, G, n_ct, flags, out_row, out_col, counter, tabs);
}

// ---- quantize ----
// Plain kernels: per-tensor / row-scaled, 1-D or 2-D blocks (flags LPM_Q_SR / LPM_Q_RHT ignored).
extern "C" __global__ void __launch_bounds__(Q_THREADS, 5) lpm_nvfp4_quantize_f32(LPM_QUANTIZE_ARGS) {
    quantize_impl<LPM_DT_F32, false> LPM_QUANTIZE_CALL;
}
extern "C" __global__ void __launch_bounds__(Q_THREADS, 5) lpm_nvfp4_quantize_f16(LPM_QUANTIZE_ARGS) {
    quantize_impl<LPM_DT_F16, false> LPM_QUANTIZE_CALL;
}
extern "C" __global__ void __launch_bounds__(Q_THREADS, 5) lpm_nvfp4_quantize_bf16(LPM_QUANTIZE_ARGS) {
    quantize_impl<LPM_DT_BF16, false> LPM_QUANTIZE_CALL;
}
// ---- dequantize ----

// Rowwise: data [R, C/2], scale [R, C/16] -> out [R, C] fp32. amax_mode 0: amax[0]; 1: amax[r];
// 2: amax[g] with g the member of row r (row_off [G+1]). One thread per 16-element block.
extern "C" __global__ void __launch_bounds__(256)
lpm_nvfp4_dequantize_rowwise(const unsigned char* __restrict__ data,
                             const unsigned char* __restrict__ scale, const float* __restrict__ amax,
                             long long R, long long C, int amax_mode,
                             const long long* __restrict__ row_off, int G, float* __restrict__ out) {
    const long long nb_row = C >> 4;
    const long long nblk = R * nb_row;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long blk = (long long)blockIdx.x * blockDim.x + threadIdx.x; blk < nblk; blk += stride) {
        const long long r = blk / nb_row;
        float a;
        if (amax_mode == 0) {
            a = amax[0];
        } else if (amax_mode == 1) {
            a = amax[r];
        } else {
            int lo = 0, hi = G - 1;  // largest g with row_off[g] <= r (empty members skipped)
            while (lo < hi) {
                const int mid = (lo + hi + 1) >> 1;
                if (row_off[mid] <= r) lo = mid;
                else hi = mid - 1;
            }
            a = amax[lo];
        }
        const float f = q_dequant_factor(scale[blk], a);
        const uint2 d = *reinterpret_cast<const uint2*>(data + blk * 8);
        float v[16];
        q_dequant16(d, f, v);
        float4* o = reinterpret_cast<float4*>(out + blk * 16);
#pragma unroll
        for (int q = 0; q < 4; ++q) o[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    }
}

// Columnwise: member g's data [K, Mp/2] at byte K*cw_rows/2 (scales [K, Mp/16] at K*cw_rows/16)
// -> out rows row_base .. row_base+M-1 of [M_total, K] fp32 (transposed back, padding cropped,
// inverse RHT when `rht`). amax_per_col 0: amax[g]; 1: amax[g*K + k]. One CTA (256 threads) per
// 64 x 64 (rows x columns) output tile; G == 0 for a single tensor of M_single rows.
extern "C" __global__ void __launch_bounds__(256)
lpm_nvfp4_dequantize_columnwise(const unsigned char* __restrict__ data,
                                const unsigned char* __restrict__ scale,
                                const float* __restrict__ amax, long long K, long long M_single,
                                const long long* __restrict__ meta, int G, int n_ct,
                                int amax_per_col, int rht, float* __restrict__ out) {
    __shared__ __align__(16) float s_t[64][68];
    const QTile ti = q_resolve_tile(M_single, meta, G, n_ct, 64, 64);
    const int tid = threadIdx.x;
    {
        const int mb = tid >> 6, kl = tid & 63;  // warp: 32 consecutive columns, one row block
        const long long k = ti.k0 + kl;
        const long long mblk = ti.row0 + 16 * mb;
        float v[16];
        if (k < K && mblk < ti.M) {
            const long long bi = ti.cw_rows * K / 16 + k * (ti.Mp >> 4) + (mblk >> 4);
            const float a = amax_per_col ? amax[(long long)ti.g * K + k] : amax[ti.g];
            const float f = q_dequant_factor(scale[bi], a);
            const uint2 d = *reinterpret_cast<const uint2*>(data + bi * 8);
            q_dequant16(d, f, v);
            if (rht) q_rht16_inverse(v);
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) v[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) s_t[16 * mb + i][kl] = v[i];
    }
    __syncthreads();
    {
        const int cq = tid >> 6, rl = tid & 63;  // warp: 32 rows, one 16-column group
        const long long m = ti.row0 + rl;
        const long long k = ti.k0 + 16 * cq;
        if (m < ti.M && k < K) {
            float4* o = reinterpret_cast<float4*>(out + (ti.row_base + m) * K + k);
#pragma unroll
            for (int q = 0; q < 4; ++q) o[q] = *reinterpret_cast<const float4*>(&s_t[rl][16 * cq + 4 * q]);
        }
    }
}
