"""Token dispatch and combine for expert parallelism (:mod:`lowprec_moe.ep`).

Shapes: ``T`` tokens of hidden size ``K`` on this rank, ``k`` experts per token (top-k), ``E``
experts in all, ``W`` ranks (``group.size``; 1 without a group) each holding ``E / W``
consecutive experts (rank ``r``: experts ``r E/W .. (r+1) E/W - 1``), ``R`` rows that this
rank's experts receive (``T * k`` in one process), ``N`` the experts' output size.

With a group, every call is a collective: all ranks call it, in the same order. :func:`dispatch`
orders this rank's ``T * k`` token copies by expert (hence by destination rank), quantizes the
tokens (MXFP8 wire) in one kernel and gathers the copies' rows, exchanges the per-expert counts
(an all-to-all of ``W x E/W`` integers, the one host synchronisation: the received counts are
read to size the receive buffers and give the experts' host splits), then sends the rows with an
all-to-all-v and sorts what arrives by local expert. :func:`combine` sends each expert row back
to its token's rank and adds the ``k`` copies there; the backward functions move the gradients
the same two ways.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowprec_moe import _validate as V
from lowprec_moe.backend import array_device_id, get_xp, is_cupy_array
from lowprec_moe.ep.group import Group
from lowprec_moe.tensors.grouped_tensor import GroupedTensor
from lowprec_moe.tensors.quantized_tensor import quantize

_WIRES = ("mxfp8", "bf16")
_FP8 = ("e4m3", "e5m2")


@dataclass
class Route:
    """Where a multi-rank :func:`dispatch` sent this rank's rows and where the rows of its
    experts came from (``DispatchHandle.route``).

    Attributes
    ----------
    group : Group
    send_counts : tuple of int
        Rows this rank sent to each rank (its tokens' copies, expert-major = rank-major).
    recv_counts : tuple of int
        Rows each rank sent to this rank's experts.
    arrival : array int64 ``[R]``
        For each received row (rank-major, as it arrived), its row in the expert-sorted order.
    gather : array int64 ``[R]``
        The inverse: for each expert-sorted row, its received row.
    returned : array ``[T * k, N]`` or None
        The expert outputs :func:`combine` brought back to this rank (kept for
        :func:`combine_backward`'s routing-weight gradient).
    """

    group: Group
    send_counts: tuple
    recv_counts: tuple
    arrival: Any
    gather: Any
    returned: Any = None


@dataclass(frozen=True)
class DispatchHandle:
    """What :func:`combine` and the backward functions need of one :func:`dispatch`.

    Attributes
    ----------
    num_tokens, topk : int
        ``T`` and ``k``.
    token : array int64 ``[T * k]``
        The token of each of this rank's copies, expert-major (then token, then slot): the
        dispatched rows in one process, the order they are sent in with a group.
    position : array int64 ``[T, k]``
        The place in that order of token ``t``'s copy for its ``j``-th expert.
    weights : array float32 ``[T, k]``
        The router's top-k weights.
    splits : tuple of int
        Dispatched rows per local expert.
    wire : {"mxfp8", "bf16"}
    route : Route or None
        The exchange of a multi-rank dispatch; None in one process.
    """

    num_tokens: int
    topk: int
    token: Any
    position: Any
    weights: Any
    splits: tuple
    wire: str
    route: Route | None = None

    @property
    def num_rows(self) -> int:
        """``R``: the rows this rank's experts hold (``T * k`` in one process)."""
        return int(sum(self.splits))


def _check_group(group) -> int:
    """The group's size (1 for None)."""
    if group is None:
        return 1
    if not isinstance(group, Group):
        raise TypeError(f"group={group!r} must be None (one process) or a lowprec_moe.ep.Group "
                        "(init_process_group() for NCCL, ThreadGroup in one process)")
    return int(group.size)


def _check_wire(wire) -> str:
    if wire not in _WIRES:
        raise ValueError(f"wire={wire!r} must be one of {_WIRES}")
    return wire


def _bf16(xp):
    import ml_dtypes

    return ml_dtypes.bfloat16


def dispatch(x, topk_idx, topk_weights, num_experts: int, *, group=None, wire: str = "mxfp8",
             fp8_dtype: str = "e4m3"):
    """Send each token's copies to their experts, sorted by expert, ready for the grouped layers.

    Parameters
    ----------
    x : array ``[T, K]`` (float32 / float16 / bfloat16)
        This rank's tokens.
    topk_idx : integer array ``[T, k]``
        Each token's experts, global ids in ``[0, num_experts)``.
    topk_weights : float array ``[T, k]``
        Each token's routing weights (used by :func:`combine`; they stay on this rank).
    num_experts : int
        ``E``, all ranks together; a multiple of the group's size.
    group : None or Group
        None: one process holding every expert (no communication, NumPy or CuPy). A
        :class:`~lowprec_moe.ep.ProcessGroup` (NCCL, CuPy arrays, one GPU per process) or a
        :class:`~lowprec_moe.ep.ThreadGroup`: this rank holds experts
        ``rank * E/W .. (rank+1) * E/W - 1``. Every rank calls ``dispatch`` with the same
        ``num_experts``, ``K``, ``wire`` and ``fp8_dtype`` (checked at the counts exchange).
    wire : {"mxfp8", "bf16"}
        ``"mxfp8"``: every token is quantized once, rowwise MXFP8 (``fp8_dtype`` elements), in
        one kernel before anything is sent, and its bytes travel (``K + K/32`` bytes a row);
        ``"bf16"``: the bf16 rows (``2 K`` bytes).
    fp8_dtype : {"e4m3", "e5m2"}

    Returns
    -------
    tokens : GroupedTensor (wire ``"mxfp8"``) or bf16 array ``[R, K]``
        The rows of this rank's experts sorted by local expert; within an expert by source
        rank, then token, then slot -- the order one process gives the concatenation of all
        ranks' tokens, so the grouped layers compute the same bits.
    splits : tuple of int
        Rows per local expert, on the host (the grouped layers take host splits).
    handle : DispatchHandle

    Notes
    -----
    Host synchronisation: one, where the received per-expert counts are read back to size the
    receive buffers (with a group), or where the counts are read back (in one process with CuPy
    inputs). The quantization and the gather of the rows to send are enqueued before it, so
    they run while the host waits.
    """
    size = _check_group(group)
    _check_wire(wire)
    if fp8_dtype not in _FP8:
        raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {_FP8}")
    V.check_array("x", x)
    if x.ndim != 2:
        raise ValueError(f"x must be [T, K], got shape {tuple(x.shape)}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, numbers.Integral) \
            or num_experts < 1:
        raise ValueError(f"num_experts={num_experts!r} must be a positive int")
    if num_experts % size:
        raise ValueError(f"num_experts={num_experts} must be a multiple of the group's size "
                         f"{size} (each rank holds num_experts / size experts)")
    xp = get_xp(x, topk_idx, topk_weights)
    if group is not None:
        group.check_arrays(xp, array_device_id(x))
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
    n = t * k
    pair = xp.arange(n, dtype=xp.int64)
    # expert-major, then (token, slot): unique keys, so any sort gives this order. The experts
    # of one rank are consecutive, so this is also the order of destination ranks. Experts out
    # of range (clipped here so that the keys cannot overflow) are refused after the counts are
    # read, before any row moves.
    order = xp.argsort(xp.clip(flat, -1, num_experts) * max(n, 1) + pair)
    position = xp.empty(n, dtype=xp.int64)
    position[order] = pair
    token = order // max(k, 1)
    # per-expert counts on the device, without a synchronisation (cupy.bincount reads back)
    edges = xp.searchsorted(flat[order], xp.arange(num_experts + 1, dtype=xp.int64))
    counts = edges[1:] - edges[:-1]
    outside = ((flat < 0) | (flat >= num_experts)).sum()
    weights = xp.ascontiguousarray(topk_weights.astype(xp.float32))
    payload = _payload(x, token, wire, fp8_dtype)
    if group is None:
        # the one host synchronisation (CuPy): the counts, for the grouped layers' host splits
        host = _host(xp.concatenate([counts, outside.reshape(1).astype(counts.dtype)]))
        if host[-1]:
            raise ValueError(f"topk_idx holds experts outside [0, {num_experts})")
        splits = tuple(int(c) for c in host[:-1])
        handle = DispatchHandle(t, k, token, position.reshape(t, k), weights, splits, wire)
        return _tokens(payload, splits, wire, fp8_dtype), splits, handle

    el = num_experts // size
    # counts exchange: row d = this rank's copies for rank d's experts, then a header (K, wire,
    # fp8 dtype, experts out of range) that every rank checks, so that all fail together
    table = xp.empty((size, el + 4), dtype=xp.int64)
    table[:, :el] = counts.reshape(size, el)
    table[:, el] = int(x.shape[1])
    table[:, el + 1] = _WIRES.index(wire)
    table[:, el + 2] = _FP8.index(fp8_dtype)
    table[:, el + 3] = outside
    arrived = group.all_to_all(table)
    # the one host synchronisation: read the counts sent and received
    both = _host(xp.stack([table, arrived]))
    _check_peers(both[1, :, el:], int(x.shape[1]), wire, fp8_dtype, num_experts, group.rank)
    sent, got = both[0, :, :el], both[1, :, :el]
    send_counts = tuple(int(c) for c in sent.sum(axis=1))
    recv_counts = tuple(int(c) for c in got.sum(axis=1))
    splits = tuple(int(c) for c in got.sum(axis=0))
    received = group.all_to_all_v(payload, send_counts, recv_counts)
    arrival, gather = _arrival_order(xp, arrived[:, :el], sum(recv_counts))
    route = Route(group, send_counts, recv_counts, arrival, gather)
    handle = DispatchHandle(t, k, token, position.reshape(t, k), weights, splits, wire, route)
    rows = [xp.ascontiguousarray(a[gather]) for a in received]
    return _tokens(rows, splits, wire, fp8_dtype), splits, handle


def _host(a):
    return a.get() if is_cupy_array(a) else a


def _payload(x, token, wire: str, fp8_dtype: str) -> list:
    """The rows to send, one per token copy in ``token``'s order: the MXFP8 data and scales of
    the quantized tokens (one quantization kernel for the ``T`` tokens, then a gather), or the
    bf16 rows."""
    xp = get_xp(x)
    if wire == "mxfp8":
        q = quantize(x, "mxfp8", fp8_dtype=fp8_dtype)
        return [q.rowwise_data[token], q.rowwise_scale[token]]
    return [x.astype(_bf16(xp), copy=False)[token]]


def _tokens(rows: list, splits: tuple, wire: str, fp8_dtype: str):
    if wire == "mxfp8":
        return GroupedTensor.from_mxfp8_rowwise(rows[0], rows[1], splits, fp8_dtype=fp8_dtype)
    return rows[0]


def _check_peers(headers, k: int, wire: str, fp8_dtype: str, num_experts: int,
                 rank: int) -> None:
    """Every rank's routing was in range and it dispatched rows of the same width and wire
    (the received ``[W, 4]`` headers; every rank sees all of them and raises alike)."""
    rows = np.asarray(headers).tolist()
    if rows[rank][3]:
        raise ValueError(f"topk_idx holds experts outside [0, {num_experts})")
    for s, (ks, ws, fs, bad) in enumerate(rows):
        if bad:
            raise ValueError(f"rank {s}'s topk_idx holds experts outside [0, {num_experts}); "
                             "no rank dispatched")
        if (ks, ws, fs) != (k, _WIRES.index(wire), _FP8.index(fp8_dtype)):
            theirs = (f"K={ks}, wire={_WIRES[ws]!r}, fp8_dtype={_FP8[fs]!r}"
                      if 0 <= ws < len(_WIRES) and 0 <= fs < len(_FP8) else f"K={ks}")
            raise ValueError(f"rank {s} dispatched {theirs}; rank {rank} K={k}, wire={wire!r}, "
                             f"fp8_dtype={fp8_dtype!r}: every rank must dispatch alike")


def _arrival_order(xp, counts, rows: int):
    """For rows received rank-major (rank ``s``'s rows for local experts ``0 .. E/W-1`` in
    turn, ``counts[s, e]`` each), their places in the expert-major order (expert, then source
    rank), and the inverse permutation. Device arithmetic on the device counts."""
    w, el = counts.shape
    flat = counts.reshape(-1)
    end = xp.cumsum(flat)
    start = end - flat
    by_expert = xp.ascontiguousarray(counts.T).reshape(-1)
    dst = (xp.cumsum(by_expert) - by_expert).reshape(el, w).T.reshape(-1)
    i = xp.arange(rows, dtype=xp.int64)
    seg = xp.searchsorted(end, i, side="right")
    arrival = i - start[seg] + dst[seg]
    gather = xp.empty_like(arrival)
    gather[arrival] = i
    return arrival, gather


def _to_home(rows, handle: DispatchHandle):
    """Rows in this rank's expert-sorted order, back to the ranks of their tokens: on return,
    this rank's ``T * k`` copies in the order they were sent."""
    route = handle.route
    if route is None:
        return rows
    xp = get_xp(rows)
    back = xp.ascontiguousarray(rows[route.arrival])
    return route.group.all_to_all_v([back], route.recv_counts, route.send_counts)[0]


def _to_experts(arrays: list, handle: DispatchHandle) -> list:
    """This rank's copies (in the order dispatch sent them) to their experts' ranks, sorted by
    local expert there."""
    route = handle.route
    if route is None:
        return arrays
    got = route.group.all_to_all_v(arrays, route.send_counts, route.recv_counts)
    return [get_xp(a).ascontiguousarray(a[route.gather]) for a in got]


def _check_handle(handle) -> None:
    if not isinstance(handle, DispatchHandle):
        raise TypeError(f"handle must be the DispatchHandle dispatch returned, got "
                        f"{type(handle).__name__}")


def _check_rows(name, a, handle: DispatchHandle) -> None:
    _check_handle(handle)
    V.check_array(name, a)
    m = handle.num_rows
    if a.ndim != 2 or a.shape[0] != m:
        raise ValueError(f"{name} must be [R={m}, N] (the dispatched rows), got shape "
                         f"{tuple(a.shape)}")
    if handle.route is not None:
        handle.route.group.check_arrays(get_xp(a), array_device_id(a))


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
    expert_out : array ``[R, N]``
        This rank's experts' rows, in the order :func:`dispatch` produced.
    handle : DispatchHandle
    out_dtype : dtype name, optional
        Default: ``expert_out``'s dtype.

    Returns
    -------
    array ``[T, N]``
        ``y[t] = sum_j w[t, j] * row(t, j)`` for this rank's tokens, where ``row(t, j)`` is the
        output of token ``t``'s ``j``-th expert (with a group, brought back from the expert's
        rank by an all-to-all-v of ``expert_out``'s dtype), summed in slot order in float32 and
        rounded once: the same bits on every run and for every group size.
    """
    _check_rows("expert_out", expert_out, handle)
    dtype = V.check_dequant_dtype(out_dtype or V.dtype_name(expert_out.dtype))
    rows = _to_home(expert_out, handle)
    if handle.route is not None:
        handle.route.returned = rows
    y = _weighted_sum(rows, handle, scale=True)
    return _cast(y, dtype)


def combine_backward(dy, expert_out, handle: DispatchHandle, *, wire: str | None = None,
                     fp8_dtype: str = "e4m3"):
    """Gradients of :func:`combine` with respect to the experts' outputs and the weights.

    Parameters
    ----------
    dy : array ``[T, N]``
        Gradient of this rank's combined output.
    expert_out : array ``[R, N]``
        What :func:`combine` was given (with a group, combine keeps the rows it brought back
        in ``handle.route.returned``; call :func:`combine` first).
    handle : DispatchHandle
    wire : {None, "mxfp8", "bf16"}
        How the experts' output gradient travels and arrives. ``"mxfp8"``: a rowwise MXFP8 wire
        ``GroupedTensor`` (``fp8_dtype`` elements: the recipe's ``dy_fp8_dtype``, E5M2 for the
        hybrid recipe), which the grouped layers' backward takes as ``dy``; quantized on this
        rank, in one kernel, before it is sent. ``"bf16"``: bf16 rows; None: ``dy``'s dtype.
    fp8_dtype : {"e4m3", "e5m2"}

    Returns
    -------
    d_expert_out : array ``[R, N]`` or GroupedTensor
        For this rank's experts' rows: ``w[t, j] * dy[t]`` of the row's token ``t`` and slot
        ``j`` (computed on the token's rank, then sent).
    d_weights : float32 array ``[T, k]``
        ``sum_n dy[t, n] * row(t, j)[n]`` in float32, for this rank's tokens.
    """
    _check_rows("expert_out", expert_out, handle)
    V.check_array("dy", dy)
    if tuple(dy.shape) != (handle.num_tokens, expert_out.shape[1]):
        raise ValueError(f"dy must be [T={handle.num_tokens}, N={expert_out.shape[1]}], got "
                         f"shape {tuple(dy.shape)}")
    if wire is not None:
        _check_wire(wire)
    if fp8_dtype not in _FP8:
        raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {_FP8}")
    xp = get_xp(dy, expert_out)
    route = handle.route
    if route is not None:
        if route.returned is None:
            raise ValueError("combine_backward needs the expert rows combine brought back: call "
                             "combine(expert_out, handle) with this handle first")
        if route.returned.shape[1] != expert_out.shape[1]:
            raise ValueError(f"expert_out has N={expert_out.shape[1]} columns, the rows combine "
                             f"brought back {route.returned.shape[1]}")
        home = route.returned
    else:
        home = expert_out
    g = dy.astype(xp.float32, copy=False)
    eo = home.astype(xp.float32, copy=False)
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
        data, scale = _to_experts([q.rowwise_data, q.rowwise_scale], handle)
        return (GroupedTensor.from_mxfp8_rowwise(data, scale, handle.splits,
                                                 fp8_dtype=fp8_dtype), d_w)
    dtype = "bfloat16" if wire == "bf16" else V.dtype_name(dy.dtype)
    return _to_experts([_cast(d_out, dtype)], handle)[0], d_w


def dispatch_backward(d_tokens, handle: DispatchHandle):
    """The gradient of :func:`dispatch` with respect to ``x``: each token's copies' gradients
    (with a group, brought back from the experts' ranks in ``d_tokens``'s dtype) summed in slot
    order in float32.

    Parameters
    ----------
    d_tokens : array ``[R, K]``
        Gradient of this rank's experts' rows (the grouped layer's ``dx``).
    handle : DispatchHandle

    Returns
    -------
    array ``[T, K]`` of ``d_tokens``'s dtype, for this rank's tokens.
    """
    _check_rows("d_tokens", d_tokens, handle)
    rows = _to_home(d_tokens, handle)
    return _cast(_weighted_sum(rows, handle, scale=False), V.dtype_name(d_tokens.dtype))


def _cast(a, dtype: str):
    if dtype == "float32":
        return a
    xp = get_xp(a)
    return a.astype(_bf16(xp) if dtype == "bfloat16" else xp.float16)
