// Grouped GEMM, fp32 SIMT kernel: the fp32-accurate path for float32 operands, and the fallback
// for any operand whose layout the tensor-core kernels cannot stream with 16-byte (NVFP4: 8-byte)
// copies (e.g. a bf16 K that is not a multiple of 8). Same tile table, descriptor table and
// epilogue as the tensor-core kernels (grouped_gemm_common.cuh); 64x64 output tiles, 16-deep
// k-tiles, 256 threads with 4x4 outputs each.
//
// Every operand element is decoded to its exact fp32 value (float32, bf16, fp16; NVFP4
// e2m1 * e4m3; MXFP8 fp8 * 2^(e-127) -- all exact in fp32) and accumulated with non-flushing
// fma.rn.f32 in k order, so the result differs from the float64 product of the dequantized
// operands by fp32 accumulation rounding only.
#include "grouped_gemm_common.cuh"

namespace lpm_ggs {

constexpr int kT = 64;   // output tile edge
constexpr int kKS = 16;  // k-tile depth

// Element kinds (mirrored in lowprec_moe/backends/cupy/gemm.py).
enum ElemKind {
    EK_F32 = 0,
    EK_BF16 = 1,
    EK_F16 = 2,
    EK_FP4 = 3,   // NVFP4, contraction contiguous only
    EK_E4M3 = 4,  // MXFP8 E4M3
    EK_E5M2 = 5,  // MXFP8 E5M2
};

// Exact fp32 value of element (row r, contraction k) of an operand.
__device__ __forceinline__ float fetch(int kind, int mn, const unsigned char* __restrict__ data,
                                       const unsigned char* __restrict__ scale, long long off,
                                       long long ld, long long soff, long long sld, long long r,
                                       long long k) {
    if (kind == EK_F32) {
        const long long p = mn ? off + k * ld + r * 4 : off + r * ld + k * 4;
        return *reinterpret_cast<const float*>(data + p);
    }
    if (kind == EK_BF16 || kind == EK_F16) {
        const long long p = mn ? off + k * ld + r * 2 : off + r * ld + k * 2;
        const unsigned short h = *reinterpret_cast<const unsigned short*>(data + p);
        return kind == EK_BF16 ? lpm_bf16_bits_to_f32(h) : lpm_f16_bits_to_f32(h);
    }
    if (kind == EK_FP4) {
        const unsigned byte = data[off + r * ld + (k >> 1)];
        const unsigned code = (k & 1) ? (byte >> 4) : (byte & 0xFu);
        const unsigned s = scale[soff + r * sld + (k >> 4)];
        return lpm_mul_rn(lpm_e2m1_to_f32(code), lpm_gg::e4m3_to_f32(s));
    }
    const unsigned q = mn ? data[off + k * ld + r] : data[off + r * ld + k];
    const unsigned e = mn ? scale[soff + (k >> 5) * sld + r] : scale[soff + r * sld + (k >> 5)];
    const float v = kind == EK_E4M3 ? lpm_gg::e4m3_to_f32(q)
                                    : lpm_f16_bits_to_f32(static_cast<unsigned short>(q << 8));
    return lpm_mul_rn(v, lpm_e8m0_to_f32(e));
}

}  // namespace lpm_ggs

extern "C" __global__ void __launch_bounds__(256) grouped_gemm_simt_64x64(
    const int* __restrict__ tiles, int n_col_tiles, const long long* __restrict__ desc,
    long long n_cols, const unsigned char* __restrict__ a_data,
    const unsigned char* __restrict__ a_scale, int a_kind, int a_mn,
    const unsigned char* __restrict__ b_data, const unsigned char* __restrict__ b_scale,
    int b_kind, int b_mn, const float* __restrict__ amax_a, const float* __restrict__ amax_b,
    int a_vec, int b_vec, int scale_mode, const float* __restrict__ bias,
    const float* __restrict__ probs, int has_bias, int has_probs, void* __restrict__ out,
    int out_type, int accumulate, int zero_if_empty) {
    using namespace lpm_gg;
    using namespace lpm_ggs;
    constexpr int LDS = kT + 4;
    __shared__ __align__(16) float As[kKS][LDS];
    __shared__ __align__(16) float Bs[kKS][LDS];
    __shared__ __align__(16) float Cs[kT * LDS];

    const CtaTile tile = locate_tile<kT, kT>(tiles, n_col_tiles, desc, n_cols);
    if (tile.rv <= 0 || tile.cv <= 0) return;
    const long long* d = tile.d;
    const long long len = tile.len, r0 = tile.r0, c0 = tile.c0;
    const int rows_valid = tile.rows_valid<kT>(), cols_valid = tile.cols_valid<kT>();

    Epilogue ep = LPM_GG_EPILOGUE_OF(d);

    if (len <= 0 && zero_if_empty) {
        if (!accumulate) {
            for (int i = threadIdx.x; i < rows_valid * cols_valid; i += blockDim.x) {
                ep.write(r0 + i / cols_valid, c0 + i % cols_valid, 0.0f);
            }
        }
        return;
    }
    ep.init_alpha();

    const long long a_off = d[D_A_OFF], a_ld = d[D_A_LD], a_soff = d[D_A_SOFF], a_sld = d[D_A_SLD];
    const long long b_off = d[D_B_OFF], b_ld = d[D_B_LD], b_soff = d[D_B_SOFF], b_sld = d[D_B_SLD];
    const int tid = threadIdx.x;
    const int tx = tid & 15, ty = tid >> 4;

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (long long k0 = 0; k0 < len; k0 += kKS) {
        float va[4], vb[4];
        int ra[4], ka[4], rb[4], kb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int e = tid + 256 * i;
            ra[i] = a_mn ? (e & (kT - 1)) : (e >> 4);
            ka[i] = a_mn ? (e >> 6) : (e & (kKS - 1));
            rb[i] = b_mn ? (e & (kT - 1)) : (e >> 4);
            kb[i] = b_mn ? (e >> 6) : (e & (kKS - 1));
            va[i] = (ra[i] < rows_valid && k0 + ka[i] < len)
                        ? fetch(a_kind, a_mn, a_data, a_scale, a_off, a_ld, a_soff, a_sld,
                                r0 + ra[i], k0 + ka[i])
                        : 0.0f;
            vb[i] = (rb[i] < cols_valid && k0 + kb[i] < len)
                        ? fetch(b_kind, b_mn, b_data, b_scale, b_off, b_ld, b_soff, b_sld,
                                c0 + rb[i], k0 + kb[i])
                        : 0.0f;
        }
        __syncthreads();  // previous k-tile consumed
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            As[ka[i]][ra[i]] = va[i];
            Bs[kb[i]][rb[i]] = vb[i];
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kKS; ++kk) {
            const float4 a4 = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
            const float4 b4 = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
            const float av[4] = {a4.x, a4.y, a4.z, a4.w};
            const float bv[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = lpm_fma_rn(av[i], bv[j], acc[i][j]);
        }
    }

#pragma unroll
    for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4*>(&Cs[(ty * 4 + i) * LDS + tx * 4]) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    __syncthreads();
    ep.tile<kT, LDS>(Cs, r0, c0, rows_valid, cols_valid);
}
