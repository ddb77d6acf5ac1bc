// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): CTA size
// and k-tile depth, the descriptor words, operand kinds and output types, the shared-memory
// footprint formulas (mirrored in lowprec_moe/backends/cupy/gemm_plan.py and gemm.py), the PTX
// wrappers (grouped_gemm_ptx.cuh), and the kernel parameter / argument lists (LPM_GG_PARAMS,
// LPM_GG_ARGS).

#ifndef LPM_GROUPED_GEMM_BASE_CUH
#define LPM_GROUPED_GEMM_BASE_CUH

#include "lpm_formats.cuh"

namespace lpm_gg {

constexpr int kThreads = 256;
constexpr int kBK = 64;         // contraction depth of one k-tile
constexpr int kDescWords = 16;  // int64 words per expert in the descriptor table

// Descriptor words (mirrored in lowprec_moe/backends/cupy/gemm.py).
enum DescWord {
    D_A_OFF = 0,   // byte offset of expert g's A operand (row 0, contraction 0) in a_data
    D_A_LD = 1,    // bytes between rows (K-major) / contraction lines (MN-major) of A
    D_A_SOFF = 2,  // byte offset of A's block scales in a_scale
    D_A_SLD = 3,   // bytes between scale rows (K-major) / scale block-lines (MN-major)
    D_B_OFF = 4,
    D_B_LD = 5,
    D_B_SOFF = 6,
    D_B_SLD = 7,
    D_ROWS = 8,     // valid output rows of expert g
    D_LEN = 9,      // contraction length (elements; padded length for quantized wgrad)
    D_OUT_OFF = 10, // element offset of expert g's output row 0
    D_AMAX_A = 11,  // index into amax_a (+ row when a_vec)
    D_AMAX_B = 12,  // index into amax_b (+ column when b_vec)
    D_BIAS = 13,    // index into bias (+ column)
    D_PROBS = 14,   // index into probs (+ row)
};

// Operand kinds of the tensor-core kernel.
constexpr int KIND_HP_K = 0;    // bf16 / fp16, contraction contiguous
constexpr int KIND_HP_MN = 1;   // bf16 / fp16, rows contiguous
constexpr int KIND_FP4_K = 2;   // NVFP4 packed nibbles + E4M3 scales per 16 (contraction contiguous)
constexpr int KIND_FP8_K = 3;   // MXFP8 bytes + E8M0 scales per 32 along the contraction (rowwise)
constexpr int KIND_FP8_MN = 4;  // MXFP8 columnwise: [Mp, X] row-major, scales [Mp/32, X]

// Output types.
constexpr int OUT_F32 = 0;
constexpr int OUT_BF16 = 1;
constexpr int OUT_F16 = 2;

__host__ __device__ constexpr bool kind_is_mn(int kind) {
    return kind == KIND_HP_MN || kind == KIND_FP8_MN;
}
__host__ __device__ constexpr bool kind_is_hp(int kind) {
    return kind == KIND_HP_K || kind == KIND_HP_MN;
}
__host__ __device__ constexpr bool kind_is_fp8(int kind) {
    return kind == KIND_FP8_K || kind == KIND_FP8_MN;
}
// A compile-time flag passed as a value (template-dispatch of generic lambdas; NVRTC has no
// <type_traits>).
template <bool B>
struct BoolC {
    static constexpr bool value = B;
};
// Call f(BoolC<A>{}, BoolC<B>{}) for the runtime flags a / b: the caller branches once, each
// of the four calls is a specialisation.
template <class F>
__device__ __forceinline__ void with_flags(bool a, bool b, F&& f) {
    if (a) {
        if (b) {
            f(BoolC<true>{}, BoolC<true>{});
        } else {
            f(BoolC<true>{}, BoolC<false>{});
        }
    } else if (b) {
        f(BoolC<false>{}, BoolC<true>{});
    } else {
        f(BoolC<false>{}, BoolC<false>{});
    }
}
// with_flags for E5M2 data on the A / B side (MXFP8 only), once per tile.
template <class F>
__device__ __forceinline__ void with_e5m2(bool ea, bool eb, F&& f) {
    with_flags(ea, eb, static_cast<F&&>(f));
}

__host__ __device__ constexpr int round16(int x) { return (x + 15) / 16 * 16; }

// Shared-memory footprint of one tile of R rows (mirrored in lowprec_moe/backends/cupy/gemm.py).
__host__ __device__ constexpr int canon_bytes(int rows) { return rows * kBK * 2; }
__host__ __device__ constexpr int raw_data_bytes(int kind, int rows) {
    return kind == KIND_FP4_K ? rows * (kBK / 2)
           : kind == KIND_FP8_K || kind == KIND_FP8_MN ? rows * kBK
                                                       : canon_bytes(rows);
}
// Block scales per tile (entries); NVFP4 keeps the E4M3 bytes, MXFP8 stores each E8M0 scale
// expanded to its fp32 factor 2^(e-127) (4 bytes) -- or, for a tile in the fp16 window, to its
// f16x2 factor word (K-major) / fp16 factor (MN-major, 2 of the 4 bytes; ScaleRegs::store_f16).
__host__ __device__ constexpr int raw_scale_count(int kind, int rows) {
    return kind == KIND_FP4_K ? rows * (kBK / LPM_NVFP4_BLOCK)
           : kind == KIND_FP8_K || kind == KIND_FP8_MN ? rows * (kBK / LPM_MXFP8_BLOCK)
                                                       : 0;
}
__host__ __device__ constexpr int raw_scale_bytes(int kind, int rows) {
    return raw_scale_count(kind, rows) * (kind == KIND_FP4_K ? 1 : 4);
}
__host__ __device__ constexpr int raw_bytes(int kind, int rows) {
    return round16(raw_data_bytes(kind, rows)) + round16(raw_scale_bytes(kind, rows));
}

// Dynamic shared memory of gemm_mma<BM, BN, ..., AKIND, BKIND, ..., WG> (mirrored by _smem_bytes
// in lowprec_moe/backends/cupy/gemm.py): the pipeline buffers or the fp32 epilogue staging tile, whichever
// is larger, plus 1024 bytes to align the base to the 1024-byte swizzle atoms.
//   DIRECT (bf16 / fp16): NST canonical stages; wgmma keeps one k-tile's MMAs in flight across
//     the barrier, so it prefetches NST - 2 tiles ahead (5 stages when a stage is <= 40 KiB, else 4);
//     mma.sync prefetches NST - 1 ahead (4 / 3 stages).
//   CONVERT (NVFP4 / MXFP8): 4 raw stages + NCB canonical buffers: 3 with wgmma when they fit
//     (the MMAs of tile k stay in flight while tile k+1 is expanded), else 2; MXFP8 with wgmma
//     adds mx_exp_bytes.
constexpr int kMaxSmem = 227 * 1024;  // opt-in shared memory per block on sm_90
__host__ __device__ constexpr int pipeline_stages(int akind, int bkind, int bm, int bn, bool wg) {
    return kind_is_hp(akind) && kind_is_hp(bkind)
               ? (canon_bytes(bm) + canon_bytes(bn) <= 40 * 1024 ? 4 : 3) + (wg ? 1 : 0)
               : 4;
}
__host__ __device__ constexpr int raw_ring_bytes(int akind, int bkind, int bm, int bn,
                                                 int nst = 4) {
    return (nst * (raw_bytes(akind, bm) + raw_bytes(bkind, bn)) + 1023) / 1024 * 1024;
}
__host__ __device__ constexpr int canon_buffers(int akind, int bkind, int bm, int bn, bool wg) {
    return wg && raw_ring_bytes(akind, bkind, bm, bn) + 3 * (canon_bytes(bm) + canon_bytes(bn)) +
                         1024 <= kMaxSmem
               ? 3
               : 2;
}
// MXFP8 with wgmma: the per-row / per-column largest block codes of the tile (one byte each,
// grouped_gemm_mxf16.cuh), kept after the canonical buffers until the epilogue.
__host__ __device__ constexpr int mx_exp_bytes(int akind, int bkind, int bm, int bn, bool wg) {
    return wg && kind_is_fp8(akind) && kind_is_fp8(bkind) ? bm + bn : 0;
}
// The fp32 accumulator staging tile of a BM x BN epilogue (rows padded by 8 floats), which
// reuses the operand buffers.
__host__ __device__ constexpr int epi_bytes(int bm, int bn) { return bm * (bn + 8) * 4; }
__host__ __device__ constexpr int gemm_smem_bytes(int akind, int bkind, int bm, int bn, bool wg) {
    const bool direct = kind_is_hp(akind) && kind_is_hp(bkind);
    const int nst = pipeline_stages(akind, bkind, bm, bn, wg);
    const int canon = canon_bytes(bm) + canon_bytes(bn);
    const int main = direct ? nst * canon
                            : raw_ring_bytes(akind, bkind, bm, bn) +
                                  canon_buffers(akind, bkind, bm, bn, wg) * canon +
                                  mx_exp_bytes(akind, bkind, bm, bn, wg);
    const int epi = epi_bytes(bm, bn);
    return (main > epi ? main : epi) + 1024;
}

// The swapped-operand kernel (gemm_swap, few tokens per expert): kSwapTokens token rows x
// kSwapCols output columns per CTA; swap_stages raw stages, then 2 canonical buffers -- NVFP4:
// the token tile only (the weights go from the raw stage to registers), MXFP8: both tiles --
// plus the 1024-byte alignment (the transposed fp32 epilogue tile fits in the raw ring).
// NVFP4: 6 stages, 43 KiB (the wide build: 70 KiB); MXFP8: 4 stages, 86 KiB.
constexpr int kSwapCols = 128;
constexpr int kSwapTokens = 32;
__host__ __device__ constexpr bool swap_rs(int xkind, int wkind) {
    return xkind == KIND_FP4_K && wkind == KIND_FP4_K;
}
__host__ __device__ constexpr int swap_stages(int xkind, int wkind) {
    return swap_rs(xkind, wkind) ? 6 : 4;
}
// mw: 2 for the wide NVFP4 build (kSwapCols * 2 weight rows per CTA), else 1.
__host__ __device__ constexpr int swap_smem_bytes(int xkind, int wkind, int mw = 1) {
    return raw_ring_bytes(wkind, xkind, kSwapCols * mw, kSwapTokens, swap_stages(xkind, wkind)) +
           2 * ((swap_rs(xkind, wkind) ? 0 : canon_bytes(kSwapCols * mw)) +
                canon_bytes(kSwapTokens)) +
           1024;
}

// The warp-specialised NVFP4 kernel (grouped_gemm_ws.cuh), 128 x 256 tile: the consumers decode
// A from the raw stage straight into wgmma registers, so only B has canonical buffers
// (kWsCanonBuffers); the producers request raw tiles kWsAhead ahead of the one they expand, and
// a raw stage is refilled only once the consumers retired its tile: kWsAhead + kWsCanonBuffers
// raw stages. NVFP4: 81 KiB of raw ring + 96 KiB of canonical B + alignment.
constexpr int kWsAhead = 3;
constexpr int kWsCanonBuffers = 3;
constexpr int kWsStages = kWsAhead + kWsCanonBuffers;
__host__ __device__ constexpr int ws_smem_bytes(int akind, int bkind) {
    const int main =
        raw_ring_bytes(akind, bkind, 128, 256, kWsStages) + kWsCanonBuffers * canon_bytes(256);
    const int epi = epi_bytes(128, 256);
    return (main > epi ? main : epi) + 1024;
}
// The 384-thread TMA kernel (NVFP4, uniform strides; grouped_gemm_ws_n256.cuh): the raw stages hold the two data tiles only; the block
// scales come in slots of kWsScaleTiles k-tiles (16 bytes per row: a tensor-map box is at least
// 16 bytes wide), kWsScaleSlots of them, after the canonical buffers.
constexpr int kWsScaleTiles = 4;
constexpr int kWsScaleSlots = 3;
// Then a scratch region of kWsCanonBuffers x kWsFragBytes (one 16-byte word per consumer thread
// and step, kWsFragSteps steps per canonical buffer), in which the 384-thread build keeps each
// consumer's B-unit addresses (grouped_gemm_ws_n256.cuh); it is part of the launch's size.
constexpr int kWsFragSteps = 2;
constexpr int kWsFragStepBytes = 16 * 256;
constexpr int kWsFragBytes = kWsFragSteps * kWsFragStepBytes;
__host__ __device__ constexpr int ws_tma_scale_slot_bytes() {
    return (128 + 256) * kWsScaleTiles * (kBK / LPM_NVFP4_BLOCK);
}
__host__ __device__ constexpr int ws_tma_smem_bytes() {
    const int main = kWsStages * (raw_data_bytes(KIND_FP4_K, 128) + raw_data_bytes(KIND_FP4_K, 256)) +
                     kWsCanonBuffers * canon_bytes(256) + kWsScaleSlots * ws_tma_scale_slot_bytes() +
                     kWsCanonBuffers * kWsFragBytes;
    const int epi = epi_bytes(128, 256);
    return (main > epi ? main : epi) + 1024;
}
// The persistent form of that build (grouped_gemm_ws_persist.cuh): its pipeline buffers, then
// a staging buffer of 16 rows x kEpiWarpLd floats per consumer warp (8) for the epilogue, which
// cannot reuse the pipeline buffers (they already hold the next tile).
constexpr int kEpiWarpLd = 68;  // 64 columns and 4 of padding
// ... and a table of 128 column amaxes per consumer warp (the row-scaled register epilogue,
// grouped_gemm_epi_regs.cuh).
constexpr int kEpiColTable = 128;
__host__ __device__ constexpr int ws_p_smem_bytes() {
    return kWsStages * (raw_data_bytes(KIND_FP4_K, 128) + raw_data_bytes(KIND_FP4_K, 256)) +
           kWsCanonBuffers * canon_bytes(256) + kWsScaleSlots * ws_tma_scale_slot_bytes() +
           8 * (16 * kEpiWarpLd + kEpiColTable) * 4 + 1024;
}
// The warp-specialised MXFP8 kernel (grouped_gemm_ws_mx.cuh, TMA only): an fp8 tile is twice an
// NVFP4 one, so one ring of six stages of both data tiles beside three canonical buffers does
// not fit. A and B have rings of their own: the consumers read A from its raw stage until they
// retire the k-tile (kWmxAhead + kWmxCanonBuffers stages of 8 KiB), while B's raw stage is free
// once the producers widened it (kWmxAhead + 1 stages of 16 KiB). Then kWmxCanonBuffers
// canonical B buffers, block scales in kWmxScaleSlots slots of kWmxScaleTiles k-tiles (16 bytes
// per row: two E8M0 codes per k-tile) and the rows' and columns' largest block codes (fp16
// window).
constexpr int kWmxAhead = 3;
constexpr int kWmxCanonBuffers = 3;
constexpr int kWmxAStages = kWmxAhead + kWmxCanonBuffers;
constexpr int kWmxBStages = kWmxAhead + 1;
constexpr int kWmxScaleTiles = 8;
constexpr int kWmxScaleSlots = 2;
__host__ __device__ constexpr int ws_mx_scale_slot_bytes() {
    return (128 + 256) * kWmxScaleTiles * (kBK / LPM_MXFP8_BLOCK);
}
__host__ __device__ constexpr int ws_mx_smem_bytes() {
    const int main = kWmxAStages * raw_data_bytes(KIND_FP8_K, 128) +
                     kWmxBStages * raw_data_bytes(KIND_FP8_K, 256) +
                     kWmxCanonBuffers * canon_bytes(256) +
                     kWmxScaleSlots * ws_mx_scale_slot_bytes() + (128 + 256);
    const int epi = epi_bytes(128, 256);
    return (main > epi ? main : epi) + 1024;
}
// Its persistent form (grouped_gemm_ws_mx_persist.cuh) requests its data copies kWmxPAhead k-tiles ahead, one B stage fewer, and spend the space on the consumer warps' own
// epilogue staging buffers (kWmxEpiStaging: 8 warps x 16 rows x 64 columns of 16-bit values,
// rows padded by 16 bytes, reg_epi_bytes<64>), so that a tile's last canonical buffer goes
// back to the producers before its epilogue. A's ring keeps its kWmxAStages stages (one spare).
// Then the window slots (a tile's rows' and columns' largest block codes and their range over
// the tile: the producers write the next tile's while the consumers finish this one): two,
// each with a full and an empty mbarrier.
constexpr int kWmxPAhead = 2;
constexpr int kWmxEpiStaging = 8 * 16 * (2 * 64 + 16);
constexpr int kWmxWinSlot = 128 + 256 + 32;  // codes, range (4 words), padding
__host__ __device__ constexpr int ws_mx_p_smem_bytes(int win_slots = 2) {
    return kWmxAStages * raw_data_bytes(KIND_FP8_K, 128) +
           (kWmxPAhead + 1) * raw_data_bytes(KIND_FP8_K, 256) +
           kWmxCanonBuffers * canon_bytes(256) + kWmxScaleSlots * ws_mx_scale_slot_bytes() +
           kWmxEpiStaging + win_slots * kWmxWinSlot + 1024;
}

}  // namespace lpm_gg

#include "grouped_gemm_ptx.cuh"

// Parameter list of every tensor-core kernel entry point and kernel body (gemm_mma, gemm_ws,
// gemm_swap), and the matching argument list. mx_bf16 = 1: MXFP8 tiles stay on bf16 (no fp16
// window, grouped_gemm_mxf16.cuh); only gemm_mma, gemm_ws_mx and gemm_ws_mx_p read it.
#define LPM_GG_PARAMS                                                                          \
    const int *__restrict__ tiles, int n_col_tiles, const long long *__restrict__ desc,       \
        long long n_cols, const unsigned char *__restrict__ a_data,                           \
        const unsigned char *__restrict__ a_scale, int a_ch, int a_e5m2,                      \
        const unsigned char *__restrict__ b_data, const unsigned char *__restrict__ b_scale,  \
        int b_ch, int b_e5m2, const float *__restrict__ amax_a,                               \
        const float *__restrict__ amax_b, int a_vec, int b_vec, int scale_mode,               \
        const float *__restrict__ bias, const float *__restrict__ probs, int has_bias,        \
        int has_probs, void *__restrict__ out, int out_type, int accumulate, int zero_if_empty, \
        int mx_bf16

#define LPM_GG_ARGS                                                                            \
    tiles, n_col_tiles, desc, n_cols, a_data, a_scale, a_ch, a_e5m2, b_data, b_scale, b_ch,   \
        b_e5m2, amax_a, amax_b, a_vec, b_vec, scale_mode, bias, probs, has_bias, has_probs,   \
        out, out_type, accumulate, zero_if_empty, mx_bf16

#endif  // LPM_GROUPED_GEMM_BASE_CUH
