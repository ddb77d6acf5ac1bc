// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// register epilogue of the warp-specialised kernels (gemm_ws, gemm_ws_mx, gemm_ws_p) for 16-bit
// output without bias.
//
// The staged epilogue (Epilogue::tile) writes every fp32 accumulator to shared memory, waits
// for the whole CTA and reads the tile back to scale and convert it. Here each consumer warp
// scales and converts its 16 x 256 accumulators in registers (the same operations in the same
// order as Epilogue::group8, so the same bits), hands the 16-bit words to its own staging buffer
// with stmatrix (the accumulator fragment is stmatrix's register layout) and copies whole rows
// to global memory with 16-byte loads and stores: half the shared-memory traffic, no CTA
// barrier after the staging, and a row of a warp's store instruction is contiguous.
//
// Staging buffer of a warp: 16 rows of COLS 16-bit values plus 16 bytes of padding (CH_LD
// bytes, so that the 8 rows of one stmatrix matrix start 4 banks apart); staging row s holds
// fragment row s: tile row wm0 + s, or with PAIRED (gemm_ws_mx's MN-major A, whose fragment
// rows are rows 2 (lane/4) + hf of the 16-row group) wm0 + 2 (s % 8) + s / 8.

#ifndef LPM_GROUPED_GEMM_EPI_REGS_CUH
#define LPM_GROUPED_GEMM_EPI_REGS_CUH

#include "grouped_gemm_mma.cuh"
#include "grouped_gemm_tile.cuh"

namespace lpm_gg {

// Bytes per staging row of a chunk of COLS columns, and of the 16-row buffer.
template <int COLS>
__host__ __device__ constexpr int reg_epi_ld() {
    return COLS * 2 + 16;
}
template <int COLS>
__host__ __device__ constexpr int reg_epi_bytes() {
    return 16 * reg_epi_ld<COLS>();
}

// Four 8 x 8 matrices of 16-bit values to shared memory (sm_90): register i of lane L holds
// row L / 4, columns 2 (L % 4) and + 1 (low half first) of matrix i, whose row r lies at the
// address of lane 8 i + r.
__device__ __forceinline__ void stsm_x4(unsigned addr, unsigned a, unsigned b, unsigned c,
                                        unsigned d) {
#if LPM_GG_HAS_WGMMA
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
#else
    __trap();
#endif
}

// Whether the epilogue of ep can run from registers: 16-bit output (accumulation is fp32
// only), no bias, whole 8-column groups (n_cols % 8 == 0) and a 16-byte aligned output.
__device__ __forceinline__ bool reg_epi_ok(const Epilogue& ep) {
    return ep.out_type != OUT_F32 && !ep.has_bias && (ep.n_cols & 7) == 0 &&
           (reinterpret_cast<unsigned long long>(ep.out) & 15ull) == 0;
}

// Two accumulators of one fragment row through step 1 of the epilogue (MODE = scale_mode; `ra`:
// the row's amax, `ca0` / `ca1`: the columns' amaxes, row-scaled only). Operations and order are
// Epilogue::group8's.
template <int MODE>
__device__ __forceinline__ void reg_epi_pair(float v0, float v1, float alpha, float ra, float ca0,
                                             float ca1, float& t0, float& t1) {
    if constexpr (MODE == 1) {
        v0 = lpm_mul_rn(v0, alpha);
        v1 = lpm_mul_rn(v1, alpha);
    } else if constexpr (MODE == 2) {
        const float inv = lpm_f32_from_bits(LPM_FP32_INV_NVFP4_GEMM_FACTOR_BITS);
        v0 = lpm_mul_rn(lpm_mul_rn(v0, inv), lpm_mul_rn(ra, ca0));
        v1 = lpm_mul_rn(lpm_mul_rn(v1, inv), lpm_mul_rn(ra, ca1));
    }
    t0 = v0;
    t1 = v1;
}

// The register epilogue of one consumer warp: accf holds the warp's 16 x (8 NI) accumulators
// in the wgmma fragment layout (fragment ni: fragment rows lane/4 and + 8 at columns 8 ni +
// 2 (lane % 4), + 1: accf[4 ni .. 4 ni + 1], accf[4 ni + 2 .. + 3]) of the tile rows from wm0
// (frag_row<PAIRED>) of the output tile at (r0, c0). `buf`: the warp's staging buffer (shared
// address, reg_epi_bytes<8 CNI> bytes, 16-byte aligned), used for CNI fragments (8 CNI
// columns) at a time; `tab`: the warp's table of a chunk's column amaxes (row-scaled: 8 CNI
// floats, 16-byte aligned), filled by the warp per chunk, so that each thread reads its two
// columns' amaxes of a fragment with one 8-byte load. The caller checked reg_epi_ok(ep) and
// that no other thread still reads or writes buf and tab.
template <int NI, bool PAIRED, int CNI, int OT, int MODE>
__device__ __forceinline__ void reg_epi_t(const Epilogue& ep, unsigned buf, unsigned tab,
                                          const float* accf, int wm0, int lane, long long r0,
                                          long long c0, int rows_valid, int cols_valid) {
    static_assert(NI % CNI == 0 && CNI % 2 == 0, "whole chunks of fragment pairs");
    constexpr int CCOLS = 8 * CNI, LD = reg_epi_ld<CCOLS>();
    constexpr int LPR = CCOLS / 8;  // lanes per staging row on the way out
    static_assert(LPR == 8 || LPR == 16 || LPR == 32, "chunks of 64, 128 or 256 columns");
    constexpr int RPI = 32 / LPR;   // staging rows per warp instruction
    const int q = lane & 3;
    // the two fragment rows' amaxes (row-scaled)
    float ra0 = 0.0f, ra1 = 0.0f;
    if constexpr (MODE == 2) {
        const int f0 = frag_row<PAIRED>(wm0, lane, 0), f1 = frag_row<PAIRED>(wm0, lane, 1);
        ra0 = f0 < rows_valid ? ep.row_amax(r0 + f0) : 0.0f;
        ra1 = f1 < rows_valid ? ep.row_amax(r0 + f1) : 0.0f;
    }
    // stmatrix: lane L gives row L % 8 of matrix L / 8 = (fragment 2 j + L / 16, half (L / 8) % 2)
    const unsigned st = buf + static_cast<unsigned>(((lane & 7) + 8 * ((lane >> 3) & 1)) * LD +
                                                    16 * (lane >> 4));
    unsigned short* const obase = static_cast<unsigned short*>(ep.out) + ep.out_off;
#pragma unroll
    for (int ch = 0; ch < NI / CNI; ++ch) {
        __syncwarp();  // the previous chunk's (or tile's) rows left the buffer and table
        if constexpr (MODE == 2) {
            // lane L: the amaxes of the chunk's columns PER L .. PER L + PER - 1
            constexpr int PER = CCOLS / 32;
            float cv[PER];
#pragma unroll
            for (int i = 0; i < PER; ++i) {
                const int col = ch * CCOLS + PER * lane + i;
                cv[i] = col < cols_valid ? ep.col_amax(c0 + col) : 0.0f;
            }
            if constexpr (PER == 2) {  // 64-column chunks
                sts_v2(tab + static_cast<unsigned>(8 * lane), __float_as_uint(cv[0]),
                       __float_as_uint(cv[1]));
            } else {
#pragma unroll
                for (int i = 0; i < PER; i += 4)
                    sts_v4(tab + static_cast<unsigned>(4 * (PER * lane + i)),
                           __float_as_uint(cv[i]), __float_as_uint(cv[i + 1]),
                           __float_as_uint(cv[i + 2]), __float_as_uint(cv[i + 3]));
            }
            __syncwarp();
        }
        // fragments 2 j and 2 j + 1 of the chunk through step 1, as one group of 8
        auto group = [&](int j, float (&t)[8]) {
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int ni = ch * CNI + 2 * j + u;
                const float* f = accf + 4 * ni;
                float ca0 = 0.0f, ca1 = 0.0f;
                if constexpr (MODE == 2) {
                    const uint2 cw =
                        lds_v2(tab + static_cast<unsigned>(4 * (16 * j + 8 * u + 2 * q)));
                    ca0 = __uint_as_float(cw.x);
                    ca1 = __uint_as_float(cw.y);
                }
                reg_epi_pair<MODE>(f[0], f[1], ep.alpha, ra0, ca0, ca1, t[4 * u], t[4 * u + 1]);
                reg_epi_pair<MODE>(f[2], f[3], ep.alpha, ra1, ca0, ca1, t[4 * u + 2],
                                   t[4 * u + 3]);
            }
        };
        // Epilogue::group8's bits (pack8) to the staging buffer; matrices: (fragment 2 j, rows
        // 0-7), (2 j, rows 8-15), (2 j + 1, 0-7), (2 j + 1, 8-15). bf16 converts by pairs and,
        // when some group of the warp's chunk holds a NaN, stages the whole chunk again element
        // by element (pack8_each: the pairs' bits for every other value). With pack8's test
        // per group, the rarely run element-wise code sat between the groups.
        unsigned bad = 0u;
        auto stage = [&](auto each) {
#pragma unroll
            for (int j = 0; j < CNI / 2; ++j) {
                float t[8];
                unsigned w[4];
                group(j, t);
                if constexpr (decltype(each)::value) {
                    pack8_each<OT>(t, w);
                } else {
                    pack8_bf16(t, w, bad);
                }
                stsm_x4(st + 32 * j, w[0], w[1], w[2], w[3]);
            }
        };
        stage(BoolC<OT != OUT_BF16>{});
        if constexpr (OT == OUT_BF16) {
            if (__any_sync(0xFFFFFFFFu, (bad & kPackNaN) != 0u))
                stage(BoolC<true>{});
        }
        __syncwarp();
        // whole staging rows to global memory: lane L takes 8 columns of row L / LPR
#pragma unroll 4
        for (int i = 0; i < 16 / RPI; ++i) {
            const int s = i * RPI + lane / LPR, cc = 8 * (lane % LPR);
            const int tr = PAIRED ? wm0 + 2 * (s & 7) + (s >> 3) : wm0 + s;
            const int col = ch * CCOLS + cc;
            const uint4 v = lds_v4(buf + static_cast<unsigned>(s * LD + 2 * cc));
            if (tr < rows_valid && col < cols_valid)
                st_global_v4(obase + (r0 + tr) * ep.n_cols + c0 + col, v.x, v.y, v.z, v.w);
        }
    }
}

// reg_epi_t for ep's output type and scale mode (reg_epi_ok(ep) holds).
template <int NI, bool PAIRED, int CNI>
__device__ __forceinline__ void reg_epi(const Epilogue& ep, unsigned buf, unsigned tab,
                                        const float* accf, int wm0, int lane, long long r0,
                                        long long c0, int rows_valid, int cols_valid) {
#define LPM_GG_REG_EPI(OT, MODE)                                                           \
    reg_epi_t<NI, PAIRED, CNI, OT, MODE>(ep, buf, tab, accf, wm0, lane, r0, c0, rows_valid, \
                                         cols_valid)
    if (ep.out_type == OUT_BF16) {
        if (ep.scale_mode == 0) LPM_GG_REG_EPI(OUT_BF16, 0);
        else if (ep.scale_mode == 1) LPM_GG_REG_EPI(OUT_BF16, 1);
        else LPM_GG_REG_EPI(OUT_BF16, 2);
    } else {
        if (ep.scale_mode == 0) LPM_GG_REG_EPI(OUT_F16, 0);
        else if (ep.scale_mode == 1) LPM_GG_REG_EPI(OUT_F16, 1);
        else LPM_GG_REG_EPI(OUT_F16, 2);
    }
#undef LPM_GG_REG_EPI
}

// reg_epi without scaling (ep.scale_mode == 0, which the caller checked): the persistent MXFP8
// kernels allow nothing else, and inlining the two output types' epilogues instead of all six
// variants into each of their k-loop builds keeps their code smaller.
template <int NI, bool PAIRED, int CNI>
__device__ __forceinline__ void reg_epi_unscaled(const Epilogue& ep, unsigned buf,
                                                 const float* accf, int wm0, int lane,
                                                 long long r0, long long c0, int rows_valid,
                                                 int cols_valid) {
    if (ep.out_type == OUT_BF16) {
        reg_epi_t<NI, PAIRED, CNI, OUT_BF16, 0>(ep, buf, 0u, accf, wm0, lane, r0, c0, rows_valid,
                                                cols_valid);
    } else {
        reg_epi_t<NI, PAIRED, CNI, OUT_F16, 0>(ep, buf, 0u, accf, wm0, lane, r0, c0, rows_valid,
                                               cols_valid);
    }
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_EPI_REGS_CUH
