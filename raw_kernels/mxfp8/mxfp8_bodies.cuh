// MXFP8 device code, part of mxfp8_impl.cuh (design notes there): the kernel bodies called by
// the extern "C" kernels of mxfp8_entry.cuh: quantize, fused wire rowwise -> columnwise, and
// dequantize.
#ifndef LPM_MXFP8_BODIES_CUH
#define LPM_MXFP8_BODIES_CUH

#include "mxfp8_formats.cuh"
#include "mxfp8_tile.cuh"

namespace lpm_mx {

// ---- quantize kernel body ---------------------------------------------------------------------

// Column sums of the tile (a bias gradient fused into the pass that quantizes dy):
// sums[rt * k + c] = (sum over the tile's even rows, in order) + (sum over its odd rows, in
// order) of x[row, c], each value first multiplied by probs[row] when probs is given; fp32,
// non-flushing. Rows past `valid` are not read. The lanes of the two row halves (l, l ^ 16)
// each hold one of the two partial sums.
template <int KIND>
__device__ __forceinline__ void tile_column_sums(const u32 (&raw)[LPM_MX_ROWS_PER_LANE][4],
                                                 const float* __restrict__ probs,
                                                 const TileRows& tr, long long rt, long long k,
                                                 long long c0, bool col_ok, int rsub,
                                                 float* __restrict__ sums) {
    constexpr int VEC = Kind<KIND>::VEC;
    float s[VEC];
#pragma unroll
    for (int c = 0; c < VEC; ++c) s[c] = 0.0f;
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
        const int r = rsub + 2 * j;
        if (r < tr.valid) {
            const float p = probs != nullptr ? __ldg(probs + tr.in_row0 + r) : 1.0f;
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                float v = KIND == KIND_F32 ? elem_to_f32<KIND>(raw[j][c], false)
                                           : elem_to_f32<KIND>(raw[j][c / 2], (c & 1) != 0);
                if (probs != nullptr) v = lpm_mul_rn(v, p);
                s[c] = lpm_add_rn(s[c], v);
            }
        }
    }
#pragma unroll
    for (int c = 0; c < VEC; ++c) s[c] = lpm_add_rn(s[c], __shfl_xor_sync(0xFFFFFFFFu, s[c], 16));
    if (rsub == 0 && col_ok) {
        float4* dst = reinterpret_cast<float4*>(sums + rt * k + c0);
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q)
            dst[q] = make_float4(s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3]);
    }
}

template <int KIND, int FMT, bool HW>
__device__ __forceinline__ void quantize_body(const u8* __restrict__ x, long long m_total,
                                              long long k, const long long* __restrict__ row_off,
                                              const long long* __restrict__ tile_off,
                                              int num_groups, long long num_row_tiles,
                                              const TileOut& o, int flags,
                                              float* __restrict__ col_sums,
                                              const float* __restrict__ probs) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int TILE_COLS = Kind<KIND>::TILE_COLS;
    constexpr int EB = Kind<KIND>::ELEM_BYTES;
    const int lane = threadIdx.x & 31;
    const long long k_tiles = (k + TILE_COLS - 1) / TILE_COLS;
    const long long warp_id =
        (long long)blockIdx.x * LPM_MX_WARPS_PER_CTA + (long long)(threadIdx.x >> 5);
    if (warp_id >= num_row_tiles * k_tiles) return;  // whole warp
    const long long rt = warp_id / k_tiles;
    const long long kt = warp_id - rt * k_tiles;
    const TileRows tr = locate_tile(rt, m_total, row_off, tile_off, num_groups);

    const int rsub = lane >> 4;
    const int chunk = lane & 15;
    const long long c0 = kt * TILE_COLS + (long long)chunk * VEC;
    const bool col_ok = c0 < k;

    u32 raw[LPM_MX_ROWS_PER_LANE][4];
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
        const int r = rsub + 2 * j;
        if (col_ok && r < tr.valid) {
            const uint4 v =
                __ldg(reinterpret_cast<const uint4*>(x + ((tr.in_row0 + r) * k + c0) * EB));
            raw[j][0] = v.x;
            raw[j][1] = v.y;
            raw[j][2] = v.z;
            raw[j][3] = v.w;
        } else {
            raw[j][0] = raw[j][1] = raw[j][2] = raw[j][3] = 0u;
        }
    }
    if (col_sums != nullptr)
        tile_column_sums<KIND>(raw, probs, tr, rt, k, c0, col_ok, rsub, col_sums);
    process_tile<KIND, FMT, HW>(raw, o, k, rt, tr, c0, col_ok, rsub, chunk,
                                (flags & LPM_MX_FLAG_ROWWISE) != 0,
                                (flags & LPM_MX_FLAG_COLUMNWISE) != 0,
                                (flags & LPM_MX_FLAG_BLOCK_2D) != 0);
}

template <int KIND, bool HW>
__device__ __forceinline__ void quantize_dispatch(const u8* x, long long m_total, long long k,
                                                  const long long* row_off,
                                                  const long long* tile_off, int num_groups,
                                                  long long num_row_tiles, const TileOut& o,
                                                  int flags, float* col_sums,
                                                  const float* probs) {
    if ((flags & LPM_MX_FLAG_E5M2) != 0) {
        quantize_body<KIND, FMT_E5M2, HW>(x, m_total, k, row_off, tile_off, num_groups,
                                          num_row_tiles, o, flags, col_sums, probs);
    } else {
        quantize_body<KIND, FMT_E4M3, HW>(x, m_total, k, row_off, tile_off, num_groups,
                                          num_row_tiles, o, flags, col_sums, probs);
    }
}

// ---- fused wire rowwise -> columnwise ---------------------------------------------------------

// Decode 4 wire bytes of one row (scale exponent e) to fp32 values rounded to bf16, exactly as
// the reference's dequantize (fp32) + astype(bfloat16) does, as fp32 bit patterns.
template <int WFMT>
__device__ __forceinline__ void decode_wire4(u32 w, u32 e, u32 (&out)[4]) {
    const u32 mag = w & 0x7F7F7F7Fu;
    const bool special = WFMT == FMT_E4M3 ? __vcmpeq4(mag, 0x7F7F7F7Fu) != 0u
                                          : __vcmpgeu4(mag, 0x7C7C7C7Cu) != 0u;
    if (!special && e != LPM_E8M0_NAN) {
        const float s = lpm_e8m0_to_f32(e);
        // Products are q * 2^(e-127) with q of at most 4 significant bits: exactly
        // representable in bf16 unless they fall below the fp32 normal range, so the bf16
        // rounding is needed only for small scales (at most 2^(10-127) for E4M3, 2^(17-127)
        // for E5M2, covering the smallest fp8 subnormal).
        const bool need_round = e < (WFMT == FMT_E4M3 ? 10u : 17u);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const u32 v = __float_as_uint(
                lpm_mul_rn(fp8_finite_to_f32<WFMT>((w >> (8 * b)) & 0xFFu), s));
            out[b] = need_round ? round_f32_to_bf16_bits32(v) : v;
        }
    } else {
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const float v = dequant_elem<WFMT>((w >> (8 * b)) & 0xFFu, e);
            out[b] = round_f32_to_bf16_bits32(__float_as_uint(v));
        }
    }
}

template <int WFMT, int FMT, bool HW>
__device__ __forceinline__ void colwise_from_rowwise_body(
    const u8* __restrict__ wire_data, const u8* __restrict__ wire_scale, long long m_total,
    long long k, const long long* __restrict__ row_off, const long long* __restrict__ tile_off,
    const long long* __restrict__ swz_off, int num_groups, long long num_row_tiles,
    u8* __restrict__ col_data, u8* __restrict__ col_scale, u8* __restrict__ swz_scale) {
    constexpr int KIND = KIND_F32;  // decoded values are kept as fp32 (bf16-rounded)
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    constexpr int TILE_COLS = Kind<KIND>::TILE_COLS;
    const int lane = threadIdx.x & 31;
    const long long k_tiles = (k + TILE_COLS - 1) / TILE_COLS;
    const long long warp_id =
        (long long)blockIdx.x * LPM_MX_WARPS_PER_CTA + (long long)(threadIdx.x >> 5);
    if (warp_id >= num_row_tiles * k_tiles) return;
    const long long rt = warp_id / k_tiles;
    const long long kt = warp_id - rt * k_tiles;

    // member of this tile (needed here also for the swizzled scale offset)
    int g = 0;
    if (row_off != nullptr) g = find_member(tile_off, num_groups, rt);
    const TileRows tr = locate_tile(rt, m_total, row_off, tile_off, num_groups);
    const long long member_row0 = row_off != nullptr ? __ldg(row_off + g) : 0;

    const int rsub = lane >> 4;
    const int chunk = lane & 15;
    const long long c0 = kt * TILE_COLS + (long long)chunk * VEC;
    const bool col_ok = c0 < k;
    const long long kb = k / LPM_MXFP8_BLOCK;
    const long long cblk = c0 / LPM_MXFP8_BLOCK;

    u32 wdat[LPM_MX_ROWS_PER_LANE];
    u32 wsc[LPM_MX_ROWS_PER_LANE];
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
        const int r = rsub + 2 * j;
        if (col_ok && r < tr.valid) {
            const long long row = tr.in_row0 + r;
            wdat[j] = __ldg(reinterpret_cast<const u32*>(wire_data + row * k + c0));
            wsc[j] = __ldg(wire_scale + row * kb + cblk);
        } else {
            wdat[j] = 0u;
            wsc[j] = 0u;
        }
    }
    if (swz_scale != nullptr && col_ok && (chunk % LB) == 0) {
        const long long cp = lpm_round_up(kb, LPM_SWIZZLE_TILE_COLS);
        u8* dst = swz_scale + (row_off != nullptr ? __ldg(swz_off + g) : 0);
#pragma unroll
        for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) {
            const int r = rsub + 2 * j;
            if (r < tr.valid) {
                const long long rl = tr.in_row0 + r - member_row0;  // row inside the member
                dst[lpm_swizzle_offset(rl, cblk, cp)] = (u8)wsc[j];
            }
        }
    }
    u32 raw[LPM_MX_ROWS_PER_LANE][4];
#pragma unroll
    for (int j = 0; j < LPM_MX_ROWS_PER_LANE; ++j) decode_wire4<WFMT>(wdat[j], wsc[j], raw[j]);

    TileOut o;
    o.row_data = nullptr;
    o.row_scale = nullptr;
    o.col_data = col_data;
    o.col_scale = col_scale;
    process_tile<KIND, FMT, HW>(raw, o, k, rt, tr, c0, col_ok, rsub, chunk, false, true, false);
}

// ---- dequantize -------------------------------------------------------------------------------

template <int FMT>
__device__ __forceinline__ void dequantize_body(const u8* __restrict__ data,
                                                const u8* __restrict__ scale,
                                                float* __restrict__ out, long long rows_out,
                                                long long k, int columnwise,
                                                const long long* __restrict__ row_off,
                                                const long long* __restrict__ tile_off,
                                                int num_groups, int tpr_log2) {
    const int tpr = 1 << tpr_log2;  // threads per row (power of two, <= block size)
    const int rows_per_cta = LPM_MX_DEQ_THREADS >> tpr_log2;
    const int tx = threadIdx.x & (tpr - 1);
    const long long chunks = k / LPM_MX_DEQ_VEC;
    const long long kb = k / LPM_MXFP8_BLOCK;
    for (long long row = (long long)blockIdx.x * rows_per_cta + (threadIdx.x >> tpr_log2);
         row < rows_out; row += (long long)gridDim.x * rows_per_cta) {
        long long src_row, scale_row;  // byte offsets of the data row and the scale row
        if (columnwise) {
            long long tile, r;
            if (row_off == nullptr) {
                tile = row / LPM_MXFP8_BLOCK;
                r = row % LPM_MXFP8_BLOCK;
            } else {
                const int g = find_member(row_off, num_groups, row);
                const long long rl = row - __ldg(row_off + g);
                tile = __ldg(tile_off + g) + rl / LPM_MXFP8_BLOCK;
                r = rl % LPM_MXFP8_BLOCK;
            }
            src_row = (tile * LPM_MXFP8_BLOCK + r) * k;
            scale_row = tile * k;
        } else {
            src_row = row * k;
            scale_row = row * kb;
        }
        for (long long ch = tx; ch < chunks; ch += tpr) {
            const long long c = ch * LPM_MX_DEQ_VEC;
            const uint4 d = __ldg(reinterpret_cast<const uint4*>(data + src_row + c));
            const u32 dw[4] = {d.x, d.y, d.z, d.w};
            u32 sw[4];
            if (columnwise) {
                const uint4 s = __ldg(reinterpret_cast<const uint4*>(scale + scale_row + c));
                sw[0] = s.x;
                sw[1] = s.y;
                sw[2] = s.z;
                sw[3] = s.w;
            } else {
                const u32 e = __ldg(scale + scale_row + c / LPM_MXFP8_BLOCK);
                sw[0] = sw[1] = sw[2] = sw[3] = e * 0x01010101u;
            }
            float4* dst = reinterpret_cast<float4*>(out + row * k + c);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float4 v;
                v.x = dequant_elem<FMT>(dw[q] & 0xFFu, sw[q] & 0xFFu);
                v.y = dequant_elem<FMT>((dw[q] >> 8) & 0xFFu, (sw[q] >> 8) & 0xFFu);
                v.z = dequant_elem<FMT>((dw[q] >> 16) & 0xFFu, (sw[q] >> 16) & 0xFFu);
                v.w = dequant_elem<FMT>(dw[q] >> 24, sw[q] >> 24);
                dst[q] = v;
            }
        }
    }
}

}  // namespace lpm_mx

#endif  // LPM_MXFP8_BODIES_CUH
