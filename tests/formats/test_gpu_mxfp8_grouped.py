"""MXFP8 grouped GPU kernels against the NumPy reference, byte for byte: one launch for all
members (any splits, empty members, zero-padded columnwise copies), grouped dequantize, and the
fused ``with_columnwise`` kernel on a rowwise wire tensor (equal to the unfused chain).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe.backends.numpy.layouts import swizzle_grouped_np

from conftest import assert_bytes_equal, requires_gpu
from test_gpu_mxfp8 import (DTYPES, FP8, MODES, QKEYS, RM, SPLITS, _assert_parts, _cast, _GT,
                            _grouped_ref, _random, _unfused_reference, _wire, cvt_module, f32,
                            mx)  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.gpu, requires_gpu]


# --------------------------------------------------------------------------------- grouped
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("k", [96, 256])
def test_grouped_quantize(cp, mx, dtype, fp8_dtype, k):
    m = sum(SPLITS)
    x = _random((m, k), seed=21)
    x[40:45] = 0
    x[100, 3] = np.nan
    x[200, 50] = -np.inf
    x[290:308, :32] *= f32(2.0 ** -125)
    x = _cast(x, dtype)
    xd = cp.asarray(x)
    for rowwise, columnwise in MODES:
        kw = dict(rowwise=rowwise, columnwise=columnwise, block_2d=False, fp8_dtype=fp8_dtype)
        got = mx.grouped_quantize_mxfp8(xd, SPLITS, **kw)
        ref = _grouped_ref(x, SPLITS, **kw)
        assert sorted(got) == sorted(ref)
        _assert_parts(got, ref, what=f"{dtype} {kw}")
        if columnwise:
            for key in ("columnwise_data_offsets", "columnwise_scale_offsets"):
                assert isinstance(got[key], np.ndarray) and got[key].dtype == np.int64
                np.testing.assert_array_equal(got[key], ref[key])
            # grouped dequantize (one launch) == per-member reference dequantize
            gt = _GT(got, SPLITS, k, fp8_dtype)
            deq = mx.grouped_dequantize_mxfp8(gt, "columnwise")
            parts = []
            for g in range(len(SPLITS)):
                lo, hi = int(gt.offsets[g]), int(gt.offsets[g + 1])
                mp = -(-(hi - lo) // 32) * 32
                d0 = int(ref["columnwise_data_offsets"][g])
                s0 = int(ref["columnwise_scale_offsets"][g])
                parts.append(RM.dequantize_mxfp8(
                    ref["columnwise_data"][d0:d0 + mp * k].reshape(mp, k),
                    ref["columnwise_scale"][s0:s0 + mp // 32 * k].reshape(mp // 32, k),
                    columnwise=True, m=hi - lo, fp8_dtype=fp8_dtype))
            assert_bytes_equal(deq, np.concatenate(parts, axis=0), "grouped columnwise deq")
        if rowwise:
            gt = _GT(got, SPLITS, k, fp8_dtype)
            assert_bytes_equal(mx.grouped_dequantize_mxfp8(gt, "rowwise"),
                               RM.dequantize_mxfp8(ref["rowwise_data"], ref["rowwise_scale"],
                                                   fp8_dtype=fp8_dtype), "grouped rowwise deq")

@pytest.mark.parametrize("splits", [[0, 64, 32, 0, 96], [32], [0, 0, 160]])
def test_grouped_quantize_block_2d(cp, mx, splits):
    x = _cast(_random((sum(splits), 160), seed=22), "bfloat16")
    for fmt in FP8:
        kw = dict(rowwise=True, columnwise=True, block_2d=True, fp8_dtype=fmt)
        got = mx.grouped_quantize_mxfp8(cp.asarray(x), splits, **kw)
        _assert_parts(got, _grouped_ref(x, splits, **kw), what=f"{splits} {fmt}")

def test_grouped_edge_splits(cp, mx):
    k = 64
    for splits in ([0], [0, 0], [1], [31, 1, 33], [0, 300, 0], [5] * 40):
        m = sum(splits)
        x = _random((m, k), seed=m)
        kw = dict(rowwise=True, columnwise=True, block_2d=False, fp8_dtype="e4m3")
        got = mx.grouped_quantize_mxfp8(cp.asarray(x), splits, **kw)
        ref = _grouped_ref(x, splits, **kw)
        _assert_parts(got, ref, what=str(splits))
        np.testing.assert_array_equal(got["columnwise_data_offsets"],
                                      ref["columnwise_data_offsets"])

def test_grouped_dequantize_random_bytes(cp, mx):
    """Grouped dequantize of arbitrary bytes (NaN bytes, scale 255) matches the reference."""
    k = 64
    rng = np.random.default_rng(3)
    offs = np.concatenate([[0], np.cumsum(SPLITS)])
    tiles = np.concatenate([[0], np.cumsum([-(-s // 32) for s in SPLITS])])
    for fmt in FP8:
        nt = int(tiles[-1])
        parts = dict(columnwise_data=rng.integers(0, 256, nt * 32 * k, dtype=np.uint8),
                     columnwise_scale=rng.integers(0, 256, nt * k, dtype=np.uint8),
                     columnwise_data_offsets=tiles * 32 * k,
                     columnwise_scale_offsets=tiles * k)
        ref = []
        for g in range(len(SPLITS)):
            t0, t1 = int(tiles[g]), int(tiles[g + 1])
            ref.append(RM.dequantize_mxfp8(
                parts["columnwise_data"][t0 * 32 * k:t1 * 32 * k].reshape(-1, k),
                parts["columnwise_scale"][t0 * k:t1 * k].reshape(-1, k), columnwise=True,
                m=int(offs[g + 1] - offs[g]), fp8_dtype=fmt))
        dev = {key: (cp.asarray(v) if key in QKEYS else v) for key, v in parts.items()}
        gt = _GT(dev, SPLITS, k, fmt)
        assert_bytes_equal(mx.grouped_dequantize_mxfp8(gt, "columnwise"),
                           np.concatenate(ref, axis=0), fmt)

# ------------------------------------------------------------------ fused with_columnwise
@pytest.mark.parametrize("wire_fmt", FP8)
@pytest.mark.parametrize("out_fmt", FP8)
@pytest.mark.parametrize("kind", ["quantized", "random_bytes"])
@pytest.mark.parametrize("k", [64, 96, 7168 // 8])
def test_fused_columnwise_from_rowwise(cp, mx, cvt_module, wire_fmt, out_fmt, kind, k):
    m = sum(SPLITS)
    data, scale = _wire(k + len(kind), m, k, wire_fmt, kind)
    gt = _GT(dict(rowwise_data=cp.asarray(data), rowwise_scale=cp.asarray(scale)), SPLITS, k,
             wire_fmt)
    got = mx.grouped_mxfp8_columnwise_from_rowwise(gt, out_fmt, swizzle_rowwise=True)
    ref = _unfused_reference(data, scale, SPLITS, wire_fmt, out_fmt)
    _assert_parts(got, ref, keys=("columnwise_data", "columnwise_scale"),
                  what=f"{cvt_module} {wire_fmt}->{out_fmt} {kind}")
    for key in ("columnwise_data_offsets", "columnwise_scale_offsets"):
        np.testing.assert_array_equal(got[key], ref[key])
    offs = gt.offsets
    swz, swz_offs = swizzle_grouped_np([scale[offs[g]:offs[g + 1]] for g in range(len(SPLITS))])
    assert_bytes_equal(got["rowwise_scale_swizzled"], swz, "swizzled rowwise scales")
    np.testing.assert_array_equal(got["rowwise_scale_swizzled_offsets"], swz_offs)
    plain = mx.grouped_mxfp8_columnwise_from_rowwise(gt, out_fmt)
    assert "rowwise_scale_swizzled" not in plain
    _assert_parts(plain, got, keys=("columnwise_data", "columnwise_scale"), what="no swizzle")

def test_fused_equals_unfused_gpu_chain(cp, mx):
    """Fused kernel == GPU dequantize -> bf16 -> GPU grouped columnwise quantize."""
    k, m = 256, sum(SPLITS)
    data, scale = _wire(5, m, k, "e4m3", "quantized")
    dd, ds = cp.asarray(data), cp.asarray(scale)
    gt = _GT(dict(rowwise_data=dd, rowwise_scale=ds), SPLITS, k, "e4m3")
    fused = mx.grouped_mxfp8_columnwise_from_rowwise(gt, "e4m3")
    deq = mx.dequantize_mxfp8(dd, ds, fp8_dtype="e4m3")
    bf16 = cp.asarray(deq.get().astype(ml_dtypes.bfloat16))
    chain = mx.grouped_quantize_mxfp8(bf16, SPLITS, rowwise=False, columnwise=True,
                                      block_2d=False, fp8_dtype="e4m3")
    _assert_parts(fused, chain, keys=("columnwise_data", "columnwise_scale"))
