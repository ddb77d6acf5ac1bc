"""The warp-specialised MXFP8 kernel (``grouped_gemm_sm90_mxfp8_wgmma_ws_tma_128x256_kk`` /
``_kn`` / ``_nn``, raw_kernels/gemm/grouped_gemm_ws_mx.cuh) on the GPU: MXFP8 fprop, dgrad and wgrad with the 128-row
tile, TMA loads, producers widening B (dgrad: W's columnwise copy, wgrad: x's, MN-major) and
consumers widening A into wgmma registers (wgrad: dy's columnwise copy, MN-major, read with
ldmatrix.trans in row pairs), each tile on fp16 (fp16 window) or bf16.

Checks, each against the plain wgmma kernel (``grouped_gemm_sm90_mxfp8_wgmma_cpasync_128x256_*``)
bit for bit and
against the float64 product of the dequantized operands:

* in-window data with 8, 16 and 32 k-tiles (fp16 in the warp-specialised kernel from 4
  k-tiles, in the plain one from 32: the two staging modes give the same bits on such data),
  E4M3 and E5M2 (fprop / dgrad need K a multiple of 512, so they never see fewer than 8
  k-tiles);
* the bf16 path forced (``lowprec_moe.config.gemm(mxfp8_mma="bf16")``) and rows spanning more
  than the window;
* ragged experts (empty, shorter than a tile, partial column tiles), bias and bf16 output;
* grouped == per-expert calls;
* wgrad (K-grouped: every expert contracts its own tokens) with 8 to 32 k-tiles, partial row and
  column tiles, and accumulation into an fp32 buffer; experts of different token counts, whose
  last k-tile ends early (the next expert's lines are read and must not count), also when the
  next expert's first block holds NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe import config
from lowprec_moe.gemm import grouped_gemm

from conftest import assert_bytes_equal, requires_gpu, set_gemm_options, to_host
from test_gemm import _data, _expected, _quantize, assert_gemm_close
from test_gpu_gemm import gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

SPLITS = [0, 300, 37, 260, 5, 129]
N = 320  # two column tiles, the second partial


def _require_wgmma():
    from lowprec_moe.backends.cupy.gemm.select import device_caps

    if device_caps()[0] != (9, 0):
        pytest.skip("the warp-specialised MXFP8 kernel is a wgmma (sm_90a) kernel")


def _problem(fmt, length, seed, *, mode="fprop", scale=None, splits=SPLITS):
    """(A, B) of an fprop (contraction K = length, N output columns) or dgrad (contraction N =
    length, K = N output columns) problem; ``scale`` multiplies the contraction dimension."""
    n, k = (N, length) if mode == "fprop" else (length, N)
    x, w, dy = _data(seed, sum(splits), n, k)
    w = np.random.default_rng(seed + 1).standard_normal((len(splits), n, k)).astype(x.dtype)
    if scale is not None:
        if mode == "fprop":
            x *= scale
            w *= scale
        else:
            dy *= scale
            w *= scale[:, None]
    xq, wq, dq = _quantize(fmt, x, w, dy, splits)
    return (xq, wq) if mode == "fprop" else (dq, wq)


LAYOUT = {"fprop": "kk", "dgrad": "kn", "wgrad": "nn"}


def ws_kernel(mode, persistent=False):
    """The warp-specialised MXFP8 config of a mode (per tile, or its persistent form)."""
    return ("grouped_gemm_sm90_mxfp8_wgmma_ws_tma_" + ("persistent_" if persistent else "")
            + f"128x256_{LAYOUT[mode]}")


def plain_kernel(mode):
    """The plain wgmma MXFP8 config of a mode (128-row tile)."""
    return f"grouped_gemm_sm90_mxfp8_wgmma_cpasync_128x256_{LAYOUT[mode]}"


def _run(a, b, splits, *, ws, mode="fprop", **kw):
    """One call on the GPU on the warp-specialised kernel (``ws=True``), the plain wgmma kernel
    (``False``) or whatever "auto" picks (``None``), checking which kernel runs."""
    from lowprec_moe.backends.cupy.gemm import launch as C
    from lowprec_moe.gemm import _validate

    kernel = "auto" if ws is None else ws_kernel(mode) if ws else plain_kernel(mode)
    ga, gb = gpu(a), gpu(b)
    kw.setdefault("out_dtype", "float32")
    with config.gemm(kernel=kernel):
        info = C.kernel_info(_validate(mode, ga, gb, splits, bias=kw.get("bias"), probs=None,
                                       out_dtype=kw["out_dtype"], out=None, accumulate=False))
        if ws is not None:
            assert info["kernel"] == kernel, info
        return to_host(grouped_gemm(ga, gb, splits, mode=mode, **kw))


@pytest.mark.parametrize("mma", ["auto", "bf16"])
@pytest.mark.parametrize("length", [512, 1024, 2048])
@pytest.mark.parametrize("fmt", ["mxfp8-e4m3", "mxfp8-e5m2", "mxfp8-hybrid"])
@pytest.mark.parametrize("mode", ["fprop", "dgrad"])
def test_gpu_mxfp8_ws_equals_plain(mode, fmt, length, mma, monkeypatch):
    """(hybrid: E5M2 dy against E4M3 W in dgrad)"""
    _require_wgmma()
    set_gemm_options(monkeypatch, mxfp8_mma=mma)
    a, b = _problem(fmt, length, 41 + length, mode=mode)
    ws = _run(a, b, SPLITS, ws=True, mode=mode)
    plain = _run(a, b, SPLITS, ws=False, mode=mode)
    exp, mag = _expected(mode, a, b, SPLITS)
    assert_gemm_close(ws, exp, mag, f"ws {mode} {fmt} length={length} {mma}")
    assert_bytes_equal(ws, plain, f"ws vs plain {mode} {fmt} length={length} {mma}")


@pytest.mark.parametrize("mode", ["fprop", "dgrad"])
def test_gpu_mxfp8_ws_wide_rows_fall_back(mode):
    """Every 7th contraction block scaled by 2^40: rows span ~40 codes, beyond the E4M3
    window, so the tiles take the bf16 path in both kernels."""
    _require_wgmma()
    length = 2048
    wide = np.ones(length, np.float32)
    wide[::7 * 32] = np.float32(2.0 ** 40)
    a, b = _problem("mxfp8-e4m3", length, 43, mode=mode, scale=wide)
    ws = _run(a, b, SPLITS, ws=True, mode=mode)
    plain = _run(a, b, SPLITS, ws=False, mode=mode)
    exp, mag = _expected(mode, a, b, SPLITS)
    assert_gemm_close(ws, exp, mag, f"ws wide rows {mode}")
    assert_bytes_equal(ws, plain, f"ws vs plain, wide rows {mode}")


def test_gpu_mxfp8_ws_tiny_blocks_exact(monkeypatch):
    """x scaled by 2^-128 and W by 2^100 (every product an fp32 normal): the fp16 window of the
    warp-specialised kernel is exact where the bf16 path truncates."""
    _require_wgmma()
    k = 1024
    x, _, _ = _data(44, sum(SPLITS), N, k)
    w = np.random.default_rng(45).standard_normal((len(SPLITS), N, k)).astype(x.dtype)
    x *= np.float32(2.0 ** -128)
    w *= np.float32(2.0 ** 100)
    a, b, _ = _quantize("mxfp8-e4m3", x, w, np.zeros((sum(SPLITS), N), np.float32), SPLITS)
    ws = _run(a, b, SPLITS, ws=True)
    exp, mag = _expected("fprop", a, b, SPLITS)
    assert_gemm_close(ws, exp, mag, "ws tiny blocks")
    set_gemm_options(monkeypatch, mxfp8_mma="bf16")
    bf = _run(a, b, SPLITS, ws=True)
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_gemm_close(bf, exp, mag, "ws bf16 path, tiny blocks")


def test_gpu_mxfp8_ws_epilogue_bf16_out():
    """Bias and bf16 output through the warp-specialised kernel: the plain kernel's bits."""
    _require_wgmma()
    a, b = _problem("mxfp8-e4m3", 1024, 45)
    bias = np.random.default_rng(46).standard_normal((len(SPLITS), N)).astype(np.float32)
    kw = dict(bias=gpu(bias), out_dtype="bfloat16")
    ws = _run(a, b, SPLITS, ws=True, **kw)
    plain = _run(a, b, SPLITS, ws=False, **kw)
    assert_bytes_equal(ws, plain, "ws vs plain, bias + bf16 output")
    exp, mag = _expected("fprop", a, b, SPLITS, bias=bias)
    assert_gemm_close(ws, exp, mag, "ws bias + bf16 output")


def test_gpu_mxfp8_ws_grouped_equals_per_expert():
    """Each expert alone gives the grouped call's rows: its own launch, its own tiles, and for
    the short experts another kernel (the 64-row tile, the swapped-operand kernel), all on the
    same values."""
    _require_wgmma()
    k = 1024
    x, w, _ = _data(47, sum(SPLITS), N, k)
    w = np.random.default_rng(48).standard_normal((len(SPLITS), N, k)).astype(x.dtype)
    zeros = np.zeros((sum(SPLITS), N), np.float32)
    a, b, _ = _quantize("mxfp8-e4m3", x, w, zeros, SPLITS)
    grouped = _run(a, b, SPLITS, ws=True)
    offs = np.concatenate([[0], np.cumsum(SPLITS)])
    for g, t in enumerate(SPLITS):
        if t == 0:
            continue
        one = [0] * len(SPLITS)
        one[g] = t
        xg = x[offs[g]:offs[g + 1]]
        ag, bg, _ = _quantize("mxfp8-e4m3", xg, w, zeros[:t], one)
        got = _run(ag, bg, one, ws=True if t >= 128 else None)
        assert_bytes_equal(got, grouped[offs[g]:offs[g + 1]], f"expert {g} alone vs grouped")


W_OUT, W_IN = 320, 384  # wgrad output rows (dy columns) and columns (x columns): partial tiles


def _wgrad_problem(fmt, splits, seed, *, scale=None):
    """(dy, x) columnwise GroupedTensors of a wgrad problem with ``splits`` tokens per expert;
    ``scale`` multiplies the token rows of both."""
    x, _, dy = _data(seed, sum(splits), W_OUT, W_IN)
    if scale is not None:
        x *= scale[:, None]
        dy *= scale[:, None]
    w = np.zeros((1, W_OUT, W_IN), np.float32)
    xq, _, dq = _quantize(fmt, x, w, dy, splits)
    return dq, xq


@pytest.mark.parametrize("mma", ["auto", "bf16"])
@pytest.mark.parametrize("tokens", [512, 1024, 2048])
@pytest.mark.parametrize("fmt", ["mxfp8-e4m3", "mxfp8-e5m2", "mxfp8-hybrid"])
def test_gpu_mxfp8_ws_wgrad_equals_plain(fmt, tokens, mma, monkeypatch):
    """wgrad (``_nn_y``): 8, 16 and 32 k-tiles per expert (hybrid: E5M2 dy against E4M3 x)."""
    _require_wgmma()
    set_gemm_options(monkeypatch, mxfp8_mma=mma)
    splits = [tokens] * 3
    a, b = _wgrad_problem(fmt, splits, 50 + tokens)
    ws = _run(a, b, splits, ws=True, mode="wgrad")
    plain = _run(a, b, splits, ws=False, mode="wgrad")
    exp, mag = _expected("wgrad", a, b, splits)
    assert_gemm_close(ws, exp, mag, f"ws wgrad {fmt} tokens={tokens} {mma}")
    assert_bytes_equal(ws, plain, f"ws vs plain wgrad {fmt} tokens={tokens} {mma}")


def test_gpu_mxfp8_ws_wgrad_wide_rows_and_accumulate():
    """wgrad with every 7th token block scaled by 2^40 (rows beyond the window: bf16 path),
    then accumulating into an fp32 buffer: the plain kernel's bits both times."""
    _require_wgmma()
    tokens = 1024
    wide = np.ones(2 * tokens, np.float32)
    wide[::7 * 32] = np.float32(2.0 ** 40)
    splits = [tokens] * 2
    a, b = _wgrad_problem("mxfp8-e4m3", splits, 51, scale=wide)
    ws = _run(a, b, splits, ws=True, mode="wgrad")
    plain = _run(a, b, splits, ws=False, mode="wgrad")
    exp, mag = _expected("wgrad", a, b, splits)
    assert_gemm_close(ws, exp, mag, "ws wgrad wide rows")
    assert_bytes_equal(ws, plain, "ws vs plain, wgrad wide rows")
    base = np.random.default_rng(52).standard_normal(ws.shape).astype(np.float32)
    acc = {}
    for on in (True, False):
        out = gpu(base.copy())
        _run(a, b, splits, ws=on, mode="wgrad", out=out, accumulate=True)
        acc[on] = to_host(out)
    assert_bytes_equal(acc[True], acc[False], "ws vs plain, wgrad accumulate")
    assert_gemm_close(acc[True], exp + base, mag + np.abs(base), "ws wgrad accumulate")


@pytest.mark.parametrize("fmt", ["mxfp8-e4m3", "mxfp8-hybrid"])
@pytest.mark.parametrize("splits", [[0, 37, 300, 5, 0, 130, 16], [1056, 0, 544, 2080, 31]],
                         ids=["short", "long"])
def test_gpu_mxfp8_ws_wgrad_ragged(fmt, splits):
    """wgrad over experts of different token counts (padded to 32: last k-tiles of 32 lines;
    1056 and 2080 tokens give 17 and 33 k-tiles, on fp16 in the warp-specialised kernel, the
    latter in the plain one too): the plain kernel's bits, float64 within tolerance."""
    _require_wgmma()
    a, b = _wgrad_problem(fmt, splits, 53)
    ws = _run(a, b, splits, ws=True, mode="wgrad")
    plain = _run(a, b, splits, ws=False, mode="wgrad")
    exp, mag = _expected("wgrad", a, b, splits)
    assert_gemm_close(ws, exp, mag, f"ws wgrad ragged {fmt} {splits}")
    assert_bytes_equal(ws, plain, f"ws vs plain wgrad ragged {fmt} {splits}")


@pytest.mark.parametrize("first", [96, 1056], ids=["bf16", "fp16-window"])
def test_gpu_mxfp8_ws_wgrad_tail_before_nan_block(first):
    """wgrad where an expert's last k-tile ends after one block (96 or 1056 tokens: 32 of the
    last 64 lines) and the next expert's first block holds NaN: the lines and the block code
    past the first expert's end are the next expert's, and must not reach its outputs (0 *
    NaN); its gradient is the plain kernel's, bit for bit, and finite (1056 tokens: 17 k-tiles,
    on fp16 in the warp-specialised kernel)."""
    _require_wgmma()
    splits = [first, 64]
    x, _, dy = _data(54, sum(splits), W_OUT, W_IN)
    dy[first:first + 4, 7:200] = np.nan
    x[first + 1, 3:150] = np.nan
    w = np.zeros((1, W_OUT, W_IN), np.float32)
    xq, _, dq = _quantize("mxfp8-e4m3", x, w, dy, splits)
    ws = _run(dq, xq, splits, ws=True, mode="wgrad")
    plain = _run(dq, xq, splits, ws=False, mode="wgrad")
    assert np.isfinite(ws[0]).all() and np.isnan(ws[1]).any()
    assert_bytes_equal(ws[0], plain[0], f"ws vs plain, expert before a NaN block ({first})")
    exp, mag = _expected("wgrad", dq, xq, splits)
    assert_gemm_close(ws[:1], exp[:1], mag[:1], f"ws wgrad before a NaN block ({first})")
