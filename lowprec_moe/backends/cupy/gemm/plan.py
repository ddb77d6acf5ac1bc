"""Host-side planning of a grouped GEMM launch (no CuPy needed).

Turns a validated :class:`lowprec_moe.gemm.GemmProblem` into the canonical per-expert form the
kernels read (see :mod:`lowprec_moe.backends.cupy.gemm.launch` for the layout): an :class:`Operand` per side, the
descriptor table ``int64 [G, DESC_WORDS]`` and the tile table ``int32 [entries, 2]``. The
constants below mirror ``raw_kernels/gemm/grouped_gemm_base.cuh`` (descriptor words, operand kinds,
tile constants), ``grouped_gemm_kernel.cuh`` (the kernel parameters) and ``grouped_gemm_simt.cu``;
``tests/gemm/test_gemm_plan.py`` checks them against the CUDA sources and emulates the tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowprec_moe import quant_formats


def _cdiv(a, b):
    return -(-a // b)


# ---- mirrored from raw_kernels/gemm/grouped_gemm_base.cuh (descriptor words, kinds, LPM_GG_PARAMS) --
DESC_WORDS = 16
(D_A_OFF, D_A_LD, D_A_SOFF, D_A_SLD, D_B_OFF, D_B_LD, D_B_SOFF, D_B_SLD, D_ROWS, D_LEN,
 D_OUT_OFF, D_AMAX_A, D_AMAX_B, D_BIAS, D_PROBS) = range(15)
KIND_HP_K, KIND_HP_MN, KIND_FP4_K, KIND_FP8_K, KIND_FP8_MN = range(5)
#: the MN-major kind of a K-major one (the kernels read no MN-major FP4)
_MN_KINDS = {KIND_HP_K: KIND_HP_MN, KIND_FP8_K: KIND_FP8_MN}
OUT_TYPES = {"float32": 0, "bfloat16": 1, "float16": 2}
BK = 64
THREADS = 256
#: threads of the warp-specialised wgmma kernels (kWsThreads in grouped_gemm_ws_roles.cuh)
WS_THREADS = 512
#: threads of the 384-thread NVFP4 TMA build ``ws_tma_128x256 (384 threads)`` (kWnThreads in grouped_gemm_ws_n256.cuh)
WS_N256_THREADS = 384
#: raw tiles requested ahead of the one being expanded, and canonical B buffers, of the
#: warp-specialised kernel (kWsAhead / kWsCanonBuffers in grouped_gemm_base.cuh)
WS_AHEAD = 3
WS_CANON_BUFFERS = 3
#: CTA tiles (output rows x output columns) of the kernels whose tile is fixed in CUDA: the
#: warp-specialised kernels (kWs* in grouped_gemm_ws_roles.cuh), the swapped-operand kernel
#: (32 token rows x 128 output columns; kSwapTokens / kSwapCols in grouped_gemm_base.cuh), its
#: wide NVFP4 TMA build (two 128-column halves) and that build's 16-token form (m64n16k16).
WS_TILE = (128, 256)
SWAP_TILE = (32, 128)
SWAP_WIDE_TILE = (32, 256)
SWAP_WIDE16_TILE = (16, 256)
#: raw stages of the swapped-operand kernel per format (swap_stages in grouped_gemm_base.cuh)
SWAP_STAGES = {"nvfp4": 6, "mxfp8": 4}
#: Parameter names, in order, of the tensor-core kernels (LPM_GG_PARAMS in
#: grouped_gemm_base.cuh) and of grouped_gemm_simt_64x64; tests/gemm/test_gemm_plan.py checks them against the CUDA
#: sources.
MMA_PARAMS = ("tiles", "n_col_tiles", "desc", "n_cols", "a_data", "a_scale", "a_ch", "a_e5m2",
              "b_data", "b_scale", "b_ch", "b_e5m2", "amax_a", "amax_b", "a_vec", "b_vec",
              "scale_mode", "bias", "probs", "has_bias", "has_probs", "out", "out_type",
              "accumulate", "zero_if_empty", "mx_bf16")
SIMT_PARAMS = tuple({"a_ch": "a_kind", "a_e5m2": "a_mn", "b_ch": "b_kind",
                     "b_e5m2": "b_mn"}.get(n, n) for n in MMA_PARAMS if n != "mx_bf16")
# ---- mirrored from raw_kernels/gemm/grouped_gemm_simt.cu ----------------------------------------
EK_F32, EK_BF16, EK_F16, EK_FP4, EK_E4M3, EK_E5M2 = range(6)
SIMT_TILE = 64


# ============================================================================================
# Operand description


@dataclass
class Operand:
    """One GEMM operand as the kernels see it (per-expert arrays are host int64 ``[G]``)."""

    data: Any            # cupy array holding element (0, 0) of every expert at data + off[g]
    scale: Any           # cupy uint8 array of block scales, or None
    mn: bool             # rows contiguous (True) or contraction contiguous (False)
    kind: int            # tensor-core kernel kind (KIND_*)
    ek: int              # SIMT element kind (EK_*)
    es_num: int          # bytes per element along the contiguous dimension = es_num / es_den
    es_den: int
    off: np.ndarray
    ld: np.ndarray
    soff: np.ndarray
    sld: np.ndarray
    e5m2: bool = False
    amax: Any = None     # cupy float32 flat array (NVFP4), or None
    amax_vec: bool = False
    amax_base: np.ndarray | None = None


_HP_EK = {"float32": EK_F32, "bfloat16": EK_BF16, "float16": EK_F16}


def _zeros(g):
    return np.zeros(g, dtype=np.int64)


def _full(g, v):
    return np.full(g, int(v), dtype=np.int64)


def _hp_operand(arr, *, mn: bool, off, ld) -> Operand:
    es = int(arr.dtype.itemsize)
    g = len(off)
    return Operand(data=arr, scale=None, mn=mn, kind=KIND_HP_MN if mn else KIND_HP_K,
                   ek=_HP_EK[np.dtype(arr.dtype).name], es_num=es, es_den=1,
                   off=np.asarray(off, np.int64) * 1, ld=_full(g, ld) if np.isscalar(ld) else ld,
                   soff=_zeros(g), sld=_zeros(g))


def _flat_amax(a):
    from lowprec_moe.backend import get_xp

    xp = get_xp(a)
    return xp.ascontiguousarray(a.astype(xp.float32, copy=False)).reshape(-1)


def _element_kinds(gt) -> tuple[int, int, bool]:
    """(tensor-core kind of a K-major copy, SIMT element kind, E5M2) of a grouped tensor's
    elements."""
    if quant_formats.get(gt.format).element_bits == 4:
        return KIND_FP4_K, EK_FP4, False
    e5 = gt.fp8_dtype == "e5m2"
    return KIND_FP8_K, EK_E5M2 if e5 else EK_E4M3, e5


def _rowwise_operand(gt, row0: np.ndarray, amax_vec_base: np.ndarray | None) -> Operand:
    """Rowwise copy of a GroupedTensor; expert g's operand starts at row ``row0[g]``."""
    fmt = quant_formats.get(gt.format)
    k = int(gt.shape[1])
    g = len(row0)
    kind, ek, e5 = _element_kinds(gt)
    line = k * fmt.element_bits // 8  # bytes per row
    op = Operand(data=gt.rowwise_data, scale=gt.rowwise_scale, mn=False, kind=kind, ek=ek,
                 es_num=fmt.element_bits, es_den=8, off=row0 * line, ld=_full(g, line),
                 soff=row0 * (k // fmt.block), sld=_full(g, k // fmt.block), e5m2=e5)
    if fmt.has_amax:
        op.amax = _flat_amax(gt.amax_rowwise)
        op.amax_vec = bool(gt.row_scaled)
        op.amax_base = amax_vec_base if gt.row_scaled else np.arange(g, dtype=np.int64)
    return op


def _columnwise_operand(gt, member_rows: np.ndarray) -> Operand:
    """Columnwise copy of a GroupedTensor, read as ``[cols of x, padded member rows]``.

    ``member_rows[g]`` is the number of (unpadded) rows of member g. A transposed copy (NVFP4:
    ``[X, Mp * bits / 8]``) has the contraction contiguous; one in x's layout (MXFP8:
    ``[Mp, X]``) has the rows contiguous (MN-major).
    """
    fmt = quant_formats.get(gt.format)
    x_cols = int(gt.shape[1])
    g = len(member_rows)
    doff = np.asarray(gt.columnwise_data_offsets, dtype=np.int64)[:g]
    soff = np.asarray(gt.columnwise_scale_offsets, dtype=np.int64)[:g]
    kind, ek, e5 = _element_kinds(gt)
    if fmt.columnwise_transposed:
        mp = _cdiv(member_rows, fmt.block) * fmt.block
        op = Operand(data=gt.columnwise_data, scale=gt.columnwise_scale, mn=False, kind=kind,
                     ek=ek, es_num=fmt.element_bits, es_den=8, off=doff,
                     ld=(mp * fmt.element_bits // 8).astype(np.int64), soff=soff,
                     sld=(mp // fmt.block).astype(np.int64), e5m2=e5)
    else:
        op = Operand(data=gt.columnwise_data, scale=gt.columnwise_scale, mn=True,
                     kind=_MN_KINDS[kind], ek=ek, es_num=fmt.element_bits, es_den=8, off=doff,
                     ld=_full(g, x_cols * fmt.element_bits // 8), soff=soff,
                     sld=_full(g, x_cols), e5m2=e5)
    if fmt.has_amax:
        op.amax = _flat_amax(gt.amax_columnwise)
        op.amax_vec = bool(gt.row_scaled)
        op.amax_base = (np.arange(g, dtype=np.int64) * x_cols if gt.row_scaled
                        else np.arange(g, dtype=np.int64))
    return op


@dataclass
class Plan:
    """Everything a launch needs (host side)."""

    a: Operand
    b: Operand
    rows: np.ndarray      # valid output rows per expert
    length: np.ndarray    # contraction length per expert (elements)
    out_off: np.ndarray   # element offset of each expert's output row 0
    bias_base: np.ndarray
    probs_base: np.ndarray
    n_cols: int
    zero_if_empty: bool


def plan(p) -> Plan:
    """Describe a validated problem in the kernels' canonical form (see the module docstring)."""
    g = p.num_groups
    gi = np.arange(g, dtype=np.int64)
    splits = np.asarray(p.splits, dtype=np.int64)
    row0 = np.asarray(p.offsets[:-1], dtype=np.int64)
    n, k = p.n, p.k
    if p.mode in ("fprop", "dgrad"):
        contr = k if p.mode == "fprop" else n
        if p.fmt == "hp":
            es = p.a.dtype.itemsize
            a = _hp_operand(p.a, mn=False, off=row0 * contr * es, ld=contr * es)
            if p.mode == "fprop":
                b = _hp_operand(p.b, mn=False, off=gi * n * k * es, ld=k * es)
            else:  # W_g^T: element (row kk, contraction nn) at W[g, nn, kk]
                b = _hp_operand(p.b, mn=True, off=gi * n * k * es, ld=k * es)
        else:
            a = _rowwise_operand(p.a, row0, row0)
            if p.mode == "fprop":
                b = _rowwise_operand(p.b, gi * n, gi * n)
            else:
                b = _columnwise_operand(p.b, _full(g, n))
        n_cols = n if p.mode == "fprop" else k
        return Plan(a=a, b=b, rows=splits, length=_full(g, contr), out_off=row0 * n_cols,
                    bias_base=gi * n_cols, probs_base=row0, n_cols=n_cols, zero_if_empty=False)
    # wgrad: rows n of dy^T, columns k of x^T, contraction over the expert's tokens
    if p.fmt == "hp":
        es = p.a.dtype.itemsize
        a = _hp_operand(p.a, mn=True, off=row0 * n * es, ld=n * es)
        b = _hp_operand(p.b, mn=True, off=row0 * k * es, ld=k * es)
        length = splits
    else:
        a = _columnwise_operand(p.a, splits)
        b = _columnwise_operand(p.b, splits)
        blk = quant_formats.get(p.fmt).block
        length = _cdiv(splits, blk) * blk
    return Plan(a=a, b=b, rows=_full(g, n), length=np.asarray(length, np.int64),
                out_off=gi * n * k, bias_base=_zeros(g), probs_base=_zeros(g), n_cols=k,
                zero_if_empty=True)


def descriptors(pl: Plan) -> np.ndarray:
    """The int64 ``[G, 16]`` descriptor table of a plan."""
    g = len(pl.rows)
    d = np.zeros((g, DESC_WORDS), dtype=np.int64)
    d[:, D_A_OFF], d[:, D_A_LD], d[:, D_A_SOFF], d[:, D_A_SLD] = (pl.a.off, pl.a.ld, pl.a.soff,
                                                                  pl.a.sld)
    d[:, D_B_OFF], d[:, D_B_LD], d[:, D_B_SOFF], d[:, D_B_SLD] = (pl.b.off, pl.b.ld, pl.b.soff,
                                                                  pl.b.sld)
    d[:, D_ROWS] = pl.rows
    d[:, D_LEN] = pl.length
    d[:, D_OUT_OFF] = pl.out_off
    d[:, D_AMAX_A] = pl.a.amax_base if pl.a.amax_base is not None else 0
    d[:, D_AMAX_B] = pl.b.amax_base if pl.b.amax_base is not None else 0
    d[:, D_BIAS] = pl.bias_base
    d[:, D_PROBS] = pl.probs_base
    return d


def tile_table(rows: np.ndarray, include: np.ndarray, bm: int,
               length: np.ndarray | None = None) -> np.ndarray:
    """int32 ``[entries, 2]``: (expert, row tile) for every row tile of every included expert.

    In expert order, or with ``length`` (the contraction length per expert, K-grouped wgrad of
    uneven experts) longest contraction first, expert order among equals: the hardware starts
    CTAs in index order as multiprocessors free up, so the longest tiles start first and the
    short ones fill in at the end (longest-processing-time-first: a largest expert started late
    leaves most multiprocessors idle while its tiles finish). Each tile
    is computed alike wherever it runs: the results do not depend on the order.
    """
    nrt = np.where(include, _cdiv(rows, bm), 0).astype(np.int64)
    g = np.repeat(np.arange(len(rows), dtype=np.int64), nrt)
    t = np.arange(int(nrt.sum()), dtype=np.int64) - np.repeat(np.cumsum(nrt) - nrt, nrt)
    if length is not None and len(g):
        order = np.argsort(-np.asarray(length, np.int64)[g], kind="stable")
        g, t = g[order], t[order]
    return np.stack([g, t], axis=1).astype(np.int32).reshape(-1, 2)
