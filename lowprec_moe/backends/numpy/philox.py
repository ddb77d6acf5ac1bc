"""Philox4x32-10 counter-based generator (NumPy, vectorized) and the stochastic-rounding stream.

The generator is the standard Philox4x32 with ten rounds (multipliers 0xD2511F53 / 0xCD9E8D57,
Weyl key increments 0x9E3779B9 / 0xBB67AE85; the key is bumped between rounds, nine times).

Stochastic rounding (NUMERICS §2.4) draws one 32-bit word per element, a pure function of
``(seed, member, direction, element)``:

* key     = (low 32 bits of seed, high 32 bits of seed)
* counter = (low 32 bits of the linear index, high 32 bits of the linear index,
             direction (0 rowwise / 1 columnwise), member index)
* r       = the first output word.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F

_MASK32 = np.uint64(0xFFFFFFFF)


def _mulhilo(a: int, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    prod = np.uint64(a) * b.astype(np.uint64)
    return (prod >> np.uint64(32)).astype(np.uint32), (prod & _MASK32).astype(np.uint32)


def philox4x32_10(counter, key) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Run Philox4x32-10.

    Parameters
    ----------
    counter : sequence of 4 uint32 arrays (broadcastable)
        The counter words ``c0..c3``.
    key : sequence of 2 uint32 scalars or arrays
        The key words ``k0, k1``.

    Returns
    -------
    tuple of 4 uint32 arrays
        The four output words.
    """
    c0, c1, c2, c3 = np.broadcast_arrays(*[np.asarray(c, dtype=np.uint32) for c in counter])
    c0, c1, c2, c3 = (c.copy() for c in (c0, c1, c2, c3))
    k0 = np.asarray(key[0], dtype=np.uint64)
    k1 = np.asarray(key[1], dtype=np.uint64)
    for rnd in range(F.PHILOX_ROUNDS):
        if rnd:
            k0 = (k0 + np.uint64(F.PHILOX_W0)) & _MASK32
            k1 = (k1 + np.uint64(F.PHILOX_W1)) & _MASK32
        hi0, lo0 = _mulhilo(F.PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(F.PHILOX_M1, c2)
        k0_32 = k0.astype(np.uint32)
        k1_32 = k1.astype(np.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0_32, lo1, hi0 ^ c3 ^ k1_32, lo0
    return c0, c1, c2, c3


def sr_random_bits(seed: int, member: int, direction: int, shape: tuple[int, int]) -> np.ndarray:
    """The 32-bit random word of every element of a stored ``[rows, cols]`` matrix.

    Parameters
    ----------
    seed : int
        64-bit seed (``0 <= seed < 2**64``).
    member : int
        Member index within a GroupedTensor (0 for a single tensor).
    direction : int
        0 for rowwise storage, 1 for columnwise storage.
    shape : (rows, cols)
        Shape of the stored (unpacked) matrix; element ``(i, j)`` has linear index ``i*cols + j``.

    Returns
    -------
    numpy.ndarray
        uint32 ``[rows, cols]``.
    """
    rows, cols = shape
    idx = np.arange(rows * cols, dtype=np.uint64).reshape(rows, cols)
    lo = (idx & _MASK32).astype(np.uint32)
    hi = (idx >> np.uint64(32)).astype(np.uint32)
    key = (np.uint32(seed & 0xFFFFFFFF), np.uint32((seed >> 32) & 0xFFFFFFFF))
    r0, _, _, _ = philox4x32_10((lo, hi, np.uint32(direction), np.uint32(member)), key)
    return r0
