// NVFP4 device code, part of nvfp4_common.cuh (design notes there): the per-tensor encode tables
// and the amax kernel bodies (per-tensor amax; tiled amax for row-scaled and RHT quantization).
#ifndef LPM_NVFP4_AMAX_CUH
#define LPM_NVFP4_AMAX_CUH

#include "nvfp4_codes.cuh"
#include "nvfp4_tiles.cuh"

// ==========================================================================================
// Encode tables (per-tensor scaling)
// ==========================================================================================

// Per member g and direction d (0: rowwise amax, 1: columnwise amax), Q_TAB_STRIDE floats at
// tabs + (2g + d) * Q_TAB_STRIDE: enc[c] = min(1 / (float(c) * S_dec), FLT_MAX) for every E4M3
// byte c < 128, then k6 = S_enc * fp32(1/6). Built once by the last CTA of the amax kernel, read
// by every quantizer CTA of the member.
constexpr int Q_TAB_STRIDE = 132;

LPM_DEV void q_build_tables(const unsigned int* amax_row, const unsigned int* amax_col, int G,
                            float* __restrict__ tabs) {
    const int per_member = 2 * 129;
    for (int idx = threadIdx.x; idx < G * per_member; idx += blockDim.x) {
        const int g = idx / per_member;
        const int rem = idx - g * per_member;
        const int d = rem / 129, c = rem - d * 129;
        const unsigned int ab = __ldcg((d ? amax_col : amax_row) + g);  // L2: written by atomics
        const float se = q_encode_scale(__uint_as_float(ab));
        float* t = tabs + (long long)(2 * g + d) * Q_TAB_STRIDE;
        if (c == 128) t[128] = q_k6(se);
        else t[c] = q_enc((unsigned int)c, lpm_rcp_rn(se));
    }
}

// Whether this CTA is the last of the grid to get here (after its amax atomics).
LPM_DEV bool q_last_cta(unsigned int* counter) {
    __shared__ unsigned int s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int total = gridDim.x * gridDim.y;
        s_last = atomicAdd(counter, 1u) == total - 1u ? 1u : 0u;
    }
    __syncthreads();
    const bool last = s_last != 0u;
    if (last) __threadfence();
    return last;
}

// ==========================================================================================
// Kernel: per-tensor amax (one value per member), grid (X, max(G, 1)); the last CTA builds the
// encode tables of every member.
// ==========================================================================================

template <int DT>
LPM_DEV void amax_tensor_impl(const unsigned char* __restrict__ x, long long K, long long M_single,
                              const long long* __restrict__ row_off, int G,
                              unsigned int* __restrict__ amax, unsigned int* __restrict__ counter,
                              float* __restrict__ tabs) {
    typedef QCfg<DT> C;
    __shared__ unsigned int s_red[32];
    const int g = (int)blockIdx.y;
    long long r0 = 0, r1 = M_single;
    if (G > 0) {
        r0 = row_off[g];
        r1 = row_off[g + 1];
    }
    const long long nchunks = (r1 - r0) * K / C::EPC;
    const uint4* base = reinterpret_cast<const uint4*>(x + r0 * K * (long long)C::BYTES);
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    for (; i + 3 * stride < nchunks; i += 4 * stride) {
        uint4 c[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) c[u] = __ldg(base + i + u * stride);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned int w[4] = {c[u].x, c[u].y, c[u].z, c[u].w};
#pragma unroll
            for (int e = 0; e < C::EPC; ++e) {
                const float v = C::BYTES == 2 ? q_word_elem<DT>(w[e >> 1], e & 1) : q_word_elem<DT>(w[e], 0);
                acc = lpm_fmax(acc, q_abs(v));
            }
        }
    }
    for (; i < nchunks; i += stride) {
        const uint4 c = __ldg(base + i);
        const unsigned int w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
        for (int e = 0; e < C::EPC; ++e) {
            const float v = C::BYTES == 2 ? q_word_elem<DT>(w[e >> 1], e & 1) : q_word_elem<DT>(w[e], 0);
            acc = lpm_fmax(acc, q_abs(v));
        }
    }
    // acc is a non-negative, non-NaN float: its bits order like its values
    const unsigned int r = q_block_max_u32(__float_as_uint(acc), s_red);
    if (threadIdx.x == 0 && r != 0u) atomicMax(amax + g, r);
    if (q_last_cta(counter)) q_build_tables(amax, amax, G > 0 ? G : 1, tabs);
}

// ==========================================================================================
// Kernel: tiled amax for row-scaled (per row + per column) and RHT (plain + transformed)
// ==========================================================================================

// flags: LPM_Q_ROW_SCALED -> out_row[row_base + m] = max_k |x|, out_col[g*K + k] = max_m |x|.
//        LPM_Q_RHT        -> out_row[g] = max |x|, out_col[g] = max |RHT(x^T)| (chunks padded
//                            with zero rows up to Mp); the last CTA builds the encode tables
//                            (n_members of them: G, or 1 for a single tensor).
template <int DT>
LPM_DEV void amax_tiles_impl(const unsigned char* __restrict__ x, long long K, long long M_single,
                             const long long* __restrict__ meta, int G, int n_ct, int flags,
                             unsigned int* __restrict__ out_row, unsigned int* __restrict__ out_col,
                             unsigned int* __restrict__ counter, float* __restrict__ tabs) {
    typedef QCfg<DT> C;
    __shared__ __align__(16) unsigned char s_tile[Q_TM * Q_ROW_BYTES];
    __shared__ unsigned int s_cm[4][C::TK];
    __shared__ unsigned int s_red[32];
    const int tid = threadIdx.x;
    const QTile ti = q_resolve_tile(M_single, meta, G, n_ct, Q_TM, C::TK);
    unsigned int rw[C::RB][C::WPB];
    q_load_tile<DT>(x, K, ti, rw, s_tile, true);
    __syncthreads();
    const int rc = tid >> 5, cg = tid & 31;

    if (flags & LPM_Q_ROW_SCALED) {
        // per row: this thread's blocks, then across the BPR lanes that share the row
#pragma unroll
        for (int i = 0; i < C::RB; ++i) {
            const int b = tid + i * Q_THREADS;
            const int r = b / C::BPR, cb = b % C::BPR;
            float v[16];
            q_unpack_block<DT>(rw[i], v);
            unsigned int m = __float_as_uint(q_amax16(v));
#pragma unroll
            for (int o = 1; o < C::BPR; o <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
            const long long row = ti.row0 + r;
            if (cb == 0 && row < ti.M && m != 0u) atomicMax(out_row + ti.row_base + row, m);
        }
        // per column: 16 rows per thread, then across the 4 row chunks through shared memory
        unsigned int cw[16][2];
        q_read_cols<DT>(s_tile, rc, cg, cw);
#pragma unroll
        for (int j = 0; j < C::CPU; ++j) {
            float v[16];
            q_col_values<DT>(cw, j, v);
            s_cm[rc][cg * C::CPU + j] = __float_as_uint(q_amax16(v));
        }
        __syncthreads();
        for (int c = tid; c < C::TK; c += Q_THREADS) {
            const unsigned int m = max(max(s_cm[0][c], s_cm[1][c]), max(s_cm[2][c], s_cm[3][c]));
            const long long k = ti.k0 + c;
            if (k < K && m != 0u) atomicMax(out_col + (long long)ti.g * K + k, m);
        }
    }
    if (flags & LPM_Q_RHT) {
        float mx = 0.0f;
#pragma unroll
        for (int i = 0; i < C::RB; ++i) {
            float v[16];
            q_unpack_block<DT>(rw[i], v);
            mx = lpm_fmax(mx, q_amax16(v));
        }
        float mt = 0.0f;
        if (ti.row0 + rc * 16 < ti.Mp) {
            unsigned int cw[16][2];
            q_read_cols<DT>(s_tile, rc, cg, cw);
#pragma unroll
            for (int j = 0; j < C::CPU; ++j) {
                float v[16];
                q_col_values<DT>(cw, j, v);
                q_rht16<C::PREC>(v);
                mt = lpm_fmax(mt, q_amax16(v));
            }
        }
        const unsigned int a = q_block_max_u32(__float_as_uint(mx), s_red);
        const unsigned int b = q_block_max_u32(__float_as_uint(mt), s_red);
        if (tid == 0) {
            if (a != 0u) atomicMax(out_row + ti.g, a);
            if (b != 0u) atomicMax(out_col + ti.g, b);
        }
        if (q_last_cta(counter)) q_build_tables(out_row, out_col, G > 0 ? G : 1, tabs);
    }
}

#endif  // LPM_NVFP4_AMAX_CUH
