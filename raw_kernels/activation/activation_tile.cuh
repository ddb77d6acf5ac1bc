// GroupedMLP activation device code, part of activation.cu (design notes there; included by it
// after its launch-time constants): the GLU column layout, the warp tile
// set-up, and the loads / stores of a lane's row (scalar and vector, with row prefetch).
#ifndef LPM_ACTIVATION_TILE_CUH
#define LPM_ACTIVATION_TILE_CUH

#include "activation_math.cuh"

namespace lpm_act {

// ---- GLU column layout -----------------------------------------------------------------------

// Column of feature f in the activation input: gate (phase 0) or linear (phase 1) half; unary
// activations (glu == 0) read column f.
__device__ __forceinline__ long long in_col(long long f, int phase, int glu, long long f_dim,
                                            int il) {
    if (!glu) return f;
    if (il == 0) return phase == 0 ? f : f_dim + f;
    const long long c = (f / il) * (2LL * il) + f % il;
    return phase == 0 ? c : c + il;
}

// ---- tile set-up -------------------------------------------------------------------------------

struct Tile {
    long long rt, ft;  // row tile, feature tile
    TileRows tr;
    int rsub, chunk;
    long long f0;      // first feature of the lane
    bool col_ok;       // f0 < F
    int nvalid;        // features of the lane inside F (0..VEC)
    bool vec;          // vector loads / stores for this lane
};

template <int KIND>
__device__ __forceinline__ bool setup_tile(Tile& t, long long f_dim, long long m_total,
                                           const long long* __restrict__ row_off,
                                           const long long* __restrict__ tile_off,
                                           int num_groups, long long num_row_tiles, int flags) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int TILE_COLS = Kind<KIND>::TILE_COLS;
    const int lane = threadIdx.x & 31;
    const long long f_tiles = (f_dim + TILE_COLS - 1) / TILE_COLS;
    const long long warp_id =
        (long long)blockIdx.x * LPM_ACT_WARPS_PER_CTA + (long long)(threadIdx.x >> 5);
    if (warp_id >= num_row_tiles * f_tiles) return false;  // whole warp
    t.rt = warp_id / f_tiles;
    t.ft = warp_id - t.rt * f_tiles;
    t.tr = lpm_mx::locate_tile(t.rt, m_total, row_off, tile_off, num_groups);
    t.rsub = lane >> 4;
    t.chunk = lane & 15;
    t.f0 = t.ft * TILE_COLS + (long long)t.chunk * VEC;
    t.col_ok = t.f0 < f_dim;
    const long long left = f_dim - t.f0;
    t.nvalid = !t.col_ok ? 0 : (left < VEC ? (int)left : VEC);
    t.vec = (flags & LPM_ACT_FLAG_VEC) != 0 && t.nvalid == VEC;
    return true;
}

// The gate (phase 0; unary input) and linear (GLU only) values of the lane's features in one row.
template <int KIND>
__device__ __forceinline__ void load_inputs(const u8* __restrict__ h, long long row,
                                            long long h_width, long long f_dim, int glu, int il,
                                            const Tile& t, float (&g)[Kind<KIND>::VEC],
                                            float (&l)[Kind<KIND>::VEC]) {
    constexpr int VEC = Kind<KIND>::VEC;
    const long long base = row * h_width;
    if (t.vec) {
        load_vec<KIND>(h, base + in_col(t.f0, 0, glu, f_dim, il), g);
        if (glu) {
            load_vec<KIND>(h, base + in_col(t.f0, 1, glu, f_dim, il), l);
        } else {
#pragma unroll
            for (int c = 0; c < VEC; ++c) l[c] = 0.0f;
        }
        return;
    }
#pragma unroll
    for (int c = 0; c < VEC; ++c) {
        g[c] = 0.0f;
        l[c] = 0.0f;
        if (c < t.nvalid) {
            g[c] = load_one<KIND>(h, base + in_col(t.f0 + c, 0, glu, f_dim, il));
            if (glu) l[c] = load_one<KIND>(h, base + in_col(t.f0 + c, 1, glu, f_dim, il));
        }
    }
}

// Raw 16-byte inputs of one row of the lane (vector path; zeros for rows past the member), loaded
// one row ahead of their use (LPM_ACT_PREFETCH) so that the loads overlap the previous row's
// arithmetic.
struct RowIn {
    uint4 g, l, d;
    float p;
};

template <int KIND, bool BWD>
__device__ __forceinline__ RowIn fetch_row(const u8* __restrict__ h, const u8* __restrict__ dz,
                                           const float* __restrict__ probs, long long h_width,
                                           long long f_dim, int glu, int il, const Tile& t,
                                           int j) {
    constexpr int EB = Kind<KIND>::ELEM_BYTES;
    RowIn x;
    x.g = x.l = x.d = make_uint4(0u, 0u, 0u, 0u);
    x.p = 1.0f;
    const int r = t.rsub + 2 * j;
    if (t.vec && r < t.tr.valid) {
        const long long row = t.tr.in_row0 + r;
        const long long base = row * h_width;
        x.g = __ldg(reinterpret_cast<const uint4*>(h + (base + in_col(t.f0, 0, glu, f_dim, il)) * EB));
        if (glu)
            x.l = __ldg(
                reinterpret_cast<const uint4*>(h + (base + in_col(t.f0, 1, glu, f_dim, il)) * EB));
        if (BWD) x.d = __ldg(reinterpret_cast<const uint4*>(dz + (row * f_dim + t.f0) * EB));
        if (probs != nullptr) x.p = __ldg(probs + row);
    }
    return x;
}

template <int KIND>
__device__ __forceinline__ void decode_vec(const uint4& w4, float (&v)[Kind<KIND>::VEC]) {
    const u32 words[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
    for (int c = 0; c < Kind<KIND>::VEC; ++c)
        v[c] = KIND == KIND_F32 ? __uint_as_float(words[c])
                                : lpm_mx::elem_to_f32<KIND>(words[c / 2], (c & 1) != 0);
}

// Store the lane's VEC values of one row (layer dtype) at output columns of `phase`.
template <int KIND>
__device__ __forceinline__ void store_row(u8* __restrict__ out, long long row, long long width,
                                          const u32 (&w)[4], const Tile& t, int phase, int glu,
                                          long long f_dim, int il) {
    constexpr int VEC = Kind<KIND>::VEC;
    const long long base = row * width;
    if (t.vec) {
        const long long c0 = in_col(t.f0, phase, glu, f_dim, il);
        uint4 v;
        v.x = w[0];
        v.y = w[1];
        v.z = w[2];
        v.w = w[3];
        *reinterpret_cast<uint4*>(out + (base + c0) * Kind<KIND>::ELEM_BYTES) = v;
        return;
    }
#pragma unroll
    for (int c = 0; c < VEC; ++c)
        if (c < t.nvalid)
            store_one<KIND>(out, base + in_col(t.f0 + c, phase, glu, f_dim, il),
                            unpack<KIND>(w, c));
}

}  // namespace lpm_act

#endif  // LPM_ACTIVATION_TILE_CUH
