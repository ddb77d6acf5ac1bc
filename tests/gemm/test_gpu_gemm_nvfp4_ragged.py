"""The ragged persistent NVFP4 kernel (its row-pair TMA build
``grouped_gemm_sm90_nvfp4_wgmma_ws_rowpair_tma_ragged_128x256_kk`` / ``..._kk_chunk8``,
raw_kernels/gemm/grouped_gemm_ws_ragged.cuh) on the GPU: each CTA runs a balanced list of tiles whose
experts contract different token counts, the pipeline running on the CTA's k-tile sequence
across tile boundaries, empty experts' tiles zeroed by the consumers.

With the grid capped at 3 CTAs every CTA runs many tiles of mixed lengths (1 to 32 k-tiles,
empty ones, partial last k-tiles), so raw stages, canonical buffers and barrier counts wrap
across tile boundaries in every way. Checks, bit for bit against the one-CTA-per-tile
cp.async build (``grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk`` / ``..._kk_chunk8``),
run to run, and within tolerance of float64:

* NVFP4 and row-scaled NVFP4, bf16 and fp16 output, 8-byte copies (token counts padded to odd
  multiples of 16) and 16-byte copies (even multiples, uneven);
* an output buffer filled with NaN: empty experts' dW is +0;
* the TMA build's boxes past the rows' ends (the even rows' read zeros there, the odd rows'
  start in the even rows' last bytes): outputs whose every product is zero stay +0, as in the
  cp.async build;
* with the real multiprocessor count: "auto" takes the ragged TMA build, which agrees with the
  per-tile cp.async build.
"""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe.gemm import _validate, grouped_gemm

from lowprec_moe import config

from conftest import assert_bytes_equal, requires_gpu, set_gemm_options, to_host
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


RAGGED = "grouped_gemm_sm90_nvfp4_wgmma_ws_rowpair_tma_ragged_128x256_kk"
PER_TILE = "grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk"


def _run(a, b, splits, *, build, out_dtype="bfloat16", out=None, ch=None):
    """wgrad on kernel ``build``: "ragged" (row-pair TMA) or "per_tile" (cp.async), its
    ``_chunk8`` form for 8-byte copies (``ch="8"``; default: for SPLITS_8)."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    ch = ch if ch is not None else "8" if splits is SPLITS_8 else ""
    name = {"ragged": RAGGED, "per_tile": PER_TILE}[build] + ("_chunk8" if ch == "8" else "")
    ga, gb = gpu(a), gpu(b)
    with config.gemm(kernel=name):
        info = C.kernel_info(_validate("wgrad", ga, gb, splits, bias=None, probs=None,
                                       out_dtype=out_dtype, out=out, accumulate=False))
        assert info["kernel"] == name, info
        return to_host(grouped_gemm(ga, gb, splits, mode="wgrad", out_dtype=out_dtype,
                                    out=out))


@pytest.mark.parametrize("copy", ["8", "16"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled"])
def test_gpu_nvfp4_ragged_equals_per_tile(fmt, out_dtype, copy, few_ctas):
    _require_wgmma()
    splits = SPLITS_8 if copy == "8" else SPLITS_16
    a, b = _operands(fmt, 70, splits)
    what = f"ragged {fmt} {out_dtype} {copy}-byte rows"
    got = _run(a, b, splits, build="ragged", out_dtype=out_dtype)
    assert_bytes_equal(got, _run(a, b, splits, build="ragged", out_dtype=out_dtype),
                       f"{what}, run to run")
    assert_bytes_equal(got, _run(a, b, splits, build="per_tile", out_dtype=out_dtype),
                       f"{what} vs the per-tile kernel")
    exp, mag = _expected("wgrad", a, b, splits)
    assert_gemm_close(got, exp, mag, what)


def test_gpu_nvfp4_ragged_empty_experts_zeroed(few_ctas):
    """Into a NaN-filled output buffer: the empty experts' dW is +0, the others' equal a fresh
    buffer's."""
    _require_wgmma()
    import cupy as cp

    a, b = _operands("nvfp4", 71, SPLITS_8)
    fresh = _run(a, b, SPLITS_8, build="ragged")
    out = cp.full(fresh.shape, np.nan, dtype=cp.float32).astype(fresh.dtype)
    got = _run(a, b, SPLITS_8, build="ragged", out=out)
    assert_bytes_equal(got, fresh, "ragged into a NaN-filled buffer")
    for g, s in enumerate(SPLITS_8):
        if s == 0:
            assert not np.any(got[g].view(np.uint16)), g


def test_gpu_nvfp4_ragged_tma_zero_sums(few_ctas):
    """Rows whose last k-tile ends early, next to rows of other signs: dy's even columns are
    zero and its odd ones negative, x's even columns zero and its odd ones positive, so every
    product of an even dy column and an even x column is zero, while the TMA build's boxes
    reach past the rows' ends (the odd rows' start in the even rows' last bytes). Those outputs
    must come out +0, bit for bit the per-tile cp.async build's results."""
    _require_wgmma()
    splits = [100, 37, 0, 200, 1030, 48]  # last k-tiles of 36, 37, 8, 6, 48 tokens
    x, _, dy = _data(73, sum(splits), W_OUT, W_IN)
    dy = -np.abs(dy)
    x = np.abs(x)
    dy[:, 0::2] = 0.0
    x[:, 0::2] = 0.0
    w = np.zeros((1, W_OUT, W_IN), np.float32)
    xq, _, dq = _quantize("nvfp4", x, w, dy, splits)
    got = _run(dq, xq, splits, build="ragged", ch="8")
    assert_bytes_equal(got, _run(dq, xq, splits, build="per_tile", ch="8"),
                       "ragged TMA vs the per-tile kernel")
    for g, s in enumerate(splits):
        assert not np.any(got[g][0::2, 0::2].view(np.uint16)), g


def test_gpu_nvfp4_ragged_real_sm_count(monkeypatch):
    """With the real multiprocessor count and more tiles than multiprocessors: "auto" takes the
    ragged TMA build for bf16 output, the per-tile cp.async kernel for fp32; the ragged build
    and the per-tile one (named) agree bit for bit on bf16."""
    _require_wgmma()
    from lowprec_moe.backends.cupy.gemm import launch as C

    splits = [0, 100, 1000, 37, 640, 2048, 200, 900] * 4
    x, _, dy = _data(72, sum(splits), 1024, 2048)
    w = np.zeros((1, 1024, 2048), np.float32)
    xq, _, dq = _quantize("nvfp4", x, w, dy, splits)
    ga, gb = gpu(dq), gpu(xq)

    def kernel(out_dtype):
        return C.kernel_info(_validate("wgrad", ga, gb, splits, bias=None, probs=None,
                                       out_dtype=out_dtype, out=None, accumulate=False))["kernel"]

    assert kernel("bfloat16") == RAGGED + "_chunk8"
    assert kernel("float32") == PER_TILE + "_chunk8"
    ragged = to_host(grouped_gemm(ga, gb, splits, mode="wgrad", out_dtype="bfloat16"))
    set_gemm_options(monkeypatch, kernel=PER_TILE + "_chunk8")
    assert kernel("bfloat16") == PER_TILE + "_chunk8"
    assert_bytes_equal(ragged,
                       to_host(grouped_gemm(ga, gb, splits, mode="wgrad", out_dtype="bfloat16")),
                       "ragged (auto) vs per-tile (named)")


def test_gpu_nvfp4_ragged_maps_built_on_device():
    """The TMA build's tensor maps, built on the device from templates (address, extents and
    pair stride replaced), equal the driver's encoding of the same maps byte for byte; experts
    without tokens get none (zeros)."""
    _require_wgmma()
    from lowprec_moe.backends.cupy.gemm import launch as C
    from lowprec_moe.backends.cupy import tensor_map as tma
    from lowprec_moe.backends.cupy.gemm.plan import BK, WS_TILE, descriptors
    from lowprec_moe.backends.cupy.gemm.tma_rules import _pair_geom, _pair_maps, _ptr

    a, b = _operands("nvfp4", 74, SPLITS_8)
    ga, gb = gpu(a), gpu(b)
    p = _validate("wgrad", ga, gb, SPLITS_8, bias=None, probs=None, out_dtype="bfloat16",
                  out=None, accumulate=False)
    pl = C.plan(p)
    desc = C._device_tables(np.zeros((1, 2), np.int32), descriptors(pl))[1]
    maps = to_host(_pair_maps(_pair_geom(pl), desc, pl.a.data, pl.b.data))
    bm, bn = WS_TILE
    for g, s in enumerate(SPLITS_8):
        if s == 0:
            assert not np.any(maps[g]), g
            continue
        for side, (op, rows, box) in enumerate(((pl.a, int(pl.rows[g]), bm),
                                                (pl.b, int(pl.n_cols), bn))):
            ld, ptr = int(op.ld[g]), _ptr(op.data) + int(op.off[g])
            for odd in (0, 1):
                want = tma.map_2d_u8(ptr, (1 + odd) * ld, rows // 2, 2 * ld,
                                     BK // 2 + 16 * odd, box // 2)
                got = maps[g, 2 * side + odd]
                assert_bytes_equal(got, np.frombuffer(want.tobytes(), np.uint64),
                                   f"expert {g} map {2 * side + odd}")
