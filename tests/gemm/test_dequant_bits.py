"""The bit manipulations of the NVFP4 decoder (``fp4_decode8``, raw_kernels/gemm/grouped_gemm_dequant.cuh),
emulated on the CPU: every E2M1 nibble of a 32-bit word becomes the E4M3 byte of its value times
2^-6 (exact, the E4M3 subnormals included), the even nibbles in ``lo`` and the odd ones in ``hi``,
byte for byte in element order, whatever the neighbouring nibbles hold (the shifts carry bits
across byte boundaries, the masks must drop them).

The same check covers an alternative the decoder may take: the odd nibbles' right shift as a multiply-high, ``__umulhi(w, 1 << 30)``,
which ptxas issues on the FMA pipe instead of the integer ALU pipe.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import assert_bytes_equal, assert_source_has


def _e4m3_bytes_of_e2m1() -> np.ndarray:
    """E4M3 byte of e2m1(code) * 2^-6 for the 16 codes (from the formats' own definitions)."""
    vals = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    return (vals * np.float32(2.0 ** -6)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _decode_bytes(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp4_decode8's lo / hi words for uint32 words w, as the kernel computes them."""
    w64 = w.astype(np.uint64)
    lo, hi = w64 & 0x0F0F0F0F, (w64 >> 4) & 0x0F0F0F0F
    lo = ((lo << 2) & 0x1C1C1C1C) | ((lo << 4) & 0x80808080)
    hi = ((hi << 2) & 0x1C1C1C1C) | ((hi << 4) & 0x80808080)
    return lo.astype(np.uint32), hi.astype(np.uint32)


def _decode_bytes_mulhi(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The multiply-high variant: lo from w directly, hi from __umulhi(w, 2^30) = w >> 2."""
    w64 = w.astype(np.uint64)
    lo = ((w64 << 2) & 0x1C1C1C1C) | ((w64 << 4) & 0x80808080)
    hi = (((w64 * (1 << 30)) >> 32) & 0x1C1C1C1C) | (w64 & 0x80808080)
    return lo.astype(np.uint32), hi.astype(np.uint32)


@pytest.mark.parametrize("decode", [_decode_bytes, _decode_bytes_mulhi], ids=["landed", "mulhi"])
def test_fp4_decode8_bytes(decode):
    table = _e4m3_bytes_of_e2m1()
    # the four nibble pairs of every 16-bit pattern, at both halves, plus random words
    pats = np.arange(1 << 16, dtype=np.uint32)
    rng = np.random.default_rng(0)
    words = np.concatenate([pats, pats << 16, pats | (pats[::-1] << 16),
                            rng.integers(0, 1 << 32, size=1 << 16, dtype=np.uint64).astype(np.uint32)])
    lo, hi = decode(words)
    nib = [(words >> (4 * i)) & 0xF for i in range(8)]
    want_lo = np.zeros_like(words)
    want_hi = np.zeros_like(words)
    for k in range(4):
        want_lo |= table[nib[2 * k]].astype(np.uint32) << (8 * k)
        want_hi |= table[nib[2 * k + 1]].astype(np.uint32) << (8 * k)
    assert_bytes_equal(lo, want_lo, "even nibbles -> E4M3 bytes")
    assert_bytes_equal(hi, want_hi, "odd nibbles -> E4M3 bytes")


def test_e4m3_table_is_exact():
    """Every E4M3 byte decodes back to e2m1 * 2^-6: no rounding in the intermediate."""
    table = _e4m3_bytes_of_e2m1()
    back = table.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.float32(64.0)
    vals = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert_bytes_equal(back, vals, "E4M3 -> e2m1")


def test_source_has_the_emulated_decoder():
    assert_source_has(
        "grouped_gemm_dequant.cuh",
        "unsigned lo = w & 0x0F0F0F0Fu;",
        "unsigned hi = (w >> 4) & 0x0F0F0F0Fu;",
        "lo = ((lo << 2) & 0x1C1C1C1Cu) | ((lo << 4) & 0x80808080u);",
        "hi = ((hi << 2) & 0x1C1C1C1Cu) | ((hi << 4) & 0x80808080u);")
