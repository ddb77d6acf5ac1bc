// lowprec_moe: GroupedMLP activation kernels (forward and backward), optionally fused with the
// MXFP8 quantization of their output. Launched by lowprec_moe/cuda/activation.py.
//
// Semantics (SPEC section 8; lowprec_moe/reference/activations.py is the definition): fp32 math,
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
//   lpm_act_segment_colsum          per-expert sums of the per-tile column sums (bias gradient)
//   lpm_act_row_sum                 per-row sums of the dprobs partials
//
// Work decomposition (shared by all modes, so that fused and unfused runs sum in the same order):
// one warp per (32-row tile of one expert, TILE_COLS output features), the tile shape of the
// MXFP8 quantizer (mxfp8_impl.cuh): lane = (rsub, chunk), rows rsub + 2j (j < 16), features
// f0 = tile start + chunk * VEC .. + VEC. The values a lane computes are packed exactly as the
// quantizer would have loaded them from memory, and the fused stage performs lpm_mx::process_tile's
// arithmetic on them (see "per-warp staging" below), which is why the fused output equals the
// unfused chain bit for bit. The _amax kernels take the NVFP4 amax of the values they write with
// the NaN rule and the RHT code of the NVFP4 quantizer (nvfp4_common.cuh). In the backward, a warp writes the gate
// gradients (phase 0) then the linear gradients (phase 1) of its features; with MXFP8 output every
// aligned 32-column block of dh must be all gate or all linear (glu_interleave % 32 == 0).
//
// Reductions: dprobs partial of (row, feature tile) = fp32 sum over the lane's VEC features in
// order, then a butterfly over the 16 lanes of the row (xor 1, 2, 4, 8); lpm_act_row_sum adds
// the partials of a row in order. Column sums: fp32 sum of the lane's 16 rows in order, plus the
// other row parity (xor 16); per expert, lpm_act_segment_colsum adds the tiles in order.
// Deterministic and independent of the other experts (grouped == per expert, bitwise); not the
// NumPy summation order.

#include "mxfp8_impl.cuh"
#include "nvfp4_common.cuh"  // q_rht16, q_amax16: the NVFP4 quantizer's RHT amax arithmetic

// ------------------------------------------------------------------------------------------
// Exponential constants: fp32 bit patterns, mirrored by EXP_CONST_BITS in
// lowprec_moe/reference/activations.py (tests/test_activations.py checks that they agree).
constexpr unsigned int LPM_ACT_LOG2E_BITS = 0x3FB8AA3Bu;
constexpr unsigned int LPM_ACT_LN2_HI_BITS = 0x3F317200u;
constexpr unsigned int LPM_ACT_LN2_LO_BITS = 0x35BFBE8Eu;
constexpr unsigned int LPM_ACT_RINT_MAGIC_BITS = 0x4B400000u;
constexpr unsigned int LPM_ACT_EXP_MAX_IN_BITS = 0x42B20000u;
constexpr unsigned int LPM_ACT_EXP_MIN_IN_BITS = 0xC2D00000u;
constexpr unsigned int LPM_ACT_C2_BITS = 0x3F000000u;
constexpr unsigned int LPM_ACT_C3_BITS = 0x3E2AAAABu;
constexpr unsigned int LPM_ACT_C4_BITS = 0x3D2AAAABu;
constexpr unsigned int LPM_ACT_C5_BITS = 0x3C088889u;
constexpr unsigned int LPM_ACT_C6_BITS = 0x3AB60B61u;
constexpr unsigned int LPM_ACT_C7_BITS = 0x39500D01u;

// Launch-time constants shared with lowprec_moe/cuda/activation.py
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

namespace lpm_act {

using lpm_mx::Kind;
using lpm_mx::KIND_BF16;
using lpm_mx::KIND_F16;
using lpm_mx::KIND_F32;
using lpm_mx::FMT_E4M3;
using lpm_mx::FMT_E5M2;
using lpm_mx::TileOut;
using lpm_mx::TileRows;
typedef unsigned char u8;
typedef unsigned int u32;

constexpr int ROWS_PER_LANE = LPM_MX_ROWS_PER_LANE;  // 16: a warp tile is 32 rows

// ---- non-flushing comparisons, negation -----------------------------------------------------

__device__ __forceinline__ bool f_gt(float a, float b) {
    u32 r;
    asm("{\n\t.reg .pred p;\n\tsetp.gt.f32 p, %1, %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(r) : "f"(a), "f"(b));
    return r != 0u;
}

__device__ __forceinline__ bool f_lt(float a, float b) { return f_gt(b, a); }

__device__ __forceinline__ bool f_le(float a, float b) {
    u32 r;
    asm("{\n\t.reg .pred p;\n\tsetp.le.f32 p, %1, %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(r) : "f"(a), "f"(b));
    return r != 0u;
}

__device__ __forceinline__ bool f_ge(float a, float b) { return f_le(b, a); }

__device__ __forceinline__ float f_neg(float x) {
    return __uint_as_float(__float_as_uint(x) ^ 0x80000000u);
}

__device__ __forceinline__ float cbits(u32 b) { return __uint_as_float(b); }

// ---- exp (reference: exp_f32) ----------------------------------------------------------------

__device__ __forceinline__ float exp_f32(float x) {
    // NaN fails both comparisons and propagates through the arithmetic.
    float xc = f_gt(x, cbits(LPM_ACT_EXP_MAX_IN_BITS)) ? cbits(LPM_ACT_EXP_MAX_IN_BITS) : x;
    xc = f_lt(xc, cbits(LPM_ACT_EXP_MIN_IN_BITS)) ? cbits(LPM_ACT_EXP_MIN_IN_BITS) : xc;
    const float t = lpm_mul_rn(xc, cbits(LPM_ACT_LOG2E_BITS));
    const float n = lpm_sub_rn(lpm_add_rn(t, cbits(LPM_ACT_RINT_MAGIC_BITS)),
                               cbits(LPM_ACT_RINT_MAGIC_BITS));
    float r = lpm_sub_rn(xc, lpm_mul_rn(n, cbits(LPM_ACT_LN2_HI_BITS)));
    r = lpm_sub_rn(r, lpm_mul_rn(n, cbits(LPM_ACT_LN2_LO_BITS)));
    float p = cbits(LPM_ACT_C7_BITS);
    p = lpm_add_rn(lpm_mul_rn(p, r), cbits(LPM_ACT_C6_BITS));
    p = lpm_add_rn(lpm_mul_rn(p, r), cbits(LPM_ACT_C5_BITS));
    p = lpm_add_rn(lpm_mul_rn(p, r), cbits(LPM_ACT_C4_BITS));
    p = lpm_add_rn(lpm_mul_rn(p, r), cbits(LPM_ACT_C3_BITS));
    p = lpm_add_rn(lpm_mul_rn(p, r), cbits(LPM_ACT_C2_BITS));
    p = lpm_add_rn(lpm_mul_rn(p, r), 1.0f);
    p = lpm_add_rn(lpm_mul_rn(p, r), 1.0f);
    const int ni = __float2int_rz(n);  // exact: n is an integer in [-150, 129] (NaN -> 0)
    const int n1 = ni >> 1;            // floor(n / 2)
    const int n2 = ni - n1;
    const float s1 = __uint_as_float((u32)(n1 + 127) << 23);
    const float s2 = __uint_as_float((u32)(n2 + 127) << 23);
    return lpm_mul_rn(lpm_mul_rn(p, s1), s2);
}


// ---- the activations (reference: act_forward_f32, act_backward_f32) --------------------------
//
// The lane's VEC features of one row are computed together, in straight-line code: the sigmoid's
// IEEE division 1 / d (d = 1 + exp(-t) >= 1) takes the fast path of rcp.rn.f32 (MUFU.RCP and one
// Newton step, correctly rounded for d < 2^126) for all VEC values, and the exact rcp.rn.f32
// replays them only when one d is out of that range (rare: t < -87). Per-element branches would
// split the VEC independent chains into serial regions. swiglu and clamped_swiglu share one
// sequence of operations (the clamps and the alpha multiply selected away for swiglu, which
// performs exactly the reference's operations); srelu has its own loop (a uniform branch).

struct Params {
    int act;
    float limit;
    float alpha;
};

// Fast path of rcp.rn.f32 for a normal d with biased exponent in [1, 252] (the range in which
// ptxas itself takes it): r = MUFU.RCP(d), e = -(d r - 1), r + r e.
__device__ __forceinline__ float rcp_fast(float d) {
    float r, e, o;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(e) : "f"(d), "f"(r), "f"(-1.0f));
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(o) : "f"(r), "f"(f_neg(e)), "f"(r));
    return o;
}

__device__ __forceinline__ bool rcp_fast_ok(float d) {
    return ((__float_as_uint(d) + 0x01800000u) & 0x7F800000u) > 0x01FFFFFFu;
}

// GLU activations: gc = clamped gate, t = sigmoid argument, s = sigmoid(t), lb = linear factor.
// swiglu: gc = g, t = g, lb = l. clamped_swiglu: gc = min(g, limit), t = alpha gc,
// lb = clamp(l, -limit, limit) + 1.
template <int N>
__device__ __forceinline__ void glu_terms(const Params& P, const float (&g)[N], const float (&l)[N],
                                          float (&gc)[N], float (&t)[N], float (&s)[N],
                                          float (&lb)[N]) {
    const bool cl = P.act == LPM_ACT_CLAMPED_SWIGLU;
    const float lim = P.limit;
    float d[N];
    bool slow = false;
#pragma unroll
    for (int c = 0; c < N; ++c) {
        gc[c] = (cl && f_gt(g[c], lim)) ? lim : g[c];
        t[c] = cl ? lpm_mul_rn(P.alpha, gc[c]) : g[c];
        const float lc = f_gt(l[c], lim) ? lim : (f_lt(l[c], f_neg(lim)) ? f_neg(lim) : l[c]);
        lb[c] = cl ? lpm_add_rn(lc, 1.0f) : l[c];
        d[c] = lpm_add_rn(1.0f, exp_f32(f_neg(t[c])));
        s[c] = rcp_fast(d[c]);
        slow |= !rcp_fast_ok(d[c]);
    }
    if (slow) {
#pragma unroll
        for (int c = 0; c < N; ++c) s[c] = lpm_rcp_rn(d[c]);  // == div.rn(1, d)
    }
}

// Activation values a[c] = act(g[c], l[c]).
template <int N>
__device__ __forceinline__ void act_values(const Params& P, const float (&g)[N],
                                           const float (&l)[N], float (&a)[N]) {
    if (P.act == LPM_ACT_SRELU) {
#pragma unroll
        for (int c = 0; c < N; ++c) a[c] = f_le(g[c], 0.0f) ? 0.0f : lpm_mul_rn(g[c], g[c]);
        return;
    }
    float gc[N], t[N], s[N], lb[N];
    glu_terms<N>(P, g, l, gc, t, s, lb);
#pragma unroll
    for (int c = 0; c < N; ++c) a[c] = lpm_mul_rn(lpm_mul_rn(gc[c], s[c]), lb[c]);
}

// Gradients w.r.t. the gate / unary input (phase 0) or the linear input (phase 1) from
// da[c] = dz * p; with `want_value` also the activation values (for dprobs; same sigmoid). The
// GLU math runs on groups of SUB features (fewer live registers, still SUB independent chains).
template <int N>
__device__ __forceinline__ void act_grads(const Params& P, const float (&g)[N],
                                          const float (&l)[N], const float (&da)[N], int phase,
                                          bool want_value, float (&out)[N], float (&val)[N]) {
    if (P.act == LPM_ACT_SRELU) {
#pragma unroll
        for (int c = 0; c < N; ++c) {
            const bool off = f_le(g[c], 0.0f);
            out[c] = off ? 0.0f : lpm_mul_rn(lpm_add_rn(g[c], g[c]), da[c]);
            val[c] = off ? 0.0f : lpm_mul_rn(g[c], g[c]);
        }
        return;
    }
    constexpr int SUB = 4;
    const bool cl = P.act == LPM_ACT_CLAMPED_SWIGLU;
    const float lim = P.limit;
#pragma unroll
    for (int c0 = 0; c0 < N; c0 += SUB) {
        float gg[SUB], ll[SUB], gc[SUB], t[SUB], s[SUB], lb[SUB];
#pragma unroll
        for (int c = 0; c < SUB; ++c) {
            gg[c] = g[c0 + c];
            ll[c] = l[c0 + c];
        }
        glu_terms<SUB>(P, gg, ll, gc, t, s, lb);
        if (phase == 1) {
#pragma unroll
            for (int c = 0; c < SUB; ++c) {
                const bool inside = f_ge(ll[c], f_neg(lim)) && f_le(ll[c], lim);
                out[c0 + c] = (cl && !inside) ? 0.0f : lpm_mul_rn(da[c0 + c], lpm_mul_rn(gc[c], s[c]));
                val[c0 + c] = 0.0f;
            }
        } else {
#pragma unroll
            for (int c = 0; c < SUB; ++c) {
                const float ds =
                    lpm_mul_rn(s[c], lpm_add_rn(1.0f, lpm_mul_rn(t[c], lpm_sub_rn(1.0f, s[c]))));
                out[c0 + c] = (cl && !f_le(gg[c], lim))
                                  ? 0.0f
                                  : lpm_mul_rn(lpm_mul_rn(da[c0 + c], lb[c]), ds);
                val[c0 + c] = want_value ? lpm_mul_rn(lpm_mul_rn(gc[c], s[c]), lb[c]) : 0.0f;
            }
        }
    }
}

// ---- element formats ----------------------------------------------------------------------------

// fp32 -> bit pattern of the layer dtype (RNE, no flush; fp32 unchanged).
template <int KIND>
__device__ __forceinline__ u32 enc(float v) {
    if (KIND == KIND_F32) return __float_as_uint(v);
    if (KIND == KIND_BF16) return (u32)lpm_f32_to_bf16_bits_rn(v);
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return (u32)r;
}

template <int KIND>
__device__ __forceinline__ float dec(u32 bits) {
    if (KIND == KIND_F32) return __uint_as_float(bits);
    if (KIND == KIND_BF16) return __uint_as_float(bits << 16);
    return lpm_f16_bits_to_f32((unsigned short)bits);
}

template <int KIND>
__device__ __forceinline__ float load_one(const u8* __restrict__ base, long long elem) {
    if (KIND == KIND_F32) return __uint_as_float(__ldg(reinterpret_cast<const u32*>(base) + elem));
    return dec<KIND>((u32)__ldg(reinterpret_cast<const unsigned short*>(base) + elem));
}

// VEC consecutive elements starting at `elem` (16-byte aligned).
template <int KIND>
__device__ __forceinline__ void load_vec(const u8* __restrict__ base, long long elem,
                                         float (&v)[Kind<KIND>::VEC]) {
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(base + elem * Kind<KIND>::ELEM_BYTES));
    const u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int c = 0; c < Kind<KIND>::VEC; ++c)
        v[c] = KIND == KIND_F32 ? __uint_as_float(words[c])
                                : lpm_mx::elem_to_f32<KIND>(words[c / 2], (c & 1) != 0);
}

// Pack VEC layer-dtype patterns into the 4 words the MXFP8 tile code expects.
template <int KIND>
__device__ __forceinline__ void pack(const u32 (&e)[Kind<KIND>::VEC], u32 (&w)[4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q)
        w[q] = KIND == KIND_F32 ? e[q] : (e[2 * q] | (e[2 * q + 1] << 16));
}

template <int KIND>
__device__ __forceinline__ u32 unpack(const u32 (&w)[4], int c) {
    if (KIND == KIND_F32) return w[c];
    return (c & 1) ? (w[c / 2] >> 16) : (w[c / 2] & 0xFFFFu);
}

template <int KIND>
__device__ __forceinline__ void store_one(u8* __restrict__ base, long long elem, u32 bits) {
    if (KIND == KIND_F32) {
        reinterpret_cast<u32*>(base)[elem] = bits;
    } else {
        reinterpret_cast<unsigned short*>(base)[elem] = (unsigned short)bits;
    }
}

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

// ---- per-warp staging of the packed tile ----------------------------------------------------
//
// The rows of a lane are computed in a rolled loop (one copy of the activation math per feature
// instead of one per (row, feature): the kernels stay small and compile fast). With MXFP8 output
// the packed words of each row go to shared memory, together with the row maxima of each
// 32-column block, and the column maxima are kept in registers; after the loop every lane reads
// its rows back one at a time and quantizes them (rowwise and / or columnwise). This is the
// arithmetic of lpm_mx::process_tile (same maxima, same scale rule, same conversions, NaN bytes
// canonicalised when the tile holds a NaN) without holding the 16 x 16-byte tile of a lane in
// registers. The RHT amax (NVFP4) reads the staged tile by columns.

constexpr int STAGE_ROWS = 2 * ROWS_PER_LANE;  // 32
constexpr int STAGE_CHUNKS = 16;
constexpr int STAGE_ROW_BLOCKS = 4;  // 32-column blocks of a warp tile (TILE_COLS / 32 <= 4)

struct Stage {
    uint4 w[LPM_ACT_WARPS_PER_CTA][STAGE_ROWS][STAGE_CHUNKS];
    u32 rowmax[LPM_ACT_WARPS_PER_CTA][STAGE_ROWS][STAGE_ROW_BLOCKS];
};

__device__ __forceinline__ void stage_put(Stage& st, int r, int chunk, const u32 (&w)[4]) {
    uint4 v;
    v.x = w[0];
    v.y = w[1];
    v.z = w[2];
    v.w = w[3];
    st.w[threadIdx.x >> 5][r][chunk] = v;
}

// |x| maxima of a lane's rows (layer-dtype bit patterns, NaN elements ignored): per word over
// the rows, and whether any element was a NaN.
struct MaxAcc {
    u32 col[4];
    bool nan;
};

__device__ __forceinline__ void acc_init(MaxAcc& A) {
#pragma unroll
    for (int q = 0; q < 4; ++q) A.col[q] = 0u;
    A.nan = false;
}

// Add one row (4 packed words); returns the lane's maximum over the row (NaN ignored).
template <int KIND>
__device__ __forceinline__ u32 acc_row(MaxAcc& A, const u32 (&w)[4]) {
    u32 a[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        a[q] = lpm_mx::abs_word_nonan<KIND>(w[q]);
        A.nan |= a[q] != lpm_mx::abs_word<KIND>(w[q]);
        A.col[q] = lpm_mx::max_word<KIND>(A.col[q], a[q]);
    }
    return lpm_mx::word_scalar_max<KIND>(lpm_mx::max_word<KIND>(
        lpm_mx::max_word<KIND>(a[0], a[1]), lpm_mx::max_word<KIND>(a[2], a[3])));
}

// Layer-dtype |x| bits of element c of a word array.
template <int KIND>
__device__ __forceinline__ u32 word_elem(const u32 (&w)[4], int c) {
    if (KIND == KIND_F32) return w[c];
    return (c & 1) ? (w[c / 2] >> 16) : (w[c / 2] & 0xFFFFu);
}

// fp32 bits of a layer-dtype |x| pattern (non-NaN): order-preserving, 0 stays 0.
template <int KIND>
__device__ __forceinline__ u32 amax_f32_bits(u32 a) {
    return __float_as_uint(lpm_mx::amax_bits_to_f32<KIND>(a));
}

// Row maximum (lane value -> the whole row block of `lanes` lanes).
__device__ __forceinline__ u32 row_reduce(u32 m, int lanes) {
    for (int s = 1; s < lanes; s <<= 1) m = lpm_mx::umax(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
    return m;
}

// The lane's 16 staged rows, quantized and stored (FIXNAN: canonical NaN bytes).
template <int KIND, int FMT, bool FIXNAN>
__device__ __forceinline__ void mx_emit_rows(const Stage& st, const TileOut& o, long long k,
                                             long long rt, const TileRows& tr, long long c0,
                                             bool col_ok, int rsub, int chunk, bool do_row,
                                             bool do_col, const float (&mcol)[Kind<KIND>::VEC]) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    const int warp = threadIdx.x >> 5;
    const long long kb = k / LPM_MXFP8_BLOCK;
    const long long r0 = tr.in_row0 + rsub;
    u8* rdp = do_row ? o.row_data + r0 * k + c0 : nullptr;
    u8* rsp = do_row ? o.row_scale + r0 * kb + c0 / LPM_MXFP8_BLOCK : nullptr;
    u8* cdp = do_col ? o.col_data + (rt * LPM_MXFP8_BLOCK + rsub) * k + c0 : nullptr;
    const bool scale_lane = (chunk % LB) == 0;
#pragma unroll 1
    for (int j = 0; j < ROWS_PER_LANE; ++j) {
        const int r = rsub + 2 * j;
        const uint4 v = st.w[warp][r][chunk];
        const u32 raw[4] = {v.x, v.y, v.z, v.w};
        float xv[VEC];
#pragma unroll
        for (int c = 0; c < VEC; ++c)
            xv[c] = KIND == KIND_F32 ? lpm_mx::elem_to_f32<KIND>(raw[c], false)
                                     : lpm_mx::elem_to_f32<KIND>(raw[c / 2], (c & 1) != 0);
        if (do_row) {
            const u32 erow = lpm_mx::scale_exponent_nonan<FMT>(
                lpm_mx::amax_bits_to_f32<KIND>(st.rowmax[warp][r][chunk / LB]));
            const float m = lpm_mx::scale_multiplier_finite(erow);
            float mrow[VEC];
#pragma unroll
            for (int c = 0; c < VEC; ++c) mrow[c] = m;
            u32 rbytes[VEC / 4];
            lpm_mx::quantize_vec<FMT, true, VEC>(xv, mrow, FIXNAN, rbytes);
            if (col_ok && r < tr.valid) {
                lpm_mx::store_words<VEC / 4>(rdp + 2LL * j * k, rbytes);
                if (scale_lane) rsp[2LL * j * kb] = (u8)erow;
            }
        }
        if (do_col && col_ok) {
            u32 cbytes[VEC / 4];
            lpm_mx::quantize_vec<FMT, true, VEC>(xv, mcol, FIXNAN, cbytes);
            lpm_mx::store_words<VEC / 4>(cdp + 2LL * j * k, cbytes);
        }
    }
}

// MXFP8 of the staged tile: maxima -> scales -> the lane's rows, quantized and stored. Columns
// c0 .. c0 + VEC of a k-column output; row tile rt (rows tr.in_row0 + r, r < tr.valid).
template <int KIND, int FMT>
__device__ __forceinline__ void mx_emit(const Stage& st, MaxAcc& A, const TileOut& o,
                                        long long k, long long rt, const TileRows& tr,
                                        long long c0, bool col_ok, int rsub, int chunk,
                                        bool do_row, bool do_col) {
    constexpr int VEC = Kind<KIND>::VEC;
    const bool has_nan = __any_sync(0xFFFFFFFFu, A.nan);
#pragma unroll
    for (int q = 0; q < 4; ++q)
        A.col[q] = lpm_mx::max_word<KIND>(A.col[q], __shfl_xor_sync(0xFFFFFFFFu, A.col[q], 16));
    u32 ecol[VEC];
    float mcol[VEC];
#pragma unroll
    for (int c = 0; c < VEC; ++c) {
        ecol[c] = do_col ? lpm_mx::scale_exponent_nonan<FMT>(
                               lpm_mx::amax_bits_to_f32<KIND>(word_elem<KIND>(A.col, c)))
                         : 0u;
        mcol[c] = lpm_mx::scale_multiplier_finite(ecol[c]);
    }
    __syncwarp();  // the staged rows and row maxima of the other lanes
    // a uniform branch picks the instantiation: NaN-free tiles carry no NaN fix-up instructions
    if (has_nan) {
        mx_emit_rows<KIND, FMT, true>(st, o, k, rt, tr, c0, col_ok, rsub, chunk, do_row, do_col,
                                      mcol);
    } else {
        mx_emit_rows<KIND, FMT, false>(st, o, k, rt, tr, c0, col_ok, rsub, chunk, do_row, do_col,
                                       mcol);
    }
    if (do_col && col_ok && rsub == 0) {
        u32 sw[VEC / 4];
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q)
            sw[q] = ecol[4 * q] | (ecol[4 * q + 1] << 8) | (ecol[4 * q + 2] << 16) |
                    (ecol[4 * q + 3] << 24);
        lpm_mx::store_words<VEC / 4>(o.col_scale + rt * k + c0, sw);
    }
    __syncwarp();  // the stage is rewritten next (backward: the next phase)
}

// NVFP4 amax outputs of one phase (see the kernel comments for the modes and buffers).
template <int KIND>
__device__ __forceinline__ void amax_flush(const Stage& st, MaxAcc& A, const Tile& t, int g,
                                           int phase, int glu, long long f_dim, int il,
                                           long long h_width, int flags,
                                           u32* __restrict__ amax_a, u32* __restrict__ amax_b) {
    constexpr int VEC = Kind<KIND>::VEC;
    if ((flags & (LPM_ACT_FLAG_AMAX | LPM_ACT_FLAG_AMAX_RHT)) != 0) {
        u32 m = lpm_mx::word_scalar_max<KIND>(lpm_mx::max_word<KIND>(
            lpm_mx::max_word<KIND>(A.col[0], A.col[1]), lpm_mx::max_word<KIND>(A.col[2], A.col[3])));
        m = row_reduce(m, 32);
        const u32 fb = amax_f32_bits<KIND>(m);
        if ((threadIdx.x & 31) == 0 && fb != 0u) atomicMax(amax_a + g, fb);
    }
    if ((flags & LPM_ACT_FLAG_AMAX_ROWS) != 0) {
        u32 col[4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
            col[q] = lpm_mx::max_word<KIND>(A.col[q], __shfl_xor_sync(0xFFFFFFFFu, A.col[q], 16));
        if (t.rsub == 0) {
            u32* dst = amax_b + (long long)g * h_width;
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const u32 fb = amax_f32_bits<KIND>(word_elem<KIND>(col, c));
                if (c < t.nvalid && fb != 0u)
                    atomicMax(dst + in_col(t.f0 + c, phase, glu, f_dim, il), fb);
            }
        }
    }
    if (KIND == KIND_BF16 && (flags & LPM_ACT_FLAG_AMAX_RHT) != 0) {
        // Columnwise RHT amax: lane (rsub, chunk) transforms rows 16 rsub .. 16 rsub + 15 (one
        // 16-row chunk of the member: tiles start at member rows multiple of 32, rows past the
        // member are zero, as the quantizer's zero padding) of its VEC columns.
        __syncwarp();
        const int warp = threadIdx.x >> 5;
        const unsigned short* base = reinterpret_cast<const unsigned short*>(
            &st.w[warp][16 * t.rsub][t.chunk]);
        constexpr int ROW_STRIDE = STAGE_CHUNKS * 8;  // unsigned shorts per staged row
        float mt = 0.0f;
#pragma unroll 1
        for (int c = 0; c < VEC; ++c) {
            float v[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) v[i] = __uint_as_float((u32)base[i * ROW_STRIDE + c] << 16);
            q_rht16<8>(v);
            mt = lpm_fmax(mt, q_amax16(v));
        }
        // mt >= 0 and not NaN: its bits order like its values
        const u32 fb = row_reduce(__float_as_uint(mt), 32);
        if ((threadIdx.x & 31) == 0 && fb != 0u) atomicMax(amax_b + g, fb);
        __syncwarp();
    }
}

// ---- forward ------------------------------------------------------------------------------------

// MODE: MODE_PLAIN (z), MODE_AMAX (z and NVFP4 amax outputs), MODE_MX (MXFP8 of z, no z).
constexpr int MODE_PLAIN = 0;
constexpr int MODE_AMAX = 1;
constexpr int MODE_MX = 2;

template <int KIND, int MODE, int FMT>
__device__ __forceinline__ void fwd_body(const u8* __restrict__ h, const float* __restrict__ probs,
                                         long long f_dim, long long h_width, int glu, int il,
                                         const Params& P, long long m_total,
                                         const long long* __restrict__ row_off,
                                         const long long* __restrict__ tile_off, int num_groups,
                                         long long num_row_tiles, u8* __restrict__ z,
                                         const TileOut& o, int flags, u32* __restrict__ amax_a,
                                         u32* __restrict__ amax_b, Stage& st) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    constexpr bool MX = MODE == MODE_MX;
    constexpr bool AMX = MODE == MODE_AMAX;
    Tile t;
    if (!setup_tile<KIND>(t, f_dim, m_total, row_off, tile_off, num_groups, num_row_tiles, flags))
        return;
    const bool do_row = MX && (flags & LPM_MX_FLAG_ROWWISE) != 0;
    const bool do_col = MX && (flags & LPM_MX_FLAG_COLUMNWISE) != 0;
    const bool rows = AMX && (flags & LPM_ACT_FLAG_AMAX_ROWS) != 0;
    const bool stage = MX || (AMX && KIND == KIND_BF16 && (flags & LPM_ACT_FLAG_AMAX_RHT) != 0);
    MaxAcc A;
    acc_init(A);
    // (not in the MXFP8 forward: its 72 registers allow the 6 CTAs / SM its shared memory allows;
    // prefetching would take it to 108 registers, 4 CTAs)
    constexpr bool PF = LPM_ACT_PREFETCH != 0 && !MX;
    RowIn nx;
    if (PF) nx = fetch_row<KIND, false>(h, nullptr, probs, h_width, f_dim, glu, il, t, 0);
#pragma unroll 1
    for (int j = 0; j < ROWS_PER_LANE; ++j) {
        const int r = t.rsub + 2 * j;
        const bool valid = t.col_ok && r < t.tr.valid;
        const long long row = t.tr.in_row0 + r;
        RowIn cur;
        if (PF) {
            cur = nx;
            if (j + 1 < ROWS_PER_LANE)
                nx = fetch_row<KIND, false>(h, nullptr, probs, h_width, f_dim, glu, il, t, j + 1);
        } else {
            cur = fetch_row<KIND, false>(h, nullptr, probs, h_width, f_dim, glu, il, t, j);
        }
        u32 e[VEC];
        if (valid) {
            float g[VEC], l[VEC], a[VEC];
            float p = cur.p;
            if (t.vec) {
                decode_vec<KIND>(cur.g, g);
                decode_vec<KIND>(cur.l, l);  // zeros for unary activations
            } else {
                load_inputs<KIND>(h, row, h_width, f_dim, glu, il, t, g, l);
                p = probs != nullptr ? __ldg(probs + row) : 1.0f;
            }
            act_values<VEC>(P, g, l, a);
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const float v = probs != nullptr ? lpm_mul_rn(a[c], p) : a[c];
                e[c] = c < t.nvalid ? enc<KIND>(v) : 0u;
            }
        } else {
#pragma unroll
            for (int c = 0; c < VEC; ++c) e[c] = 0u;
        }
        u32 w[4];
        pack<KIND>(e, w);
        if (stage) stage_put(st, r, t.chunk, w);
        if (!MX && valid) store_row<KIND>(z, row, f_dim, w, t, 0, 0, f_dim, 0);
        if (MX || AMX) {
            const u32 rm = acc_row<KIND>(A, w);
            if (do_row) {
                const u32 m = row_reduce(rm, LB);
                if (t.chunk % LB == 0) st.rowmax[threadIdx.x >> 5][r][t.chunk / LB] = m;
            }
            if (rows) {
                const u32 fb = amax_f32_bits<KIND>(row_reduce(rm, 16));
                if (t.chunk == 0 && r < t.tr.valid && fb != 0u) atomicMax(amax_a + row, fb);
            }
        }
    }
    if (MX)
        mx_emit<KIND, FMT>(st, A, o, f_dim, t.rt, t.tr, t.f0, t.col_ok, t.rsub, t.chunk, do_row,
                           do_col);
    if (AMX)
        amax_flush<KIND>(st, A, t, lpm_mx::find_member(tile_off, num_groups, t.rt), 0, 0, f_dim,
                         0, f_dim, flags, amax_a, amax_b);
}

// ---- backward -----------------------------------------------------------------------------------

template <int KIND, int MODE, int FMT>
__device__ __forceinline__ void bwd_body(const u8* __restrict__ dz, const u8* __restrict__ h,
                                         const float* __restrict__ probs, long long f_dim,
                                         long long h_width, int glu, int il, const Params& P,
                                         long long m_total, const long long* __restrict__ row_off,
                                         const long long* __restrict__ tile_off, int num_groups,
                                         long long num_row_tiles, u8* __restrict__ dh,
                                         const TileOut& o, int flags,
                                         float* __restrict__ dprobs_part,
                                         float* __restrict__ colsum_part, u32* __restrict__ amax_a,
                                         u32* __restrict__ amax_b, Stage& st) {
    constexpr int VEC = Kind<KIND>::VEC;
    constexpr int TILE_COLS = Kind<KIND>::TILE_COLS;
    constexpr int LB = Kind<KIND>::LANES_PER_BLOCK;
    constexpr bool MX = MODE == MODE_MX;
    constexpr bool AMX = MODE == MODE_AMAX;
    Tile t;
    if (!setup_tile<KIND>(t, f_dim, m_total, row_off, tile_off, num_groups, num_row_tiles, flags))
        return;
    const bool want_p = dprobs_part != nullptr && probs != nullptr;
    const long long f_tiles = (f_dim + TILE_COLS - 1) / TILE_COLS;
    const bool do_row = MX && (flags & LPM_MX_FLAG_ROWWISE) != 0;
    const bool do_col = MX && (flags & LPM_MX_FLAG_COLUMNWISE) != 0;
    const bool rows = AMX && (flags & LPM_ACT_FLAG_AMAX_ROWS) != 0;
    const bool stage = MX || (AMX && KIND == KIND_BF16 && (flags & LPM_ACT_FLAG_AMAX_RHT) != 0);
    const int g_member = AMX ? lpm_mx::find_member(tile_off, num_groups, t.rt) : 0;

    const int nphase = glu ? 2 : 1;
#pragma unroll 1
    for (int phase = 0; phase < nphase; ++phase) {
        float s[VEC];  // column sums of the lane's rows
#pragma unroll
        for (int c = 0; c < VEC; ++c) s[c] = 0.0f;
        MaxAcc A;
        acc_init(A);
        const bool want_v = want_p && phase == 0;
        constexpr bool PF = LPM_ACT_PREFETCH != 0;
        RowIn nx;
        if (PF) nx = fetch_row<KIND, true>(h, dz, probs, h_width, f_dim, glu, il, t, 0);
#pragma unroll 1
        for (int j = 0; j < ROWS_PER_LANE; ++j) {
            const int r = t.rsub + 2 * j;
            const bool valid = t.col_ok && r < t.tr.valid;
            const long long row = t.tr.in_row0 + r;
            RowIn cur;
            if (PF) {
                cur = nx;
                if (j + 1 < ROWS_PER_LANE)
                    nx = fetch_row<KIND, true>(h, dz, probs, h_width, f_dim, glu, il, t, j + 1);
            } else {
                cur = fetch_row<KIND, true>(h, dz, probs, h_width, f_dim, glu, il, t, j);
            }
            u32 e[VEC];
            float pj = 0.0f;  // this row's dprobs partial over the lane's features
            if (valid) {
                float g[VEC], l[VEC], d[VEC], da[VEC], gr[VEC], val[VEC];
                float p = cur.p;
                if (t.vec) {
                    decode_vec<KIND>(cur.g, g);
                    decode_vec<KIND>(cur.l, l);
                    decode_vec<KIND>(cur.d, d);
                } else {
                    load_inputs<KIND>(h, row, h_width, f_dim, glu, il, t, g, l);
#pragma unroll
                    for (int c = 0; c < VEC; ++c)
                        d[c] = c < t.nvalid ? load_one<KIND>(dz, row * f_dim + t.f0 + c) : 0.0f;
                    p = probs != nullptr ? __ldg(probs + row) : 1.0f;
                }
#pragma unroll
                for (int c = 0; c < VEC; ++c) da[c] = probs != nullptr ? lpm_mul_rn(d[c], p) : d[c];
                act_grads<VEC>(P, g, l, da, phase, want_v, gr, val);
#pragma unroll
                for (int c = 0; c < VEC; ++c) {
                    e[c] = c < t.nvalid ? enc<KIND>(gr[c]) : 0u;
                    if (want_v && c < t.nvalid) pj = lpm_add_rn(pj, lpm_mul_rn(val[c], d[c]));
                }
            } else {
#pragma unroll
                for (int c = 0; c < VEC; ++c) e[c] = 0u;
            }
#pragma unroll
            for (int c = 0; c < VEC; ++c) s[c] = lpm_add_rn(s[c], dec<KIND>(e[c]));
            u32 w[4];
            pack<KIND>(e, w);
            if (stage) stage_put(st, r, t.chunk, w);
            if (dh != nullptr && valid)
                store_row<KIND>(dh, row, h_width, w, t, phase, glu, f_dim, il);
            if (MX || AMX) {
                const u32 rm = acc_row<KIND>(A, w);
                if (do_row) {
                    const u32 m = row_reduce(rm, LB);
                    if (t.chunk % LB == 0) st.rowmax[threadIdx.x >> 5][r][t.chunk / LB] = m;
                }
                if (rows) {
                    const u32 fb = amax_f32_bits<KIND>(row_reduce(rm, 16));
                    if (t.chunk == 0 && r < t.tr.valid && fb != 0u) atomicMax(amax_a + row, fb);
                }
            }
            if (want_v) {
                // butterfly over the 16 lanes of this row (uniform: every lane runs it)
#pragma unroll
                for (int sh = 1; sh < 16; sh <<= 1)
                    pj = lpm_add_rn(pj, __shfl_xor_sync(0xFFFFFFFFu, pj, sh));
                if (t.chunk == 0 && r < t.tr.valid) dprobs_part[row * f_tiles + t.ft] = pj;
            }
        }
        if (colsum_part != nullptr) {
#pragma unroll
            for (int c = 0; c < VEC; ++c)
                s[c] = lpm_add_rn(s[c], __shfl_xor_sync(0xFFFFFFFFu, s[c], 16));
            if (t.rsub == 0) {
                float* dst = colsum_part + t.rt * h_width;
#pragma unroll
                for (int c = 0; c < VEC; ++c)
                    if (c < t.nvalid) dst[in_col(t.f0 + c, phase, glu, f_dim, il)] = s[c];
            }
        }
        if (MX)
            mx_emit<KIND, FMT>(st, A, o, h_width, t.rt, t.tr, in_col(t.f0, phase, glu, f_dim, il),
                               t.col_ok, t.rsub, t.chunk, do_row, do_col);
        if (AMX)
            amax_flush<KIND>(st, A, t, g_member, phase, glu, f_dim, il, h_width, flags, amax_a,
                             amax_b);
    }
}
}  // namespace lpm_act

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

// out[g, c] = sum over the row tiles t of member g (tile_off, device int64 [num_groups + 1]) of
// part[t, c], in tile order (fp32, non-flushing); 0 for members without rows. One thread per
// (member, column).
extern "C" __global__ void __launch_bounds__(LPM_ACT_COLSUM_THREADS)
    lpm_act_segment_colsum(const float* __restrict__ part, long long width,
                           const long long* __restrict__ tile_off, int num_groups,
                           float* __restrict__ out) {
    const long long idx = (long long)blockIdx.x * LPM_ACT_COLSUM_THREADS + threadIdx.x;
    if (idx >= (long long)num_groups * width) return;
    const long long g = idx / width;
    const long long c = idx - g * width;
    const long long t1 = __ldg(tile_off + g + 1);
    float s = 0.0f;
    for (long long t = __ldg(tile_off + g); t < t1; ++t)
        s = lpm_add_rn(s, __ldg(part + t * width + c));
    out[idx] = s;
}

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
