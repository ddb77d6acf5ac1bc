// lowprec_moe: grouped (MoE) GEMM machinery shared by raw_kernels/grouped_gemm_*.cu.
//
// One launch covers every expert. The host (lowprec_moe/backends/cupy/gemm.py) uploads
//   * a tile table  int32 [entries][2] = (expert g, row tile of that expert); the grid is
//     entries * n_col_tiles CTAs, column tile fastest (CTAs that share an A row tile run together);
//   * a descriptor table int64 [G][16] (DescWord in grouped_gemm_base.cuh) holding, per expert,
//     the byte offsets and leading dimensions of both operands and their block scales, the valid
//     output rows, the contraction length, and the bases into the output / amax / bias / probs
//     arrays.
// All layout logic lives on the host; the kernel only knows two operand orientations:
//   K-major : element (row r, contraction k) at off + r*ld + k*size     (contraction contiguous)
//   MN-major: element (row r, contraction k) at off + k*ld + r*size     (rows contiguous)
//
// Canonical GEMM: out[r][c] = sum_k A[r][k] * B[c][k] for r < rows(g), c < n_cols, k < len(g).
//
// Tensor-core kernels, fp32 accumulation, 256 threads, BK = 64: mma.sync.m16n8k16 per warp
// (ldmatrix fragments; sm_89 and newer), or on sm_90a wgmma per warpgroup (m64n256k16 for the
// 128-row tile, m64n128k16 for the 64-row tile and the warp-specialised kernel) reading the
// operands straight from the shared-memory tiles (A from registers where noted below). Operand
// staging is common to both:
//   * high-precision bf16 / fp16 operands ("DIRECT"): cp.async straight into the canonical
//     shared-memory tile (3-5 stage ring, see pipeline_stages);
//   * NVFP4 / MXFP8 operands ("CONVERT"): cp.async of the packed bytes into a 4-stage raw ring,
//     block scales through registers one tile ahead; every k-tile the CTA expands the next raw tile
//     into a 16-bit canonical tile (2-3 buffers, see canon_buffers) while the tensor cores work
//     on the current one. The warp-specialised variant (grouped_gemm_ws.cuh, 512 threads, NVFP4;
//     6 raw stages, 3 canonical B buffers: ws_smem_bytes) hands the copies and B's expansion to
//     two producer warpgroups; its two consumer warpgroups decode A straight into wgmma
//     registers. The swapped-operand kernel (grouped_gemm_swap.cuh) does the same with its
//     NVFP4 weights; its NVFP4 builds load the data tiles with TMA instead of cp.async
//     (grouped_gemm_tma.cuh).
//     No dequantized copy of an operand ever exists in global memory.
// Canonical tiles (16-bit): K-major [R][64] (128-byte rows, 16-byte chunk c of row r stored at
// chunk c ^ (r & 7)), or MN-major [64 lines][R] stored as R/64 panels of [64][128 bytes] with the
// same XOR on the line index. These are exactly wgmma's 128-byte-swizzle K-major / MN-major
// layouts (8-row atoms of 1024 bytes), and ldmatrix (.trans for MN-major) reads them without
// bank conflicts.
//
// Exact in-kernel dequantization (grouped_gemm_dequant.cuh):
//   * NVFP4: e2m1 * e4m3 has at most 6 significant bits and lies in [2^-10, 2688]: exact in fp16.
//     A nibble is re-encoded as the E4M3 byte of e2m1 * 2^-6, widened by cvt.rn.f16x2.e4m3x2, and
//     multiplied (mul.rn.f16x2, exact) by the block scale * 2^6 (exact in fp16: <= 28672). The MMA
//     runs on fp16.
//   * MXFP8: fp8 * 2^(e-127) formed in fp32 (cvt.rn.f16x2.e4m3x2 / e5m2x2 and cvt.f32.f16 widen
//     exactly, subnormals included; one non-flushing multiply by the block factor), and its high
//     half taken as bf16. Exact whenever the value is representable in bf16: every block with
//     E4M3 scale code e >= 3 (block amax above ~1e-35; E5M2: e >= 10), up to the largest
//     finite-input scale. Blocks of even smaller magnitude are truncated toward zero onto bf16's
//     subnormal grid -- the one documented deviation from exact dequantization. NaN / inf
//     elements and the NaN scale (255) propagate. The E8M0 scales are expanded to fp32 factors
//     when they are staged in shared memory. The MMA runs on bf16 -- or, in the plain wgmma
//     kernel, on fp16 for tiles whose block codes fit the fp16 window: q * 2^(e - e_max(row) +
//     S_MAX), exact, with the powers of two restored before the epilogue
//     (grouped_gemm_mxf16.cuh).
// The epilogue (NVFP4 scaling, bias, probs, cast / accumulate) uses non-flushing PTX (mul.rn.f32,
// add.rn.f32), so it reproduces the NumPy reference bit for bit given the same accumulator.
// Determinism: every output element is owned by one thread of one CTA and accumulated in a fixed
// order (k-tiles, then 16-wide MMA steps); no atomics, no split-K. Grouped == per-expert calls:
// row tiles start at each expert's first row, and every tile shape of one family issues the same
// MMA instruction on the same k-steps, so an expert's results do not depend on its neighbours.
//
// The machinery is split into parts, each self-contained (it includes what it uses); this
// header includes them in dependency order:
//   grouped_gemm_base.cuh     CTA size, k-tile depth, descriptor words (DescWord), operand kinds,
//                             output types, shared-memory formulas (pipeline_stages,
//                             canon_buffers, gemm_smem_bytes, ws_smem_bytes,
//                             swap_smem_bytes), the kernel
//                             parameter / argument lists (LPM_GG_PARAMS, LPM_GG_ARGS)
//   grouped_gemm_ptx.cuh      the PTX wrappers (shared-memory accesses, cp.async, ldmatrix /
//                             stmatrix, mma.sync, fp8 / fp16 / bf16 conversions)
//   grouped_gemm_staging.cuh  swizzled tile offsets, cp.async tile loads, TileGeo,
//                             OperandCopy, ScaleRegs
//   grouped_gemm_dequant.cuh  exact in-kernel dequantization: fp4 / fp8 decoders, convert_unit,
//                             fp4_a_frags (NVFP4 straight into wgmma A registers)
//   grouped_gemm_mma.cuh      warp-level mma.sync steps, sm_90a wgmma wrappers
//   grouped_gemm_pack.cuh     16-bit output words with the reference's rounding (pack8)
//   grouped_gemm_epilogue.cuh the epilogue (Epilogue)
//   grouped_gemm_tile.cuh     a kernel body's output tile: set-up (LPM_GG_TILE_SETUP), the
//                             accumulator fragment layout (frag_row) and staging (stage_acc)
//   grouped_gemm_mxf16.cuh    MXFP8 on fp16: the tile's window check (scale scan) and the
//                             accumulators' powers of two (mx_rescale)
//   grouped_gemm_kernel.cuh   the kernel body gemm_mma and the entry-point macros
//                             (LPM_GG_DEFINE, LPM_GG_DEFINE_WG)
//   grouped_gemm_epi_regs.cuh the warp-specialised kernels' register epilogue (16-bit output
//                             without bias: scale and convert in registers, stmatrix, 16-byte rows)
//   grouped_gemm_ws_roles.cuh what the warp-specialised kernels share: role sizes, register
//                             budgets, named barriers, the consumers' step start and epilogue
//   grouped_gemm_ws_fp4.cuh   the NVFP4 TMA kernels' k-tile steps (layout, copy requests,
//                             producer and consumer k-tiles), shared by gemm_ws_n256 and gemm_ws_p
//   grouped_gemm_ws.cuh       the warp-specialised wgmma kernel body gemm_ws (instantiated
//                             for NVFP4: two producer warpgroups copy and expand B, two
//                             consumer warpgroups decode A into registers and multiply)
//                             and LPM_GG_DEFINE_WS
//   grouped_gemm_ws_mx_produce.cuh  its shared-memory layout (WmxLayout) and producers'
//                             k-loops (wmx_produce_b: B widened per K-major or MN-major layout)
//   grouped_gemm_mx_ranges.cuh  the block-code range of every MXFP8 operand row
//                             (grouped_gemm_sm90_mxfp8_block_code_ranges, LPM_GG_DEFINE_MX_RANGES), which the
//                             warp-specialised MXFP8 kernels check the fp16 window with
//   grouped_gemm_ws_mx_consume.cuh  its consumers' k-loop (wmx_consume: A widened into
//                             registers, m64n128k16 on the canonical B)
//   grouped_gemm_ws_mx.cuh    the warp-specialised MXFP8 kernel gemm_ws_mx (fprop, TMA loads,
//                             fp16 window or bf16 per tile) and LPM_GG_DEFINE_WS_MX
//   grouped_gemm_ws_n256.cuh  the 384-thread NVFP4 TMA kernel gemm_ws_n256 (one
//                             producer warpgroup, consumers on m64n256k16), and
//                             LPM_GG_DEFINE_WS_N256
//   grouped_gemm_ws_persist.cuh  the persistent form of gemm_ws_n256, gemm_ws_p (one CTA per
//                             SM over many tiles; epilogue from registers;
//                             LPM_GG_DEFINE_WS_NP)
//   grouped_gemm_ws_mx_persist.cuh  the persistent form of gemm_ws_mx, gemm_ws_mx_p (the
//                             producers check the next tile's window; copies 2 k-tiles
//                             ahead; epilogue from registers through each consumer warp's
//                             own staging buffer), and LPM_GG_DEFINE_WS_MX_P
//   grouped_gemm_ragged_list.cuh  an entry of a ragged kernel's balanced tile list
//   grouped_gemm_ws_ragged.cuh  the ragged persistent NVFP4 kernel gemm_ws_g for wgrad of
//                             uneven experts, data through row-pair tensor maps
//                             (LPM_GG_DEFINE_WS_H)
//   grouped_gemm_ws_ragged_tma.cuh  that TMA build's stage layout (WsgTmaLayout) and the
//                             builder of its per-expert tensor maps (LPM_GG_DEFINE_WS_H_MAPS)
//   grouped_gemm_tma.cuh      TMA tile loads: the tensor-map parameter type, mbarrier and
//                             cp.async.bulk.tensor wrappers
//   grouped_gemm_swap.cuh     the swapped-operand wgmma kernel body gemm_swap for few tokens
//                             per expert (weights on the wgmma M side), LPM_GG_DEFINE_SWAP
//                             and LPM_GG_DEFINE_SWAP_TMA

#ifndef LPM_GROUPED_GEMM_COMMON_CUH
#define LPM_GROUPED_GEMM_COMMON_CUH

#include "grouped_gemm_base.cuh"
#include "grouped_gemm_staging.cuh"
#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_mma.cuh"
#include "grouped_gemm_pack.cuh"
#include "grouped_gemm_epilogue.cuh"
#include "grouped_gemm_tile.cuh"
#include "grouped_gemm_mxf16.cuh"
#include "grouped_gemm_kernel.cuh"
#include "grouped_gemm_epi_regs.cuh"
#include "grouped_gemm_ws_roles.cuh"
#include "grouped_gemm_ws_fp4.cuh"
#include "grouped_gemm_ws.cuh"
#include "grouped_gemm_mx_ranges.cuh"
#include "grouped_gemm_ws_mx.cuh"
#include "grouped_gemm_ws_n256.cuh"
#include "grouped_gemm_ws_persist.cuh"
#include "grouped_gemm_ws_mx_persist.cuh"
#include "grouped_gemm_ragged_list.cuh"
#include "grouped_gemm_ws_ragged.cuh"
#include "grouped_gemm_tma.cuh"
#include "grouped_gemm_swap.cuh"

#endif  // LPM_GROUPED_GEMM_COMMON_CUH
