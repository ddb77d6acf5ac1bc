"""Grouped (Mixture-of-Experts) GEMMs on high-precision or quantized operands (NUMERICS §7).

Three entry points cover the three GEMMs of a grouped linear layer; expert ``g`` owns the rows
``offsets[g]:offsets[g+1]`` of the token-major tensors (``offsets = [0, cumsum(splits)]``) and the
weight ``W_g = weight[g]`` of shape ``[N, K]``:

=========  ======================  ================================  ==========================
function   math per expert g       operands (quantized copy used)    grouping
=========  ======================  ================================  ==========================
fprop      ``y_g = x_g W_g^T``     x rowwise, W rowwise              M-grouped  -> ``[M, N]``
dgrad      ``dx_g = dy_g W_g``     dy rowwise, W columnwise          M-grouped  -> ``[M, K]``
wgrad      ``dW_g = dy_g^T x_g``   dy columnwise, x columnwise       K-grouped  -> ``[G, N, K]``
=========  ======================  ================================  ==========================

Operands
--------
Either both operands are high-precision arrays, or both are quantized (same format):

* high precision: float32 / float16 / bfloat16 arrays of one dtype. ``x`` / ``dy`` are
  ``[M_total, K]`` / ``[M_total, N]`` (rank > 2 is flattened to 2-D), ``weight`` is ``[G, N, K]``.
* quantized: ``x`` / ``dy`` are :class:`~lowprec_moe.GroupedTensor` s split by ``splits``; the
  weight is a ``GroupedTensor`` of the ``[G*N, K]`` stacked weight with splits ``[N] * G``. The
  copy named in the table must be present (e.g. ``GroupedTensor.quantize(w.reshape(-1, K),
  [N] * G, "nvfp4", columnwise=True, block_2d=True)``). NVFP4 or MXFP8 on both sides; MXFP8
  operands may mix E4M3 and E5M2 ("hybrid"). Row-scaled NVFP4 is honoured on either side.

Device splits
-------------
On the GPU ``splits`` may be a 1-D CuPy integer array on the operands' device (the router's
token counts, say); quantized token operands must then be GroupedTensors quantized with device
splits, and their own splits are used (``splits`` may be None; given, it must name as many
experts, and its values are not compared). The call then never reads them back: output
shapes come from ``M_total``, and the launch tables are built on the device. They are not
checked (that would need a device-to-host copy): negative counts act as 0 and counts past
``M_total`` are cut there, so no row outside the tensors is ever addressed (output rows past the
cut splits are not written). Valid device splits give the same bits as the same host splits
(NUMERICS §7.5). Such calls run a kernel that computes every split of the experts' rows from
the device-built tables with tensor maps that do not depend on the split: the persistent and
row-pair kernels, whose schedules or maps are built from host splits, are left out (so NVFP4
runs its per-tile TMA kernels instead of the persistent ones). wgrad with ``accumulate=True``
raises ``NotImplementedError``.

Numerics
--------
Operands are dequantized exactly (NVFP4 ``e2m1 * e4m3``, MXFP8 ``fp8 * 2**k``, without the global
fp32 factors), multiplied with fp32 accumulation, then the epilogue runs in fp32 in this order:
NVFP4 scaling (per tensor ``acc * ((amax_a * amax_b) * fp32(1/NVFP4_GEMM_FACTOR))``, or row-scaled
``(acc * fp32(1/NVFP4_GEMM_FACTOR)) * (amax_row[m] * amax_col[n])``), bias (``+ bias[n]`` or
``+ bias[n] * probs[m]``), then one rounding to the output dtype or ``out += t`` in fp32.
Results are deterministic, and a grouped call equals one call per expert bit for bit. wgrad
writes zeros for experts without tokens. The NumPy path is :mod:`lowprec_moe.backends.numpy.gemm`; the
CuPy path (:mod:`lowprec_moe.backends.cupy.gemm.launch`) runs one kernel launch for all experts.

GPU kernels (``raw_kernels/grouped_gemm_*.cu``): the packed NVFP4 / MXFP8 bytes and scales are
staged in shared memory and expanded there to fp16 (NVFP4: ``e2m1 * e4m3`` is exact in fp16) or
bf16 (MXFP8), then multiplied on tensor cores with fp32 accumulation -- ``wgmma`` on sm_90,
``mma.sync`` elsewhere; bf16 / fp16 operands go straight to the tensor cores; float32 operands
take an fp32 SIMT kernel (exact fp32 products, fp32 accumulation). The one deviation from exact
dequantization: MXFP8 blocks whose values lie below bf16's normal range (E4M3 scale code < 3,
block amax below ~1e-35; E5M2: code < 10) are truncated onto bf16's subnormal grid.

Output dtype: ``out_dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``); by default the input
dtype for high-precision operands and ``"float32"`` for quantized ones. ``out`` receives the
result in place (C-contiguous, exact shape and dtype); with ``accumulate=True`` it must be a
float32 buffer and the result is added to it (``out = out + t``, one fp32 rounding).

Examples
--------
>>> import numpy as np, lowprec_moe as lpm
>>> from lowprec_moe.gemm import grouped_gemm_fprop
>>> x = np.random.default_rng(0).standard_normal((48, 64)).astype(np.float32)
>>> w = np.random.default_rng(1).standard_normal((3, 32, 64)).astype(np.float32)
>>> grouped_gemm_fprop(x, w, [16, 0, 32]).shape
(48, 32)
>>> xq = lpm.GroupedTensor.quantize(x, [16, 0, 32], "nvfp4")
>>> wq = lpm.GroupedTensor.quantize(w.reshape(-1, 64), [32] * 3, "nvfp4", block_2d=True)
>>> grouped_gemm_fprop(xq, wq, [16, 0, 32]).dtype
dtype('float32')
"""

from __future__ import annotations

from lowprec_moe.gemm_problem import MODES, OUT_DTYPES, GemmProblem
from lowprec_moe.gemm_problem import validate as _validate

__all__ = [
    "GemmProblem",
    "grouped_gemm",
    "grouped_gemm_dgrad",
    "grouped_gemm_fprop",
    "grouped_gemm_wgrad",
    "MODES",
    "OUT_DTYPES",
]


# ============================================================================================
# Public API


def grouped_gemm_fprop(x, weight, splits=None, *, bias=None, probs=None, out_dtype=None,
                       out=None, accumulate: bool = False, kernel: str = "auto"):
    """Forward GEMM ``y_g = x_g W_g^T`` for every expert (M-grouped).

    Parameters
    ----------
    x : array ``[M_total, K]`` or GroupedTensor (rowwise copy)
        Tokens, expert-major.
    weight : array ``[G, N, K]`` or GroupedTensor of ``[G*N, K]`` with splits ``[N]*G``
        (rowwise copy).
    splits : sequence of int, or 1-D cupy integer array, optional
        Tokens per expert (``G`` entries, summing to ``M_total``). Defaults to ``x.splits`` when
        ``x`` is a GroupedTensor (and must equal it when given). On the GPU they may be a
        device array (see "Device splits" above).
    bias : array ``[G, N]``, optional
        Added in fp32 after the NVFP4 scaling.
    probs : array ``[M_total]``, optional
        Scales the bias per token (``+ bias[n] * probs[m]``); needs ``bias``.
    out_dtype : {"float32", "bfloat16", "float16"}, optional
    out : array ``[M_total, N]``, optional
        Written in place (and returned).
    accumulate : bool
        Add into ``out`` (float32) instead of overwriting it.
    kernel : str
        GPU only: ``"auto"`` (the kernel config the selector ranks first, or the one set with
        :func:`lowprec_moe.config.gemm`) or the name of one config (for cross-checks and
        A/B runs; ``ValueError`` when it cannot compute the call). Ignored on the CPU.

    Returns
    -------
    array ``[M_total, N]`` (NumPy or CuPy like the inputs).
    """
    p = _validate("fprop", x, weight, splits, bias=bias, probs=probs, out_dtype=out_dtype,
                  out=out, accumulate=accumulate)
    return _run(p, kernel)


def grouped_gemm_dgrad(dy, weight, splits=None, *, out_dtype=None, out=None,
                       accumulate: bool = False, kernel: str = "auto"):
    """Data-gradient GEMM ``dx_g = dy_g W_g`` for every expert (M-grouped).

    Parameters
    ----------
    dy : array ``[M_total, N]`` or GroupedTensor (rowwise copy)
    weight : array ``[G, N, K]`` or GroupedTensor of ``[G*N, K]`` (columnwise copy, not
        Hadamard-transformed)
    splits, out_dtype, out, accumulate, kernel
        As in :func:`grouped_gemm_fprop`.

    Returns
    -------
    array ``[M_total, K]``.
    """
    p = _validate("dgrad", dy, weight, splits, bias=None, probs=None, out_dtype=out_dtype,
                  out=out, accumulate=accumulate)
    return _run(p, kernel)


def grouped_gemm_wgrad(dy, x, splits=None, *, out_dtype=None, out=None,
                       accumulate: bool = False, kernel: str = "auto"):
    """Weight-gradient GEMM ``dW_g = dy_g^T x_g`` for every expert (K-grouped).

    The contraction runs over each expert's tokens; an expert without tokens gets ``dW_g = 0``
    (left untouched with ``accumulate=True``).

    Parameters
    ----------
    dy : array ``[M_total, N]`` or GroupedTensor (columnwise copy)
    x : array ``[M_total, K]`` or GroupedTensor (columnwise copy)
        Quantized: both or neither Hadamard-transformed (the transform cancels in ``dy^T x``).
    splits, out_dtype, out, accumulate, kernel
        As in :func:`grouped_gemm_fprop`.

    Returns
    -------
    array ``[G, N, K]``.
    """
    p = _validate("wgrad", dy, x, splits, bias=None, probs=None, out_dtype=out_dtype, out=out,
                  accumulate=accumulate)
    return _run(p, kernel)


def grouped_gemm(a, b, splits=None, *, mode: str, **kwargs):
    """Dispatch to :func:`grouped_gemm_fprop`, ``_dgrad`` or ``_wgrad`` by ``mode``."""
    fns = {"fprop": grouped_gemm_fprop, "dgrad": grouped_gemm_dgrad, "wgrad": grouped_gemm_wgrad}
    if mode not in fns:
        raise ValueError(f"mode={mode!r} must be one of {MODES}")
    return fns[mode](a, b, splits, **kwargs)


def _run(p: GemmProblem, kernel: str):
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a str, got {type(kernel).__name__}")
    if p.on_gpu:
        from lowprec_moe.backends.cupy.gemm import launch

        return launch.grouped_gemm(p, kernel)
    from lowprec_moe.backends.numpy import gemm as reference

    return reference.grouped_gemm(p)
