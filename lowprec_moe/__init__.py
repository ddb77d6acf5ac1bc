"""lowprec_moe: NVFP4 / MXFP8 quantization and grouped MoE layers on NumPy and CuPy.

Public API (NUMERICS §6)::

    import lowprec_moe as lpm
    q = lpm.quantize(x, "nvfp4", columnwise=True)
    x_hat = lpm.dequantize(q, "rowwise", dtype="float32")
    g = lpm.GroupedTensor.quantize(x, splits, "mxfp8", columnwise=True)
    y, ctx = lpm.grouped_linear_forward(x, splits, w, recipe=lpm.Recipe.nvfp4())
    y, ctx = lpm.grouped_mlp_forward(x, splits, fc1_w, fc2_w, probs=p, activation="swiglu",
                                     recipe=lpm.Recipe.mxfp8())
    grads = lpm.grouped_mlp_backward(dy, ctx)
"""

from lowprec_moe import config, formats
from lowprec_moe.tensors.grouped_tensor import GroupedTensor
from lowprec_moe.tensors.quantized_tensor import QuantizedTensor, dequantize, quantize
from lowprec_moe.tensors.swizzle import swizzle_scales, unswizzle_scales
from lowprec_moe.io import load, save
from lowprec_moe.layers.linear import (GroupedLinearContext, GroupedLinearGrads, grouped_linear_backward,
                     grouped_linear_forward)
from lowprec_moe.layers.mlp import GroupedMLPContext, GroupedMLPGrads, grouped_mlp_backward, grouped_mlp_forward
from lowprec_moe.layers.modules import GroupedLinear, GroupedMLP
from lowprec_moe.layers.recipe import Recipe

__version__ = "0.1.0"

__all__ = [
    "GroupedLinear",
    "GroupedLinearContext",
    "GroupedLinearGrads",
    "GroupedMLP",
    "GroupedMLPContext",
    "GroupedMLPGrads",
    "GroupedTensor",
    "QuantizedTensor",
    "Recipe",
    "config",
    "dequantize",
    "formats",
    "grouped_linear_backward",
    "grouped_linear_forward",
    "grouped_mlp_backward",
    "grouped_mlp_forward",
    "load",
    "save",
    "quantize",
    "swizzle_scales",
    "unswizzle_scales",
    "__version__",
]
