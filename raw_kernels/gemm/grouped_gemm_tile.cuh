// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): a kernel
// body's output tile -- its set-up (LPM_GG_EPILOGUE_OF, LPM_GG_TILE_SETUP), the accumulator
// fragment layout of the mma.sync / wgmma kernels (frag_row: which tile row a thread's fragment
// row holds) and the staging of a warp's accumulators into a shared fp32 tile for the epilogue
// (stage_acc). frag_row is also the MXFP8 rescale's map (grouped_gemm_mxf16.cuh).

#ifndef LPM_GROUPED_GEMM_TILE_CUH
#define LPM_GROUPED_GEMM_TILE_CUH

#include "grouped_gemm_epilogue.cuh"

namespace lpm_gg {

// The epilogue of expert descriptor D inside a kernel body whose parameters carry the names of
// LPM_GG_PARAMS (grouped_gemm_base.cuh; the SIMT kernel uses the same names).
#define LPM_GG_EPILOGUE_OF(D)                                                                  \
    ::lpm_gg::Epilogue::of_expert((D), out, n_cols, out_type, accumulate, scale_mode, amax_a,  \
                                  a_vec, amax_b, b_vec, bias, probs, has_bias, has_probs)

// The start of a tensor-core kernel body (parameter names of LPM_GG_PARAMS): locate this CTA's
// BM_ x BN_ output tile and declare `tile`, `d` (the expert's descriptor words), `len`, `r0`,
// `c0`, the valid extents ROWS / COLS (names given) and the epilogue `ep`. Returns when the tile
// holds no output; for the wgrad of an expert without tokens (dW_g = 0) NT threads write the
// zero tile first. A macro because it returns from the kernel.
#define LPM_GG_TILE_SETUP(BM_, BN_, ROWS, COLS, NT)                                           \
    const ::lpm_gg::CtaTile tile =                                                           \
        ::lpm_gg::locate_tile<BM_, BN_>(tiles, n_col_tiles, desc, n_cols);                   \
    if (tile.rv <= 0 || tile.cv <= 0) return;                                                \
    const long long* d = tile.d;                                                             \
    const long long len = tile.len, r0 = tile.r0, c0 = tile.c0;                              \
    const int ROWS = tile.rows_valid<BM_>(), COLS = tile.cols_valid<BN_>();                  \
    ::lpm_gg::Epilogue ep = LPM_GG_EPILOGUE_OF(d);                                           \
    if (len <= 0 && zero_if_empty) {                                                         \
        ep.zero_tile(r0, c0, ROWS, COLS, NT);                                                \
        return;                                                                              \
    }

// Row of the tile held by half hf of a thread's accumulator fragment in the 16-row group
// starting at m0: lane/4 + 8 hf, or with PAIRED (the MN-major A of gemm_ws_mx, whose fragment
// rows are rows 2 (lane/4) and 2 (lane/4) + 1 of the group) 2 (lane/4) + hf.
template <bool PAIRED>
__device__ __forceinline__ int frag_row(int m0, int lane, int hf) {
    return PAIRED ? m0 + 2 * (lane >> 2) + hf : m0 + (lane >> 2) + 8 * hf;
}

// Stage a warp's mma.sync-layout accumulators acc[MI][NI][4] (flattened: accf) into the fp32
// tile cs ([rows][LD]):
// fragment (mi, ni) holds rows frag_row(wm0 + 16 mi, lane, 0 / 1), columns wn0 + 8 ni +
// 2 (lane%4) (+1).
template <int MI, int NI, int LD, bool PAIRED = false>
__device__ __forceinline__ void stage_acc(float* cs, const float* accf, int wm0, int wn0,
                                          int lane) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = frag_row<PAIRED>(wm0 + mi * 16, lane, hf);
                const int c = wn0 + ni * 8 + (lane & 3) * 2;
                const float* f = accf + (mi * NI + ni) * 4 + 2 * hf;
                *reinterpret_cast<float2*>(cs + r * LD + c) = make_float2(f[0], f[1]);
            }
        }
    }
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_TILE_CUH
