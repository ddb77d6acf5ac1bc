"""MXFP8 on fp16 tensor cores (raw_kernels/gemm/grouped_gemm_mxf16.cuh), on the GPU.

The wgmma kernels stage an MXFP8 tile as ``q * 2^(e - e_max(row) + S_MAX)`` in fp16 when every
row and column of the tile keeps its block codes within the fp16 window (E4M3: 21 codes, E5M2: 8),
its scale rows are 16-byte aligned and its contraction has at least 32 k-tiles (2048); otherwise
the tile takes the bf16 path. The problems below mix both kinds of tile. Checks:

* in-window data: the fp16 path gives the bf16 path's bits
  (``lowprec_moe.config.gemm(mxfp8_mma="bf16")``), in every mode and fp8 mix, and both agree
  with the float64 product;
* tiny blocks (codes near 0, which the bf16 path truncates onto bf16's subnormal grid): the fp16
  path is exact -- within the float64 tolerance where the bf16 path is not (so the fp16 path ran);
* rows spanning more than the window, and the NaN scale: the tile falls back to bf16, same
  bits; NaN data propagates on both paths;
* the window's edge: rows spanning exactly the window take the fp16 path, one code more falls
  back (E4M3 and E5M2);
* grouped == per-expert calls, bitwise, with in-window and out-of-window experts mixed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lowprec_moe import config
from lowprec_moe.gemm import grouped_gemm

from conftest import assert_bytes_equal, requires_gpu, set_gemm_options, to_host
from test_gemm import _data, _expected, _member_operands, _quantize, assert_gemm_close
from test_gpu_gemm import gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

# M-grouped: every tile contracts 2048 (fp16 window possible); K-grouped (wgrad): experts 1, 3
# and 5 contract >= 2048 tokens, the others are short (bf16 path)
SPLITS = {"fprop": [0, 300, 37, 260, 5, 129], "dgrad": [0, 300, 37, 260, 5, 129],
          "wgrad": [0, 2100, 37, 2050, 5, 2080]}
# aligned scale rows: the contraction a multiple of 512 for rowwise operands, the columns of
# columnwise operands a multiple of 16
SHAPES = {"fprop": (320, 2048), "dgrad": (2048, 320), "wgrad": (320, 320)}
FP8 = ["mxfp8-e4m3", "mxfp8-e5m2", "mxfp8-hybrid"]


def _operands(mode, fmt, seed, *, x_scale=None, w_scale=None, dy_scale=None):
    n, k = SHAPES[mode]
    splits = SPLITS[mode]
    x, w, dy = _data(seed, sum(splits), n, k)
    if len(splits) != w.shape[0]:
        w = np.random.default_rng(seed + 1).standard_normal((len(splits), n, k)).astype(x.dtype)
    for arr, f in ((x, x_scale), (w, w_scale), (dy, dy_scale)):
        if f is not None:
            arr *= f
    xq, wq, dq = _quantize(fmt, x, w, dy, splits)
    ops = {"fprop": (xq, wq), "dgrad": (dq, wq), "wgrad": (dq, xq)}[mode]
    return ops, (x, w, dy)


def _both(mode, a, b):
    """(auto, bf16-forced) float32 results of one problem."""
    splits = SPLITS[mode]
    ga, gb = gpu(a), gpu(b)
    with config.gemm(mxfp8_mma="auto"):
        auto = to_host(grouped_gemm(ga, gb, splits, mode=mode, out_dtype="float32"))
    with config.gemm(mxfp8_mma="bf16"):
        bf = to_host(grouped_gemm(ga, gb, splits, mode=mode, out_dtype="float32"))
    return auto, bf


def _require_wgmma():
    from lowprec_moe.backends.cupy.gemm.select import device_caps

    if device_caps()[0] != (9, 0):
        pytest.skip("the MXFP8 fp16 window is a wgmma (sm_90a) kernel path")


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
def test_gpu_fp16_window_equals_bf16_bitwise(mode, fmt):
    _require_wgmma()
    (a, b), _ = _operands(mode, fmt, 31)
    auto, bf = _both(mode, a, b)
    exp, mag = _expected(mode, a, b, SPLITS[mode])
    assert_gemm_close(auto, exp, mag, f"fp16 window {mode} {fmt}")
    assert_bytes_equal(auto, bf, f"fp16 window vs bf16 {mode} {fmt}")


@pytest.mark.parametrize("mode", ["fprop", "wgrad"])
def test_gpu_fp16_window_exact_for_tiny_blocks(mode):
    """x scaled by 2^-128 (block code 0: most elements below bf16's normal range) and the
    other operand by 2^100, so every product is an fp32 normal: the fp16 path matches float64,
    the bf16 path (truncated subnormals) does not."""
    _require_wgmma()
    (a, b), _ = _operands(mode, "mxfp8-e4m3", 32, x_scale=np.float32(2.0 ** -128),
                          w_scale=np.float32(2.0 ** 100), dy_scale=np.float32(2.0 ** 100))
    auto, bf = _both(mode, a, b)
    exp, mag = _expected(mode, a, b, SPLITS[mode])
    if mode == "wgrad":  # the experts long enough for the fp16 window
        long = [g for g, t in enumerate(SPLITS[mode]) if t >= 2048]
        auto, bf, exp, mag = auto[long], bf[long], exp[long], mag[long]
    assert_gemm_close(auto, exp, mag, f"fp16 window, tiny blocks {mode}")
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_gemm_close(bf, exp, mag, f"bf16 path, tiny blocks {mode}")


@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
def test_gpu_wide_rows_fall_back_to_bf16(mode):
    """Every 7th contraction block of the operands scaled by 2^40 (rows span ~40 codes, beyond
    the E4M3 window): those tiles take the bf16 path -- same bits as forcing it, and correct."""
    _require_wgmma()
    n, k = SHAPES[mode]
    m = sum(SPLITS[mode])
    wide = {"fprop": np.ones(k, np.float32), "dgrad": np.ones(n, np.float32),
            "wgrad": np.ones(m, np.float32)}[mode]
    wide[::7 * 32] = np.float32(2.0 ** 40)
    if mode == "fprop":
        kw = dict(x_scale=wide, w_scale=wide)
    elif mode == "dgrad":
        kw = dict(dy_scale=wide)
    else:
        kw = dict(x_scale=wide[:, None], dy_scale=wide[:, None])
    (a, b), _ = _operands(mode, "mxfp8-e4m3", 33, **kw)
    auto, bf = _both(mode, a, b)
    exp, mag = _expected(mode, a, b, SPLITS[mode])
    assert_gemm_close(auto, exp, mag, f"wide rows {mode}")
    assert_bytes_equal(auto, bf, f"wide rows: fallback vs bf16 {mode}")


def _fp16_window(e5m2):
    """Block codes a row may span and still stage exactly in fp16: S_MAX - S_MIN of the
    kernels' window (grouped_gemm_staging.cuh), from the format constants."""
    from lowprec_moe import formats as F

    mant, bias, fmax = ((F.E5M2_MANT_BITS, F.E5M2_EXP_BIAS, F.E5M2_MAX) if e5m2
                        else (F.E4M3_MANT_BITS, F.E4M3_EXP_BIAS, F.E4M3_MAX))
    max_exp = int(np.floor(np.log2(fmax)))  # exponent of the largest finite value
    min_exp = 1 - bias - mant  # exponent of the smallest subnormal
    s_max = F.FP16_EXP_BIAS - max_exp
    s_min = max(1 - F.FP16_EXP_BIAS, 1 - F.FP16_EXP_BIAS - F.FP16_MANT_BITS - min_exp)
    return s_max - s_min


@pytest.mark.parametrize("extra", [0, 1])
@pytest.mark.parametrize("fmt", ["mxfp8-e4m3", "mxfp8-e5m2"])
def test_gpu_window_edge(fmt, extra):
    """Every row of x spans exactly the window (extra=0: fp16 path) or one code more (extra=1:
    bf16 path). x is tiny (scaled by 2^-128: block codes near 0, which the bf16 path truncates)
    except contraction elements 0 and 32 (blocks 0 and 1), set to 2^t with t chosen so that those
    blocks' code is the row's smallest code + window + extra; W's block 1 is minus its block 0,
    so the two large products cancel exactly as the first k-tile's accumulation starts and the
    output is the tiny blocks' sum. Within the window the result matches the float64 product of
    the tiny blocks; one code past it the tile falls back (the bf16 path's bits, out of
    tolerance: its truncation of the tiny blocks shows in most output elements). If the kernel
    ignored the window, extra=1 would differ from forced bf16; if it always fell back, extra=0
    would be out of tolerance."""
    _require_wgmma()
    from lowprec_moe import formats as F

    e5 = fmt == "mxfp8-e5m2"
    window = _fp16_window(e5)
    assert window == (8 if e5 else 21)  # the kernels' static_assert
    elem_emax = int(np.floor(np.log2(F.E5M2_MAX if e5 else F.E4M3_MAX)))  # largest exponent
    n, k = SHAPES["fprop"]
    splits = SPLITS["fprop"]
    x, w, dy = _data(36, sum(splits), n, k)
    w = np.random.default_rng(37).standard_normal((len(splits), n, k)).astype(np.float32)
    x *= np.float32(2.0 ** -128)
    w *= np.float32(2.0 ** 100)
    w[:, :, 32:64] = -w[:, :, 0:32]
    codes = _quantize(fmt, x, w, dy, splits)[0].rowwise_scale[:, 2:k // 32]
    e_min = codes.astype(np.int64).min(axis=1)
    big = np.exp2(e_min + window + extra - F.E8M0_BIAS + elem_emax).astype(np.float32)
    x[:, 0:64] = 0
    x[:, 0] = big
    x[:, 32] = big
    xq, wq, _ = _quantize(fmt, x, w, dy, splits)
    assert (xq.rowwise_scale[:, 0].astype(np.int64) == e_min + window + extra).all()
    auto, bf = _both("fprop", xq, wq)
    tiny = dataclasses.replace(xq, rowwise_data=xq.rowwise_data.copy())
    tiny.rowwise_data[:, [0, 32]] = 0
    exp, mag = _expected("fprop", tiny, wq, splits)
    if extra == 0:
        assert_gemm_close(auto, exp, mag, f"window edge {fmt}")
        with pytest.raises(AssertionError, match="out of tolerance"):
            assert_gemm_close(bf, exp, mag, f"window edge, bf16 path {fmt}")
    else:
        assert_bytes_equal(auto, bf, f"one code past the window: fallback {fmt}")
        with pytest.raises(AssertionError, match="out of tolerance"):
            assert_gemm_close(auto, exp, mag, f"one code past the window {fmt}")


def test_gpu_nan_data_propagates():
    """A NaN input (its block: scale code 0, NaN data codes; the tile spans ~120 codes and takes
    the bf16 path) gives a NaN row on both paths, the other rows the same bits."""
    _require_wgmma()
    x_scale = np.ones((sum(SPLITS["fprop"]), 1), np.float32)
    x_scale[310] = np.nan
    (a, b), _ = _operands("fprop", "mxfp8-e4m3", 34, x_scale=x_scale)
    auto, bf = _both("fprop", a, b)
    assert np.isnan(auto[310]).all() and np.isnan(bf[310]).all()
    keep = np.ones(auto.shape[0], bool)
    keep[310] = False
    assert_bytes_equal(auto[keep], bf[keep], "NaN data: other rows")


def test_gpu_nan_scale_falls_back():
    """The NaN scale code (255) on one block of row 310 keeps its tile off the fp16 window:
    row 310 is NaN on both paths, every other row the same bits."""
    _require_wgmma()
    (a, b), _ = _operands("fprop", "mxfp8-e4m3", 37)
    a.rowwise_scale[310, 3] = 255
    auto, bf = _both("fprop", a, b)
    assert np.isnan(auto[310]).all() and np.isnan(bf[310]).all()
    keep = np.ones(auto.shape[0], bool)
    keep[310] = False
    assert_bytes_equal(auto[keep], bf[keep], "NaN scale: other rows")


@pytest.mark.parametrize("mode", ["fprop", "wgrad"])
def test_gpu_fp16_window_grouped_equals_per_expert(mode, monkeypatch):
    """Experts 1 and 3 tiny-scaled (in the window), expert 5 wide (out of it): one grouped call
    == one call per expert, bitwise."""
    _require_wgmma()
    set_gemm_options(monkeypatch)  # auto kernel choice and MMA type
    n, k = SHAPES[mode]
    splits = SPLITS[mode]
    offs = np.concatenate([[0], np.cumsum(splits)])
    rs = np.ones((sum(splits), 1), np.float32)
    rs[offs[1]:offs[2]] = np.float32(2.0 ** -100)
    rs[offs[3]:offs[4]] = np.float32(2.0 ** -90)
    (a, b), (x, w, dy) = _operands(mode, "mxfp8-e4m3", 35, x_scale=rs)
    if mode == "fprop":
        cw = np.ones(k, np.float32)
        cw[::5 * 32] = np.float32(2.0 ** 30)
        x[offs[5]:offs[6]] *= cw
    else:
        x[offs[5]:offs[6]:40] *= np.float32(2.0 ** 30)
    xq, wq, dq = _quantize("mxfp8-e4m3", x, w, dy, splits)
    a, b = {"fprop": (xq, wq), "wgrad": (dq, xq)}[mode]
    full = to_host(grouped_gemm(gpu(a), gpu(b), splits, mode=mode, out_dtype="float32"))
    exp, mag = _expected(mode, a, b, SPLITS[mode])
    assert_gemm_close(full, exp, mag, f"mixed experts {mode}")
    for g in range(len(splits)):
        lo, hi = int(offs[g]), int(offs[g + 1])
        ag, bg = _member_operands(mode, "mxfp8-e4m3", x, w, dy, g, lo, hi)
        one = to_host(grouped_gemm(gpu(ag), gpu(bg), [hi - lo], mode=mode, out_dtype="float32"))
        ref = full[g:g + 1] if mode == "wgrad" else full[lo:hi]
        assert_bytes_equal(one, ref, f"mixed experts {mode} expert {g}")
