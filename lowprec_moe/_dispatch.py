"""Route an operation to the NumPy reference or to the CUDA launchers.

The CUDA launchers live in ``lowprec_moe.backends.cupy`` and share the reference signatures. An operation
whose kernel does not exist yet raises ``NotImplementedError`` naming it: a CuPy input is never
copied to the host behind the caller's back.
"""

from __future__ import annotations

import importlib

_REFERENCE = {
    "quantize_nvfp4": "lowprec_moe.reference.nvfp4",
    "dequantize_nvfp4": "lowprec_moe.reference.nvfp4",
    "quantize_mxfp8": "lowprec_moe.reference.mxfp8",
    "dequantize_mxfp8": "lowprec_moe.reference.mxfp8",
    "grouped_colsum": "lowprec_moe.reference.reduce",
}


_GPU_CACHE: dict = {}


def implementation(name: str, on_gpu: bool, gpu_module: str = "lowprec_moe.backends.cupy.quantize"):
    """Return the function ``name`` of the reference (CPU) or CUDA (GPU) backend."""
    if on_gpu:
        fn = _GPU_CACHE.get((gpu_module, name))
        if fn is not None:
            return fn
    if not on_gpu:
        return getattr(importlib.import_module(_REFERENCE[name]), name)
    try:
        mod = importlib.import_module(gpu_module)
        fn = getattr(mod, name)
    except (ImportError, AttributeError):
        raise NotImplementedError(
            f"the GPU kernel for {name} is not available yet; "
            "move the input to the host explicitly (cupy.asnumpy) to use the NumPy backend"
        ) from None
    _GPU_CACHE[(gpu_module, name)] = fn
    return fn
