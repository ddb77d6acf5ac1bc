// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// swapped-operand wgmma kernel body gemm_swap for M-grouped GEMMs with few tokens per expert,
// and its entry-point macro LPM_GG_DEFINE_SWAP.
//
// With a handful of tokens per expert (the memory-bound MoE case: E = 128 x 16 tokens) a
// 64- or 128-row token tile leaves most of every wgmma idle while each CTA still expands a
// 256-row weight tile, one CTA per SM. This body computes the transposed tile instead,
//     D^T (128 output columns x 32 tokens) = W_tile (128 x K) * x_tile^T (K x 32),
// so the weight rows fill the wgmma M dimension (two warpgroups x 64 rows) and the tokens its
// N dimension (wgmma.m64n32k16). A CTA expands 128 weight rows and 32 token rows per k-tile and
// needs 70 KiB of shared memory (NVFP4; five raw stages, block scales copied with the data), so
// three CTAs share an SM and overlap one another's copies, expansion and barriers.
//
// Both operands are quantized and contraction-contiguous (NVFP4 rowwise / transposed
// columnwise, MXFP8 rowwise): the staging, block scales and exact expansion are those of
// gemm_mma (OperandCopy, ScaleRegs, convert_stage) with the roles exchanged -- the weight side
// takes the "A" slots (128 rows), the token side the "B" slots (32 rows). Every output element
// is the sum of the same 16-deep slices of exact products as in the other wgmma kernels, in the
// same k order; the GPU tests check that the results are bitwise those of gemm_mma.
// The accumulators are staged transposed ([token][column]) so the shared epilogue runs as is.

#ifndef LPM_GROUPED_GEMM_SWAP_CUH
#define LPM_GROUPED_GEMM_SWAP_CUH

#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_mma.cuh"
#include "grouped_gemm_epilogue.cuh"
#include "grouped_gemm_kernel.cuh"

namespace lpm_gg {

// D(64x32, fp32) += A(64x16) * B(16x32), both operands K-major in shared memory.
template <bool F16>
__device__ __forceinline__ void wgmma_m64n32k16(float* d, unsigned long long da,
                                                unsigned long long db) {
#if LPM_GG_HAS_WGMMA
    if constexpr (F16) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
            "%16, %17, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
              "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
              "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "l"(da), "l"(db), "r"(1));
    } else {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
            "%16, %17, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
              "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
              "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "l"(da), "l"(db), "r"(1));
    }
#else
    __trap();
#endif
}

// XKIND: the token-side operand (the launch's A: x in fprop, dy in dgrad); WKIND: the
// weight-side operand (the launch's B). Both K-major and quantized.
template <int XKIND, int WKIND, bool F16, int CH>
__device__ __forceinline__ void gemm_swap(
    const int* __restrict__ tiles, int n_col_tiles, const long long* __restrict__ desc,
    long long n_cols, const unsigned char* __restrict__ a_data,
    const unsigned char* __restrict__ a_scale, int a_ch, int a_e5m2,
    const unsigned char* __restrict__ b_data, const unsigned char* __restrict__ b_scale, int b_ch,
    int b_e5m2, const float* __restrict__ amax_a, const float* __restrict__ amax_b, int a_vec,
    int b_vec, int scale_mode, const float* __restrict__ bias, const float* __restrict__ probs,
    int has_bias, int has_probs, void* __restrict__ out, int out_type, int accumulate,
    int zero_if_empty) {
    constexpr int BW = kSwapCols, BT = kSwapTokens;
    static_assert(XKIND == KIND_FP4_K || XKIND == KIND_FP8_K, "K-major quantized token side");
    static_assert(WKIND == KIND_FP4_K || WKIND == KIND_FP8_K, "K-major quantized weight side");
    constexpr int CANON_W = canon_bytes(BW), CANON_X = canon_bytes(BT);
    constexpr int RAW_W = raw_bytes(WKIND, BW), RAW_X = raw_bytes(XKIND, BT);
    constexpr int STAGE = RAW_W + RAW_X;
    constexpr int NST = swap_stages(XKIND, WKIND), NCB = 2;
    // NVFP4: the 4 block-scale bytes of a row and k-tile are one aligned word (the launcher
    // checks), copied with the data (cp.async, NST-1 tiles ahead) instead of through registers
    // one tile ahead: with so little work per k-tile a register round trip would expose a
    // memory latency every iteration.
    constexpr bool ASYNC_SC = XKIND == KIND_FP4_K && WKIND == KIND_FP4_K;
    constexpr int CANON_OFF = (NST * STAGE + 1023) / 1024 * 1024;
    constexpr int EPI_LD = BW + 4;  // conflict-free transposed staging, 16-byte aligned rows
    constexpr int SMEM = swap_smem_bytes(XKIND, WKIND);
    static_assert(CANON_OFF + NCB * (CANON_W + CANON_X) + 1024 <= SMEM, "shared memory");
    static_assert(BT * EPI_LD * 4 + 1024 <= SMEM, "epilogue staging");
    constexpr int NACC = BT / 2;  // m64n32 accumulators per thread

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != CH || b_ch != CH, s0);

    // Tile rows are tokens (BT per row tile), tile columns output columns (BW per column tile).
    const CtaTile tile = locate_tile<BT, BW>(tiles, n_col_tiles, desc, n_cols);
    if (tile.rv <= 0 || tile.cv <= 0) return;
    const long long* d = tile.d;
    const long long len = tile.len, r0 = tile.r0, c0 = tile.c0;
    const int tok_valid = tile.rows_valid<BT>(), col_valid = tile.cols_valid<BW>();

    Epilogue ep = Epilogue::of_expert(d, out, n_cols, out_type, accumulate, scale_mode, amax_a,
                                      a_vec, amax_b, b_vec, bias, probs, has_bias, has_probs);
    if (len <= 0 && zero_if_empty) {
        ep.zero_tile(r0, c0, tok_valid, col_valid, kThreads);
        return;
    }
    ep.init_alpha();

    const unsigned char* x_base = a_data + d[D_A_OFF] + r0 * d[D_A_LD];
    const unsigned char* w_base = b_data + d[D_B_OFF] + c0 * d[D_B_LD];
    const unsigned char* x_sbase = a_scale + d[D_A_SOFF] + r0 * d[D_A_SLD];
    const unsigned char* w_sbase = b_scale + d[D_B_SOFF] + c0 * d[D_B_SLD];
    const int KT = static_cast<int>((len + kBK - 1) / kBK);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.0f;

    const OperandCopy<WKIND, BW, CH> copy_w(w_base, d[D_B_LD], threadIdx.x);
    const OperandCopy<XKIND, BT, CH> copy_x(x_base, d[D_A_LD], threadIdx.x);
    if (ASYNC_SC && threadIdx.x == 0 &&
        ((d[D_A_SLD] | d[D_B_SLD] | reinterpret_cast<long long>(x_sbase) |
          reinterpret_cast<long long>(w_sbase)) & 3) != 0)
        __trap();  // the launcher's alignment check was bypassed
    // ASYNC_SC: thread t < BW copies weight row t's scale word, BW <= t < BW + BT token row
    // t - BW's, into the stage's scale area (the ScaleRegs layout: row r at 4r).
    const bool sc_w = threadIdx.x < BW;
    const int sc_row = sc_w ? threadIdx.x : threadIdx.x - BW;
    const bool sc_on = ASYNC_SC && threadIdx.x < BW + BT;
    const unsigned char* sc_src =
        (sc_w ? w_sbase + sc_row * d[D_B_SLD] : x_sbase + sc_row * d[D_A_SLD]);
    const unsigned sc_dst = (sc_w ? round16(raw_data_bytes(WKIND, BW))
                                  : RAW_W + round16(raw_data_bytes(XKIND, BT))) +
                            4u * static_cast<unsigned>(sc_row);
    const bool sc_live = sc_row < (sc_w ? col_valid : tok_valid);
    const ScaleCopy<WKIND, BW> scopy_w(w_sbase, d[D_B_SLD], threadIdx.x);
    const ScaleCopy<XKIND, BT> scopy_x(x_sbase, d[D_A_SLD], threadIdx.x);
    ScaleRegs<WKIND, BW> srw;
    ScaleRegs<XKIND, BT> srx;
    auto issue = [&](int stage, int kt) {
        const long long k0 = static_cast<long long>(kt) * kBK;
        const unsigned sb = s0 + stage * STAGE;
        copy_w.issue(sb, k0, col_valid, len - k0, b_data);
        copy_x.issue(sb + RAW_W, k0, tok_valid, len - k0, a_data);
        if (ASYNC_SC && sc_on) {
            const long long blocks = (len - k0 + LPM_NVFP4_BLOCK - 1) / LPM_NVFP4_BLOCK;
            const int bytes = sc_live ? static_cast<int>(blocks < 4 ? blocks : 4) : 0;
            cp_async<4>(sb + sc_dst, bytes ? sc_src + k0 / LPM_NVFP4_BLOCK : sc_src, bytes);
        }
    };
    auto load_scales = [&](int kt) {
        const long long k0 = static_cast<long long>(kt) * kBK;
        srw.load(scopy_w, k0, col_valid, len, threadIdx.x);
        srx.load(scopy_x, k0, tok_valid, len, threadIdx.x);
    };
    auto store_scales = [&](int stage) {
        unsigned char* sb = smem + stage * STAGE;
        srw.store(sb + round16(raw_data_bytes(WKIND, BW)), threadIdx.x);
        srx.store(sb + RAW_W + round16(raw_data_bytes(XKIND, BT)), threadIdx.x);
    };
    auto convert_tile = [&](int stage, int cb, auto ew, auto ex) {
        convert_stage<WKIND, XKIND, BW, BT, kThreads, decltype(ew)::value, decltype(ex)::value>(
            smem + stage * STAGE, smem + CANON_OFF + cb * (CANON_W + CANON_X), threadIdx.x,
            col_valid, tok_valid);
    };
    using F_ = BoolC<false>;
    using T_ = BoolC<true>;
    constexpr bool QW = WKIND != KIND_FP4_K, QX = XKIND != KIND_FP4_K;  // fp8 operands
    const bool e5w = QW && b_e5m2, e5x = QX && a_e5m2;
    auto convert_all = [&](int stage, int cb) {
        if (e5w) {
            if (e5x) {
                convert_tile(stage, cb, T_{}, T_{});
            } else {
                convert_tile(stage, cb, T_{}, F_{});
            }
        } else if (e5x) {
            convert_tile(stage, cb, F_{}, T_{});
        } else {
            convert_tile(stage, cb, F_{}, F_{});
        }
    };
    // One 64-deep k-tile of this warpgroup's 64 weight rows x 32 tokens.
    auto mma_tile = [&](unsigned sw) {
        const unsigned long long dw = wg_desc(sw + (warp >> 2) * (64 * 128), 16, 1024);
        const unsigned long long dx = wg_desc(sw + CANON_W, 16, 1024);
        wg_fence_acc<NACC>(acc);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < kBK / 16; ++ks)
            wgmma_m64n32k16<F16>(acc, dw + ((ks * 32) >> 4), dx + ((ks * 32) >> 4));
        wg_commit();
        wg_fence_acc<NACC>(acc);
    };

    // The pipeline of gemm_mma's wgmma CONVERT path with two canonical buffers: tile kt's MMAs
    // run while tile kt+1 is expanded; copies are requested NST-1 tiles ahead.
#pragma unroll
    for (int s = 0; s < NST - 1; ++s) {
        if (s < KT) issue(s, s);
        cp_async_commit();
    }
    if constexpr (!ASYNC_SC) {
        ScaleRegs<WKIND, BW> prw[NST - 1];
        ScaleRegs<XKIND, BT> prx[NST - 1];
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) {
            if (s < KT) {
                const long long k0 = static_cast<long long>(s) * kBK;
                prw[s].load(scopy_w, k0, col_valid, len, threadIdx.x);
                prx[s].load(scopy_x, k0, tok_valid, len, threadIdx.x);
            }
        }
#pragma unroll
        for (int s = 0; s < NST - 1; ++s) {
            if (s < KT) {
                unsigned char* sb = smem + s * STAGE;
                prw[s].store(sb + round16(raw_data_bytes(WKIND, BW)), threadIdx.x);
                prx[s].store(sb + RAW_W + round16(raw_data_bytes(XKIND, BT)), threadIdx.x);
            }
        }
    }
    if (!ASYNC_SC && NST - 1 < KT) load_scales(NST - 1);
    cp_async_wait<NST - 3>();  // tiles 0 and 1 landed (this thread's copies)
    __syncthreads();
    if (KT > 0) {
        convert_all(0, 0);
        fence_proxy_async();
    }
    for (int kt = 0; kt < KT; ++kt) {
        // Invariants: canonical buffer kt%2 holds tile kt (this thread's part); raw tile kt+1
        // landed (this thread's copies); raw stage (kt-1)%NST is free; !ASYNC_SC: scale
        // registers hold tile kt+NST-1.
        __syncthreads();
        mma_tile(s0 + CANON_OFF + (kt & 1) * (CANON_W + CANON_X));
        const int nt = kt + NST - 1;
        if (nt < KT) issue(nt % NST, nt);
        cp_async_commit();
        if (kt + 1 < KT) {
            convert_all((kt + 1) % NST, (kt + 1) & 1);
            fence_proxy_async();
        }
        if (!ASYNC_SC && nt < KT) store_scales(nt % NST);
        if (!ASYNC_SC && nt + 1 < KT) load_scales(nt + 1);
        wg_wait0();  // canonical buffer kt%2 is rewritten next iteration
        wg_fence_acc<NACC>(acc);
        cp_async_wait<NST - 3>();  // raw tile kt+2 landed (this thread's copies)
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the operand tiles: reuse shared memory

    // Epilogue: thread (warp, lane) holds D^T rows (output columns) f, f + 8 and, per n8 block
    // j, columns (tokens) t, t + 1; staged as cs[token][column].
    float* cs = reinterpret_cast<float*>(smem);
    const int f = 64 * (warp >> 2) + 16 * (warp & 3) + (lane >> 2);
#pragma unroll
    for (int j = 0; j < BT / 8; ++j) {
        const int t = 8 * j + 2 * (lane & 3);
        cs[t * EPI_LD + f] = acc[4 * j + 0];
        cs[(t + 1) * EPI_LD + f] = acc[4 * j + 1];
        cs[t * EPI_LD + f + 8] = acc[4 * j + 2];
        cs[(t + 1) * EPI_LD + f + 8] = acc[4 * j + 3];
    }
    __syncthreads();
    ep.tile<BW, EPI_LD>(cs, r0, c0, tok_valid, col_valid);
}

}  // namespace lpm_gg

// extern "C" entry point NAME of a swapped-operand wgmma (sm_90a) configuration: 32 tokens x
// 128 output columns per CTA, 256 threads, MIN_CTAS CTAs per SM at least (the register bound;
// shared memory must allow as many). On other architectures it compiles to a trap; the
// launcher never selects it there.
#define LPM_GG_DEFINE_SWAP(NAME, XKIND, WKIND, F16, CH, MIN_CTAS)                               \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kThreads, MIN_CTAS) NAME(LPM_GG_PARAMS) { \
        lpm_gg::gemm_swap<XKIND, WKIND, F16, CH>(LPM_GG_ARGS);                                  \
    }

#endif  // LPM_GROUPED_GEMM_SWAP_CUH
