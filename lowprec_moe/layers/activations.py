"""GroupedMLP activations: forward / backward, optionally fused with quantization (NUMERICS §8).

The activation sits between the two grouped GEMMs of an MoE expert block::

    h = fc1(x)                    [M, 2F] (GLU activations) or [M, F] (unary)
    z = act(h) * probs[:, None]   [M, F]   -> quantized for fc2 (rowwise: fprop, columnwise: wgrad)
    ...
    dh = act'(h) * (dz * probs)   [M, 2F]  -> quantized for fc1 (rowwise: dgrad, columnwise: wgrad)
    dprobs[m] += sum_f act(h)_f * dz_f

Activations: ``swiglu``, ``clamped_swiglu`` (GPT-OSS; ``limit``, ``alpha``) and ``srelu``. Their
exact arithmetic (fp32, a reproducible exponential, one rounding to the layer dtype) is defined in
:mod:`lowprec_moe.backends.numpy.activations`; the NumPy and CUDA backends give the same bits for every
element of ``z`` and ``dh``. Reductions (``dprobs``, the bias gradient ``sum_rows dh``) are summed
in another order on the GPU (deterministic, but not bitwise equal to NumPy's).

Fusion on the GPU (``raw_kernels/activation/activation.cu``)
-------------------------------------------------
The pre-activation ``h`` is kept between forward and backward (in the layer dtype), as TE does.

* **Forward, MXFP8**: one kernel reads ``h`` (and probs) and writes fc2's input quantized to MXFP8
  rowwise *and* columnwise; ``z`` is never written to memory. The quantization stage performs the
  MXFP8 quantizer's tile arithmetic (``raw_kernels/mxfp8/mxfp8_tile.cuh``: maxima, scale rule,
  conversions, NaN bytes) on the rounded activation values, staged in shared memory row by row
  (``raw_kernels/activation/activation_stage.cuh``) with the maxima taken on the fly, so the result is bit
  for bit ``GroupedTensor.quantize(z)`` of the unfused chain.
* **Backward, MXFP8**: one kernel reads ``dz``, ``h`` (and probs) and writes ``dh`` quantized
  rowwise and columnwise (E4M3, or E5M2 for the hybrid recipe), the per-row ``dprobs``
  contribution and the per-tile column sums of ``dh`` (for fc1's bias gradient); ``dh`` is never
  written to memory. Needs ``F % 32 == 0`` and ``glu_interleave`` a multiple of 32 (or none), so
  that every 32-column block of ``dh`` is all gate or all linear; otherwise the unfused path runs.
  Speed (H200): the activation kernels are compute-bound (the exact
  fp32 exponential and IEEE division), so the quantization arithmetic added to the fused kernel
  costs about what the separate bandwidth-bound quantize pass costs: the fused forward is faster
  than the unfused chain, the fused backward is still ~3-5 % slower at the bench_mlp shapes.
* **NVFP4**: the activation kernel writes ``z`` (``dh``) in the layer dtype and, as it writes
  them, takes the amax of the rounded values that the NVFP4 quantizer needs (NaN ignored, as
  IEEE fmax; ``atomicMax`` on the fp32 bits of ``|v|``, so the result does not depend on the
  order): per member for per-tensor scaling; with RHT (bf16) also the per-member amax of the
  Hadamard-transformed 16-row column chunks of the columnwise copy (the staged 32-row tile is
  transformed with the quantizer's own RHT code); when row-scaled, per row and per (member,
  column). The grouped NVFP4 quantizer is then called with this precomputed amax
  (``grouped_quantize_nvfp4(..., amax=...)``): its amax pass over ``z`` is skipped (per tensor,
  one CTA builds its encode tables from the given amax) and its one-pass rowwise + columnwise
  quantize runs as before (RHT / stochastic rounding as the recipe says). ``z`` is still written
  once and read once: E2M1 scales need the global amax before any element can be quantized, so a
  single-pass fusion would need a second pass over the activation anyway. Every option of
  ``GroupedTensor.quantize`` for nvfp4 is fused this way (per tensor, RHT, stochastic rounding,
  row-scaled, 2-D blocks), forward and backward.
* **bf16 recipe**: the same activation kernels write ``z`` / ``dh`` in the layer dtype.

``fused=False`` forces the unfused chain (activation kernel writing the layer dtype, then
``GroupedTensor.quantize`` with its own amax pass); the tests check that both give the same
bytes (MXFP8 and every NVFP4 mode, forward and backward). On the NumPy backend both are the same
code.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowprec_moe import _validate as V
from lowprec_moe.backend import get_xp, is_cupy_array
from lowprec_moe.tensors.grouped_tensor import GroupedTensor, _offsets
from lowprec_moe.backends.numpy import activations as _ref
from lowprec_moe.backends.numpy.reduce import grouped_colsum
from lowprec_moe.backends.numpy.activations import ACTIVATIONS, GLU_ACTIVATIONS

__all__ = [
    "ACTIVATIONS",
    "GLU_ACTIVATIONS",
    "Activation",
    "ActivationGrads",
    "make_activation",
    "activation_forward",
    "activation_backward",
]

DEFAULT_LIMIT = 7.0
DEFAULT_ALPHA = 1.702


@dataclass(frozen=True)
class Activation:
    """A validated activation: name, GLU column interleave, clamped-SwiGLU parameters."""

    name: str
    glu_interleave: int | None = None
    limit: float = DEFAULT_LIMIT
    alpha: float = DEFAULT_ALPHA

    @property
    def is_glu(self) -> bool:
        return self.name in GLU_ACTIVATIONS

    def input_features(self, f: int) -> int:
        """Columns of the activation input (fc1's output) for ``F`` output columns."""
        return 2 * f if self.is_glu else f


def make_activation(activation="swiglu", glu_interleave=None, limit=None,
                    alpha=None) -> Activation:
    """Validate an activation name and its options (ValueError / TypeError naming the argument).

    ``activation`` may also be an :class:`Activation` (then the other arguments must be None).
    """
    if isinstance(activation, Activation):
        if glu_interleave is not None or limit is not None or alpha is not None:
            raise ValueError("pass glu_interleave / limit / alpha inside the Activation, not "
                             "next to it")
        return activation
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not supported; valid activations: "
                         f"{', '.join(ACTIVATIONS)}")
    if glu_interleave is not None:
        if isinstance(glu_interleave, bool) or not isinstance(glu_interleave, numbers.Integral):
            raise TypeError(f"glu_interleave={glu_interleave!r} must be an int or None")
        glu_interleave = int(glu_interleave)
        if glu_interleave <= 0:
            raise ValueError(f"glu_interleave={glu_interleave} must be positive")
        if activation not in GLU_ACTIVATIONS:
            raise ValueError(f"glu_interleave={glu_interleave} applies to GLU activations "
                             f"({', '.join(GLU_ACTIVATIONS)}), not to activation={activation!r}")
    for name, v in (("limit", limit), ("alpha", alpha)):
        if v is None:
            continue
        if activation != "clamped_swiglu":
            raise ValueError(f"{name}={v!r} applies to activation='clamped_swiglu' only, not to "
                             f"activation={activation!r}")
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name}={v!r} must be a number")
        if not np.isfinite(float(v)) or float(v) <= 0:
            raise ValueError(f"{name}={v!r} must be a positive finite number")
    return Activation(activation, glu_interleave,
                      DEFAULT_LIMIT if limit is None else float(limit),
                      DEFAULT_ALPHA if alpha is None else float(alpha))


def check_features(act: Activation, n_in: int, f: int, what_in: str = "h",
                   what_f: str = "F") -> None:
    """The activation input must have ``2F`` (GLU) or ``F`` columns; interleave must divide F."""
    want = act.input_features(f)
    if n_in != want:
        kind = "GLU: gate and linear halves, 2*F" if act.is_glu else "unary: F"
        raise ValueError(f"{what_in} has {n_in} columns but activation={act.name!r} with "
                         f"{what_f}={f} needs {want} ({kind})")
    if act.glu_interleave is not None and f % act.glu_interleave:
        raise ValueError(f"glu_interleave={act.glu_interleave} must divide {what_f}={f}")


@dataclass(frozen=True)
class ActivationGrads:
    """Result of :func:`activation_backward`.

    Attributes
    ----------
    dh : array ``[M, W]`` of h's dtype, or None (not materialized: fused quantization)
    dh_quantized : GroupedTensor or None
    dprobs : float32 ``[M]`` or None -- ``sum_f act(h)_f * dz_f``
    dbias : float32 ``[G, W]`` or None -- per expert ``sum_rows dh``
    """

    dh: Any = None
    dh_quantized: Any = None
    dprobs: Any = None
    dbias: Any = None


# ============================================================================================
# validation shared by both entry points


def _check_common(h, probs, splits, act, f):
    V.check_array("h", h)
    h = V.as_2d(h)
    m, n_in = h.shape
    if f is None:
        f = n_in // 2 if act.is_glu else n_in
    check_features(act, n_in, f)
    if splits is None:
        splits = (m,)
    if is_cupy_array(splits):  # device splits: not read here (NUMERICS §7.5)
        splits = V.check_device_splits(splits, h, "h")
    else:
        splits = V.check_splits(splits, m)
    if probs is not None:
        V.check_array("probs", probs, min_rank=1)
        if probs.size != m or probs.ndim != 1:
            raise ValueError(f"probs.shape={tuple(probs.shape)} must be (M,)=({m},)")
    return h, m, f, splits


def _check_quantize(quantize: dict | None, width: int, what: str) -> dict | None:
    if quantize is None:
        return None
    if not isinstance(quantize, dict) or "format" not in quantize:
        raise TypeError(f"quantize={quantize!r} must be a dict of GroupedTensor.quantize options "
                        "with a 'format' key")
    q = dict(quantize)
    fmt = V.check_format(q["format"])
    block = V.block_size(fmt)
    if width % block:
        raise ValueError(f"{what} has {width} columns; quantizing it to {fmt} needs a multiple "
                         f"of {block}")
    return q


def _probs32(probs, xp):
    if probs is None:
        return None
    return xp.ascontiguousarray(probs.astype(xp.float32, copy=False).reshape(-1))


def _quantize_grouped(t, splits, q: dict) -> GroupedTensor:
    opts = {k: v for k, v in q.items() if k != "format"}
    return GroupedTensor.quantize(t, splits, q["format"], **opts)


def _splits_fields(splits, parts: dict) -> dict:
    """A GroupedTensor's ``splits`` and ``offsets``: host ones from host splits, the device
    splits and the row offsets the kernels built (``parts["offsets"]``) otherwise."""
    if is_cupy_array(splits):  # a copy: the caller may refill its buffer
        return dict(splits=splits.copy(), offsets=parts.pop("offsets"))
    return dict(splits=tuple(splits), offsets=_offsets(splits))


def _gt_from_parts(parts: dict, shape, splits, fp8_dtype: str) -> GroupedTensor:
    parts = dict(parts)
    return GroupedTensor(format="mxfp8", shape=tuple(shape), fp8_dtype=fp8_dtype,
                         **_splits_fields(splits, parts), **parts)


_NVFP4_KEYS = {"format", "rowwise", "columnwise", "row_scaled", "block_2d", "rht",
               "stochastic_rounding", "seed", "fp8_dtype", "first_member"}


def _fusable_nvfp4(q: dict | None, t_dtype, splits) -> dict | None:
    """NVFP4 options with a fused amax (validated as ``GroupedTensor.quantize`` does), or None."""
    if q is None or q["format"] != "nvfp4" or set(q) - _NVFP4_KEYS:
        return None  # (unknown options: the unfused call reports them)
    o = dict(rowwise=bool(q.get("rowwise", True)), columnwise=bool(q.get("columnwise", False)),
             row_scaled=bool(q.get("row_scaled", False)), block_2d=bool(q.get("block_2d", False)),
             rht=bool(q.get("rht", False)),
             stochastic_rounding=bool(q.get("stochastic_rounding", False)))
    V.check_options("nvfp4", fp8_dtype=q.get("fp8_dtype", "e4m3"), dtype=t_dtype, **o)
    b = V.block_size("nvfp4")
    if o["block_2d"] and (is_cupy_array(splits) or any(s % b for s in splits)):
        return None  # the unfused call raises
    o["seed"] = V.check_seed(q.get("seed", 0))
    o["first_member"] = V.check_first_member(q.get("first_member", 0), len(splits))
    o["rht"] = o["rht"] and o["columnwise"]
    return o


def _amax_mode(o: dict) -> str:
    if o["row_scaled"]:
        return "rows"
    return "rht" if o["rht"] else "tensor"


def _nvfp4_from_amax(t, splits, o: dict, amax) -> GroupedTensor:
    """GroupedTensor.quantize(t, splits, "nvfp4", **o) with the amax already computed."""
    from lowprec_moe.backends.cupy.nvfp4 import grouped_quantize_nvfp4

    parts = grouped_quantize_nvfp4(t, splits, amax=amax, **o)
    return GroupedTensor(format="nvfp4", shape=tuple(t.shape),
                         **_splits_fields(splits, parts), row_scaled=o["row_scaled"],
                         block_2d=o["block_2d"], rht=o["rht"],
                         stochastic_rounding=o["stochastic_rounding"], seed=o["seed"],
                         first_member=o["first_member"], **parts)


def _fusable_mxfp8(q: dict | None, act: Activation, f: int, backward: bool) -> bool:
    if q is None or q["format"] != "mxfp8" or q.get("block_2d"):
        return False
    if f % 32:
        return False
    if backward and act.glu_interleave is not None and act.glu_interleave % 32:
        return False
    return True


# ============================================================================================
# forward


def activation_forward(h, activation="swiglu", probs=None, *, splits=None, glu_interleave=None,
                       limit=None, alpha=None, quantize: dict | None = None, fused: bool = True):
    """``z = act(h) * probs`` rounded to h's dtype, or quantized for the next GEMM.

    Parameters
    ----------
    h : array ``[M, 2F]`` (GLU) or ``[M, F]`` (srelu); float32 / float16 / bfloat16
    activation : str or Activation
        "swiglu", "clamped_swiglu" or "srelu".
    probs : array ``[M]``, optional
        Routing weights multiplying the activation output (fp32 product).
    splits : sequence of int, or 1-D cupy integer array, optional
        Rows per expert (needed with ``quantize``; default one group). A device array (GPU) is
        not read back (NUMERICS §7.5); a quantized result then has device splits.
    glu_interleave, limit, alpha
        As in :func:`make_activation`.
    quantize : dict, optional
        ``GroupedTensor.quantize`` options plus ``"format"``, e.g.
        ``{"format": "mxfp8", "rowwise": True, "columnwise": True}``: the result is then the
        GroupedTensor of ``z`` (split by ``splits``).
    fused : bool
        GPU only: allow the fused activation + MXFP8 quantize kernel, and the NVFP4 amax taken
        by the activation kernel (same bytes either way).

    Returns
    -------
    array ``[M, F]`` of h's dtype, or GroupedTensor.
    """
    act = make_activation(activation, glu_interleave, limit, alpha)
    h, m, f, splits = _check_common(h, probs, splits, act, None)
    q = _check_quantize(quantize, f, "z")
    xp = get_xp(h, probs)
    if xp is np:
        z = _ref.forward(h, act, probs)
        return z if q is None else _quantize_grouped(z, splits, q)
    from lowprec_moe.backends.cupy import activation as _cu

    p32 = _probs32(probs, xp)
    if fused and _fusable_mxfp8(q, act, f, backward=False):
        fp8 = q.get("fp8_dtype", "e4m3")
        V.check_fp8_dtype(fp8)
        parts = _cu.activation_forward(h, splits, act, p32, f, mxfp8=dict(
            rowwise=q.get("rowwise", True), columnwise=q.get("columnwise", False),
            fp8_dtype=fp8))
        return _gt_from_parts(parts, (m, f), splits, fp8)
    nv = _fusable_nvfp4(q, h.dtype, splits) if fused else None
    if nv is not None:
        z, amax = _cu.activation_forward(h, splits, act, p32, f, amax=_amax_mode(nv))
        return _nvfp4_from_amax(z, splits, nv, amax)
    z = _cu.activation_forward(h, splits, act, p32, f)
    return z if q is None else _quantize_grouped(z, splits, q)


# ============================================================================================
# backward


def activation_backward(dz, h, activation="swiglu", probs=None, *, splits=None,
                        glu_interleave=None, limit=None, alpha=None,
                        quantize: dict | None = None, want_dh: bool | None = None,
                        want_dprobs: bool = True, want_dbias: bool = False,
                        fused: bool = True) -> ActivationGrads:
    """Gradient of :func:`activation_forward` w.r.t. ``h`` (and probs).

    Parameters
    ----------
    dz : array ``[M, F]``
        Gradient of ``z``, of h's dtype.
    h : array ``[M, 2F]`` or ``[M, F]``
        The saved pre-activation.
    activation, probs, splits, glu_interleave, limit, alpha
        As in :func:`activation_forward`.
    quantize : dict, optional
        Quantize ``dh`` (``GroupedTensor.quantize`` options plus ``"format"``).
    want_dh : bool, optional
        Also return ``dh`` in h's dtype. Default: when ``quantize`` is None. (With fused MXFP8
        quantization ``dh`` is otherwise never written to memory.)
    want_dprobs : bool
        Return ``dprobs`` (when probs are given).
    want_dbias : bool
        Return the per-expert column sums of ``dh`` (float32 ``[G, W]``; the bias gradient of
        the GEMM that produced h).
    fused : bool
        GPU only: allow the fused activation-backward + MXFP8 quantize kernel, and the NVFP4
        amax of ``dh`` taken by the activation kernel.

    Returns
    -------
    ActivationGrads
    """
    act = make_activation(activation, glu_interleave, limit, alpha)
    h, m, f, splits = _check_common(h, probs, splits, act, None)
    V.check_array("dz", dz)
    dz = V.as_2d(dz)
    if tuple(dz.shape) != (m, f):
        raise ValueError(f"dz.shape={tuple(dz.shape)} must be (M, F)={(m, f)}")
    if V.dtype_name(dz.dtype) != V.dtype_name(h.dtype):
        raise TypeError(f"dz.dtype={V.dtype_name(dz.dtype)} must match h.dtype="
                        f"{V.dtype_name(h.dtype)}")
    w = h.shape[1]
    q = _check_quantize(quantize, w, "dh")
    if want_dh is None:
        want_dh = q is None
    xp = get_xp(h, dz, probs)
    want_dprobs = bool(want_dprobs) and probs is not None
    if xp is np:
        dh, dprobs = _ref.backward(dz, h, act, probs, want_dprobs=want_dprobs)
        dbias = grouped_colsum(dh, splits) if want_dbias else None
        dhq = None if q is None else _quantize_grouped(dh, splits, q)
        return ActivationGrads(dh=dh if want_dh else None, dh_quantized=dhq,
                               dprobs=dprobs, dbias=dbias)
    from lowprec_moe.backends.cupy import activation as _cu

    p32 = _probs32(probs, xp)
    if fused and _fusable_mxfp8(q, act, f, backward=True):
        fp8 = q.get("fp8_dtype", "e4m3")
        V.check_fp8_dtype(fp8)
        r = _cu.activation_backward(dz, h, splits, act, p32, f, want_dh=want_dh,
                                    want_dprobs=want_dprobs, want_dbias=want_dbias,
                                    mxfp8=dict(rowwise=q.get("rowwise", True),
                                               columnwise=q.get("columnwise", False),
                                               fp8_dtype=fp8))
        dhq = _gt_from_parts(r["parts"], (m, w), splits, fp8)
        return ActivationGrads(dh=r["dh"], dh_quantized=dhq, dprobs=r["dprobs"],
                               dbias=r["dbias"])
    nv = _fusable_nvfp4(q, h.dtype, splits) if fused else None
    r = _cu.activation_backward(dz, h, splits, act, p32, f, want_dh=want_dh or q is not None,
                                want_dprobs=want_dprobs, want_dbias=want_dbias,
                                amax=None if nv is None else _amax_mode(nv))
    if nv is not None:
        dhq = _nvfp4_from_amax(r["dh"], splits, nv, r["amax"])
    else:
        dhq = None if q is None else _quantize_grouped(r["dh"], splits, q)
    return ActivationGrads(dh=r["dh"] if want_dh else None, dh_quantized=dhq,
                           dprobs=r["dprobs"], dbias=r["dbias"])

