"""Per-expert column sums (NumPy): the bias gradients of the grouped layers.

``grouped_colsum(a, splits, probs)`` is ``out[g] = sum over expert g's rows of a * probs``:
each element converted to float32 and multiplied by its row's float32 prob (one float32
rounding), the products summed in float64 and the sum rounded once to float32. An expert without
rows gets zeros. The CUDA twin (``raw_kernels/reduce/reduce.cu``) computes the same products and sums
them in float32 in a fixed order (rows of 128-row tiles in order, then the tiles in order), so the
two agree to float32 summation error, not bit for bit; each is deterministic, and an expert's
sums depend on its own rows only. NaN / inf propagate as in IEEE arithmetic. The GPU quantizers
also sum the columns of dy while they quantize it (``GroupedTensor.quantize_with_column_sums``,
the quantized layers' bias gradients), each in its own fixed order, to the same accuracy.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F

__all__ = ["grouped_colsum"]


#: ``like`` values (the GPU backend's summation orders: None or a quantized format); the
#: float64 sums here need none.
ORDERS = (None, *F.FORMATS)


def grouped_colsum(a: np.ndarray, splits, probs: np.ndarray | None = None, *,
                   like=None) -> np.ndarray:
    """float32 ``[G, N]``: per expert, the column sums of ``a`` (times ``probs``).

    Parameters
    ----------
    a : ndarray ``[M, N]``, float32 / float16 / bfloat16
        Rows sorted by expert (``splits[g]`` rows for expert ``g``).
    splits : sequence of int, length ``G``, summing to ``M``
    probs : ndarray ``[M]`` or None
        Per-row factor (converted to float32).
    like : None, "mxfp8" or "nvfp4"
        The GPU twin's summation order (that format's quantize kernel's); checked, and
        otherwise without effect here (float64 sums, one rounding to float32).
    """
    if like not in ORDERS:
        raise ValueError(f"like={like!r} must be one of {list(ORDERS)}")
    offs = np.concatenate([[0], np.cumsum(np.asarray(splits, dtype=np.int64))])
    a32 = a.astype(np.float32)
    if probs is not None:
        a32 = a32 * np.asarray(probs).astype(np.float32)[:, None]
    out = np.zeros((len(offs) - 1, a.shape[1]), dtype=np.float64)
    for g in range(len(offs) - 1):
        lo, hi = int(offs[g]), int(offs[g + 1])
        if hi > lo:
            out[g] = a32[lo:hi].astype(np.float64).sum(axis=0)
    return out.astype(np.float32)
