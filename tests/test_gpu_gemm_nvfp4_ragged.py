"""The ragged persistent NVFP4 kernel (``lpm_gg_nvfp4_kk_g`` / ``_kk_g8``,
raw_kernels/grouped_gemm_ws_ragged.cuh) on the GPU: each CTA runs a balanced list of tiles whose
experts contract different token counts, the cp.async pipeline running on the CTA's k-tile
sequence across tile boundaries, empty experts' tiles zeroed by the consumers.

With the grid capped at 3 CTAs every CTA runs many tiles of mixed lengths (1 to 32 k-tiles,
empty ones, partial last k-tiles), so raw stages, canonical buffers and barrier counts wrap
across tile boundaries in every way. Checks, bit for bit against the one-CTA-per-tile
cp.async build (``_kk_x`` / ``_kk_x8``), run to run, and within tolerance of float64:

* NVFP4 and row-scaled NVFP4, bf16 and fp16 output, 8-byte copies (token counts padded to odd
  multiples of 16) and 16-byte copies (even multiples, uneven);
* an output buffer filled with NaN: empty experts' dW is +0;
* with the real multiprocessor count: "auto" takes the ragged form, which agrees with "off".
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

# token counts: empty experts, 1 to 32 k-tiles of 64, last k-tiles of 16 to 64 tokens; padded
# to 16 some rows are odd multiples of 8 bytes (8-byte copies)
SPLITS_8 = [0, 100, 1030, 37, 0, 2000, 64, 1088, 200, 33, 0, 960]
# ... and every count a multiple of 32, uneven (16-byte copies, no tensor map)
SPLITS_16 = [0, 96, 1024, 32, 0, 2016, 64, 1088, 224, 32, 0, 960]
W_OUT, W_IN = 320, 544  # wgrad output rows (dy columns) and columns: partial row / column tiles


def _operands(fmt, seed, splits):
    x, _, dy = _data(seed, sum(splits), W_OUT, W_IN)
    w = np.zeros((1, W_OUT, W_IN), np.float32)
    xq, _, dq = _quantize(fmt, x, w, dy, splits)
    return dq, xq


def _run(a, b, splits, monkeypatch, *, persist, out_dtype="bfloat16", out=None):
    from lowprec_moe.cuda import gemm as C

    monkeypatch.setenv(C.PERSIST_ENV, "on" if persist else "off")
    ga, gb = gpu(a), gpu(b)
    info = C.kernel_info(_validate("wgrad", ga, gb, splits, bias=None, probs=None,
                                   out_dtype=out_dtype, out=out, accumulate=False))
    ch = "8" if splits is SPLITS_8 else ""
    assert info["kernel"] == "lpm_gg_nvfp4_kk_" + ("g" if persist else "x") + ch, info
    res = to_host(grouped_gemm(ga, gb, splits, mode="wgrad", out_dtype=out_dtype, out=out))
    monkeypatch.delenv(C.PERSIST_ENV)
    return res


@pytest.mark.parametrize("copy", ["8", "16"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled"])
def test_gpu_nvfp4_ragged_equals_per_tile(fmt, out_dtype, copy, monkeypatch, few_ctas):
    _require_wgmma()
    splits = SPLITS_8 if copy == "8" else SPLITS_16
    a, b = _operands(fmt, 70, splits)
    what = f"ragged {fmt} {out_dtype} {copy}-byte copies"
    got = _run(a, b, splits, monkeypatch, persist=True, out_dtype=out_dtype)
    assert_bytes_equal(got, _run(a, b, splits, monkeypatch, persist=True, out_dtype=out_dtype),
                       f"{what}, run to run")
    assert_bytes_equal(got, _run(a, b, splits, monkeypatch, persist=False, out_dtype=out_dtype),
                       f"{what} vs the per-tile kernel")
    exp, mag = _expected("wgrad", a, b, splits)
    assert_gemm_close(got, exp, mag, what)


def test_gpu_nvfp4_ragged_empty_experts_zeroed(monkeypatch, few_ctas):
    """Into a NaN-filled output buffer: the empty experts' dW is +0, the others' equal a fresh
    buffer's."""
    _require_wgmma()
    import cupy as cp

    a, b = _operands("nvfp4", 71, SPLITS_8)
    fresh = _run(a, b, SPLITS_8, monkeypatch, persist=True)
    out = cp.full(fresh.shape, np.nan, dtype=cp.float32).astype(fresh.dtype)
    got = _run(a, b, SPLITS_8, monkeypatch, persist=True, out=out)
    assert_bytes_equal(got, fresh, "ragged into a NaN-filled buffer")
    for g, s in enumerate(SPLITS_8):
        if s == 0:
            assert not np.any(got[g].view(np.uint16)), g


def test_gpu_nvfp4_ragged_real_sm_count(monkeypatch):
    """With the real multiprocessor count and more tiles than multiprocessors: "auto" takes the
    ragged form for bf16 output, the per-tile kernel for fp32 and with "off"; both agree bit
    for bit on bf16."""
    _require_wgmma()
    from lowprec_moe.cuda import gemm as C

    splits = [0, 100, 1000, 37, 640, 2048, 200, 900] * 4
    x, _, dy = _data(72, sum(splits), 1024, 2048)
    w = np.zeros((1, 1024, 2048), np.float32)
    xq, _, dq = _quantize("nvfp4", x, w, dy, splits)
    ga, gb = gpu(dq), gpu(xq)

    def kernel(out_dtype):
        return C.kernel_info(_validate("wgrad", ga, gb, splits, bias=None, probs=None,
                                       out_dtype=out_dtype, out=None, accumulate=False))["kernel"]

    assert kernel("bfloat16") == "lpm_gg_nvfp4_kk_g8"
    assert kernel("float32") == "lpm_gg_nvfp4_kk_x8"
    ragged = to_host(grouped_gemm(ga, gb, splits, mode="wgrad", out_dtype="bfloat16"))
    monkeypatch.setenv(C.PERSIST_ENV, "off")
    assert kernel("bfloat16") == "lpm_gg_nvfp4_kk_x8"
    assert_bytes_equal(ragged,
                       to_host(grouped_gemm(ga, gb, splits, mode="wgrad", out_dtype="bfloat16")),
                       "ragged (auto) vs per-tile (off)")
