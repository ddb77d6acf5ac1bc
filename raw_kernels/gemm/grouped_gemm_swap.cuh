// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// swapped-operand wgmma kernel body gemm_swap for M-grouped GEMMs with few tokens per expert,
// and its entry-point macro LPM_GG_DEFINE_SWAP.
//
// With a handful of tokens per expert (the memory-bound MoE case: E = 128 x 16 tokens) a
// 64- or 128-row token tile leaves most of every wgmma idle while each CTA still expands a
// 256-row weight tile, one CTA per SM. This body computes the transposed tile instead,
//     D^T (128 output columns x 32 tokens) = W_tile (128 x K) * x_tile^T (K x 32),
// so the weight rows fill the wgmma M dimension (two warpgroups x 64 rows) and the tokens its
// N dimension (wgmma.m64n32k16). A CTA handles 128 weight rows and 32 token rows per k-tile;
// with NVFP4 it needs 43 KiB of shared memory and 80 registers per thread, so three CTAs share
// an SM and overlap one another's copies, decoding and barriers (MXFP8: 86 KiB, two CTAs).
//
// Both operands are quantized and contraction-contiguous (NVFP4 rowwise / transposed
// columnwise, MXFP8 rowwise): the staging, block scales and exact expansion are those of
// gemm_mma (OperandCopy, ScaleRegs, convert_unit / convert_stage) with the roles exchanged --
// the weight side takes the "A" slots (128 rows), the token side the "B" slots (32 rows); with
// NVFP4 the weights skip the canonical tile and go from the raw stage to wgmma registers
// (fp4_a_frags, the same decoder and scale product), and the token tile is expanded one
// 8-element word per thread (fp4_convert_word: unit_store's values, spread over all 256
// threads instead of 64). Every output element is the sum of the
// same 16-deep slices of exact products as in the other wgmma kernels, in the same k order; the
// GPU tests check that the results are bitwise those of gemm_mma. The accumulators are staged
// transposed ([token][column]) so the shared epilogue runs as is.
//
// The NVFP4 build grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x128_kk loads both data tiles of a k-tile with two TMA copies
// issued by one thread (LPM_GG_DEFINE_SWAP_TMA): the per-thread cp.async address work leaves
// the k-loop (static loop 398 -> 299 instructions); on the membound NVFP4 shape the medians of
// six alternated pairs moved by -19 % (fprop) / -15 % (dgrad), about as much as this machine's
// run-to-run spread.
//
// Measured: the NVFP4 kernel is bound by the weight decode (~3
// instructions per element) and by the four dependent wgmma per k-tile that each warp waits
// for, not by memory. Decoding tile k+1 into a second register set while tile k's wgmma run
// would hide the latter; in the form tried, ptxas serialized the wgmma (C7513). The
// warp-specialised kernel decodes with one commit group per 16-deep step, which ptxas does not
// serialize (grouped_gemm_ws.cuh); not tried here.
//
// The wide NVFP4 TMA builds (MW = 2): grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x256_kk, 256 weight rows x
// 32 tokens per CTA, and grouped_gemm_sm90_nvfp4_wgmma_swap_tma_16x256_kk, the same with 16 token rows (m64n16k16) for experts
// of at most 16 tokens. Each warpgroup decodes and multiplies two 64-row halves per k-tile, one
// commit group each (the second half is decoded while the first half's wgmma run; ptxas does
// not serialize this form), two CTAs per SM at 117 registers. The k-loop is 420 SASS
// instructions per 256 weight rows against 289 per 128 (-27 % per weight row). GPU time on the
// membound shape (E = 128 x 16 tokens, 2048 -> 1536, interleaved A/B): fprop 0.177 ms (the 32x128 TMA build)
// -> 0.159 (the 32x256 build) -> 0.153 (the 16x256 build), 1.40x -> 1.62x torch bf16; dgrad 0.172 -> 0.145 ms.
// Tried and reverted: moving the token-tile expansion to warps 4-7 and precomputing the
// fragment / token-word shared offsets (6244301); it measured 12-15 % slower than the 32x256 build, but on
// host-bound timing (before the benchmarks' GPU hold), so the question is open.

#ifndef LPM_GROUPED_GEMM_SWAP_CUH
#define LPM_GROUPED_GEMM_SWAP_CUH

#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_mma.cuh"
#include "grouped_gemm_tile.cuh"
#include "grouped_gemm_kernel.cuh"
#include "grouped_gemm_tma.cuh"

namespace lpm_gg {

// D(64x32, fp32) += A(64x16) * B(16x32), both operands K-major in shared memory; TYPES: the
// operand types of the instruction ("f16.f16" or "bf16.bf16").
#define LPM_GG_WGMMA_M64N32K16_SS(TYPES)                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                  \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPES " "                       \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "    \
                 "%16, %17, p, 1, 1, 0, 0;\n}\n"                                               \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),     \
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),   \
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                          \
                 : "l"(da), "l"(db), "r"(1))
template <bool F16>
__device__ __forceinline__ void wgmma_m64n32k16(float* d, unsigned long long da,
                                                unsigned long long db) {
    LPM_GG_WGMMA_TYPED(F16, LPM_GG_WGMMA_M64N32K16_SS)
}
#undef LPM_GG_WGMMA_M64N32K16_SS

// D(64x16, fp32) += A(64x16 f16, registers as below) * B(16x16 f16, K-major in shared memory).
__device__ __forceinline__ void wgmma_m64n16k16_rs(float* d, const unsigned (&a)[4],
                                                   unsigned long long db) {
#if LPM_GG_HAS_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#else
    __trap();
#endif
}

// The same with A (64x16 f16) from registers: a[0..3] = the m16n8k16 A fragment of this warp's
// 16 rows (rows g, g+8 x contraction 2q, 2q+1 and 2q+8, 2q+9; g = lane/4, q = lane%4).
__device__ __forceinline__ void wgmma_m64n32k16_rs(float* d, const unsigned (&a)[4],
                                                   unsigned long long db) {
#if LPM_GG_HAS_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#else
    __trap();
#endif
}

// XKIND: the token-side operand (the launch's A: x in fprop, dy in dgrad); WKIND: the
// weight-side operand (the launch's B). Both K-major and quantized.
//   NVFP4 (RS): the weight fragments are decoded from the raw stage straight into registers
//     (wgmma with A from registers): no canonical weight tile, so no shared-memory stores and
//     wgmma reads of it -- the token tile is the only canonical buffer. The block scales come
//     with the data: the 4 scale bytes of a row and k-tile are one aligned word (the launcher
//     checks), copied by cp.async NST-1 tiles ahead.
//   MXFP8 (SS): both operands expanded into canonical tiles in shared memory, block scales
//     through registers one tile ahead (gemm_mma's CONVERT path).
// TMA (NVFP4 only): thread 0 loads each stage's two data tiles with one tensor-map copy each
//   (tmx: the token operand, tmw: the weight operand, both 2-D byte maps whose rows are the
//   operands' rows, grouped_gemm_tma.cuh), completing on the stage's mbarrier; the block scales
//   stay on cp.async. Rows past an expert's extent load the next expert's rows (or zeros past
//   the array): like the rows issue_split skips, they only reach outputs that are never stored.
//   The launcher guarantees uniform row strides, expert offsets that are whole rows and a
//   contraction that is a multiple of the k-tile (whole k-tiles only).
// MW: m64 weight blocks per warpgroup -- 1 (128 weight rows per CTA), or 2 for the wide NVFP4
//   TMA build (256 weight rows per CTA, grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x256_kk): a warpgroup decodes and multiplies
//   two 64-row halves per k-tile (the second half decoded while the first half's wgmma run), so
//   the per-k-tile work that does not grow with the weight rows -- the barrier, the copy issue,
//   the token-tile expansion, the mbarrier waits -- is spread over twice the weights.
// NTOK: token rows per tile, the wgmma N -- kSwapTokens (32), or 16 for the wide build when no
//   expert has more than 16 tokens (grouped_gemm_sm90_nvfp4_wgmma_swap_tma_16x256_kk: m64n16k16, half the MMA work of a 32-row
//   tile of which 16 rows are valid); the shared-memory layout stays that of 32 token rows.
template <int XKIND, int WKIND, bool F16, int CH, bool TMA, int MW = 1, int NTOK = kSwapTokens>
__device__ __forceinline__ void gemm_swap(LPM_GG_PARAMS, const TmaMap* tmx, const TmaMap* tmw) {
    constexpr int BW = kSwapCols * MW, BT = NTOK, BTS = kSwapTokens;
    static_assert(MW == 1 || (MW == 2 && TMA), "the wide tile is an NVFP4 TMA build only");
    static_assert(BT == BTS || (BT == 16 && MW == 2), "16-token tiles: the wide build only");
    static_assert(XKIND == KIND_FP4_K || XKIND == KIND_FP8_K, "K-major quantized token side");
    static_assert(WKIND == KIND_FP4_K || WKIND == KIND_FP8_K, "K-major quantized weight side");
    constexpr bool RS = swap_rs(XKIND, WKIND);
    static_assert(!RS || F16, "NVFP4 expands to fp16");
    static_assert(!TMA || RS, "TMA loads: NVFP4 only");
    constexpr int CANON_W = RS ? 0 : canon_bytes(BW), CANON_X = canon_bytes(BTS);
    constexpr int RAW_W = raw_bytes(WKIND, BW), RAW_X = raw_bytes(XKIND, BTS);
    constexpr int STAGE = RAW_W + RAW_X;
    static_assert(!TMA || (STAGE % 128 == 0 && RAW_W % 128 == 0),
                  "TMA destinations must be 128-byte aligned");
    constexpr int NST = swap_stages(XKIND, WKIND), NCB = 2;
    constexpr int CANON_OFF = raw_ring_bytes(WKIND, XKIND, BW, BTS, NST);
    constexpr int EPI_LD = BW + 4;  // conflict-free transposed staging, 16-byte aligned rows
    constexpr int SMEM = swap_smem_bytes(XKIND, WKIND, MW);
    static_assert(CANON_OFF + NCB * (CANON_W + CANON_X) + 1024 == SMEM, "shared memory");
    static_assert(BT * EPI_LD * 4 + 1024 <= SMEM, "epilogue staging");
    static_assert(NST >= 3, "pipeline depth");
    constexpr int NACC = BT / 2;  // m64nBT accumulators per thread (per 64-row half)

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != CH || b_ch != CH, s0);

    // Tile rows are tokens (BT per row tile), tile columns output columns (BW per column tile).
    LPM_GG_TILE_SETUP(BT, BW, tok_valid, col_valid, kThreads)
    ep.init_alpha();

    const unsigned char* x_base = a_data + d[D_A_OFF] + r0 * d[D_A_LD];
    const unsigned char* w_base = b_data + d[D_B_OFF] + c0 * d[D_B_LD];
    const unsigned char* x_sbase = a_scale + d[D_A_SOFF] + r0 * d[D_A_SLD];
    const unsigned char* w_sbase = b_scale + d[D_B_SOFF] + c0 * d[D_B_SLD];
    const int KT = static_cast<int>((len + kBK - 1) / kBK);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int W_SC = round16(raw_data_bytes(WKIND, BW));            // in a stage
    constexpr int X_SC = RAW_W + round16(raw_data_bytes(XKIND, BTS));   // in a stage

    float acc[MW][NACC];
#pragma unroll
    for (int h = 0; h < MW; ++h)
#pragma unroll
        for (int i = 0; i < NACC; ++i) acc[h][i] = 0.0f;

    if (RS && threadIdx.x == 0 &&
        ((d[D_A_SLD] | d[D_B_SLD] | reinterpret_cast<long long>(x_sbase) |
          reinterpret_cast<long long>(w_sbase)) & 3) != 0)
        __trap();  // the launcher's alignment check was bypassed
    // RS: scale row q < BW + BT (weight row q, then token row q - BW) is copied by thread
    // q % kThreads in pass q / kThreads into the stage's scale areas (the ScaleRegs layout: row r
    // at 4r). One pass for 128 weight rows, two for 256 (the second: token rows only).
    constexpr int SCP = (BW + BT + kThreads - 1) / kThreads;
    static_assert(SCP == 1 || (SCP == 2 && BW == kThreads), "scale-copy passes");
    bool sc_on[SCP], sc_live[SCP];
    const unsigned char* sc_src[SCP];
    unsigned sc_dst[SCP];
#pragma unroll
    for (int j = 0; j < SCP; ++j) {
        const int q = static_cast<int>(threadIdx.x) + j * kThreads;
        const bool sc_w = q < BW;
        const int sc_row = sc_w ? q : q - BW;
        sc_on[j] = RS && q < BW + BT;
        sc_src[j] = sc_w ? w_sbase + sc_row * d[D_B_SLD] : x_sbase + sc_row * d[D_A_SLD];
        sc_dst[j] = (sc_w ? W_SC : X_SC) + 4u * static_cast<unsigned>(sc_row);
        sc_live[j] = sc_row < (sc_w ? col_valid : tok_valid);
    }

    // TMA: the stages' mbarriers and the tensor-map rows of the tile's first weight / token
    // row (thread 0 only).
    constexpr unsigned TMA_BYTES = raw_data_bytes(WKIND, BW) + raw_data_bytes(XKIND, BT);
    __shared__ __align__(8) unsigned long long tma_bar[TMA ? NST : 1];
    const unsigned bar0 = smem_u32(tma_bar);
    int w_row = 0, x_row = 0;
    if constexpr (TMA) {
        if (threadIdx.x == 0) {
            w_row = static_cast<int>(d[D_B_OFF] / d[D_B_LD] + c0);
            x_row = static_cast<int>(d[D_A_OFF] / d[D_A_LD] + r0);
#pragma unroll
            for (int s = 0; s < NST; ++s) mbar_init(bar0 + 8 * s, 1);
            mbar_init_fence();
        }
        __syncthreads();
    }
    const OperandCopy<WKIND, BW, CH> copy_w(w_base, d[D_B_LD], threadIdx.x);
    const OperandCopy<XKIND, BT, CH> copy_x(x_base, d[D_A_LD], threadIdx.x);
    auto issue = [&](int stage, int kt) {
        const long long k0 = static_cast<long long>(kt) * kBK;
        const unsigned sb = s0 + stage * STAGE;
        if constexpr (TMA) {
            if (threadIdx.x == 0) {
                const unsigned bar = bar0 + 8 * stage;
                const int kb = static_cast<int>(k0 / 2);  // NVFP4: two elements per byte
                mbar_arrive_expect_tx(bar, TMA_BYTES);
                tma_load_2d(sb, tmw, bar, kb, w_row);
                tma_load_2d(sb + RAW_W, tmx, bar, kb, x_row);
            }
        } else {
            copy_w.issue_split(sb, k0, col_valid, len - k0, b_data);
            copy_x.issue_split(sb + RAW_W, k0, tok_valid, len - k0, a_data);
        }
#pragma unroll
        for (int j = 0; j < SCP; ++j) {
            if (!(RS && sc_on[j])) continue;
            constexpr int NB = kBK / LPM_NVFP4_BLOCK;  // scale bytes of a row and k-tile
            // whole k-tile (always with TMA): as OperandCopy, rows past the extent skip
            if (TMA || len - k0 >= kBK) {
                if (sc_live[j])
                    cp_async_full<NB>(sb + sc_dst[j], sc_src[j] + k0 / LPM_NVFP4_BLOCK);
            } else {
                const long long blocks = (len - k0 + LPM_NVFP4_BLOCK - 1) / LPM_NVFP4_BLOCK;
                const int bytes = sc_live[j] ? static_cast<int>(blocks < NB ? blocks : NB) : 0;
                cp_async<NB>(sb + sc_dst[j], bytes ? sc_src[j] + k0 / LPM_NVFP4_BLOCK : sc_src[j],
                             bytes);
            }
        }
    };
    const ScaleCopy<WKIND, BW> scopy_w(w_sbase, d[D_B_SLD], threadIdx.x);
    const ScaleCopy<XKIND, BT> scopy_x(x_sbase, d[D_A_SLD], threadIdx.x);
    ScaleRegs<WKIND, BW> srw;
    ScaleRegs<XKIND, BT> srx;
    auto load_scales = [&](int kt) {  // (SS)
        const long long k0 = static_cast<long long>(kt) * kBK;
        srw.load(scopy_w, k0, col_valid, len, threadIdx.x);
        srx.load(scopy_x, k0, tok_valid, len, threadIdx.x);
    };
    auto store_scales = [&](int stage) {  // (SS)
        unsigned char* sb = smem + stage * STAGE;
        srw.store(sb + W_SC, threadIdx.x);
        srx.store(sb + X_SC, threadIdx.x);
    };
    // Expand raw stage `stage` into canonical buffer `cb`: SS both operands, RS the tokens only.
    auto convert_tile = [&](int stage, int cb, auto ew, auto ex) {
        unsigned char* const rs = smem + stage * STAGE;
        unsigned char* const cs = smem + CANON_OFF + cb * (CANON_W + CANON_X);
        if constexpr (RS) {  // one 8-element word per thread
            constexpr int WORDS = BT * (kBK / 8);
            static_assert(WORDS <= kThreads, "one word per thread");
            const int v = static_cast<int>(threadIdx.x);
            if ((WORDS == kThreads || v < WORDS) && (v >> 3) < tok_valid)
                fp4_convert_word(rs + RAW_W, rs + X_SC, cs, v);
        } else {
            convert_stage<WKIND, XKIND, BW, BT, kThreads, decltype(ew)::value,
                          decltype(ex)::value>(rs, cs, threadIdx.x, col_valid, tok_valid);
        }
    };
    constexpr bool QW = WKIND != KIND_FP4_K, QX = XKIND != KIND_FP4_K;  // fp8 operands
    const bool e5w = QW && b_e5m2, e5x = QX && a_e5m2;
    auto convert_all = [&](int stage, int cb) {
        with_e5m2(e5w, e5x, [&](auto ew, auto ex) { convert_tile(stage, cb, ew, ex); });
    };
    // Weight rows of this thread's fragments (RS), half h < MW: wr + 64h, wr + 64h + 8.
    const int wr = 64 * MW * (warp >> 2) + 16 * (warp & 3) + (lane >> 2);
    // One 64-deep k-tile of this warpgroup's 64 MW weight rows x 32 tokens (raw stage `stage`,
    // canonical buffer `cb`); RS: one commit group per 64-row half, so that the second half is
    // decoded while the first half's wgmma run.
    auto mma_tile = [&](int stage, int cb) {
        const unsigned sc = s0 + CANON_OFF + cb * (CANON_W + CANON_X);
        const unsigned long long dx = wg_desc(sc + CANON_W, 16, 1024);
        if constexpr (RS) {
            const unsigned char* rs = smem + stage * STAGE;
#pragma unroll
            for (int h = 0; h < MW; ++h) {
                unsigned af[4][4];
                fp4_a_frags<0, kBK / 16>(rs, rs + W_SC, wr + 64 * h, lane & 3, af);
                wg_fence_acc<NACC>(acc[h]);
                wg_fence();
#pragma unroll
                for (int ks = 0; ks < kBK / 16; ++ks) {
                    if constexpr (BT == 16)
                        wgmma_m64n16k16_rs(acc[h], af[ks], dx + ((ks * 32) >> 4));
                    else
                        wgmma_m64n32k16_rs(acc[h], af[ks], dx + ((ks * 32) >> 4));
                }
                wg_commit();
                wg_fence_acc<NACC>(acc[h]);
            }
        } else {
            const unsigned long long dw = wg_desc(sc + (warp >> 2) * (64 * 128), 16, 1024);
            wg_fence_acc<NACC>(acc[0]);
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < kBK / 16; ++ks)
                wgmma_m64n32k16<F16>(acc[0], dw + ((ks * 32) >> 4), dx + ((ks * 32) >> 4));
            wg_commit();
            wg_fence_acc<NACC>(acc[0]);
        }
    };

    // gemm_mma's wgmma CONVERT pipeline with two canonical buffers: tile kt's MMAs run while
    // the canonical tiles of kt+1 are expanded; copies are requested NST-1 tiles ahead.
#pragma unroll
    for (int s = 0; s < NST - 1; ++s) {
        if (s < KT) issue(s, s);
        cp_async_commit();
    }
    if constexpr (!RS)
        prologue_scales<NST - 1>(scopy_w, col_valid, scopy_x, tok_valid, len, KT, smem, STAGE,
                                 W_SC, X_SC, threadIdx.x);
    if (!RS && NST - 1 < KT) load_scales(NST - 1);
    cp_async_wait<NST - 3>();  // tiles 0 and 1 landed (this thread's copies)
    if constexpr (TMA) {
        if (KT > 0) mbar_wait(bar0, 0);
        if (KT > 1) mbar_wait(bar0 + 8, 0);
    }
    __syncthreads();
    if (KT > 0) {
        convert_all(0, 0);
        fence_proxy_async();
    }
    // Raw stages of tiles kt, kt+1 and kt+NST-1 (= (kt-1)%NST), kept as counters (NVFP4's
    // NST = 6 is not a power of two).
    // TMA: ph1 is the mbarrier phase parity of the tile in stage st1.
    int st = 0, st1 = 1 % NST, stn = NST - 1;
    unsigned ph1 = 0;
    for (int kt = 0; kt < KT; ++kt) {
        // Invariants: canonical buffer kt%2 holds tile kt (this thread's part); raw tiles kt
        // and kt+1 landed (this thread's copies); raw stage (kt-1)%NST is free; SS: scale
        // registers hold tile kt+NST-1.
        __syncthreads();
        mma_tile(st, kt & 1);
        const int nt = kt + NST - 1;
        if (nt < KT) issue(stn, nt);
        cp_async_commit();
        if (kt + 1 < KT) {
            convert_all(st1, (kt + 1) & 1);
            fence_proxy_async();
        }
        if (!RS && nt < KT) store_scales(stn);
        stn = st, st = st1;
        if (++st1 == NST) st1 = 0, ph1 ^= 1u;
        if (!RS && nt + 1 < KT) load_scales(nt + 1);
        wg_wait0();  // canonical buffer kt%2 (and RS: the fragment registers) reused next
#pragma unroll
        for (int h = 0; h < MW; ++h) wg_fence_acc<NACC>(acc[h]);
        cp_async_wait<NST - 3>();  // raw tile kt+2 landed (this thread's copies)
        if constexpr (TMA) {
            if (kt + 2 < KT) mbar_wait(bar0 + 8 * st1, ph1);  // and its TMA data (stage st1)
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the operand tiles: reuse shared memory

    // Epilogue: thread (warp, lane) holds D^T rows (output columns) wr + 64h, wr + 64h + 8
    // and, per n8 block j, columns (tokens) t, t + 1; staged as cs[token][column].
    float* cs = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int h = 0; h < MW; ++h) {
        const int c = wr + 64 * h;
#pragma unroll
        for (int j = 0; j < BT / 8; ++j) {
            const int t = 8 * j + 2 * (lane & 3);
            cs[t * EPI_LD + c] = acc[h][4 * j + 0];
            cs[(t + 1) * EPI_LD + c] = acc[h][4 * j + 1];
            cs[t * EPI_LD + c + 8] = acc[h][4 * j + 2];
            cs[(t + 1) * EPI_LD + c + 8] = acc[h][4 * j + 3];
        }
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
        lpm_gg::gemm_swap<XKIND, WKIND, F16, CH, false>(LPM_GG_ARGS, nullptr, nullptr);         \
    }
// The same with TMA data loads (NVFP4): two more parameters, the tensor maps of the launch's A
// (tokens) and B (weights) data, passed by value.
#define LPM_GG_DEFINE_SWAP_TMA(NAME, XKIND, WKIND, F16, MIN_CTAS)                               \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kThreads, MIN_CTAS)                   \
        NAME(LPM_GG_PARAMS, const __grid_constant__ lpm_gg::TmaMap tma_a,                      \
             const __grid_constant__ lpm_gg::TmaMap tma_b) {                                   \
        lpm_gg::gemm_swap<XKIND, WKIND, F16, 16, true>(LPM_GG_ARGS, &tma_a, &tma_b);            \
    }
// The wide TMA build (NVFP4): 32 tokens x 256 output columns per CTA, two CTAs per SM.
#define LPM_GG_DEFINE_SWAP_TMA_WIDE(NAME, XKIND, WKIND, F16)                                   \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kThreads, 2)                          \
        NAME(LPM_GG_PARAMS, const __grid_constant__ lpm_gg::TmaMap tma_a,                      \
             const __grid_constant__ lpm_gg::TmaMap tma_b) {                                   \
        lpm_gg::gemm_swap<XKIND, WKIND, F16, 16, true, 2>(LPM_GG_ARGS, &tma_a, &tma_b);         \
    }
// ... with 16 token rows per tile (wgmma m64n16k16; at most 16 tokens per expert).
#define LPM_GG_DEFINE_SWAP_TMA_WIDE16(NAME, XKIND, WKIND, F16)                                 \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kThreads, 2)                          \
        NAME(LPM_GG_PARAMS, const __grid_constant__ lpm_gg::TmaMap tma_a,                      \
             const __grid_constant__ lpm_gg::TmaMap tma_b) {                                   \
        lpm_gg::gemm_swap<XKIND, WKIND, F16, 16, true, 2, 16>(LPM_GG_ARGS, &tma_a, &tma_b);     \
    }

#endif  // LPM_GROUPED_GEMM_SWAP_CUH
