// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the MMA
// steps -- warp-level mma.sync over one 16-deep slice of the canonical tiles, and the sm_90a
// wgmma wrappers (LPM_GG_HAS_WGMMA, descriptors, fences, wgmma.m64n128k16).

#ifndef LPM_GROUPED_GEMM_MMA_CUH
#define LPM_GROUPED_GEMM_MMA_CUH

#include "grouped_gemm_staging.cuh"

namespace lpm_gg {

// ==========================================================================================
// Warp-level MMA over one 16-deep slice (ks) of the canonical tiles

// ldmatrix address of the A fragment (rows m0..m0+15, contraction 16*ks..16*ks+15).
template <bool MN, int R>
__device__ __forceinline__ unsigned a_frag_addr(unsigned base, int m0, int ks, int lane) {
    const int j = lane >> 3, i = lane & 7;
    if constexpr (!MN) {
        const int row = m0 + (j & 1) * 8 + i;
        const int kc = ks * 2 + (j >> 1);
        return base + row * (kBK * 2) + ((kc ^ (row & 7)) << 4);
    } else {
        const int line = ks * 16 + (j >> 1) * 8 + i;
        const int mc = (m0 >> 3) + (j & 1);
        return base + mn_canon_off(line, mc);
    }
}

// ldmatrix address of the B fragments of two n8 tiles (rows n0..n0+15).
template <bool MN, int R>
__device__ __forceinline__ unsigned b_frag_addr(unsigned base, int n0, int ks, int lane) {
    const int j = lane >> 3, i = lane & 7;
    if constexpr (!MN) {
        const int row = n0 + (j >> 1) * 8 + i;
        const int kc = ks * 2 + (j & 1);
        return base + row * (kBK * 2) + ((kc ^ (row & 7)) << 4);
    } else {
        const int line = ks * 16 + (j & 1) * 8 + i;
        const int nc = (n0 >> 3) + (j >> 1);
        return base + mn_canon_off(line, nc);
    }
}

template <int MI, int NI, bool AMN, bool BMN, int BM, int BN, bool F16>
__device__ __forceinline__ void warp_mma_ks(unsigned sa, unsigned sb, float (&acc)[MI][NI][4],
                                            int wm0, int wn0, int ks, int lane) {
    unsigned bfr[NI][2];
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj) {
        const unsigned addr = b_frag_addr<BMN, BN>(sb, wn0 + nj * 16, ks, lane);
        if constexpr (BMN) {
            ldsm_x4_t(addr, bfr[2 * nj][0], bfr[2 * nj][1], bfr[2 * nj + 1][0], bfr[2 * nj + 1][1]);
        } else {
            ldsm_x4(addr, bfr[2 * nj][0], bfr[2 * nj][1], bfr[2 * nj + 1][0], bfr[2 * nj + 1][1]);
        }
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
        unsigned af[4];
        const unsigned addr = a_frag_addr<AMN, BM>(sa, wm0 + mi * 16, ks, lane);
        if constexpr (AMN) {
            ldsm_x4_t(addr, af[0], af[1], af[2], af[3]);
        } else {
            ldsm_x4(addr, af[0], af[1], af[2], af[3]);
        }
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma16816<F16>(acc[mi][ni], af, bfr[ni][0], bfr[ni][1]);
    }
}

// ==========================================================================================
// wgmma (sm_90a): m64n128k16 / m64n256k16 per warpgroup, both operands from shared memory, or
// A from registers (wgmma_m64n128k16_rs)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LPM_GG_HAS_WGMMA 1
#else
#define LPM_GG_HAS_WGMMA 0
#endif

// The body of a wgmma wrapper templated on F16: INSTR (a macro taking the operand types) with
// "f16.f16" or "bf16.bf16"; a trap where wgmma does not exist (the launcher never selects it).
#if LPM_GG_HAS_WGMMA
#define LPM_GG_WGMMA_TYPED(F16, INSTR) \
    if constexpr (F16) {               \
        INSTR("f16.f16");              \
    } else {                           \
        INSTR("bf16.bf16");            \
    }
#else
#define LPM_GG_WGMMA_TYPED(F16, INSTR) __trap();
#endif

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading / stride byte offsets.
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return static_cast<unsigned long long>((addr & 0x3FFFFu) >> 4) |
           (static_cast<unsigned long long>((lbo >> 4) & 0x3FFFu) << 16) |
           (static_cast<unsigned long long>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() {
#if LPM_GG_HAS_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if LPM_GG_HAS_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_wait0() {
#if LPM_GG_HAS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// Wait until at most N committed wgmma groups of this warpgroup are still pending.
template <int N>
__device__ __forceinline__ void wg_wait() {
#if LPM_GG_HAS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy shared-memory writes (st.shared, cp.async) -> visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
#if LPM_GG_HAS_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keep the compiler from moving accumulator accesses across the asynchronous wgmma window.
template <int N>
__device__ __forceinline__ void wg_fence_acc(float* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The instruction of wgmma_m64n128k16 with operand types TYPES ("f16.f16" or "bf16.bf16").
#define LPM_GG_WGMMA_M64N128K16_SS(TYPES) asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " " \
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
            "%64, %65, p, 1, 1, %67, %68;\n}\n" \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
            : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))

// D(64x128, fp32) += A(64x16) * B(16x128); TA / TB: 1 = operand stored MN-major. The library's
// wgmma are this shape and its two-halves form m64n256k16 (below); both give every output
// element the same products in the same order, so tile configurations never change the
// arithmetic (the bitwise tests between kernel families check it).
template <bool F16, int TA, int TB>
__device__ __forceinline__ void wgmma_m64n128k16(float* d, unsigned long long da,
                                                 unsigned long long db) {
    LPM_GG_WGMMA_TYPED(F16, LPM_GG_WGMMA_M64N128K16_SS)
}
#undef LPM_GG_WGMMA_M64N128K16_SS

// The instruction of wgmma_m64n128k16_rs with operand types TYPES ("f16.f16" or "bf16.bf16").
#define LPM_GG_WGMMA_M64N128K16_RS(TYPES) asm volatile( \
        "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %70, 0;\nmov.b64 db, {%68, %69};\n" \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
        "{%64, %65, %66, %67}, db, p, 1, 1, %71;\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(db_hi), "r"(1), "n"(TB))

// D(64x128, fp32) += A(64x16 f16, registers) * B(16x128 f16, K-major shared memory): a[0..3]
// is the m16n8k16 A fragment of this warp's 16 rows (rows g, g+8 x contraction 2q, 2q+1 and
// 2q+8, 2q+9; g = lane/4, q = lane%4). The same products in the same order as the shared-memory
// form, so the results are bitwise those of wgmma_m64n128k16 on the same values.
// B's descriptor comes as its two 32-bit words (joined by mov.b64 inside the asm): a loop that
// steps through a canonical buffer adds to the low word only (the start address field, bits
// 0-13, never carries: shared addresses / 16 < 2^14), so no 64-bit add per instruction.
// F16 = false: the same with bf16 operands (the MXFP8 warp-specialised kernel's bf16 tiles);
// TB = 1: B stored MN-major (the canonical MN-major layout, as in wgmma_m64n128k16).
template <bool F16 = true, int TB = 0>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float* d, const unsigned (&a)[4],
                                                    unsigned db_lo, unsigned db_hi) {
    LPM_GG_WGMMA_TYPED(F16, LPM_GG_WGMMA_M64N128K16_RS)
}
#undef LPM_GG_WGMMA_M64N128K16_RS

// The instruction of wgmma_m64n256k16 with operand types TYPES ("f16.f16" or "bf16.bf16").
#define LPM_GG_WGMMA_M64N256K16_SS(TYPES) asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPES " " \
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, " \
            "%128, %129, p, 1, 1, %131, %132;\n}\n" \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
            : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))

// D(64x256, fp32) += A(64x16) * B(16x256): the two m64n128k16 halves of one warpgroup's 256
// columns in one instruction (A is read from shared memory once instead of twice). The
// accumulator registers are those of the two halves in order (d[0..63]: columns 0-127), and
// every output element sees the same products in the same order as with m64n128k16.
template <bool F16, int TA, int TB>
__device__ __forceinline__ void wgmma_m64n256k16(float* d, unsigned long long da,
                                                 unsigned long long db) {
    LPM_GG_WGMMA_TYPED(F16, LPM_GG_WGMMA_M64N256K16_SS)
}
#undef LPM_GG_WGMMA_M64N256K16_SS

// The instruction of wgmma_m64n256k16_rs with operand types TYPES ("f16.f16" or "bf16.bf16").
#define LPM_GG_WGMMA_M64N256K16_RS(TYPES) asm volatile( \
        "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %134, 0;\nmov.b64 db, {%132, %133};\n" \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPES " " \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, " \
        "{%128, %129, %130, %131}, db, p, 1, 1, %135;\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(db_hi), "r"(1), "n"(TB))

// D(64x256, fp32) += A(64x16 f16, registers) * B(16x256, K-major shared memory): the two
// m64n128k16_rs halves in one instruction (accumulators d[0..63]: columns 0-127, as in
// wgmma_m64n256k16), so every output element sees the same products in the same order. Needs
// the kernel's launch-bound register target above ptxas's 158 for this shape (the 384-thread
// gemm_ws_n256; with 512 threads ptxas refuses it).
template <bool F16 = true, int TB = 0>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float* d, const unsigned (&a)[4],
                                                    unsigned db_lo, unsigned db_hi) {
    LPM_GG_WGMMA_TYPED(F16, LPM_GG_WGMMA_M64N256K16_RS)
}
#undef LPM_GG_WGMMA_M64N256K16_RS

// One 64-deep k-tile of wgmma for warpgroup `wg` of a BM x 256 CTA tile held in canonical tiles
// sa (A, BM rows) / sb (B, 256 rows). BM = 128: the warpgroup owns rows 64wg..64wg+63 x all 256
// columns (one m64n256k16 per 16-deep step); BM = 64: rows 0..63 x columns 128wg..128wg+127
// (one m64n128k16).
// K-major: 8-row atoms 1024 B apart (SBO), LBO unused; a 16-deep step = +32 B. MN-major: 8-line
// atoms 1024 B apart (SBO), 64-row panels 8 KiB apart (LBO); a 16-deep step = +16 lines = +2 KiB.
// 64 rows of A / 128 rows of B start 8 KiB / 16 KiB further on in both layouts (so m64n256k16
// spans B's 256 rows with the same descriptor strides). Commits one
// wgmma group; NACC: accumulator floats per thread.
template <int BM, bool F16, bool AMN, bool BMN, int NACC>
__device__ __forceinline__ void wg_ktile(float* accf, unsigned sa, unsigned sb, int wg) {
    constexpr unsigned A_LBO = AMN ? kBK * 128 : 16, B_LBO = BMN ? kBK * 128 : 16;
    constexpr unsigned A_STEP = AMN ? 16 * 128 : 32, B_STEP = BMN ? 16 * 128 : 32;
    constexpr int HALVES = BM == 128 ? 2 : 1;  // n128 column blocks per warpgroup
    const unsigned a_addr = sa + (BM == 128 ? wg * (64 * 128) : 0);
    const unsigned b_addr = sb + (BM == 128 ? 0 : wg * (128 * 128));
    // The start-address field (bits 0-13, address / 16) of a descriptor never carries: every
    // shared address is below 2^18, so a later slice's descriptor is the tile's plus
    // (byte offset / 16).
    const unsigned long long da = wg_desc(a_addr, A_LBO, 1024);
    const unsigned long long db = wg_desc(b_addr, B_LBO, 1024);
    wg_fence_acc<NACC>(accf);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
        if constexpr (HALVES == 2) {
            wgmma_m64n256k16<F16, AMN ? 1 : 0, BMN ? 1 : 0>(accf, da + ((ks * A_STEP) >> 4),
                                                           db + ((ks * B_STEP) >> 4));
        } else {
            wgmma_m64n128k16<F16, AMN ? 1 : 0, BMN ? 1 : 0>(accf, da + ((ks * A_STEP) >> 4),
                                                           db + ((ks * B_STEP) >> 4));
        }
    }
    wg_commit();
    wg_fence_acc<NACC>(accf);
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_MMA_CUH
