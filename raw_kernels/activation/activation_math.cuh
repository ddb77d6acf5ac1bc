// GroupedMLP activation device code, part of activation.cu (design notes there; included by it
// after its launch-time constants): the exponential constants, the lpm_act namespace
// preamble, non-flushing comparisons, exp_f32, the activations and their gradients (reference:
// lowprec_moe/backends/numpy/activations.py), and the layer-dtype element formats.
#ifndef LPM_ACTIVATION_MATH_CUH
#define LPM_ACTIVATION_MATH_CUH

#include "mxfp8_impl.cuh"

#ifndef LPM_ACT_PREFETCH
#error "activation_*.cuh are parts of activation.cu: include them after its launch constants"
#endif

// ------------------------------------------------------------------------------------------
// Exponential constants: fp32 bit patterns, mirrored by EXP_CONST_BITS in
// lowprec_moe/backends/numpy/activations.py (tests/layers/test_activations.py checks that they agree).
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

}  // namespace lpm_act

#endif  // LPM_ACTIVATION_MATH_CUH
