"""Serving-stack layouts: the array names and quantization configs that loaders read.

Layouts
-------
``lowprec``
    Everything the library has (exact amax arrays, columnwise copies, row-scaled and grouped
    tensors); see :mod:`lowprec_moe.io.checkpoint`.
``modelopt``
    NVIDIA ModelOpt's export: ``W`` (NVFP4: U8, two E2M1 codes per byte, low nibble first;
    MXFP8: F8_E4M3 / F8_E5M2), ``W_scale`` (NVFP4: F8_E4M3 per 16 values; MXFP8: E8M0 codes as
    U8 per 32 values) and, for NVFP4, ``W_scale_2`` (F32 scalar, ``amax / 2688``, 2688 = 6 * 448).
    A value decodes as ``e2m1 * float(W_scale) * W_scale_2``. The exact amax goes to the
    metadata, not to an extra array a loader would not expect.
``compressed-tensors``
    The ``nvfp4-pack-quantized`` format: ``W_packed`` (the same bytes as ModelOpt's ``W``),
    ``W_scale`` (F8_E4M3) and ``W_global_scale`` (F32 ``[1]``, ``2688 / amax``: the reciprocal
    of ModelOpt's ``W_scale_2``). A value decodes as ``e2m1 * (float(W_scale) /
    W_global_scale)``. NVFP4 only.

The quantization config goes where loaders read it: ModelOpt's ``hf_quant_config.json``
(``producer`` and ``quantization`` with ``quant_algo``, ``kv_cache_quant_algo``, ``group_size``
and ``exclude_modules``) and ``config.json``'s ``quantization_config``. Weights only are
quantized here, so NVFP4 is ``W4A16_NVFP4``: a W4A4 ``NVFP4`` loader expects activation scales
(``input_scale``) that only calibration can give.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe import quant_formats

__all__ = ["LAYOUTS", "check_layout", "to_layout", "quant_algo", "hf_quant_config",
           "quantization_config"]

LAYOUTS = ("modelopt", "compressed-tensors", "lowprec")
_PRODUCER = "lowprec_moe"


def check_layout(layout: str, format: str, opts: dict, experts: str) -> None:
    """Refuse option combinations a serving layout cannot hold.

    Raises
    ------
    ValueError
        Unknown layout, or columnwise copies, row scaling or fused expert stacks in a serving
        layout, or MXFP8 in the compressed-tensors layout.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {LAYOUTS}")
    if layout == "lowprec":
        return
    extra = [o for o in ("columnwise", "row_scaled") if opts.get(o)]
    if extra:
        raise ValueError(f"layout={layout!r} holds rowwise, per-tensor scaled weights only; "
                         f"{', '.join(extra)} needs layout='lowprec'")
    if layout == "compressed-tensors":
        if format != "nvfp4":
            raise ValueError("layout='compressed-tensors' is written for nvfp4 only "
                             "(nvfp4-pack-quantized)")
        if experts == "fused":
            raise ValueError("layout='compressed-tensors' stores one tensor per expert; "
                             "fused expert stacks need layout='modelopt' or 'lowprec'")


def to_layout(name: str, arrays: list[tuple[str, np.ndarray]], entry: dict[str, Any],
              layout: str) -> tuple[list[tuple[str, np.ndarray]], dict[str, Any]]:
    """Rename / replace the arrays of one flattened tensor for a serving ``layout``.

    ``arrays`` and ``entry`` come from :func:`lowprec_moe.io.layout.flatten`; the exact amax
    moves to ``entry["amax_values"]`` so that loading stays bit-exact.
    """
    if layout == "lowprec":
        return arrays, entry
    by_key = dict(arrays)
    fields = dict(entry["arrays"])
    entry = {**entry, "layout": layout}
    if "amax_rowwise" in fields:
        amax = by_key[fields["amax_rowwise"]]
        if np.isfinite(amax).all():  # JSON holds finite numbers only; else the array stays
            del by_key[fields.pop("amax_rowwise")]
            entry["amax_values"] = {"amax_rowwise": [float(v) for v in amax.reshape(-1)]}
        if layout == "compressed-tensors":
            del by_key[fields.pop("rowwise_scale_2")]
            with np.errstate(divide="ignore"):
                gs = (np.float32(F.NVFP4_AMAX_DIVISOR) / amax.astype(np.float32)).reshape(-1)
            entry["aux_arrays"] = {"rowwise_global_scale": name + "_global_scale"}
            by_key[name + "_global_scale"] = gs.astype(np.float32)
    if layout == "compressed-tensors":
        data = by_key.pop(fields["rowwise_data"])
        fields["rowwise_data"] = name + "_packed"
        by_key[name + "_packed"] = data
    entry["arrays"] = fields
    order = [fields.get("rowwise_data"), fields.get("rowwise_scale"),
             fields.get("rowwise_scale_2"), *entry.get("aux_arrays", {}).values()]
    out = [(k, by_key.pop(k)) for k in order if k in by_key]
    out += list(by_key.items())
    return out, entry


def quant_algo(format: str) -> str:
    """ModelOpt's name for weight-only quantization in ``format``."""
    return "W4A16_NVFP4" if format == "nvfp4" else "MXFP8"


def group_size(format: str) -> int:
    return quant_formats.get(format).block


def hf_quant_config(format: str, exclude_modules: Sequence[str], version: str) -> dict:
    """The content of ModelOpt's ``hf_quant_config.json`` for this checkpoint."""
    return {"producer": {"name": _PRODUCER, "version": version},
            "quantization": {"quant_algo": quant_algo(format), "kv_cache_quant_algo": None,
                             "group_size": group_size(format),
                             "exclude_modules": sorted(exclude_modules)}}


def quantization_config(format: str, layout: str, exclude_modules: Sequence[str],
                        version: str) -> dict:
    """``config.json``'s ``quantization_config`` for ``layout``."""
    gs = group_size(format)
    ignore = sorted(exclude_modules)
    if layout == "compressed-tensors":
        fmt = "nvfp4-pack-quantized"
        weights = {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                   "group_size": gs, "symmetric": True, "dynamic": False}
        return {"quant_method": "compressed-tensors", "format": fmt,
                "quantization_status": "compressed", "kv_cache_scheme": None,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                              "input_activations": None, "format": fmt}},
                "ignore": ignore, "producer": {"name": _PRODUCER, "version": version}}
    weights = {"dynamic": False, "num_bits": quant_formats.get(format).element_bits,
               "type": "float",
               "group_size": gs}
    return {"quant_method": "modelopt", "quant_algo": quant_algo(format),
            "kv_cache_quant_algo": None, "group_size": gs, "exclude_modules": ignore,
            "ignore": ignore, "config_groups": {"group_0": {"weights": weights,
                                                            "targets": ["Linear"]}},
            "producer": {"name": _PRODUCER, "version": version}}
