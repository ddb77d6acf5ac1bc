// NVFP4 device code shared by nvfp4.cu and nvfp4_ext.cu (NUMERICS §2): global amax,
// quantize (rowwise and columnwise in one pass, 1-D or 16x16 blocks, per-tensor or row-scaled, RHT
// on the columnwise copy, stochastic rounding) and dequantize, for single tensors and for all
// members of a GroupedTensor in one launch. Results are bit-identical to
// lowprec_moe/backends/numpy/nvfp4.py.
//
// Bit-exactness under CuPy's -ftz=true: every fp32 operation on the exact path is inline PTX
// without .ftz (lpm_formats.cuh and the helpers below) or integer bit manipulation, and every
// float comparison that matters is made on bit patterns.
//
// Elements -> E2M1, fast path. For a = |x * enc| (not NaN) the E2M1 code is
//     code = RNE(g(a)),   g(a) = 4*sat(a/2) + 2*sat(a/2 - 1) + sat(a/2 - 2)
// (g = 2a on [0,2], a+2 on [2,4], a/2+4 on [4,6], 7 above 6; g is integral exactly at the grid
// points, the integer has the parity of the E2M1 code, so ties-to-even on g is ties-to-even on
// the grid). The saturated terms are FMUL.SAT / FFMA.SAT, exact wherever they are not clamped;
// they are added onto the magic constant 2^23 by three FFMAs. For any a at most one term lies
// strictly between 0 and 1 and only that FFMA rounds, once, to an integer: bits(t) - 0x4B000000
// is the code. Blocks holding a NaN take an exact compare-chain path (.sat maps NaN to 0).
//
// Quantizer tiling: one CTA of 128 threads per 64-row x 256-byte tile of one member (128 columns
// of a 16-bit input, 64 of fp32). Each thread loads whole 16-element row blocks with 16-byte
// loads and quantizes them rowwise from registers; the tile also goes to shared memory (16-byte
// chunks XOR-swizzled), from which each thread reads 16 rows x 8 bytes for the columnwise blocks.
// x is read from global memory once for both directions.
//
// This header only includes the parts, in this order (each part includes those it uses):
//   nvfp4_scalar.cuh    dtype / flag macros, LPM_DEV, non-flushing scalar helpers, E4M3 scales
//   nvfp4_codes.cuh     E2M1 element codes (the fast path above), block packing, RHT
//   nvfp4_tiles.cuh     input formats, quantizer tiles (location, loads, shared-memory layout)
//   nvfp4_amax.cuh      encode tables, amax kernel bodies
//   nvfp4_quantize.cuh  quantize kernel body, dequantize helpers, quantize argument macros
#ifndef LPM_NVFP4_COMMON_CUH
#define LPM_NVFP4_COMMON_CUH

#include "nvfp4_scalar.cuh"
#include "nvfp4_codes.cuh"
#include "nvfp4_tiles.cuh"
#include "nvfp4_amax.cuh"
#include "nvfp4_quantize.cuh"

#endif  // LPM_NVFP4_COMMON_CUH
