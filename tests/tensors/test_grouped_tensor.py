"""``GroupedTensor`` (NUMERICS §5): grouped quantization == per-member quantization, bitwise.

Run on both backends through ``xp``: the expected values are always computed with NumPy, member
by member, so the GPU run compares the CuPy grouped kernels against the NumPy reference.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe.tensors.quantized_tensor import _quantize_2d
from lowprec_moe.backends.numpy import layouts as L

from conftest import assert_bytes_equal, assert_quantized_equal, to_host

SPLITS = [0, 37, 128, 5, 90, 0, 48]
M_TOTAL = sum(SPLITS)  # 308
K = 64
OFFSETS = [0, 0, 37, 165, 170, 260, 260, 308]

CONFIGS = {
    "nvfp4": ("nvfp4", np.float32, {}),
    "nvfp4-row-scaled": ("nvfp4", np.float32, {"row_scaled": True}),
    "nvfp4-rht-sr": ("nvfp4", ml_dtypes.bfloat16,
                     {"rht": True, "stochastic_rounding": True, "seed": 2024}),
    "nvfp4-sr": ("nvfp4", np.float32, {"stochastic_rounding": True, "seed": 7}),
    "mxfp8-e4m3": ("mxfp8", np.float32, {"fp8_dtype": "e4m3"}),
    "mxfp8-e5m2": ("mxfp8", ml_dtypes.bfloat16, {"fp8_dtype": "e5m2"}),
}
_ALL_OPTS = dict(row_scaled=False, block_2d=False, rht=False, stochastic_rounding=False, seed=0,
                 fp8_dtype="e4m3")


def _input(m=M_TOTAL, k=K, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-3, 4, (m, 1)))  # rows differ in scale
    return x.astype(dtype)


def _member_reference(x, splits, fmt, g, *, rowwise=True, columnwise=True, **opts):
    """NumPy quantization of member g alone. Stochastic rounding uses member index g in its
    random stream, which only the internal ``_quantize_2d`` exposes."""
    lo, hi = int(np.sum(splits[:g])), int(np.sum(splits[:g + 1]))
    xg = x[lo:hi]
    if opts.get("stochastic_rounding"):
        kw = {**_ALL_OPTS, **opts}
        return _quantize_2d(xg, fmt, rowwise=rowwise, columnwise=columnwise, member=g, **kw)
    return lpm.quantize(xg, fmt, rowwise=rowwise, columnwise=columnwise, **opts)


def _shares(a, b) -> bool:
    """Whether array ``a`` lies inside the memory of array ``b`` (NumPy or CuPy)."""
    if isinstance(a, np.ndarray):
        return np.shares_memory(a, b)
    lo, hi = b.data.ptr, b.data.ptr + b.nbytes
    return lo <= a.data.ptr and a.data.ptr + a.nbytes <= hi


@pytest.mark.parametrize("name", list(CONFIGS))
def test_grouped_equals_per_member(xp, name):
    fmt, dtype, opts = CONFIGS[name]
    x = _input(dtype=dtype)
    g = lpm.GroupedTensor.quantize(xp.asarray(x), SPLITS, fmt, columnwise=True, **opts)
    assert g.format == fmt and g.shape == (M_TOTAL, K)
    assert g.splits == tuple(SPLITS) and g.num_groups == 7
    assert g.is_cuda == (xp is not np)
    members = [_member_reference(x, SPLITS, fmt, i, **opts) for i in range(7)]
    for i, ref in enumerate(members):
        m = g.member(i)
        assert isinstance(m, lpm.QuantizedTensor)
        assert m.shape == (SPLITS[i], K) and m.format == fmt
        assert m.fp8_dtype == ref.fp8_dtype and m.rht == ref.rht
        assert_quantized_equal(m, ref, f"{name} member {i}")
    # the packed buffers themselves
    assert_bytes_equal(g.rowwise_data, np.concatenate([q.rowwise_data for q in members]))
    assert_bytes_equal(g.rowwise_scale, np.concatenate([q.rowwise_scale for q in members]))
    assert_bytes_equal(g.columnwise_data,
                       np.concatenate([q.columnwise_data.reshape(-1) for q in members]))
    assert_bytes_equal(g.columnwise_scale,
                       np.concatenate([q.columnwise_scale.reshape(-1) for q in members]))
    for field in ("columnwise_data", "columnwise_scale"):
        sizes = [getattr(q, field).size for q in members]
        offs = np.asarray(getattr(g, field + "_offsets"))
        assert offs.dtype == np.int64
        np.testing.assert_array_equal(offs, np.concatenate([[0], np.cumsum(sizes)]))
    if fmt == "nvfp4":
        assert_bytes_equal(g.amax_rowwise, np.concatenate([q.amax_rowwise for q in members]))
        stack = np.stack if opts.get("row_scaled") else np.concatenate
        assert_bytes_equal(g.amax_columnwise, stack([q.amax_columnwise for q in members]))
        if opts.get("row_scaled"):
            assert tuple(g.amax_rowwise.shape) == (M_TOTAL,)
            assert tuple(g.amax_columnwise.shape) == (7, K)
        else:
            assert tuple(g.amax_rowwise.shape) == (7,)
    else:
        assert g.amax_rowwise is None and g.amax_columnwise is None


@pytest.mark.parametrize("fmt, splits", [("nvfp4", [0, 32, 16, 0, 48]),
                                         ("mxfp8", [0, 64, 32, 0])])
def test_grouped_block_2d(xp, fmt, splits):
    x = _input(m=sum(splits), seed=1)
    g = lpm.GroupedTensor.quantize(xp.asarray(x), splits, fmt, columnwise=True, block_2d=True)
    for i in range(len(splits)):
        assert_quantized_equal(g.member(i), _member_reference(x, splits, fmt, i, block_2d=True),
                               f"member {i}")


def test_rowwise_only_grouped(xp):
    x = _input(seed=2)
    g = lpm.GroupedTensor.quantize(xp.asarray(x), SPLITS, "nvfp4")
    assert g.columnwise_data is None and g.amax_columnwise is None
    for i in range(7):
        assert_quantized_equal(g.member(i), lpm.quantize(x[OFFSETS[i]:OFFSETS[i + 1]], "nvfp4"))


def test_sr_member_index_matters():
    """Two members holding the same values get different SR bytes (member g in the stream)."""
    row = _input(m=16, seed=3)
    x = np.concatenate([row, row])
    g = lpm.GroupedTensor.quantize(x, [16, 16], "nvfp4", stochastic_rounding=True, seed=1)
    assert not np.array_equal(g.member(0).rowwise_data, g.member(1).rowwise_data)
    assert_bytes_equal(g.member(0).rowwise_scale, g.member(1).rowwise_scale)


def test_offsets(xp):
    g = lpm.GroupedTensor.quantize(xp.asarray(_input()), SPLITS, "mxfp8")
    assert isinstance(g.offsets, np.ndarray) and g.offsets.dtype == np.int64
    np.testing.assert_array_equal(g.offsets, OFFSETS)
    g2 = lpm.GroupedTensor.quantize(xp.asarray(_input()), np.array(SPLITS, np.int32), "mxfp8")
    assert g2.splits == tuple(SPLITS) and all(type(s) is int for s in g2.splits)
    assert_quantized_equal(g, g2)


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4-row-scaled", "nvfp4-rht-sr", "mxfp8-e4m3"])
def test_member_views_are_zero_copy(xp, name):
    fmt, dtype, opts = CONFIGS[name]
    g = lpm.GroupedTensor.quantize(xp.asarray(_input(dtype=dtype)), SPLITS, fmt,
                                   columnwise=True, **opts)
    for i in range(7):
        if SPLITS[i] == 0:
            continue
        m = g.member(i)
        for field in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale",
                      "amax_rowwise", "amax_columnwise"):
            a, b = getattr(m, field), getattr(g, field)
            if a is None:
                assert b is None and fmt == "mxfp8" and field.startswith("amax")
                continue
            assert _shares(a, b), f"member {i} {field} is a copy"
    with pytest.raises(IndexError, match="g=7"):
        g.member(7)
    with pytest.raises(IndexError, match="g=-1"):
        g.member(-1)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_grouped_dequantize_is_concatenated_member_dequantize(xp, name):
    fmt, dtype, opts = CONFIGS[name]
    x = _input(dtype=dtype, seed=4)
    g = lpm.GroupedTensor.quantize(xp.asarray(x), SPLITS, fmt, columnwise=True, **opts)
    members = [_member_reference(x, SPLITS, fmt, i, **opts) for i in range(7)]
    for d in ("rowwise", "columnwise"):
        for dt in ("float32", "bfloat16"):
            got = g.dequantize(d, dt)
            assert isinstance(got, xp.ndarray) and got.shape == (M_TOTAL, K)
            expected = np.concatenate([lpm.dequantize(q, d, dt) for q in members])
            assert_bytes_equal(got, expected, f"{name} {d} {dt}")


# ---------------------------------------------------------------------------- wire format
def _wire(xp, x, splits, fp8_dtype="e4m3"):
    q = lpm.quantize(x, "mxfp8", fp8_dtype=fp8_dtype)
    data, scale = xp.asarray(q.rowwise_data), xp.asarray(q.rowwise_scale)
    return lpm.GroupedTensor.from_mxfp8_rowwise(data, scale, splits, fp8_dtype=fp8_dtype), data, \
        scale, q


def test_from_mxfp8_rowwise_wraps_without_copy(xp):
    x = _input(seed=5)
    w, data, scale, q = _wire(xp, x, SPLITS)
    assert w.format == "mxfp8" and w.fp8_dtype == "e4m3" and w.shape == (M_TOTAL, K)
    assert w.rowwise_data is data or _shares(w.rowwise_data, data)
    assert w.rowwise_scale is scale or _shares(w.rowwise_scale, scale)
    assert w.columnwise_data is None
    np.testing.assert_array_equal(w.offsets, OFFSETS)
    for i in range(7):
        if SPLITS[i]:
            assert _shares(w.member(i).rowwise_data, data)
    assert_bytes_equal(w.dequantize("rowwise", "bfloat16"), lpm.dequantize(q, dtype="bfloat16"))


@pytest.mark.parametrize("fp8_dtype", ["e4m3", "e5m2"])
def test_with_columnwise_equals_quantize_of_dequantized(xp, fp8_dtype):
    x = _input(seed=6)
    w, data, scale, _ = _wire(xp, x, SPLITS, fp8_dtype)
    wc = w.with_columnwise()
    # shares the rowwise buffers
    assert wc.rowwise_data is w.rowwise_data and wc.rowwise_scale is w.rowwise_scale
    assert _shares(wc.rowwise_data, data)
    # columnwise == GroupedTensor.quantize(dequantize(wire, bf16), columnwise=True), NumPy
    bf16 = to_host(w.dequantize("rowwise", dtype="bfloat16"))
    assert bf16.dtype == ml_dtypes.bfloat16
    ref = lpm.GroupedTensor.quantize(bf16, SPLITS, "mxfp8", columnwise=True, fp8_dtype=fp8_dtype)
    for field in ("columnwise_data", "columnwise_scale"):
        assert_bytes_equal(getattr(wc, field), getattr(ref, field), field)
        np.testing.assert_array_equal(np.asarray(getattr(wc, field + "_offsets")),
                                      getattr(ref, field + "_offsets"))
    for i in range(7):
        m = wc.member(i)
        assert_bytes_equal(m.columnwise_data, ref.member(i).columnwise_data, f"member {i}")
        assert_bytes_equal(m.columnwise_scale, ref.member(i).columnwise_scale, f"member {i}")
    # a tensor that already has a columnwise copy is returned as is
    assert wc.with_columnwise() is wc


def test_with_columnwise_needs_mxfp8(xp):
    g = lpm.GroupedTensor.quantize(xp.asarray(_input(seed=7)), SPLITS, "nvfp4")
    with pytest.raises(ValueError, match="nvfp4"):
        g.with_columnwise()


# ------------------------------------------------------------------------------ swizzling
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize("direction", ["rowwise", "columnwise"])
def test_swizzle_round_trip_grouped(xp, fmt, direction):
    g = lpm.GroupedTensor.quantize(xp.asarray(_input(seed=8)), SPLITS, fmt, columnwise=True)
    transpose = fmt == "mxfp8" and direction == "columnwise"
    buf, offs = lpm.swizzle_scales(g, direction)
    assert isinstance(buf, xp.ndarray) and buf.dtype == np.uint8
    offs = np.asarray(offs)
    assert offs.dtype == np.int64 and offs.shape == (8,) and offs[0] == 0
    scales = [to_host(g.member(i).rowwise_scale if direction == "rowwise"
                      else g.member(i).columnwise_scale) for i in range(7)]
    # each member swizzled on its own, buffers concatenated
    for i, s in enumerate(scales):
        assert_bytes_equal(buf[int(offs[i]):int(offs[i + 1])],
                           L.swizzle_scales_np(s, transpose=transpose), f"member {i}")
    assert buf.size == offs[-1]
    back = lpm.unswizzle_scales(buf, [s.shape for s in scales], transpose=transpose)
    assert len(back) == 7
    for i, (b, s) in enumerate(zip(back, scales)):
        assert_bytes_equal(b, s, f"member {i}")


@pytest.mark.parametrize("rht", [False, True])
def test_first_member_numbers_the_rounding_stream(xp, rht):
    """Members 2.. quantized alone with first_member=2 round (stochastic rounding, RHT) exactly
    as members 2.. of the whole tensor: an expert-parallel rank holding experts 2.. matches one
    process holding them all."""
    rng = np.random.default_rng(31)
    splits = [48, 16, 32, 0, 64]
    x = rng.standard_normal((sum(splits), 64)).astype(ml_dtypes.bfloat16)
    opts = dict(columnwise=True, stochastic_rounding=True, rht=rht, seed=7)
    whole = lpm.GroupedTensor.quantize(xp.asarray(x), splits, "nvfp4", **opts)
    part = lpm.GroupedTensor.quantize(xp.asarray(x[64:]), splits[2:], "nvfp4", first_member=2,
                                      **opts)
    shifted = lpm.GroupedTensor.quantize(xp.asarray(x[64:]), splits[2:], "nvfp4", **opts)
    for g in range(len(splits) - 2):
        a, b = part.member(g), whole.member(g + 2)
        assert a.member_index == b.member_index == g + 2
        assert_bytes_equal(a.rowwise_data, b.rowwise_data, f"member {g + 2} rowwise")
        assert_bytes_equal(a.columnwise_data, b.columnwise_data, f"member {g + 2} columnwise")
    differs = any(not np.array_equal(to_host(shifted.member(g).rowwise_data),
                                     to_host(whole.member(g + 2).rowwise_data))
                  for g in range(len(splits) - 2) if splits[g + 2])
    assert differs, "member index 0.. and 2.. gave the same stochastic rounding"


def test_first_member_is_checked():
    x = np.zeros((32, 32), np.float32)
    with pytest.raises(TypeError, match="first_member"):
        lpm.GroupedTensor.quantize(x, [16, 16], "nvfp4", first_member=1.5)
    with pytest.raises(ValueError, match="first_member"):
        lpm.GroupedTensor.quantize(x, [16, 16], "nvfp4", first_member=2**32 - 1)
