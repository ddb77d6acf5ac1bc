// lowprec_moe: MXFP8 quantization / dequantization, device code shared by the kernel modules
// raw_kernels/mxfp8/mxfp8.cu (production: hardware fp32 -> fp8 conversion) and
// raw_kernels/mxfp8/mxfp8_intcvt.cu (same kernels with a pure integer conversion; tests use it as a
// cross-check and it is the fallback should the hardware conversion ever disagree).
//
// NUMERICS §3 (MXFP8) and section 5 (GroupedTensor). Bit-exact with
// lowprec_moe/backends/numpy/mxfp8.py. CuPy compiles with -ftz=true, so everything on the bit-exact
// path is integer bit manipulation or PTX without .ftz (lpm_formats.cuh helpers).
//
// Kernels (all extern "C", defined in mxfp8_entry.cuh, launched on CuPy's current stream by
// lowprec_moe/backends/cupy/mxfp8.py):
//
//   lpm_mxfp8_quantize_{f32,f16,bf16}
//       Rowwise and/or columnwise (or 2-D 32x32) quantization of x [M, K] in ONE pass: every
//       warp owns a 32-row x (16*VEC)-column tile in registers (VEC = 16 bytes of input per lane
//       and row: 8 elements of bf16/fp16, 4 of fp32) and produces the rowwise blocks (32 along
//       K) and the columnwise blocks (32 along M) of that tile. Grouped tensors use the same
//       kernel: the tiles are per-member 32-row tiles (a member's last tile is zero padded for
//       the columnwise copy), located through device arrays of member row offsets and
//       columnwise tile offsets. The flat columnwise buffers of a grouped tensor are exactly a
//       row-major [32 * num_row_tiles, K] matrix (data) and [num_row_tiles, K] (scale).
//   lpm_mxfp8_colwise_from_rowwise
//       Fused path of GroupedTensor.with_columnwise(): wire rowwise MXFP8 (data + compact E8M0
//       scale) -> dequantize (fp32) -> round to bf16 (RNE) -> columnwise MXFP8 quantize, per
//       member, one launch; optionally also scatters the rowwise scales into the GEMM-swizzled
//       layout (each member swizzled separately, buffers concatenated).
//   lpm_mxfp8_dequantize
//       Rowwise or columnwise (single or grouped, cropping padding rows) dequantization to
//       float32: q * 2^(e - 127), NaN bytes exactly as the NumPy reference produces them.
//
// fp32 -> fp8 conversion (template parameter HW): the hardware
// `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` (round to nearest even, +-inf and overflow -> +-max).
// Its only possible departures from the reference are (a) the NaN byte, which is canonicalised
// to 0x7F here whenever the tile holds a NaN, and (b) fp32-subnormal inputs, which only come
// from products far below the smallest fp8 subnormal and give a signed zero either way. With
// HW = false a pure integer conversion is used instead.
//
// This header only includes the parts, in this order (each part includes those it uses):
//   mxfp8_formats.cuh  launch constants and flag bits, input kinds, fp8 formats, integer
//                      helpers, the scale rule, fp32 <-> fp8 conversions
//   mxfp8_tile.cuh     tile location and the per-warp tile pipeline (process_tile)
//   mxfp8_bodies.cuh   quantize, fused wire rowwise -> columnwise and dequantize bodies

#ifndef LPM_MXFP8_IMPL_CUH
#define LPM_MXFP8_IMPL_CUH

#include "mxfp8_formats.cuh"
#include "mxfp8_tile.cuh"
#include "mxfp8_bodies.cuh"

#endif  // LPM_MXFP8_IMPL_CUH
