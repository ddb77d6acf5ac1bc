"""GroupedMLP activations, NumPy reference (NUMERICS §8).

This module defines the exact arithmetic of the activations; the CUDA kernels
(``raw_kernels/activation/activation.cu``, arithmetic in ``activation_math.cuh``) perform the same fp32
operations in the same order and give the same bits.

Semantics: fp32 math, every operation rounded once (IEEE round-to-nearest-even, subnormals kept,
no fused multiply-add), in the order written below. bfloat16 / float16 inputs are upcast exactly;
the result is rounded once to the layer dtype.

The exponential
---------------
A library ``expf`` (NumPy's SIMD one, CUDA's) is not reproducible across backends: results may
differ by an ulp. The activations therefore use their own fp32 exponential, built from basic
IEEE operations only, which both backends evaluate identically::

    exp(x):  NaN -> NaN;  x is clamped to [-104, 89] (exp(-104) rounds to 0, exp(89) to inf)
             n = rint(x * log2(e))                 (rint through + 1.5*2^23 - 1.5*2^23)
             r = (x - n * LN2_HI) - n * LN2_LO     (Cody-Waite: n * LN2_HI and the difference
                                                    are exact)
             p = 1 + r (1 + r (1/2 + r (1/6 + ... + r / 5040)))   (Horner: mul, then add)
             exp = (p * 2^(n >> 1)) * 2^(n - (n >> 1))            (one rounding, possibly to a
                                                                    subnormal)

It is within 2 ulp of the exact exponential over the normal range (tested). Consequently the GPU
and the NumPy results of every activation value and element gradient are **bit-identical**; only
reductions (``dprobs``, bias gradients) are summed in a different order on the two backends.

Activations (``g`` = gate, ``l`` = linear half, all fp32; ``sigmoid(t) = 1 / (1 + exp(-t))``)
---------------------------------------------------------------------------------------------------
* ``swiglu``: ``s = sigmoid(g)``, ``a = (g * s) * l``; backward with ``da``:
  ``dl = da * (g * s)``, ``dg = (da * l) * (s * (1 + g * (1 - s)))``.
* ``clamped_swiglu`` (GPT-OSS; ``limit`` = 7, ``alpha`` = 1.702 by default):
  ``gc = g > limit ? limit : g``, ``lc = clamp(l, -limit, limit)``, ``t = alpha * gc``,
  ``s = sigmoid(t)``, ``a = (gc * s) * (lc + 1)``; backward: ``dl = da * (gc * s)`` where
  ``-limit <= l <= limit`` (else 0), ``dg = (da * (lc + 1)) * (s * (1 + t * (1 - s)))`` where
  ``g <= limit`` (else 0).
* ``srelu``: ``a = g <= 0 ? 0 : g * g``; backward ``dg = g <= 0 ? 0 : (g + g) * da``.

NaN inputs give NaN outputs (the NaN's bit pattern is not specified).

Column layout of the GLU input (fc1's output, ``2F`` columns): gate columns first, then the
linear ones; with ``glu_interleave = I`` the columns alternate in blocks of ``I``:
``[gate 0:I | lin 0:I | gate I:2I | lin I:2I | ...]``.

Routing probabilities: ``z = round(a * p[m])`` (fp32 product, one rounding to the layer dtype); in
the backward ``da = dz * p[m]`` and ``dprobs[m] = sum_f a_f * dz_f`` (fp32 products, summed here in
float64 and rounded to fp32).
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F

ACTIVATIONS = ("swiglu", "clamped_swiglu", "srelu")
GLU_ACTIVATIONS = ("swiglu", "clamped_swiglu")


def _f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


# fp32 bit patterns of the constants; raw_kernels/activation/activation_math.cuh defines the same (tested).
EXP_CONST_BITS = {
    "LOG2E": 0x3FB8AA3B,      # fp32(log2(e))
    "LN2_HI": 0x3F317200,     # 0.693145751953125 (15 significant bits)
    "LN2_LO": 0x35BFBE8E,     # fp32(ln(2) - LN2_HI)
    "RINT_MAGIC": 0x4B400000,  # 1.5 * 2^23
    "EXP_MAX_IN": 0x42B20000,  # 89
    "EXP_MIN_IN": 0xC2D00000,  # -104
    "C2": 0x3F000000,         # 1/2
    "C3": 0x3E2AAAAB,         # fp32(1/6)
    "C4": 0x3D2AAAAB,         # fp32(1/24)
    "C5": 0x3C088889,         # fp32(1/120)
    "C6": 0x3AB60B61,         # fp32(1/720)
    "C7": 0x39500D01,         # fp32(1/5040)
}
_C = {k: _f32(v) for k, v in EXP_CONST_BITS.items()}
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


def exp_f32(x) -> np.ndarray:
    """The activations' fp32 exponential (see the module docstring), elementwise."""
    x = np.asarray(x, dtype=np.float32)
    nan = np.isnan(x)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        xc = np.where(nan, _ZERO, x)
        xc = np.where(xc > _C["EXP_MAX_IN"], _C["EXP_MAX_IN"], xc)
        xc = np.where(xc < _C["EXP_MIN_IN"], _C["EXP_MIN_IN"], xc).astype(np.float32)
        t = xc * _C["LOG2E"]
        n = (t + _C["RINT_MAGIC"]) - _C["RINT_MAGIC"]
        r = xc - n * _C["LN2_HI"]
        r = r - n * _C["LN2_LO"]
        p = np.full_like(r, _C["C7"])
        for c in (_C["C6"], _C["C5"], _C["C4"], _C["C3"], _C["C2"], _ONE, _ONE):
            p = p * r + c
        ni = n.astype(np.int32)
        n1 = ni >> 1
        n2 = ni - n1
        s1 = ((n1 + F.FP32_EXP_BIAS).astype(np.uint32) << np.uint32(F.FP32_MANT_BITS)).view(np.float32)
        s2 = ((n2 + F.FP32_EXP_BIAS).astype(np.uint32) << np.uint32(F.FP32_MANT_BITS)).view(np.float32)
        out = (p * s1) * s2
    return np.where(nan, x, out).astype(np.float32)


def sigmoid_f32(t) -> np.ndarray:
    """``1 / (1 + exp_f32(-t))`` in fp32."""
    t = np.asarray(t, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        return (_ONE / (_ONE + exp_f32(-t))).astype(np.float32)


# ============================================================================================
# column layout


def glu_columns(f: int, interleave: int | None) -> tuple[np.ndarray, np.ndarray]:
    """int64 column indices of the gate and linear halves of a ``[*, 2F]`` GLU input."""
    idx = np.arange(f, dtype=np.int64)
    if interleave is None:
        return idx, idx + f
    gate = (idx // interleave) * (2 * interleave) + idx % interleave
    return gate, gate + interleave


def _split(h32: np.ndarray, act):
    if act.name in GLU_ACTIVATIONS:
        f = h32.shape[1] // 2
        gi, li = glu_columns(f, act.glu_interleave)
        return h32[:, gi], h32[:, li], (gi, li)
    return h32, None, None


# ============================================================================================
# element math (fp32 arrays in, fp32 arrays out)


def act_forward_f32(g: np.ndarray, l, act) -> np.ndarray:
    """The activation value ``a`` (fp32) from the gate (or unary input) ``g`` and linear ``l``."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if act.name == "swiglu":
            s = sigmoid_f32(g)
            return ((g * s) * l).astype(np.float32)
        if act.name == "clamped_swiglu":
            lim, alpha = np.float32(act.limit), np.float32(act.alpha)
            gc = np.where(g > lim, lim, g).astype(np.float32)
            lc = np.where(l > lim, lim, np.where(l < -lim, -lim, l)).astype(np.float32)
            s = sigmoid_f32(alpha * gc)
            return ((gc * s) * (lc + _ONE)).astype(np.float32)
        if act.name == "srelu":
            return np.where(g <= _ZERO, _ZERO, g * g).astype(np.float32)
    raise ValueError(f"activation={act.name!r} must be one of {ACTIVATIONS}")


def act_backward_f32(g: np.ndarray, l, da: np.ndarray, act):
    """``(dg, dl)`` (fp32; ``dl`` None for unary activations) from the fp32 ``da``."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if act.name == "swiglu":
            s = sigmoid_f32(g)
            silu = g * s
            dl = da * silu
            dsilu = s * (_ONE + g * (_ONE - s))
            dg = (da * l) * dsilu
            return dg.astype(np.float32), dl.astype(np.float32)
        if act.name == "clamped_swiglu":
            lim, alpha = np.float32(act.limit), np.float32(act.alpha)
            gc = np.where(g > lim, lim, g).astype(np.float32)
            lc = np.where(l > lim, lim, np.where(l < -lim, -lim, l)).astype(np.float32)
            t = alpha * gc
            s = sigmoid_f32(t)
            glu = gc * s
            dl = np.where((l >= -lim) & (l <= lim), da * glu, _ZERO)
            dsg = s * (_ONE + t * (_ONE - s))
            dg = np.where(g <= lim, (da * (lc + _ONE)) * dsg, _ZERO)
            return dg.astype(np.float32), dl.astype(np.float32)
        if act.name == "srelu":
            dg = np.where(g <= _ZERO, _ZERO, (g + g) * da)
            return dg.astype(np.float32), None
    raise ValueError(f"activation={act.name!r} must be one of {ACTIVATIONS}")


# ============================================================================================
# layer-level functions


def _cast(a32: np.ndarray, dtype) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return a32.astype(dtype)


def forward(h: np.ndarray, act, probs=None) -> np.ndarray:
    """``z = round(act(h) * probs)`` of h's dtype; h is ``[M, 2F]`` (GLU) or ``[M, F]``."""
    h32 = h.astype(np.float32)
    g, l, _ = _split(h32, act)
    a = act_forward_f32(g, l, act)
    if probs is not None:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            a = (a * np.asarray(probs, dtype=np.float32)[:, None]).astype(np.float32)
    return _cast(a, h.dtype)


def backward(dz: np.ndarray, h: np.ndarray, act, probs=None, *, want_dprobs: bool = True):
    """``(dh, dprobs)``: dh of h's dtype ``[M, W]``; dprobs float32 ``[M]`` (None without probs
    or when not wanted) = ``sum_f a_f * dz_f`` (the activation's share of the routing gradient).
    """
    h32 = h.astype(np.float32)
    dz32 = dz.astype(np.float32)
    g, l, cols = _split(h32, act)
    p = None if probs is None else np.asarray(probs, dtype=np.float32)[:, None]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        da = dz32 if p is None else (dz32 * p).astype(np.float32)
        dg, dl = act_backward_f32(g, l, da, act)
        dprobs = None
        if p is not None and want_dprobs:
            a = act_forward_f32(g, l, act)
            prod = (a * dz32).astype(np.float32)
            dprobs = prod.astype(np.float64).sum(axis=1).astype(np.float32)
    if cols is None:
        dh32 = dg
    else:
        dh32 = np.empty_like(h32)
        dh32[:, cols[0]] = dg
        dh32[:, cols[1]] = dl
    return _cast(dh32, h.dtype), dprobs
