// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// tensor-core kernel body gemm_mma and its entry-point macros (LPM_GG_DEFINE,
// LPM_GG_DEFINE_WG).

#ifndef LPM_GROUPED_GEMM_KERNEL_CUH
#define LPM_GROUPED_GEMM_KERNEL_CUH

#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_mma.cuh"
#include "grouped_gemm_tile.cuh"
#include "grouped_gemm_mxf16.cuh"

namespace lpm_gg {

// The dynamic shared memory of a GEMM kernel body, aligned to 1024 bytes (wgmma swizzle
// atoms; the launch adds 1024 bytes for it): returns the generic pointer and sets s0 to the
// shared address. Thread 0 traps when the launch gave fewer than `need` bytes or when
// `mismatch` (the launcher's copy chunks are not the kernel's).
__device__ __forceinline__ unsigned char* gemm_smem(unsigned char* smem_raw, unsigned need,
                                                    bool mismatch, unsigned& s0) {
    if (threadIdx.x == 0) {
        unsigned have;
        asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(have));
        if (have < need) __trap();
        if (mismatch) __trap();
    }
    const unsigned raw_u32 = smem_u32(smem_raw);
    s0 = (raw_u32 + 1023u) & ~1023u;
    return smem_raw + (s0 - raw_u32);
}

// ==========================================================================================
// The tensor-core kernel body

// WG = false: mma.sync.m16n8k16 per warp (ldmatrix fragments), warps arranged WARPS_M x WARPS_N.
// WG = true : wgmma (sm_90a), BN = 256, two warpgroups:
//             BM = 128: warpgroup w owns rows 64w..64w+63 x all 256 columns (m64n256k16);
//             BM = 64 : warpgroup w owns rows 0..63 x columns 128w..128w+127 (m64n128k16).
//             Warp v of a warpgroup holds rows 16v..16v+15 of the warpgroup's block in the
//             mma.sync C layout, so the accumulator array and the epilogue serve both paths.
template <int BM, int BN, int WARPS_M, int AKIND, int BKIND, bool F16, int ACH, int BCH, bool WG>
__device__ __forceinline__ void gemm_mma(LPM_GG_PARAMS) {
    constexpr int WARPS_N = (kThreads / 32) / WARPS_M;
    constexpr int TM = WG ? 16 : BM / WARPS_M, TN = WG ? (BM == 128 ? BN : BN / 2) : BN / WARPS_N;
    constexpr int MI = TM / 16, NI = TN / 8;
    static_assert(MI >= 1 && NI >= 2 && NI % 2 == 0, "warp tile");
    static_assert(!WG || ((BM == 128 || BM == 64) && BN == 256), "wgmma tiles: 128x256, 64x256");
    constexpr bool AMN = kind_is_mn(AKIND), BMN = kind_is_mn(BKIND);
    static_assert(!AMN || BM % 64 == 0, "an MN-major A tile is made of 64-row panels");
    static_assert(!BMN || BN % 64 == 0, "an MN-major B tile is made of 64-row panels");
    constexpr bool DIRECT = kind_is_hp(AKIND) && kind_is_hp(BKIND);
    static_assert(DIRECT || (!kind_is_hp(AKIND) && !kind_is_hp(BKIND)), "operand mix");
    using GA = TileGeo<AKIND, BM>;
    using GB = TileGeo<BKIND, BN>;
    constexpr int CANON_A = canon_bytes(BM), CANON_B = canon_bytes(BN);
    constexpr int NST = pipeline_stages(AKIND, BKIND, BM, BN, WG);
    constexpr int NCB = DIRECT ? 0 : canon_buffers(AKIND, BKIND, BM, BN, WG);
    constexpr int RAW_A = raw_bytes(AKIND, BM), RAW_B = raw_bytes(BKIND, BN);
    constexpr int STAGE = DIRECT ? CANON_A + CANON_B : RAW_A + RAW_B;
    constexpr int CANON_OFF = (NST * STAGE + 1023) / 1024 * 1024;  // 1024-byte swizzle atoms
    constexpr int EPI_LD = BN + 8;  // padded row of the accumulator staging tile (floats)
    // MXFP8 with wgmma: the fp16 window (grouped_gemm_mxf16.cuh); the rows' and columns' largest
    // block codes live after the canonical buffers.
    constexpr bool MXW = WG && kind_is_fp8(AKIND) && kind_is_fp8(BKIND);
    constexpr int EXPS_OFF = CANON_OFF + NCB * (CANON_A + CANON_B);
    constexpr int MAIN_SMEM =
        DIRECT ? NST * STAGE : EXPS_OFF + mx_exp_bytes(AKIND, BKIND, BM, BN, WG);
    constexpr int EPI_SMEM = BM * EPI_LD * 4;
    // + 1024: the kernel aligns its shared-memory base to 1024 bytes (wgmma swizzle atoms).
    constexpr int SMEM = (MAIN_SMEM > EPI_SMEM ? MAIN_SMEM : EPI_SMEM) + 1024;
    static_assert(SMEM <= kMaxSmem, "shared memory");
    static_assert(SMEM == gemm_smem_bytes(AKIND, BKIND, BM, BN, WG), "shared-memory formula");
    static_assert(DIRECT || CANON_OFF == raw_ring_bytes(AKIND, BKIND, BM, BN), "raw ring");
    static_assert((ACH == 16 || ACH == 8) && (BCH == 16 || BCH == 8), "copy chunk");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != ACH || b_ch != BCH, s0);

    LPM_GG_TILE_SETUP(BM, BN, rows_valid, cols_valid, kThreads)
    ep.init_alpha();

    // Operand bases at (tile row 0, contraction 0).
    const long long a_ld = d[D_A_LD], b_ld = d[D_B_LD];
    const unsigned char* a_base =
        a_data + d[D_A_OFF] + (AMN ? r0 * GA::ES_NUM / GA::ES_DEN : r0 * a_ld);
    const unsigned char* b_base =
        b_data + d[D_B_OFF] + (BMN ? c0 * GB::ES_NUM / GB::ES_DEN : c0 * b_ld);
    const long long a_sld = d[D_A_SLD], b_sld = d[D_B_SLD];
    const unsigned char* a_sbase = a_scale + d[D_A_SOFF] + (AMN ? r0 : r0 * a_sld);
    const unsigned char* b_sbase = b_scale + d[D_B_SOFF] + (BMN ? c0 : c0 * b_sld);

    const int KT = static_cast<int>((len + kBK - 1) / kBK);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm0 = WG ? (BM == 128 ? 64 * (warp >> 2) : 0) + 16 * (warp & 3)
                       : (warp % WARPS_M) * TM;
    const int wn0 = WG ? (BM == 128 ? 0 : 128 * (warp >> 2)) : (warp / WARPS_M) * TN;

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    const OperandCopy<AKIND, BM, ACH> copy_a(a_base, a_ld, threadIdx.x);
    const OperandCopy<BKIND, BN, BCH> copy_b(b_base, b_ld, threadIdx.x);
    auto issue = [&](int stage, int kt) {
        const long long k0 = static_cast<long long>(kt) * kBK;
        const unsigned sb = s0 + stage * STAGE;
        copy_a.issue(sb, k0, rows_valid, len - k0, a_data);
        copy_b.issue(sb + (DIRECT ? CANON_A : RAW_A), k0, cols_valid, len - k0, b_data);
    };

    float* const accf = &acc[0][0][0];
    auto wg_tile = [&](unsigned sa, unsigned sb, auto h) {
        (void)h;  // true: MXFP8 staged in the fp16 window
        if constexpr (WG) {
            wg_ktile<BM, F16 || decltype(h)::value, AMN, BMN, MI * NI * 4>(accf, sa, sb, warp >> 2);
        }
    };

    if constexpr (DIRECT && WG) {
        // wgmma: the MMAs of tile kt stay in flight while tile kt+NST-2 is requested and the
        // barrier of iteration kt+1 passes; stage (kt-2)%NST is refilled once every warpgroup
        // has retired tile kt-2 (wg_wait<1> of iteration kt-1, then the barrier).
        static_assert(NST >= 3, "pipeline depth");
#pragma unroll
        for (int s = 0; s < NST - 2; ++s) {
            if (s < KT) issue(s, s);
            cp_async_commit();
        }
        for (int kt = 0; kt < KT; ++kt) {
            cp_async_wait<NST - 3>();  // tile kt landed (this thread's copies)
            fence_proxy_async();
            __syncthreads();
            const unsigned sa = s0 + (kt % NST) * STAGE;
            wg_tile(sa, sa + CANON_A, BoolC<false>{});
            const int nt = kt + NST - 2;
            if (nt < KT) issue(nt % NST, nt);
            cp_async_commit();
            wg_wait<1>();  // tile kt-1 retired by this warpgroup
            wg_fence_acc<MI * NI * 4>(accf);
        }
        wg_wait0();
        wg_fence_acc<MI * NI * 4>(accf);
    } else if constexpr (DIRECT) {
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) {
            if (s < KT) issue(s, s);
            cp_async_commit();
        }
        for (int kt = 0; kt < KT; ++kt) {
            cp_async_wait<NST - 2>();
            __syncthreads();
            const int nt = kt + NST - 1;
            if (nt < KT) issue(nt % NST, nt);
            cp_async_commit();
            const unsigned sa = s0 + (kt % NST) * STAGE;
#pragma unroll
            for (int ks = 0; ks < kBK / 16; ++ks) {
                warp_mma_ks<MI, NI, AMN, BMN, BM, BN, F16>(sa, sa + CANON_A, acc, wm0, wn0, ks,
                                                           lane);
            }
        }
    } else {
        static_assert(NST >= 3, "pipeline depth");
        const ScaleCopy<AKIND, BM> scopy_a(a_sbase, a_sld, threadIdx.x);
        const ScaleCopy<BKIND, BN> scopy_b(b_sbase, b_sld, threadIdx.x);
        ScaleRegs<AKIND, BM> sra;
        ScaleRegs<BKIND, BN> srb;
        unsigned char* const exps_a = smem + EXPS_OFF;  // MXW only
        unsigned char* const exps_b = exps_a + BM;
        const bool ea5 = a_e5m2 != 0, eb5 = b_e5m2 != 0;
        const int bias_a = mx_s_max(ea5) + LPM_FP16_EXP_BIAS;
        const int bias_b = mx_s_max(eb5) + LPM_FP16_EXP_BIAS;
        auto load_scales = [&](int kt) {
            const long long k0 = static_cast<long long>(kt) * kBK;
            sra.load(scopy_a, k0, rows_valid, len, threadIdx.x);
            srb.load(scopy_b, k0, cols_valid, len, threadIdx.x);
        };
        // Scales ra / rb (one k-tile) into raw stage `stage`; h: the fp16 window's factors.
        auto put_scales = [&](int stage, const ScaleRegs<AKIND, BM>& ra,
                              const ScaleRegs<BKIND, BN>& rb, auto h) {
            unsigned char* sb = smem + stage * STAGE;
            unsigned char* sda = sb + round16(raw_data_bytes(AKIND, BM));
            unsigned char* sdb = sb + RAW_A + round16(raw_data_bytes(BKIND, BN));
            if constexpr (decltype(h)::value) {
                ra.store_f16(sda, threadIdx.x, exps_a, bias_a);
                rb.store_f16(sdb, threadIdx.x, exps_b, bias_b);
            } else {
                ra.store(sda, threadIdx.x);
                rb.store(sdb, threadIdx.x);
            }
        };
        auto store_scales = [&](int stage, auto h) { put_scales(stage, sra, srb, h); };
        // Convert part p (of 4) of raw stage `stage` into canonical buffer `cb`.
        auto convert_part = [&](int p, int stage, int cb) {
            const unsigned char* rs = smem + stage * STAGE;
            unsigned char* cs = smem + CANON_OFF + cb * (CANON_A + CANON_B);
#pragma unroll
            for (int idx = 0; idx < GA::UNITS_PER_THREAD + GB::UNITS_PER_THREAD; ++idx) {
                if (idx % 4 != p) continue;
                if (idx < GA::UNITS_PER_THREAD) {
                    const int u = static_cast<int>(threadIdx.x) + idx * kThreads;
                    if (u < GA::UNITS && unit_live<AKIND>(u, rows_valid)) {
                        const unsigned char* raw = rs;
                        const unsigned char* rsc = rs + round16(raw_data_bytes(AKIND, BM));
                        if (AKIND != KIND_FP4_K && a_e5m2) {
                            convert_unit<AKIND, BM, true>(raw, rsc, cs, u);
                        } else {
                            convert_unit<AKIND, BM, false>(raw, rsc, cs, u);
                        }
                    }
                } else {
                    const int u =
                        static_cast<int>(threadIdx.x) + (idx - GA::UNITS_PER_THREAD) * kThreads;
                    if (u < GB::UNITS && unit_live<BKIND>(u, cols_valid)) {
                        const unsigned char* raw = rs + RAW_A;
                        const unsigned char* rsc = raw + round16(raw_data_bytes(BKIND, BN));
                        if (BKIND != KIND_FP4_K && b_e5m2) {
                            convert_unit<BKIND, BN, true>(raw, rsc, cs + CANON_A, u);
                        } else {
                            convert_unit<BKIND, BN, false>(raw, rsc, cs + CANON_A, u);
                        }
                    }
                }
            }
        };

        // The whole raw stage `stage` into canonical buffer `cb` (wgmma path): K-major units are
        // loaded first, all of them, then expanded and stored (see unit_load); MN-major units one
        // by one (their 32 per-row factors per unit would not fit in registers many times over).
        // EA / EB: E5M2 data (MXFP8 only); the caller branches once per tile. H: the fp16 window.
        auto convert_tile = [&](int stage, int cb, auto ea, auto eb, auto h) {
            convert_stage<AKIND, BKIND, BM, BN, kThreads, decltype(ea)::value,
                          decltype(eb)::value, true, decltype(h)::value>(
                smem + stage * STAGE, smem + CANON_OFF + cb * (CANON_A + CANON_B), threadIdx.x,
                rows_valid, cols_valid);
        };
        auto convert_all = [&](int stage, int cb, auto h) {
            constexpr bool QA = AKIND != KIND_FP4_K, QB = BKIND != KIND_FP4_K;  // fp8 operands
            with_e5m2(QA && a_e5m2, QB && b_e5m2,
                      [&](auto ea, auto eb) { convert_tile(stage, cb, ea, eb, h); });
        };

        // Prologue: tiles 0..NST-2 in flight (their copies do not depend on the staging mode).
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) {
            if (s < KT) issue(s, s);
            cp_async_commit();
        }
        // Their block scales into registers (stored once the staging mode is known).
        ScaleRegs<AKIND, BM> pra[NST - 1];
        ScaleRegs<BKIND, BN> prb[NST - 1];
        prologue_scale_loads<NST - 1>(pra, prb, scopy_a, rows_valid, scopy_b, cols_valid, len, KT,
                                      threadIdx.x);
        // MXFP8: the window check of the tile (reads the scales while the copies fly; its
        // scratch is canonical buffer 0, untouched until the first expansion). Its fixed cost
        // (~2 us: a scale pass and three barriers) is only paid by tiles of at least
        // kMxMinKTiles k-tiles (measured: 8 k-tiles lose 20 %, 128 gain 10 %).
        bool f16m = false;
        if constexpr (MXW) {
            f16m = mx_window_check<AKIND, BKIND, BM, BN, kThreads>(
                a_sbase, a_sld, rows_valid, b_sbase, b_sld, cols_valid, len, ea5, eb5,
                mx_bf16 == 0 && KT >= kMxMinKTiles,
                reinterpret_cast<unsigned*>(smem + CANON_OFF), exps_a, exps_b, threadIdx.x);
        }
        // The rest of the k-loop, for one staging mode H (false: bf16 / NVFP4's fp16 as ever;
        // true: MXFP8 in the fp16 window, rescaled before the epilogue).
        auto body = [&](auto h) {
#pragma unroll
            for (int s = 0; s < NST - 1; ++s) {
                if (s < KT) put_scales(s, pra[s], prb[s], h);
            }
            if (NST - 1 < KT) load_scales(NST - 1);
            cp_async_wait<NST - 3>();  // tiles 0 and 1 landed (this thread's copies)
            __syncthreads();
            if (KT > 0) {
                if constexpr (WG) {
                    convert_all(0, 0, h);
                    fence_proxy_async();
                } else {
#pragma unroll
                    for (int p = 0; p < 4; ++p) convert_part(p, 0, 0);
                }
            }
            if constexpr (WG) {
                for (int kt = 0; kt < KT; ++kt) {
                    // Invariants: canonical buffer kt%NCB holds tile kt (this thread's part); raw
                    // tile kt+1 landed (this thread's copies); raw stage (kt-1)%NST is free; scale
                    // registers hold tile kt+NST-1. NCB = 3: tile kt-1 may still be in flight.
                    __syncthreads();
                    const unsigned sa = s0 + CANON_OFF + (kt % NCB) * (CANON_A + CANON_B);
                    wg_tile(sa, sa + CANON_A, h);  // asynchronous: expand the next tile meanwhile
                    const int nt = kt + NST - 1;
                    if (nt < KT) issue(nt % NST, nt);
                    cp_async_commit();
                    if (kt + 1 < KT) {
                        // Buffer (kt+1)%NCB last held tile kt+1-NCB, retired by every warpgroup
                        // before this iteration's barrier.
                        convert_all((kt + 1) % NST, (kt + 1) % NCB, h);
                        fence_proxy_async();
                    }
                    // Scales of tile nt go to shared memory only now, a whole iteration after
                    // their loads were issued (tile nt is expanded in iteration nt-1 >= kt+2).
                    if (nt < KT) store_scales(nt % NST, h);
                    if (nt + 1 < KT) load_scales(nt + 1);
                    if constexpr (NCB >= 3) {
                        wg_wait<1>();  // tile kt-1 retired by this warpgroup
                    } else {
                        wg_wait0();  // canonical buffer kt%2 is rewritten next iteration
                    }
                    wg_fence_acc<MI * NI * 4>(accf);
                    cp_async_wait<NST - 3>();  // raw tile kt+2 landed (this thread's copies)
                }
                wg_wait0();
                wg_fence_acc<MI * NI * 4>(accf);
                if constexpr (decltype(h)::value) {
                    mx_rescale<MI, NI>(accf, exps_a, exps_b, mx_rescale_shift(ea5, eb5), wm0,
                                       wn0, lane);
                }
            } else {
                for (int kt = 0; kt < KT; ++kt) {
                    // Invariants: canonical buffer kt&1 holds tile kt; raw tile kt+1 landed (all
                    // threads); raw stage (kt-1)%NST is free; scale registers hold tile kt+NST-1.
                    __syncthreads();
                    const int nt = kt + NST - 1;
                    if (nt < KT) {
                        issue(nt % NST, nt);
                        store_scales(nt % NST, h);
                    }
                    cp_async_commit();
                    if (nt + 1 < KT) load_scales(nt + 1);
                    const unsigned sa = s0 + CANON_OFF + (kt & 1) * (CANON_A + CANON_B);
                    const bool next = kt + 1 < KT;
#pragma unroll
                    for (int ks = 0; ks < kBK / 16; ++ks) {
                        warp_mma_ks<MI, NI, AMN, BMN, BM, BN, F16>(sa, sa + CANON_A, acc, wm0,
                                                                   wn0, ks, lane);
                        if (next) convert_part(ks, (kt + 1) % NST, (kt + 1) & 1);
                    }
                    cp_async_wait<NST - 3>();  // raw tile kt+2 landed (this thread's copies)
                }
            }
        };
        if constexpr (MXW) {
            if (f16m) {
                body(BoolC<true>{});
            } else {
                body(BoolC<false>{});
            }
        } else {
            body(BoolC<false>{});
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the operand tiles: reuse shared memory

    // ---- epilogue: stage the fp32 accumulators through shared memory ([BM][BN + 8]), then
    // apply the epilogue in a compact loop with coalesced stores. Fragment (mi, ni): rows
    // wm0 + 16 mi + lane/4 (+8), columns wn0 + 8 ni + 2 (lane%4) (+1).
    float* cs = reinterpret_cast<float*>(smem);
    stage_acc<MI, NI, EPI_LD>(cs, accf, wm0, wn0, lane);
    __syncthreads();
    ep.tile<BN, EPI_LD>(cs, r0, c0, rows_valid, cols_valid);
}

}  // namespace lpm_gg

// extern "C" entry point NAME for one mma.sync configuration (CH: cp.async chunk, 16 or 8).
#define LPM_GG_DEFINE(NAME, BM, BN, WARPS_M, AKIND, BKIND, F16, CH)                            \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kThreads, 1) NAME(LPM_GG_PARAMS) {    \
        lpm_gg::gemm_mma<BM, BN, WARPS_M, AKIND, BKIND, F16, CH, CH, false>(LPM_GG_ARGS);      \
    }

// extern "C" entry point NAME of a wgmma (sm_90a) configuration: BM x 256 tile (BM = 128 or
// 64), two warpgroups. On other architectures it compiles to a trap; the launcher never selects
// it there.
#define LPM_GG_DEFINE_WG(NAME, BM, AKIND, BKIND, F16, CH)                                      \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kThreads, 1) NAME(LPM_GG_PARAMS) {    \
        lpm_gg::gemm_mma<BM, 256, 2, AKIND, BKIND, F16, CH, CH, true>(LPM_GG_ARGS);            \
    }

#endif  // LPM_GROUPED_GEMM_KERNEL_CUH
