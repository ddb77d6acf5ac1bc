"""Token dispatch and combine for expert parallelism (:mod:`lowprec_moe.ep`), one process.

Shapes: ``T`` tokens of hidden size ``K``, ``k`` experts per token (top-k), ``E`` experts,
``M = T * k`` dispatched rows, ``N`` the experts' output size.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowprec_moe import _validate as V
from lowprec_moe.backend import get_xp, is_cupy_array
from lowprec_moe.tensors.grouped_tensor import GroupedTensor
from lowprec_moe.tensors.quantized_tensor import quantize

_WIRES = ("mxfp8", "bf16")


@dataclass(frozen=True)
class DispatchHandle:
    """What :func:`combine` and the backward functions need of one :func:`dispatch`.

    Attributes
    ----------
    num_tokens, topk : int
        ``T`` and ``k``.
    token : array int64 ``[M]``
        The token of each dispatched row.
    position : array int64 ``[T, k]``
        The dispatched row of token ``t``'s copy for its ``j``-th expert.
    weights : array float32 ``[T, k]``
        The router's top-k weights.
    splits : tuple of int
        Dispatched rows per local expert.
    wire : {"mxfp8", "bf16"}
    """

    num_tokens: int
    topk: int
    token: Any
    position: Any
    weights: Any
    splits: tuple
    wire: str


def _check_group(group) -> None:
    if group is not None:
        raise NotImplementedError(
            "expert parallelism over several processes (an NCCL group) is not implemented yet; "
            "group=None runs every expert in this process")


def _check_wire(wire) -> str:
    if wire not in _WIRES:
        raise ValueError(f"wire={wire!r} must be one of {_WIRES}")
    return wire


def _bf16(xp):
    import ml_dtypes

    return ml_dtypes.bfloat16


def dispatch(x, topk_idx, topk_weights, num_experts: int, *, group=None, wire: str = "mxfp8",
             fp8_dtype: str = "e4m3"):
    """Sort token copies by expert, ready for the grouped layers.

    Parameters
    ----------
    x : array ``[T, K]`` (float32 / float16 / bfloat16)
    topk_idx : integer array ``[T, k]``
        Each token's experts, in ``[0, num_experts)``.
    topk_weights : float array ``[T, k]``
        Each token's routing weights (used by :func:`combine`).
    num_experts : int
    group : None
        One process (a multi-process group is not implemented yet).
    wire : {"mxfp8", "bf16"}
        ``"mxfp8"``: every token is quantized once, rowwise MXFP8 (``fp8_dtype`` elements), and
        its bytes are copied; ``"bf16"``: the bf16 rows.
    fp8_dtype : {"e4m3", "e5m2"}

    Returns
    -------
    tokens : GroupedTensor (wire ``"mxfp8"``) or bf16 array ``[M, K]``
        Rows sorted by expert; within an expert by token, then slot.
    splits : tuple of int
        Rows per expert (on the host: the grouped layers take host splits, so with CuPy inputs
        the counts are read back once here).
    handle : DispatchHandle
    """
    _check_group(group)
    _check_wire(wire)
    V.check_array("x", x)
    if x.ndim != 2:
        raise ValueError(f"x must be [T, K], got shape {tuple(x.shape)}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, numbers.Integral) \
            or num_experts < 1:
        raise ValueError(f"num_experts={num_experts!r} must be a positive int")
    xp = get_xp(x, topk_idx, topk_weights)
    t = int(x.shape[0])
    if topk_idx.ndim != 2 or topk_idx.shape[0] != t:
        raise ValueError(f"topk_idx must be [T={t}, k], got shape {tuple(topk_idx.shape)}")
    if not np.issubdtype(np.dtype(topk_idx.dtype), np.integer):
        raise TypeError(f"topk_idx.dtype={topk_idx.dtype} must be an integer dtype")
    if tuple(topk_weights.shape) != tuple(topk_idx.shape):
        raise ValueError(f"topk_weights.shape={tuple(topk_weights.shape)} must equal "
                         f"topk_idx.shape={tuple(topk_idx.shape)}")
    k = int(topk_idx.shape[1])
    flat = topk_idx.reshape(-1).astype(xp.int64)
    if flat.size and bool((flat < 0).any() | (flat >= num_experts).any()):
        raise ValueError(f"topk_idx holds experts outside [0, {num_experts})")
    n = t * k
    pair = xp.arange(n, dtype=xp.int64)
    # expert-major, then (token, slot): unique keys, so any sort gives this order
    order = xp.argsort(flat * max(n, 1) + pair)
    position = xp.empty(n, dtype=xp.int64)
    position[order] = pair
    token = order // max(k, 1)
    counts = xp.bincount(flat, minlength=num_experts)
    splits = tuple(int(c) for c in (counts.get() if is_cupy_array(counts) else counts))
    weights = xp.ascontiguousarray(topk_weights.astype(xp.float32))
    handle = DispatchHandle(t, k, token, position.reshape(t, k), weights, splits, wire)
    if wire == "mxfp8":
        q = quantize(x, "mxfp8", fp8_dtype=fp8_dtype)
        out = GroupedTensor.from_mxfp8_rowwise(q.rowwise_data[token], q.rowwise_scale[token],
                                               splits, fp8_dtype=fp8_dtype)
    else:
        out = x.astype(_bf16(xp), copy=False)[token]
    return out, splits, handle


def _check_rows(name, a, handle: DispatchHandle) -> None:
    V.check_array(name, a)
    m = handle.num_tokens * handle.topk
    if a.ndim != 2 or a.shape[0] != m:
        raise ValueError(f"{name} must be [M={m}, N] (the dispatched rows), got shape "
                         f"{tuple(a.shape)}")


def _weighted_sum(rows, handle: DispatchHandle, scale: bool):
    """Per token, the sum over its k copies (slot order, float32) of ``rows[position]``, each
    times its routing weight when ``scale``."""
    xp = get_xp(rows)
    r = rows.astype(xp.float32, copy=False)
    out = xp.zeros((handle.num_tokens, rows.shape[1]), dtype=xp.float32)
    for j in range(handle.topk):
        part = r[handle.position[:, j]]
        out += handle.weights[:, j, None] * part if scale else part
    return out


def combine(expert_out, handle: DispatchHandle, *, out_dtype=None):
    """The experts' outputs back in token order, weighted by the routing weights.

    Parameters
    ----------
    expert_out : array ``[M, N]``
        Rows in the order :func:`dispatch` produced.
    handle : DispatchHandle
    out_dtype : dtype name, optional
        Default: ``expert_out``'s dtype.

    Returns
    -------
    array ``[T, N]``
        ``y[t] = sum_j w[t, j] * expert_out[position[t, j]]``, summed in slot order in float32
        and rounded once.
    """
    _check_rows("expert_out", expert_out, handle)
    dtype = V.check_dequant_dtype(out_dtype or V.dtype_name(expert_out.dtype))
    y = _weighted_sum(expert_out, handle, scale=True)
    return _cast(y, dtype)


def combine_backward(dy, expert_out, handle: DispatchHandle, *, wire: str | None = None,
                     fp8_dtype: str = "e4m3"):
    """Gradients of :func:`combine` with respect to the experts' outputs and the weights.

    Parameters
    ----------
    dy : array ``[T, N]``
    expert_out : array ``[M, N]``
        What :func:`combine` was given.
    handle : DispatchHandle
    wire : {None, "mxfp8", "bf16"}
        ``"mxfp8"``: the experts' output gradient as a rowwise MXFP8 wire ``GroupedTensor``
        (``fp8_dtype`` elements: the recipe's ``dy_fp8_dtype``, E5M2 for the hybrid recipe),
        which the grouped layers' backward takes as ``dy``; ``"bf16"``: bf16 rows; None:
        ``dy``'s dtype.

    Returns
    -------
    d_expert_out : array ``[M, N]`` or GroupedTensor
        ``w[t, j] * dy[t]`` at row ``position[t, j]``.
    d_weights : float32 array ``[T, k]``
        ``sum_n dy[t, n] * expert_out[position[t, j], n]`` in float32.
    """
    _check_rows("expert_out", expert_out, handle)
    V.check_array("dy", dy)
    if tuple(dy.shape) != (handle.num_tokens, expert_out.shape[1]):
        raise ValueError(f"dy must be [T={handle.num_tokens}, N={expert_out.shape[1]}], got "
                         f"shape {tuple(dy.shape)}")
    if wire is not None:
        _check_wire(wire)
    xp = get_xp(dy, expert_out)
    g = dy.astype(xp.float32, copy=False)
    eo = expert_out.astype(xp.float32, copy=False)
    m = handle.num_tokens * handle.topk
    d_out = xp.empty((m, dy.shape[1]), dtype=xp.float32)
    d_w = xp.empty((handle.num_tokens, handle.topk), dtype=xp.float32)
    for j in range(handle.topk):
        rows = handle.position[:, j]
        d_out[rows] = handle.weights[:, j, None] * g
        d_w[:, j] = (g * eo[rows]).sum(axis=1)
    if wire == "mxfp8":
        # the bf16 rows the bf16 wire would carry, quantized: the grouped layers' backward then
        # computes bitwise what it computes from the bf16 gradient
        q = quantize(_cast(d_out, "bfloat16"), "mxfp8", fp8_dtype=fp8_dtype)
        return (GroupedTensor.from_mxfp8_rowwise(q.rowwise_data, q.rowwise_scale,
                                                 handle.splits, fp8_dtype=fp8_dtype), d_w)
    dtype = "bfloat16" if wire == "bf16" else V.dtype_name(dy.dtype)
    return _cast(d_out, dtype), d_w


def dispatch_backward(d_tokens, handle: DispatchHandle):
    """The gradient of :func:`dispatch` with respect to ``x``: each token's copies' gradients
    summed in slot order in float32.

    Parameters
    ----------
    d_tokens : array ``[M, K]``
        Gradient of the dispatched rows (the grouped layer's ``dx``).
    handle : DispatchHandle

    Returns
    -------
    array ``[T, K]`` of ``d_tokens``'s dtype.
    """
    _check_rows("d_tokens", d_tokens, handle)
    return _cast(_weighted_sum(d_tokens, handle, scale=False), V.dtype_name(d_tokens.dtype))


def _cast(a, dtype: str):
    if dtype == "float32":
        return a
    xp = get_xp(a)
    return a.astype(_bf16(xp) if dtype == "bfloat16" else xp.float16)
