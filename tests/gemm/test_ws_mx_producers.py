"""The MN-major B producers of the warp-specialised MXFP8 kernel (``_kn_y`` dgrad, ``_nn_y``
wgrad; raw_kernels/gemm/grouped_gemm_ws_mx_produce.cuh), emulated on the CPU.

* Address map: each of the 256 producer threads widens 8 columns x 8 contraction lines per
  k-tile. Checked for every thread and line: the 8 raw bytes it loads (two raw panels of
  [64 lines][128 bytes] as TMA stores them, 128-byte swizzle) are those of its columns on that
  line, its 16-byte canonical store lands where mn_canon_off puts that line's chunk, and the 256
  threads write every chunk of the canonical buffer exactly once.
* Factors: the packed two-column factor words (e + 256 + bias - e_max per 16-bit half, clamped
  to [256, 286], shifted and masked) equal mx_factor_bits for every code pair, row maximum and
  both fp8 formats.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_bytes_equal, assert_source_has

from lowprec_moe import formats as F

LINES, PANEL_BYTES, P_RAW, BN = 64, 128, 64 * 128, 256


def _mn_canon_off(line: int, chunk: int) -> int:
    """grouped_gemm_staging.cuh mn_canon_off (16-bit elements, 64-line panels)."""
    return (chunk >> 3) * (LINES * 128) + line * 128 + (((chunk & 7) ^ (line & 7)) << 4)


def _producer_addresses(t: int, j: int) -> tuple:
    """(raw byte offset in the B stage, canonical byte offset, first tile column, line) of
    producer thread t's line j, as the kernel computes them."""
    g, p, w = t & 15, (t >> 4) & 1, t >> 5
    col = 128 * p + 8 * g
    o_raw = p * P_RAW + 8 * w * 128 + ((g & 1) << 3)
    o_cn = _mn_canon_off(8 * w, 16 * p + g) - ((g & 7) << 4)
    gc, gk = g >> 1, g & 7
    return (o_raw + j * 128 + ((gc ^ j) << 4), o_cn + j * 128 + ((gk ^ j) << 4), col,
            8 * w + j)


def test_source_has_the_emulated_addresses():
    assert_source_has(
        "grouped_gemm_ws_mx_produce.cuh",
        "const int g = t & 15, p = (t >> 4) & 1, w = t >> 5;",
        "p * P_RAW + 8 * w * 128 + ((g & 1) << 3)",
        "mn_canon_off(8 * w, 16 * p + g) -",
        "x[l] = lds_v2(rb + l * 128 + ((gc ^ static_cast<unsigned>(l)) << 4));",
        "sts_v4(cbb + l * 128 + ((gk ^ static_cast<unsigned>(l)) << 4)")
    assert_source_has("grouped_gemm_staging.cuh",
                      "return (c >> 3) * (kBK * 128) + l * 128 + (((c & 7) ^ (l & 7)) << 4);")


def test_mn_major_b_producer_map():
    rng = np.random.default_rng(0)
    tile = rng.integers(0, 256, size=(LINES, BN), dtype=np.uint8)  # [line][column] of fp8
    raw = np.empty(2 * P_RAW, np.uint8)  # two panels of 128 columns, TMA 128-byte swizzle
    for p in range(2):
        for line in range(LINES):
            for c in range(8):
                dst = p * P_RAW + line * PANEL_BYTES + ((c ^ (line & 7)) << 4)
                raw[dst:dst + 16] = tile[line, 128 * p + 16 * c:128 * p + 16 * c + 16]
    written = np.zeros(LINES * BN * 2 // 16, np.int32)  # canonical 16-byte chunks
    for t in range(256):
        for j in range(8):
            a_raw, a_cn, col, line = _producer_addresses(t, j)
            got = raw[a_raw:a_raw + 8]
            np.testing.assert_array_equal(got, tile[line, col:col + 8],
                                          err_msg=f"thread {t} line {j}: raw bytes")
            assert a_cn == _mn_canon_off(line, col // 8), (t, j)
            written[a_cn // 16] += 1
    assert (written == 1).all(), np.flatnonzero(written != 1)[:8]


def _mx_factor_bits(e: np.ndarray, e_max: np.ndarray, code_bias: int) -> np.ndarray:
    """grouped_gemm_staging.cuh mx_factor_bits."""
    f = np.clip(e.astype(np.int64) - e_max + code_bias, 0, 2 * F.FP16_EXP_BIAS)
    return (f << F.FP16_MANT_BITS).astype(np.uint32)


def _s_max(e5m2: bool) -> int:
    """grouped_gemm_staging.cuh mx_s_max: 15 - exponent of the format's largest finite."""
    top = ((1 << (7 - F.E5M2_MANT_BITS)) - 2 - F.E5M2_EXP_BIAS if e5m2
           else (1 << (7 - F.E4M3_MANT_BITS)) - 1 - F.E4M3_EXP_BIAS)
    return F.FP16_EXP_BIAS - top


@pytest.mark.parametrize("e5m2", [False, True], ids=["e4m3", "e5m2"])
def test_packed_factor_pairs(e5m2):
    code_bias = _s_max(e5m2) + F.FP16_EXP_BIAS
    # every (code, row maximum) pair in each half; the other half's pairs shuffled against it
    e0, m0 = (a.ravel().astype(np.uint32) for a in np.meshgrid(np.arange(256), np.arange(256)))
    perm = np.random.default_rng(1).permutation(e0.size)
    e1, m1 = e0[perm], m0[perm]
    e2 = e0 | (e1 << 16)  # __byte_perm(codes, 0, 0x4140): two codes as 16-bit halves
    dh = (256 + code_bias - m0) | ((256 + code_bias - m1) << 16)
    v = (e2 + dh).astype(np.uint32)
    lo = np.clip(v & 0xFFFF, 0x100, 0x11E)  # __vmaxu2 / __vminu2
    hi = np.clip(v >> 16, 0x100, 0x11E)
    words = (((lo | (hi << 16)) << F.FP16_MANT_BITS) & 0x7C007C00).astype(np.uint32)
    want = _mx_factor_bits(e0, m0, code_bias) | (_mx_factor_bits(e1, m1, code_bias) << 16)
    assert_bytes_equal(words, want.astype(np.uint32), "packed factor words (index: e + 256 e_max)")


def test_source_factor_constants():
    assert_source_has(
        "grouped_gemm_ws_mx_produce.cuh",
        "__vminu2(__vmaxu2(e2 + dh[i], 0x01000100u), 0x011E011Eu)",
        "(v << LPM_FP16_MANT_BITS) & 0x7C007C00u",
        "256u + static_cast<unsigned>(bias_b) - exps_b[col + 2 * i]")


def _window(e5m2: bool) -> int:
    """grouped_gemm_staging.cuh mx_window: S_MAX - S_MIN (E4M3 21 codes, E5M2 8)."""
    bias, mant = (F.E5M2_EXP_BIAS, F.E5M2_MANT_BITS) if e5m2 else (F.E4M3_EXP_BIAS, F.E4M3_MANT_BITS)
    min_exp = 1 - bias - mant  # fp8_min_exp: the smallest subnormal's exponent
    s_min = max(1 - F.FP16_EXP_BIAS, 1 - F.FP16_EXP_BIAS - F.FP16_MANT_BITS - min_exp)
    return _s_max(e5m2) - s_min


@pytest.mark.parametrize("e5m2", [False, True], ids=["e4m3", "e5m2"])
def test_window_factor_one_imad(e5m2):
    """mx_block_factor<true> (consumers' A factors, K-major producers' B factors): for every
    row maximum and every code within the window below it (what the window check guarantees
    for a valid row), ``e * 0x04000400 + (code_bias - e_max) * 0x04000400`` (mod 2^32) is
    the word (f, f), f = mx_factor_bits."""
    code_bias = _s_max(e5m2) + F.FP16_EXP_BIAS
    window = _window(e5m2)
    assert window == (8 if e5m2 else 21)  # the static_assert beside mx_window
    unit = (0x00010001 << F.FP16_MANT_BITS) & 0xFFFFFFFF
    assert unit == 0x04000400
    e_max = np.repeat(np.arange(window, 255, dtype=np.int64), window + 1)
    e = e_max - np.tile(np.arange(window + 1, dtype=np.int64), 255 - window)
    fk = ((code_bias - e_max) * unit) % (1 << 32)
    got = ((e * unit + fk) % (1 << 32)).astype(np.uint32)
    f = _mx_factor_bits(e, e_max, code_bias)
    assert (f >> F.FP16_MANT_BITS).min() >= 1 and (f >> F.FP16_MANT_BITS).max() == code_bias
    assert_bytes_equal(got, (f | (f << 16)).astype(np.uint32), "window factor words")


def test_source_window_factor():
    assert_source_has("grouped_gemm_dequant.cuh",
                      "constexpr unsigned kMxPairUnit = 0x00010001u << LPM_FP16_MANT_BITS;",
                      "return static_cast<unsigned>(code_bias - static_cast<int>(e_max)) * kMxPairUnit;",
                      "return e * kMxPairUnit + fk;")
    assert_source_has("grouped_gemm_ws_mx_consume.cuh",
                      "const unsigned ma0 = mx_block_factor<H>(ea0, fka),")
    assert_source_has("grouped_gemm_ws_mx.cuh",
                      "const unsigned fka = mx_window_row(exps_a[fr.ra0], bias_a);")
    assert_source_has("grouped_gemm_ws_mx_persist.cuh",
                      "const unsigned fka = H ? mx_window_row(w[fr.ra0], bias_a) : 0u;")
    assert_source_has("grouped_gemm_ws_mx_produce.cuh",
                      "if (live0) unit(x0, y0, mx_block_factor<H>(e0, fk0), cbb);",
                      "const unsigned fk0 = mx_window_row(exps_b[ur], bias_b);")
