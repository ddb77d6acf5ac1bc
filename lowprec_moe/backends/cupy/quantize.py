"""GPU backend entry points for single-tensor quantize / dequantize (reference signatures)."""

from lowprec_moe.backends.cupy.mxfp8 import dequantize_mxfp8, quantize_mxfp8  # noqa: F401
from lowprec_moe.backends.cupy.nvfp4 import dequantize_nvfp4, quantize_nvfp4  # noqa: F401
