"""Random Hadamard transform (RHT) of NVFP4 columnwise data (NUMERICS §2.3), NumPy reference.

The transform acts on rows of the stored columnwise matrix ``x^T`` ``[K, Mp]``: each row is cut
into 16-element chunks along M and every chunk ``v`` (a row vector) becomes

    w = v @ T,    T = diag(s) @ H16 / 4,    H16[i, j] = (-1) ** popcount(i & j),

with the signs ``s`` of ``formats.RHT_SIGN_MASK``. ``T`` is orthogonal (``T @ T.T = I``).

Rounding: every product ``v_i * s_i * H[i, j] / 4`` is exact; each output is the float64 sum of
its 16 products taken in order ``i = 0..15``, rounded once to bfloat16 (round to nearest even,
subnormals kept, overflow to inf). NaN and inf propagate through the sums as IEEE arithmetic
says. The inverse (:func:`rht_inverse`) multiplies by ``T.T`` in float64 and returns float32; it
is used only for dequantization, so it needs no bit-exact contract.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backends.numpy.fp import f64_to_bf16


def rht_matrix() -> np.ndarray:
    """The 16x16 transform ``T = diag(s) @ H16 / 4`` as float64."""
    return (F.rht_signs()[:, None].astype(np.float64) * F.hadamard16().astype(np.float64)) / F.RHT_NORM


def rht_forward(a: np.ndarray) -> np.ndarray:
    """Apply the RHT to 16-element chunks along the last axis.

    Parameters
    ----------
    a : numpy.ndarray
        float32 (holding bf16-exact values) or bfloat16, shape ``[R, C]`` with ``C % 16 == 0``.

    Returns
    -------
    numpy.ndarray
        bfloat16 ``[R, C]``: each chunk's float64 ordered sum rounded once to bf16.
    """
    a = np.asarray(a)
    rows, cols = a.shape
    v = a.astype(np.float64).reshape(rows, cols // F.RHT_SIZE, F.RHT_SIZE)
    t = rht_matrix()
    acc = np.zeros_like(v)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(F.RHT_SIZE):  # fixed summation order i = 0..15
            acc += v[:, :, i : i + 1] * t[i][None, None, :]
    return f64_to_bf16(acc.reshape(rows, cols))


def rht_inverse(w: np.ndarray) -> np.ndarray:
    """Undo :func:`rht_forward` on 16-element chunks along the last axis (float32 result)."""
    w = np.asarray(w, dtype=np.float64)
    rows, cols = w.shape
    v = w.reshape(rows, cols // F.RHT_SIZE, F.RHT_SIZE) @ rht_matrix().T
    return v.reshape(rows, cols).astype(np.float32)
