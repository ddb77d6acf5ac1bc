"""The ragged persistent MXFP8 wgrad kernel (``lpm_gg_mxfp8_nn_g``,
raw_kernels/grouped_gemm_ws_mx_ragged.cuh) on the GPU: each CTA runs a balanced list of tiles
whose experts contract different token counts, every tile starting its own scale group, a last
k-tile that ends early zeroed past its end by the producers, empty experts' tiles zeroed by the
consumers, window slots in a ring with mbarriers.

With the grid capped at 3 CTAs every CTA runs many tiles of mixed lengths (1 to 17 k-tiles,
empty ones, partial last k-tiles), so the rings, window slots and barrier phases wrap across
tile boundaries in every way. Checks, bit for bit against the one-CTA-per-tile kernel
(``_nn_y``) and within tolerance of float64:

* E4M3 (every row in the fp16 window: the launch on fp16, while the per-tile kernel keeps
  tiles of fewer than 4 k-tiles on bf16 -- the same bits on such data) and hybrid (E5M2
  gradients, some rows outside the window: the launch on bf16), bf16 and fp16 output;
* rows spanning more than the window (the launch on bf16), and bf16 forced;
* an output buffer filled with NaN: empty experts' dW is +0;
* with the real multiprocessor count: "auto" keeps the per-tile kernel, "on" takes the ragged
  form.
"""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe.gemm import _validate, grouped_gemm

from conftest import assert_bytes_equal, requires_gpu, to_host
from test_gemm import _data, _expected, _quantize, assert_gemm_close
from test_gpu_gemm import gpu
from test_gpu_gemm_mxfp8_ws import _require_wgmma
from test_gpu_gemm_persist import few_ctas  # noqa: F401 - fixture

pytestmark = [pytest.mark.gpu, requires_gpu]

# token counts (padded to 32): empty experts, 1 to 32 k-tiles, scale groups of one k-tile (17)
# and of a partial one (32: 7.5), last k-tiles of 32 and 64 tokens, the mean above
# MXFP8_WS_WGRAD_MIN_LEN
SPLITS = [0, 100, 1030, 37, 0, 2000, 64, 1088, 200, 33, 0, 960]
W_OUT, W_IN = 320, 544  # wgrad output rows (dy columns) and columns: partial row / column tiles


def _operands(fmt, seed, *, wide=False):
    x, _, dy = _data(seed, sum(SPLITS), W_OUT, W_IN)
    if wide:  # some dy columns (output rows of the second row tile) span ~40 block codes
        dy[::7 * 32, 130:140] *= np.float32(2.0 ** 40)
    w = np.zeros((1, W_OUT, W_IN), np.float32)
    xq, _, dq = _quantize(fmt, x, w, dy, SPLITS)
    return dq, xq


def _run(a, b, monkeypatch, *, persist, out_dtype="bfloat16", out=None):
    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setenv(C.PERSIST_ENV, "on" if persist else "off")
    ga, gb = gpu(a), gpu(b)
    info = C.kernel_info(_validate("wgrad", ga, gb, SPLITS, bias=None, probs=None,
                                   out_dtype=out_dtype, out=out, accumulate=False))
    assert info["kernel"] == "lpm_gg_mxfp8_nn_" + ("g" if persist else "y"), info
    res = to_host(grouped_gemm(ga, gb, SPLITS, mode="wgrad", out_dtype=out_dtype, out=out))
    monkeypatch.delenv(C.PERSIST_ENV)
    return res


def _out_of_window(a, b) -> int:
    from lowprec_moe.backends.cupy.gemm import launch as C

    p = _validate("wgrad", gpu(a), gpu(b), SPLITS, bias=None, probs=None, out_dtype="bfloat16",
                  out=None, accumulate=False)
    arrays = C._operand_arrays(p)
    _, flag = C._range_words(C._prepare(p, arrays), arrays[1], arrays[4])
    return int(to_host(flag)[0])


def _check(a, b, monkeypatch, what, out_dtype="bfloat16"):
    got = _run(a, b, monkeypatch, persist=True, out_dtype=out_dtype)
    assert_bytes_equal(got, _run(a, b, monkeypatch, persist=True, out_dtype=out_dtype),
                       f"{what}, run to run")
    assert_bytes_equal(got, _run(a, b, monkeypatch, persist=False, out_dtype=out_dtype),
                       f"{what} vs the per-tile kernel")
    exp, mag = _expected("wgrad", a, b, SPLITS)
    assert_gemm_close(got, exp, mag, what)


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["mxfp8-e4m3", "mxfp8-hybrid"])
def test_gpu_mxfp8_ragged_equals_per_tile(fmt, out_dtype, monkeypatch, few_ctas):
    """E4M3: every row in the fp16 window (the launch on fp16); hybrid: the E5M2 gradient's
    narrower window leaves some rows outside (the launch on bf16)."""
    _require_wgmma()
    a, b = _operands(fmt, 60)
    assert _out_of_window(a, b) == (0 if fmt == "mxfp8-e4m3" else 1)
    _check(a, b, monkeypatch, f"ragged {fmt} {out_dtype}", out_dtype)


@pytest.mark.parametrize("mma", ["auto", "bf16"])
def test_gpu_mxfp8_ragged_mixed_modes(mma, monkeypatch, few_ctas):
    """Some rows beyond the window (the launch on bf16), and every tile on bf16 when forced."""
    _require_wgmma()
    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setenv(C.MXFP8_MMA_ENV, mma)
    a, b = _operands("mxfp8-e4m3", 61, wide=True)
    assert _out_of_window(a, b) == 1
    _check(a, b, monkeypatch, f"ragged wide rows {mma}")


def test_gpu_mxfp8_ragged_empty_experts_zeroed(monkeypatch, few_ctas):
    """Into a NaN-filled output buffer: the empty experts' dW is +0, the others' equal a fresh
    buffer's."""
    _require_wgmma()
    import cupy as cp

    a, b = _operands("mxfp8-e4m3", 62)
    fresh = _run(a, b, monkeypatch, persist=True)
    out = cp.full(fresh.shape, np.nan, dtype=cp.float32).astype(fresh.dtype)
    got = _run(a, b, monkeypatch, persist=True, out=out)
    assert_bytes_equal(got, fresh, "ragged into a NaN-filled buffer")
    for g, s in enumerate(SPLITS):
        if s == 0:
            assert not np.any(got[g].view(np.uint16)), g


def test_gpu_mxfp8_ragged_real_sm_count(monkeypatch):
    """With the real multiprocessor count and more tiles than multiprocessors: "auto" keeps the
    per-tile kernel for uneven experts (the ragged form measured slower), "on" takes the ragged
    form for bf16 output, the per-tile kernel for fp32; the two agree bit for bit on bf16."""
    _require_wgmma()
    from lowprec_moe.backends.cupy.gemm import launch as C

    splits = [0, 100, 1000, 37, 640, 2048, 200, 900] * 4
    x, _, dy = _data(63, sum(splits), 1024, 2048)
    w = np.zeros((1, 1024, 2048), np.float32)
    xq, _, dq = _quantize("mxfp8-e4m3", x, w, dy, splits)
    ga, gb = gpu(dq), gpu(xq)

    def kernel(out_dtype):
        return C.kernel_info(_validate("wgrad", ga, gb, splits, bias=None, probs=None,
                                       out_dtype=out_dtype, out=None, accumulate=False))["kernel"]

    assert kernel("bfloat16") == "lpm_gg_mxfp8_nn_y"
    per_tile = to_host(grouped_gemm(ga, gb, splits, mode="wgrad", out_dtype="bfloat16"))
    monkeypatch.setenv(C.PERSIST_ENV, "on")
    assert kernel("bfloat16") == "lpm_gg_mxfp8_nn_g"
    assert kernel("float32") == "lpm_gg_mxfp8_nn_y"
    assert_bytes_equal(to_host(grouped_gemm(ga, gb, splits, mode="wgrad", out_dtype="bfloat16")),
                       per_tile, "ragged (on) vs per-tile (auto)")
