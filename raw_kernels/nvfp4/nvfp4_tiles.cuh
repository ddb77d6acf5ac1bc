// NVFP4 device code, part of nvfp4_common.cuh (design notes there): input formats and quantizer
// tiles: tile geometry (QCfg), tile location for single and grouped tensors, tile loads and the
// swizzled shared-memory layout, column reads, CTA / block maxima.
#ifndef LPM_NVFP4_TILES_CUH
#define LPM_NVFP4_TILES_CUH

#include "nvfp4_scalar.cuh"

// ==========================================================================================
// Input formats and tiles
// ==========================================================================================

constexpr int Q_THREADS = 128;   // threads per quantizer / tile-amax CTA
constexpr int Q_TM = 64;         // tile rows
constexpr int Q_ROW_BYTES = 256; // tile row bytes (16 chunks of 16 bytes)

template <int DT>
struct QCfg {
    static constexpr int BYTES = DT == LPM_DT_F32 ? 4 : 2;
    static constexpr int PREC = DT == LPM_DT_F32 ? 24 : (DT == LPM_DT_F16 ? 11 : 8);
    static constexpr int EPC = 16 / BYTES;                // elements per 16-byte chunk
    static constexpr int TK = Q_ROW_BYTES / BYTES;        // tile columns: 128 or 64
    static constexpr int CPB = 16 / EPC;                  // chunks per 16-element block
    static constexpr int BPR = TK / 16;                   // blocks per tile row: 8 or 4
    static constexpr int RB = Q_TM * BPR / Q_THREADS;     // row blocks per thread: 4 or 2
    static constexpr int WPB = 16 * BYTES / 4;            // 32-bit words per block: 8 or 16
    static constexpr int CPU = 8 / BYTES;                 // columns per column unit: 4 or 2
    static constexpr int LPG = 16 / CPU;                  // lanes per 16-column group: 4 or 8
};

// element e of a word (16-bit formats: e = 0 low half, 1 high half), exact fp32.
template <int DT>
LPM_DEV float q_word_elem(unsigned int w, int e) {
    if (DT == LPM_DT_BF16) return __uint_as_float(e ? (w & 0xFFFF0000u) : (w << 16));
    if (DT == LPM_DT_F16) return lpm_f16_bits_to_f32((unsigned short)(e ? (w >> 16) : (w & 0xFFFFu)));
    return __uint_as_float(w);
}

template <int DT>
LPM_DEV void q_unpack_block(const unsigned int (&w)[QCfg<DT>::WPB], float (&v)[16]) {
#pragma unroll
    for (int e = 0; e < 16; ++e) {
        if (QCfg<DT>::BYTES == 2) v[e] = q_word_elem<DT>(w[e >> 1], e & 1);
        else v[e] = q_word_elem<DT>(w[e], 0);
    }
}

// swizzled byte offset of (row, 16-byte chunk c) in the shared tile (conflict-free stores of the
// row-block layout and loads of the column layout).
LPM_DEV int q_smem_off(int row, int chunk) {
    return row * Q_ROW_BYTES + ((chunk ^ ((chunk >> 3) & 1)) << 4);
}

struct QTile {
    int g;               // member (0 for a single tensor)
    long long M;         // member rows
    long long Mp;        // member rows rounded up to 16
    long long row_base;  // first row of the member in x and in the rowwise outputs
    long long cw_rows;   // sum of Mp over the previous members (columnwise offsets)
    long long row0;      // first member row of the tile
    long long k0;        // first column of the tile
};

LPM_DEV QTile q_tile_rc(long long rt, int ct, long long M_single, const long long* __restrict__ meta,
                        int G, int tile_rows, int tile_cols);

// Tile number `tile` (row tiles x n_ct column tiles). G == 0: a single tensor of M_single rows.
// Otherwise meta (int64) holds
// [row offsets (G+1) | columnwise padded-row prefix (G+1) | row-tile prefix (G+1)].
LPM_DEV QTile q_tile_at(long long tile, long long M_single, const long long* __restrict__ meta,
                        int G, int n_ct, int tile_rows, int tile_cols) {
    long long rt;
    int ct;
    if (tile <= 0x7FFFFFFFll) {  // (always, in practice: a 32-bit division)
        const unsigned int q = (unsigned int)tile / (unsigned int)n_ct;
        rt = (long long)q;
        ct = (int)((unsigned int)tile - q * (unsigned int)n_ct);
    } else {
        rt = tile / n_ct;
        ct = (int)(tile - rt * n_ct);
    }
    return q_tile_rc(rt, ct, M_single, meta, G, tile_rows, tile_cols);
}

// Tile (row tile rt, column tile ct); G, meta as q_tile_at.
LPM_DEV QTile q_tile_rc(long long rt, int ct, long long M_single, const long long* __restrict__ meta,
                        int G, int tile_rows, int tile_cols) {
    QTile t;
    t.k0 = (long long)ct * tile_cols;
    if (G == 0) {
        t.g = 0;
        t.M = M_single;
        t.row_base = 0;
        t.cw_rows = 0;
        t.row0 = rt * tile_rows;
    } else {
        const long long* off = meta;
        const long long* cwp = meta + (G + 1);
        const long long* tp = meta + 2 * (G + 1);
        int lo = 0, hi = G - 1;  // largest g with tp[g] <= rt
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (tp[mid] <= rt) lo = mid;
            else hi = mid - 1;
        }
        t.g = lo;
        t.row0 = (rt - tp[lo]) * tile_rows;
        t.row_base = off[lo];
        t.M = off[lo + 1] - off[lo];
        t.cw_rows = cwp[lo];
    }
    t.Mp = (t.M + 15) & ~15ll;
    return t;
}

// Tile of this CTA. `reverse`: CTA 0 takes the last tile (the quantizer runs right after the amax
// pass, which ends by reading the end of x: that part is still in L2).
LPM_DEV QTile q_resolve_tile(long long M_single, const long long* __restrict__ meta, int G,
                             int n_ct, int tile_rows, int tile_cols, bool reverse = false) {
    const long long tile = reverse ? (long long)gridDim.x - 1 - (long long)blockIdx.x
                                   : (long long)blockIdx.x;
    return q_tile_at(tile, M_single, meta, G, n_ct, tile_rows, tile_cols);
}

// Load this thread's row blocks of the tile (zeros outside the member / matrix) and, when
// `to_smem`, store the whole tile into shared memory.
template <int DT>
LPM_DEV void q_load_tile(const unsigned char* __restrict__ x, long long K, const QTile& ti,
                         unsigned int (&rw)[QCfg<DT>::RB][QCfg<DT>::WPB], unsigned char* s_tile,
                         bool to_smem) {
    typedef QCfg<DT> C;
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < C::RB; ++i) {
        const int b = tid + i * Q_THREADS;
        const int r = b / C::BPR, cb = b % C::BPR;
        const long long m = ti.row0 + r;
        const long long kb = ti.k0 + cb * 16;
        const bool valid = m < ti.M && kb < K;
        const uint4* src = reinterpret_cast<const uint4*>(
            x + ((ti.row_base + m) * K + kb) * (long long)C::BYTES);
#pragma unroll
        for (int q = 0; q < C::CPB; ++q) {
            uint4 c = make_uint4(0u, 0u, 0u, 0u);
            if (valid) c = __ldg(src + q);
            rw[i][4 * q + 0] = c.x;
            rw[i][4 * q + 1] = c.y;
            rw[i][4 * q + 2] = c.z;
            rw[i][4 * q + 3] = c.w;
        }
    }
    if (to_smem) {
#pragma unroll
        for (int i = 0; i < C::RB; ++i) {
            const int b = tid + i * Q_THREADS;
            const int r = b / C::BPR, cb = b % C::BPR;
#pragma unroll
            for (int q = 0; q < C::CPB; ++q) {
                *reinterpret_cast<uint4*>(s_tile + q_smem_off(r, cb * C::CPB + q)) =
                    make_uint4(rw[i][4 * q + 0], rw[i][4 * q + 1], rw[i][4 * q + 2], rw[i][4 * q + 3]);
            }
        }
    }
}

// Column unit of this thread: rows 16*rc .. 16*rc+15 of the tile, 8 bytes (CPU columns) at
// column group cg; cw[i] = the two words of row 16*rc + i.
template <int DT>
LPM_DEV void q_read_cols(const unsigned char* s_tile, int rc, int cg, unsigned int (&cw)[16][2]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const uint2 w = *reinterpret_cast<const uint2*>(
            s_tile + q_smem_off(rc * 16 + i, cg >> 1) + ((cg & 1) << 3));
        cw[i][0] = w.x;
        cw[i][1] = w.y;
    }
}

// column j (0 .. CPU-1) of a column unit as 16 fp32 values.
template <int DT>
LPM_DEV void q_col_values(const unsigned int (&cw)[16][2], int j, float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        if (QCfg<DT>::BYTES == 2) v[i] = q_word_elem<DT>(cw[i][j >> 1], j & 1);
        else v[i] = q_word_elem<DT>(cw[i][j], 0);
    }
}

LPM_DEV unsigned int q_warp_max_u32(unsigned int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

// max over the CTA (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
LPM_DEV unsigned int q_block_max_u32(unsigned int v, unsigned int* s_red) {
    v = q_warp_max_u32(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // s_red may still be read from a previous call
    if (lane == 0) s_red[warp] = v;
    __syncthreads();
    unsigned int r = 0u;
    const int nw = blockDim.x >> 5;
    for (int w = 0; w < nw; ++w) r = max(r, s_red[w]);
    return r;
}

// Block maxima of 16-bit inputs on packed words (two lanes per instruction).
template <int DT>
LPM_DEV unsigned int q_hmax2(unsigned int a, unsigned int b) {
    return DT == LPM_DT_BF16 ? q_hmax2_bf16(a, b) : q_hmax2_f16(a, b);
}

// 16-bit magnitude pattern (sign cleared) -> fp32 value (NaN pattern -> NaN).
template <int DT>
LPM_DEV float q_lane_to_f32(unsigned int lane) {
    if (DT == LPM_DT_BF16) return __uint_as_float(lane << 16);
    return lpm_f16_bits_to_f32((unsigned short)lane);
}

// max |x| of a 16-element row block held as 8 words; NaN if the block holds a NaN.
template <int DT>
LPM_DEV float q_block_max_words(const unsigned int* w) {
    unsigned int a = q_hmax2<DT>(q_hmax2<DT>(q_hmax2<DT>(w[0], w[1]), q_hmax2<DT>(w[2], w[3])),
                                 q_hmax2<DT>(q_hmax2<DT>(w[4], w[5]), q_hmax2<DT>(w[6], w[7])));
    a = q_hmax2<DT>(a, q_prmt(a, a, 0x1032u));  // fold the high lane onto the low one
    return q_lane_to_f32<DT>(a & 0x7FFFu);
}

#endif  // LPM_NVFP4_TILES_CUH
