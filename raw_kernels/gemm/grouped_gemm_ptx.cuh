// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview; included by
// grouped_gemm_base.cuh): the PTX wrappers -- shared-memory addresses and accesses, cp.async,
// ldmatrix / stmatrix, mma.sync, fp8 / fp16 / bf16 conversions.

#ifndef LPM_GROUPED_GEMM_PTX_CUH
#define LPM_GROUPED_GEMM_PTX_CUH

#include "lpm_formats.cuh"

namespace lpm_gg {

// threadIdx.x read through volatile asm: values derived from it cannot be hoisted out of the
// k-loop, so the per-chunk copy addresses are recomputed each tile instead of pinning registers.
__device__ __forceinline__ int tid_volatile() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
    return t;
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Shared-memory accesses at 32-bit shared addresses (a per-thread offset plus a buffer base the
// caller computes once per k-tile), in program order with the other memory operations.
__device__ __forceinline__ uint4 lds_v4(unsigned addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}
__device__ __forceinline__ uint2 lds_v2(unsigned addr) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                 : "=r"(v.x), "=r"(v.y)
                 : "r"(addr)
                 : "memory");
    return v;
}
// (volatile: read where it stands, never hoisted out of a loop into a register)
__device__ __forceinline__ unsigned lds_u32_volatile(unsigned addr) {
    unsigned v;
    asm volatile("ld.volatile.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ unsigned lds_u32(unsigned addr) {
    unsigned v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ unsigned short lds_u16(unsigned addr) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void sts_v4(unsigned addr, unsigned a, unsigned b, unsigned c,
                                       unsigned d) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b),
                 "r"(c), "r"(d)
                 : "memory");
}
__device__ __forceinline__ void sts_v2(unsigned addr, unsigned a, unsigned b) {
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(addr), "r"(a), "r"(b) : "memory");
}
// One byte / half-word / word at a 32-bit shared address; a global 64-bit load the compiler
// cannot merge with another load of the same address (volatile).
__device__ __forceinline__ unsigned lds_u8(unsigned addr) {
    unsigned v;
    asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ long long ld_volatile_s64(const long long* p) {
    long long v;
    asm volatile("ld.global.s64 %0, [%1];\n" : "=l"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ void sts_u16(unsigned addr, unsigned v) {
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<unsigned short>(v))
                 : "memory");
}
__device__ __forceinline__ void sts_u32(unsigned addr, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

template <int CH>
__device__ __forceinline__ void cp_async(unsigned dst, const void* src, int src_bytes) {
    if constexpr (CH == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "r"(src_bytes));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                     "n"(CH), "r"(src_bytes));
    }
}
// The same, all CH bytes copied (no source-size operand).
template <int CH>
__device__ __forceinline__ void cp_async_full(unsigned dst, const void* src) {
    if constexpr (CH == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src),
                     "n"(CH));
    }
}
// Bring the line of global address p into L1 (no value returned: a later load hits L1).
__device__ __forceinline__ void prefetch_l1(const void* p) {
    asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                        unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                          unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// D = A * B + D, m16n8k16, fp32 accumulation. A: 4 regs (row-major 16x16), B: 2 regs (16x8).
template <bool F16>
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
    if constexpr (F16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two fp8 bytes (low byte = first element) -> f16x2 (low half = first element), exact.
template <bool E5M2>
__device__ __forceinline__ unsigned fp8x2_to_f16x2(unsigned short v) {
    unsigned r;
    if constexpr (E5M2) {
        asm("cvt.rn.f16x2.e5m2x2 %0, %1;\n" : "=r"(r) : "h"(v));
    } else {
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(v));
    }
    return r;
}

// The same for the two fp8 bytes in the low (HI = false) or high (HI = true) half of w. The
// high half is selected in PTX (mov.b32 {lo, hi}), so ptxas reads it with the conversion's
// operand selector (F2FP ..., w.H1): no shift.
template <bool E5M2, bool HI>
__device__ __forceinline__ unsigned fp8x2_half_to_f16x2(unsigned w) {
    if constexpr (!HI) {
        return fp8x2_to_f16x2<E5M2>(static_cast<unsigned short>(w & 0xFFFFu));
    } else {
        unsigned r;
        if constexpr (E5M2) {
            asm("{.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e5m2x2 %0, hi;}\n"
                : "=r"(r) : "r"(w));
        } else {
            asm("{.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;}\n"
                : "=r"(r) : "r"(w));
        }
        return r;
    }
}

__device__ __forceinline__ unsigned hmul2_rn(unsigned a, unsigned b) {
    unsigned r;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
// f16x2 a * (h, h), h = the low (HI = false) or high (HI = true) half of b. ptxas folds the
// broadcast into the multiply's operand selector (HMUL2 ..., b.H0_H0): no byte permute.
template <bool HI>
__device__ __forceinline__ unsigned hmul2_bcast_rn(unsigned a, unsigned b) {
    unsigned r;
    if constexpr (HI) {
        asm("{\n.reg .b16 l, h;\n.reg .b32 t;\nmov.b32 {l, h}, %2;\nmov.b32 t, {h, h};\n"
            "mul.rn.f16x2 %0, %1, t;\n}\n"
            : "=r"(r)
            : "r"(a), "r"(b));
    } else {
        asm("{\n.reg .b16 l, h;\n.reg .b32 t;\nmov.b32 {l, h}, %2;\nmov.b32 t, {l, l};\n"
            "mul.rn.f16x2 %0, %1, t;\n}\n"
            : "=r"(r)
            : "r"(a), "r"(b));
    }
    return r;
}

__device__ __forceinline__ float f16_bits_to_f32(unsigned h) {
    return lpm_f16_bits_to_f32(static_cast<unsigned short>(h & 0xFFFFu));
}

// (hi, lo) fp32 -> bf16x2 bits (lo in the low half), round to nearest even, no flush.
__device__ __forceinline__ unsigned pack_bf16x2_rn(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// One 16-byte global store (p 16-byte aligned) of the epilogues' 16-bit output, which the kernel
// never reads back: no L1 line is allocated for it (0.1-1.8 % faster in 28 of 30 MXFP8 / NVFP4
// cases, none slower). (The compiler split the equivalent uint4 store
// into four 4-byte ones.)
__device__ __forceinline__ void st_global_v4(void* p, unsigned a, unsigned b, unsigned c,
                                             unsigned d) {
    asm volatile("st.global.L1::no_allocate.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(a),
                 "r"(b), "r"(c), "r"(d)
                 : "memory");
}

__device__ __forceinline__ unsigned short f32_to_f16_bits_rn(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
    return h;
}

// E4M3 byte -> fp32 (exact).
__device__ __forceinline__ float e4m3_to_f32(unsigned b) {
    return f16_bits_to_f32(fp8x2_to_f16x2<false>(static_cast<unsigned short>(b & 0xFFu)));
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_PTX_CUH
