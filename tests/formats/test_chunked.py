"""The NumPy quantizers work on chunks of rows; results must not depend on where chunks end.

Chunks are made tiny here (a few rows) so that every tensor spans several of them, with the
special values (NaN, inf, subnormal and zero blocks) in some chunks and not in others. Outputs
are checked byte for byte against the NUMERICS transcriptions of ``test_nvfp4`` /
``test_mxfp8`` and, for options those do not cover, against one whole-tensor chunk.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe.backends.numpy import chunks

from conftest import assert_bytes_equal, assert_quantized_equal
from test_mxfp8 import spec_mxfp8
from test_nvfp4 import _padded_t, spec_quantize_rows

DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32]


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of one block of rows (16 for nvfp4, 32 for mxfp8) for these tests' widths."""
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 256)


def _data(shape, dtype, seed=0, special=True):
    rng = np.random.default_rng(seed)
    span = 10 if dtype is np.float16 else 30
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-span, span, shape))
    if special:
        x[3, :16] = 0.0                                   # a zero block in the first chunk
        x[20, 16:32] = rng.standard_normal(16) * 2.0 ** -(24 if dtype is np.float16 else 130)
        x[21, 5] = -0.0
    return x.astype(dtype)


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def _amax(x):
    return np.array([np.fmax.reduce(np.abs(_f32(x)), axis=None, initial=np.float32(0))],
                    np.float32)


def _whole(monkeypatch, fn):
    """``fn()`` with the whole tensor in one chunk."""
    with monkeypatch.context() as m:
        m.setattr(chunks, "CHUNK_ELEMENTS", 1 << 30)
        return fn()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("special", ["none", "nan_late", "inf_middle"])
def test_nvfp4_chunks_match_spec(tiny_chunks, dtype, special):
    x = _data((70, 64), dtype)
    if special == "nan_late":
        x[66, 7] = np.nan       # only the last chunk holds a NaN
    elif special == "inf_middle":
        x[40, 9] = -np.inf
    q = lpm.quantize(x, "nvfp4", columnwise=True)
    amax = _amax(x)
    d, s, _ = spec_quantize_rows(_f32(x), amax)
    assert_bytes_equal(q.rowwise_data, d, "rowwise data")
    assert_bytes_equal(q.rowwise_scale, s, "rowwise scale")
    assert_bytes_equal(q.amax_rowwise, amax, "amax")
    d, s, _ = spec_quantize_rows(_padded_t(_f32(x)), amax)
    assert_bytes_equal(q.columnwise_data, d, "columnwise data")
    assert_bytes_equal(q.columnwise_scale, s, "columnwise scale")


@pytest.mark.parametrize("dtype", DTYPES)
def test_nvfp4_row_scaled_chunks_match_spec(tiny_chunks, dtype):
    x = _data((48, 32), dtype, seed=1)
    x[40, 3] = np.nan
    q = lpm.quantize(x, "nvfp4", row_scaled=True)
    amax = np.fmax.reduce(np.abs(_f32(x)), axis=1, initial=np.float32(0))
    d, s, _ = spec_quantize_rows(_f32(x), amax)
    assert_bytes_equal(q.rowwise_data, d, "rowwise data")
    assert_bytes_equal(q.rowwise_scale, s, "rowwise scale")


@pytest.mark.parametrize("opts", [dict(block_2d=True, columnwise=True),
                                  dict(stochastic_rounding=True, seed=7, columnwise=True),
                                  dict(rht=True, columnwise=True)])
def test_nvfp4_options_do_not_depend_on_chunks(tiny_chunks, monkeypatch, opts):
    x = _data((64, 48), ml_dtypes.bfloat16, seed=2)
    x[50, 1] = np.nan
    q = lpm.quantize(x, "nvfp4", **opts)
    assert_quantized_equal(q, _whole(monkeypatch, lambda: lpm.quantize(x, "nvfp4", **opts)),
                           "tiny chunks vs one chunk")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", ["e4m3", "e5m2"])
@pytest.mark.parametrize("special", ["none", "nan_late"])
def test_mxfp8_chunks_match_spec(tiny_chunks, dtype, fp8_dtype, special):
    x = _data((70, 64), dtype, seed=3)
    if special == "nan_late":
        x[69, 40] = np.nan
        x[68, 0] = np.inf
    q = lpm.quantize(x, "mxfp8", columnwise=True, fp8_dtype=fp8_dtype)
    row, er, col, ec = spec_mxfp8(_f32(x), fp8_dtype)
    assert_bytes_equal(q.rowwise_data, row, "rowwise data")
    assert_bytes_equal(q.rowwise_scale, er, "rowwise scale")
    assert_bytes_equal(q.columnwise_data, col, "columnwise data")
    assert_bytes_equal(q.columnwise_scale, ec, "columnwise scale")


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp8_block_2d_does_not_depend_on_chunks(tiny_chunks, monkeypatch, dtype):
    x = _data((96, 64), dtype, seed=4)
    x[70, 2] = np.nan
    kw = dict(columnwise=True, block_2d=True)
    q = lpm.quantize(x, "mxfp8", **kw)
    assert_quantized_equal(q, _whole(monkeypatch, lambda: lpm.quantize(x, "mxfp8", **kw)),
                           "tiny chunks vs one chunk")


def test_non_finite_check_across_its_steps(monkeypatch):
    from lowprec_moe.io import _shard

    monkeypatch.setattr(_shard, "_FINITE_STEP", 64)
    x = _data((10, 32), ml_dtypes.bfloat16, special=False)
    assert _shard.all_finite(x)
    for i in (0, 63, 64, 319):
        y = x.copy()
        y.reshape(-1)[i] = np.nan
        assert not _shard.all_finite(y), i
