"""lowprec_moe: NVFP4 / MXFP8 quantization and grouped MoE layers on NumPy and CuPy.

Public API (SPEC section 6)::

    import lowprec_moe as lpm
    q = lpm.quantize(x, "nvfp4", columnwise=True)
    x_hat = lpm.dequantize(q, "rowwise", dtype="float32")
    g = lpm.GroupedTensor.quantize(x, splits, "mxfp8", columnwise=True)
"""

from . import formats
from .grouped_tensor import GroupedTensor
from .quantized_tensor import QuantizedTensor, dequantize, quantize
from .swizzle import swizzle_scales, unswizzle_scales
from .io import load, save
from .linear import (GroupedLinear, GroupedLinearContext, GroupedLinearGrads,
                     grouped_linear_backward, grouped_linear_forward)
from .recipe import Recipe

__version__ = "0.1.0"

__all__ = [
    "GroupedLinear",
    "GroupedLinearContext",
    "GroupedLinearGrads",
    "GroupedTensor",
    "QuantizedTensor",
    "Recipe",
    "dequantize",
    "formats",
    "grouped_linear_backward",
    "grouped_linear_forward",
    "load",
    "save",
    "quantize",
    "swizzle_scales",
    "unswizzle_scales",
    "__version__",
]
