"""The validated form of a grouped GEMM call (:class:`GemmProblem`) and the checks that build it
(NUMERICS §9: one block, ``ValueError`` / ``TypeError`` naming the argument). The public entry
points are in :mod:`lowprec_moe.gemm`; the backends take a ``GemmProblem``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowprec_moe import _validate as V
from lowprec_moe import quant_formats
from lowprec_moe.backend import get_xp, is_cupy_array
from lowprec_moe.tensors.grouped_tensor import GroupedTensor

__all__ = ["GemmProblem", "MODES", "OUT_DTYPES", "validate"]

MODES = ("fprop", "dgrad", "wgrad")
OUT_DTYPES = ("float32", "bfloat16", "float16")

#: epilogue scaling: none (high precision, MXFP8), NVFP4 per tensor, NVFP4 row-scaled.
SCALE_NONE, SCALE_TENSOR, SCALE_ROWS = 0, 1, 2


@dataclass(frozen=True)
class GemmProblem:
    """A validated grouped GEMM, as handed to the NumPy or CuPy backend.

    Attributes
    ----------
    mode : {"fprop", "dgrad", "wgrad"}
    fmt : {"hp", "nvfp4", "mxfp8"}
        ``"hp"``: high-precision arrays (``hp_dtype`` says which).
    a : array or GroupedTensor
        The token-side operand: fprop ``x``, dgrad / wgrad ``dy`` (2-D when an array).
    b : array or GroupedTensor
        fprop / dgrad: the weight (``[G, N, K]`` array, or GroupedTensor of ``[G*N, K]``);
        wgrad: ``x`` (2-D array or GroupedTensor).
    splits : tuple of int or None
        Tokens per expert (None with ``device_splits``).
    offsets : numpy.ndarray or None
        int64 ``[G+1]`` token offsets (None with ``device_splits``).
    m_total, n, k : int
        Tokens, weight rows (out features) and weight columns (in features).
    out_shape : tuple
    out_dtype : str
    bias : array or None
        float32 ``[G, N]`` (fprop only).
    probs : array or None
        float32 ``[M_total]`` (fprop only, with bias).
    out : array or None
        Caller's output buffer.
    accumulate : bool
    scale_mode : int
        0 none, 1 NVFP4 per tensor, 2 NVFP4 row-scaled (either side per row / column).
    hp_dtype : str or None
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` for ``fmt == "hp"``.
    on_gpu : bool
    device_splits : cupy.ndarray or None
        int64 ``[G]`` tokens per expert on the operands' device, when the caller passed them
        there (``splits`` and ``offsets`` are then None; NUMERICS §7.5).
    """

    mode: str
    fmt: str
    a: Any
    b: Any
    splits: tuple
    offsets: np.ndarray
    m_total: int
    n: int
    k: int
    out_shape: tuple
    out_dtype: str
    bias: Any = None
    probs: Any = None
    out: Any = None
    accumulate: bool = False
    scale_mode: int = SCALE_NONE
    hp_dtype: str | None = None
    on_gpu: bool = False
    device_splits: Any = None

    @property
    def num_groups(self) -> int:
        if self.splits is None:
            return int(self.device_splits.size)
        return len(self.splits)


# ============================================================================================
# Validation (NUMERICS §9: one block, ValueError / TypeError naming the argument)

_NAMES = {"fprop": ("x", "weight"), "dgrad": ("dy", "weight"), "wgrad": ("dy", "x")}
_COPY = {"fprop": ("rowwise", "rowwise"), "dgrad": ("rowwise", "columnwise"),
         "wgrad": ("columnwise", "columnwise")}


def _gt_arrays(g: GroupedTensor) -> list:
    return [a for a in (g.rowwise_data, g.rowwise_scale, g.columnwise_data, g.columnwise_scale,
                        g.amax_rowwise, g.amax_columnwise) if a is not None]


def _is_array(a) -> bool:
    return isinstance(a, np.ndarray) or is_cupy_array(a)


def _describe(a) -> str:
    if isinstance(a, GroupedTensor):
        return f"a GroupedTensor ({a.format})"
    if _is_array(a):
        return f"an array ({V.dtype_name(a.dtype)})"
    return type(a).__name__


def validate(mode, a, b, splits, *, bias, probs, out_dtype, out, accumulate) -> GemmProblem:
    an, bn = _NAMES[mode]
    a_copy, b_copy = _COPY[mode]
    a_q, b_q = isinstance(a, GroupedTensor), isinstance(b, GroupedTensor)
    for name, v, q in ((an, a, a_q), (bn, b, b_q)):
        if not q and not _is_array(v):
            raise TypeError(f"{name} must be a numpy / cupy array or a GroupedTensor, "
                            f"got {type(v).__name__}")
    if a_q != b_q:
        raise TypeError(f"{an} is {_describe(a)} but {bn} is {_describe(b)}: formats mixed; "
                        "quantize both operands (same format) or neither")
    if not isinstance(accumulate, (bool, np.bool_)):
        raise TypeError(f"accumulate={accumulate!r} must be a bool")
    accumulate = bool(accumulate)

    # ---- backend: no NumPy / CuPy mixing, one GPU
    arrays = []
    for v, q in ((a, a_q), (b, b_q)):
        arrays += _gt_arrays(v) if q else [v]
    arrays += [bias, probs, out]
    xp = get_xp(*arrays)
    on_gpu = xp is not np

    # ---- operands
    hp_dtype = None
    if not a_q:
        fmt = "hp"
        V.check_array(an, a)
        V.check_array(bn, b, min_rank=2)
        if V.dtype_name(a.dtype) != V.dtype_name(b.dtype):
            raise TypeError(f"{an}.dtype={V.dtype_name(a.dtype)} and {bn}.dtype="
                            f"{V.dtype_name(b.dtype)} differ; high-precision operands must share "
                            "one dtype")
        hp_dtype = V.dtype_name(a.dtype)
        a2 = V.as_2d(a)
        m_total = int(a2.shape[0])
        if mode == "wgrad":
            b2 = V.as_2d(b)
            n, k = int(a2.shape[1]), int(b2.shape[1])
            if b2.shape[0] != m_total:
                raise ValueError(f"dy has M={m_total} rows but x has M={b2.shape[0]} rows")
            num_w = None
        else:
            if b.ndim != 3:
                raise ValueError(f"weight must be [G, N, K] (rank 3), got shape {tuple(b.shape)}")
            b2 = xp.ascontiguousarray(b)
            num_w, n, k = (int(s) for s in b.shape)
            contr = k if mode == "fprop" else n
            if a2.shape[1] != contr:
                dim = "K" if mode == "fprop" else "N"
                raise ValueError(f"{an} has {dim}={a2.shape[1]} columns but weight has "
                                 f"{dim}={contr} (weight.shape={tuple(b.shape)}): "
                                 f"{dim} mismatch")
        a_op, b_op = a2, b2
    else:
        if a.format != b.format:
            raise ValueError(f"{an}.format={a.format!r} and {bn}.format={b.format!r}: formats "
                             "mixed; both operands must use one format")
        fmt = a.format
        for name, v, copy in ((an, a, a_copy), (bn, b, b_copy)):
            have = v.rowwise_data if copy == "rowwise" else v.columnwise_data
            if have is None:
                opt = "rowwise=True" if copy == "rowwise" else "columnwise=True"
                raise ValueError(f"{mode} needs the {copy} copy of {name}; quantize it with {opt}")
        m_total = int(a.shape[0])
        if mode == "wgrad":
            n, k = int(a.shape[1]), int(b.shape[1])
            if b.shape[0] != m_total:
                raise ValueError(f"dy has M={m_total} rows but x has M={b.shape[0]} rows")
            if a.splits_on_device != b.splits_on_device:
                raise ValueError("dy and x must both have host splits or both device splits")
            if a.splits_on_device and a.num_groups != b.num_groups:
                raise ValueError(f"dy has {a.num_groups} experts but x has {b.num_groups}")
            if not a.splits_on_device and tuple(a.splits) != tuple(b.splits):
                raise ValueError(f"dy.splits={list(a.splits)} and x.splits={list(b.splits)} "
                                 "differ")
            if bool(a.rht) != bool(b.rht):
                raise ValueError(f"dy.rht={bool(a.rht)} but x.rht={bool(b.rht)}: the Hadamard "
                                 "transform cancels in dy^T x only when both columnwise copies "
                                 "carry it")
            num_w = None
        else:
            num_w = b.num_groups
            w_splits = tuple(b.splits)
            if len(set(w_splits)) > 1:
                raise ValueError(f"weight.splits={list(w_splits)} must all be equal (N rows per "
                                 "expert): pass the [G*N, K] weight with splits [N] * G")
            n = w_splits[0] if w_splits else 0
            k = int(b.shape[1])
            contr = k if mode == "fprop" else n
            if int(a.shape[1]) != contr:
                dim = "K" if mode == "fprop" else "N"
                raise ValueError(f"{an} has {dim}={a.shape[1]} columns but weight has "
                                 f"{dim}={contr}: {dim} mismatch")
            if mode == "dgrad" and b.rht:
                raise ValueError("weight.rht=True: the weight's columnwise copy is "
                                 "Hadamard-transformed; dgrad needs an untransformed copy")
        a_op, b_op = a, b

    # ---- splits
    device_splits = None
    if a_q and a.splits_on_device and not (splits is None or is_cupy_array(splits)):
        raise ValueError(f"{an} has device splits but splits are host values: pass "
                         "splits=None (or the device array)")
    if a_q and not a.splits_on_device and is_cupy_array(splits):
        raise ValueError(f"{an} has host splits but splits is a device array: pass the host "
                         f"splits, or quantize {an} with the device splits")
    if a_q and a.splits_on_device:
        # the tensor's own splits: its buffers are laid out by them (values not compared)
        if splits is not None and splits.size != a.num_groups:
            raise ValueError(f"splits has {splits.size} entries but {an} was quantized with "
                             f"{a.num_groups} experts")
        splits = a.splits
    if splits is None:
        if not a_q:
            raise ValueError(f"splits=None: pass the tokens per expert (splits) when {an} is a "
                             "plain array")
        splits = a.splits
    if is_cupy_array(splits):
        device_splits = _check_device_splits(splits, an, on_gpu,
                                             a.rowwise_data if a_q and a.rowwise_data is not None
                                             else a.columnwise_data if a_q else a)
        splits = None
        g_count = int(device_splits.size)
        if mode == "wgrad" and accumulate:
            raise NotImplementedError("accumulate=True with device splits is not implemented "
                                      "for wgrad (an expert without tokens must leave its "
                                      "block of out untouched, which needs its count on the "
                                      "host)")
    else:
        splits = V.check_splits(splits, m_total)
        if a_q and tuple(a.splits) != splits:
            raise ValueError(f"splits={list(splits)} differ from {an}.splits={list(a.splits)}")
        g_count = len(splits)
    if num_w is not None and num_w != g_count:
        raise ValueError(f"weight has G={num_w} experts but splits has G={g_count} entries: "
                         "mismatched expert count")
    if n <= 0 or k <= 0:
        raise ValueError(f"N={n} and K={k} must be positive")
    offsets = (None if splits is None else
               np.fromiter(itertools.accumulate(splits, initial=0), np.int64, g_count + 1))

    # ---- bias / probs (fprop only)
    if bias is not None:
        V.check_array("bias", bias, min_rank=1)
        if tuple(bias.shape) != (g_count, n):
            if bias.ndim == 2 and bias.shape[0] != g_count:
                raise ValueError(f"bias has G={bias.shape[0]} experts but splits has "
                                 f"G={g_count} entries: mismatched expert count")
            raise ValueError(f"bias.shape={tuple(bias.shape)} must be (G, N)={(g_count, n)}")
        bias = xp.ascontiguousarray(bias).astype(xp.float32)
    if probs is not None:
        if bias is None:
            raise ValueError("probs scales the bias (+ bias[n] * probs[m]); pass bias too")
        V.check_array("probs", probs, min_rank=1)
        if probs.size != m_total or not (probs.ndim == 1 or (probs.ndim == 2
                                                             and probs.shape[1] == 1)):
            raise ValueError(f"probs.shape={tuple(probs.shape)} must be (M,)=({m_total},)")
        probs = xp.ascontiguousarray(probs).reshape(-1).astype(xp.float32)

    # ---- output
    out_shape = (m_total, n) if mode == "fprop" else (m_total, k) if mode == "dgrad" \
        else (g_count, n, k)
    if out_dtype is not None:
        od = out_dtype if isinstance(out_dtype, str) else _dtype_name_or_none(out_dtype)
        if od not in OUT_DTYPES:
            raise ValueError(f"out_dtype={out_dtype!r} must be one of {OUT_DTYPES}")
        out_dtype = od
    if out is not None:
        if not _is_array(out):
            raise TypeError(f"out must be a numpy / cupy array, got {type(out).__name__}")
        od = V.dtype_name(out.dtype)
        if od not in OUT_DTYPES:
            raise TypeError(f"out.dtype={od} is not supported; use one of {OUT_DTYPES}")
        if out_dtype is not None and out_dtype != od:
            raise ValueError(f"out_dtype={out_dtype!r} but out.dtype={od}")
        out_dtype = od
        if tuple(out.shape) != out_shape:
            raise ValueError(f"out.shape={tuple(out.shape)} must be {out_shape}")
        if not out.flags.c_contiguous:
            raise ValueError("out must be C-contiguous")
    if accumulate:
        if out is None:
            raise ValueError("accumulate=True needs an out buffer (float32) to add into")
        if out_dtype != "float32":
            raise TypeError(f"accumulate=True needs a float32 out buffer, got out.dtype="
                            f"{out_dtype}")
    if out_dtype is None:
        out_dtype = hp_dtype if fmt == "hp" else "float32"

    scale_mode = SCALE_NONE
    if fmt != "hp" and quant_formats.get(fmt).has_amax:  # a second-level fp32 scale
        scale_mode = SCALE_ROWS if (a.row_scaled or b.row_scaled) else SCALE_TENSOR

    return GemmProblem(mode=mode, fmt=fmt, a=a_op, b=b_op, splits=splits, offsets=offsets,
                       m_total=m_total, n=n, k=k, out_shape=out_shape, out_dtype=out_dtype,
                       bias=bias, probs=probs, out=out, accumulate=accumulate,
                       scale_mode=scale_mode, hp_dtype=hp_dtype, on_gpu=on_gpu,
                       device_splits=device_splits)


def _check_device_splits(splits, an: str, on_gpu: bool, a):
    """int64 contiguous device splits of a GPU problem (values are not read: see NUMERICS
    §7.5), or TypeError / ValueError naming what does not fit."""
    if not on_gpu:
        raise TypeError("splits is a cupy array but the operands are numpy arrays; pass host "
                        "splits (list, tuple or numpy array)")
    return V.check_device_splits(splits, a, an)


def _dtype_name_or_none(dt) -> str | None:
    try:
        return V.dtype_name(dt)
    except TypeError:
        return None
