"""GroupedTensor.quantize with device splits on the GPU: with_host_splits() gives, bit for bit,
the tensor of the same splits given on the host (MXFP8 and NVFP4 with every grouped option,
empty experts, uneven M), a call reads nothing back (it captures into a CUDA graph whose replay
with other splits of the same M gives the eager results), and what needs host splits says so."""

from __future__ import annotations

import numpy as np
import pytest

import lowprec_moe as lpm

from conftest import (assert_bytes_equal, assert_quantized_equal, capture_graph, random_splits,
                      requires_gpu)

pytestmark = [pytest.mark.gpu, requires_gpu]

_OPTIONS = [
    ("mxfp8", dict(rowwise=True, columnwise=True)),
    ("mxfp8", dict(rowwise=False, columnwise=True, fp8_dtype="e5m2")),
    ("nvfp4", dict(rowwise=True, columnwise=True)),
    ("nvfp4", dict(rowwise=True, columnwise=False)),
    ("nvfp4", dict(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True, seed=5,
                   first_member=3)),
    ("nvfp4", dict(rowwise=True, columnwise=True, row_scaled=True)),
]
def _assert_same(got, want, what):
    """Every stored array (conftest's assert_quantized_equal) and the layout fields."""
    assert got.splits == want.splits, what
    assert_quantized_equal(got, want, what)
    for f in ("columnwise_data_offsets", "columnwise_scale_offsets", "offsets"):
        assert_bytes_equal(getattr(got, f), getattr(want, f), f"{what}: {f}")


def _x(cp, rng, m, k, dtype):
    return cp.asarray((rng.standard_normal((m, k)) * 3).astype(np.float32)).astype(dtype)


@pytest.mark.parametrize("fmt,opts", _OPTIONS)
@pytest.mark.parametrize("g,m,k", [(4, 300, 128), (8, 1000, 256), (1, 70, 64), (6, 5, 64)])
def test_device_splits_give_host_bits(fmt, opts, g, m, k):
    import cupy as cp
    import ml_dtypes

    rng = np.random.default_rng(g * m + k)
    x = _x(cp, rng, m, k, ml_dtypes.bfloat16)
    cases = [random_splits(rng, m, g) for _ in range(3)] + [np.array([0] * (g - 1) + [m])]
    for s in cases:
        ds = cp.asarray(s.astype(np.int32))
        dev = lpm.GroupedTensor.quantize(x, ds, fmt, **opts)
        assert dev.splits_on_device
        host = lpm.GroupedTensor.quantize(x, [int(v) for v in s], fmt, **opts)
        _assert_same(dev.with_host_splits(), host, f"{fmt} {opts} splits={s.tolist()}")


def test_float32_input():
    import cupy as cp

    rng = np.random.default_rng(3)
    x = _x(cp, rng, 200, 128, cp.float32)
    s = random_splits(rng, 200, 5)
    for fmt in ("mxfp8", "nvfp4"):
        dev = lpm.GroupedTensor.quantize(x, cp.asarray(s), fmt, columnwise=True)
        host = lpm.GroupedTensor.quantize(x, [int(v) for v in s], fmt, columnwise=True)
        _assert_same(dev.with_host_splits(), host, fmt)


def test_quantize_captures_into_a_graph_and_replays_with_new_splits():
    import cupy as cp
    import ml_dtypes

    rng = np.random.default_rng(17)
    g, m, k = 8, 1024, 256
    x = _x(cp, rng, m, k, ml_dtypes.bfloat16)
    ds = cp.asarray(random_splits(rng, m, g))
    opts = {"mxfp8": dict(columnwise=True),
            "nvfp4": dict(columnwise=True, rht=True, stochastic_rounding=True, seed=9)}
    got, replay = capture_graph(
        lambda: {f: lpm.GroupedTensor.quantize(x, ds, f, **o) for f, o in opts.items()})
    for _ in range(3):
        s = random_splits(rng, m, g)
        ds[...] = cp.asarray(s)
        x[...] = _x(cp, rng, m, k, ml_dtypes.bfloat16)
        replay()
        for f, o in opts.items():
            want = lpm.GroupedTensor.quantize(x, [int(v) for v in s], f, **o)
            _assert_same(got[f].with_host_splits(), want, f"replayed {f}")


def test_invalid_device_splits_are_refused_on_reading_back():
    import cupy as cp

    x = cp.ones((64, 64), dtype=cp.float32)
    for bad in ([40, 40], [-8, 72]):
        gt = lpm.GroupedTensor.quantize(x, cp.asarray(bad), "mxfp8", columnwise=True)
        with pytest.raises(ValueError, match="splits="):
            gt.with_host_splits()


def test_what_needs_host_splits_says_so():
    import cupy as cp

    x = cp.ones((64, 64), dtype=cp.float32)
    ds = cp.asarray([32, 32])
    gt = lpm.GroupedTensor.quantize(x, ds, "mxfp8", columnwise=True)
    for call in (lambda: gt.member(0), lambda: gt.dequantize()):
        with pytest.raises(NotImplementedError, match="splits on the host"):
            call()
    with pytest.raises(NotImplementedError, match="block_2d"):
        lpm.GroupedTensor.quantize(x, ds, "mxfp8", block_2d=True)
    with pytest.raises(TypeError, match="integer"):
        lpm.GroupedTensor.quantize(x, ds.astype(cp.float32), "mxfp8")
    with pytest.raises(ValueError, match="1-D"):
        lpm.GroupedTensor.quantize(x, ds.reshape(1, 2), "mxfp8")
    with pytest.raises(TypeError, match="numpy"):
        lpm.GroupedTensor.quantize(x.get(), ds, "mxfp8")
    wire = lpm.GroupedTensor.quantize(x, ds, "mxfp8")
    with pytest.raises(NotImplementedError, match="splits on the host"):
        wire.with_columnwise()
