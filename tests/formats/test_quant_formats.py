"""The format objects (lowprec_moe.quant_formats): one per format, with its facts from
formats.py, its option rules, and quantize / dequantize that equal the public functions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import formats as F
from lowprec_moe import quant_formats as Q


def test_registry_matches_the_constants():
    assert tuple(Q.FORMATS) == F.FORMATS
    assert Q.get("nvfp4") is Q.NVFP4 and Q.NVFP4.block == F.NVFP4_BLOCK
    assert Q.get("mxfp8") is Q.MXFP8 and Q.MXFP8.block == F.MXFP8_BLOCK
    for bad in ("mxfp4", None, ["nvfp4"]):
        with pytest.raises(ValueError, match="format="):
            Q.get(bad)


@pytest.mark.parametrize("fmt,opts,match", [
    ("mxfp8", dict(rht=True), "nvfp4 option"),
    ("mxfp8", dict(fp8_dtype="e3m4"), "fp8_dtype"),
    ("nvfp4", dict(fp8_dtype="e5m2"), "mxfp8 only"),
    ("nvfp4", dict(row_scaled=True, block_2d=True), "row_scaled"),
    ("nvfp4", dict(rht=True, dtype_name="float32"), "bfloat16"),
])
def test_option_rules(fmt, opts, match):
    kw = dict(row_scaled=False, rht=False, stochastic_rounding=False, block_2d=False,
              fp8_dtype="e4m3", dtype_name="bfloat16")
    kw.update(opts)
    with pytest.raises(ValueError, match=match):
        Q.get(fmt).check_options(**kw)


@pytest.mark.parametrize("fmt", F.FORMATS)
def test_hooks_equal_the_public_functions(fmt):
    x = np.random.default_rng(3).standard_normal((64, 128)).astype(ml_dtypes.bfloat16)
    q = lpm.quantize(x, fmt, columnwise=True)
    parts = Q.get(fmt).quantize(x, False, rowwise=True, columnwise=True, row_scaled=False,
                                block_2d=False, rht=False, stochastic_rounding=False, seed=0,
                                fp8_dtype="e4m3")
    assert bytes(parts["rowwise_data"]) == bytes(q.rowwise_data)
    assert bytes(parts["columnwise_scale"]) == bytes(q.columnwise_scale)
    for col in (False, True):
        got = Q.get(fmt).dequantize(q, col, False)
        want = lpm.dequantize(q, "columnwise" if col else "rowwise")
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("fmt,m,k", [("nvfp4", 20, 64), ("mxfp8", 20, 64), ("nvfp4", 32, 32),
                                     ("mxfp8", 33, 32)])
def test_columnwise_shapes_match_quantize(fmt, m, k):
    """The format's columnwise shapes are the ones quantize stores (rows padded to the block)."""
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    q = lpm.quantize(x, fmt, columnwise=True)
    d, sc = Q.get(fmt).columnwise_shapes(m, k)
    assert q.columnwise_data.shape == d and q.columnwise_scale.shape == sc
    assert Q.get(fmt).has_amax == (q.amax_rowwise is not None)
