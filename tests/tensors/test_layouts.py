"""Scale layouts (NUMERICS §4): padding, swizzle / unswizzle, grouped, on both backends.

Tests taking ``xp`` run the NumPy reference and, marked ``gpu``, the CuPy launchers; both are
checked against the literal index formula, so CPU and GPU agree byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe import formats as F
from lowprec_moe.backends.numpy.layouts import (
    pad_scales,
    padded_scale_shape,
    round_up,
    swizzle_grouped_np,
    swizzle_scales_np,
    swizzled_size,
)

SHAPES = [
    (1, 1),
    (0, 0),
    (0, 5),
    (7, 0),
    (1, 4),
    (3, 3),
    (31, 2),
    (32, 4),
    (100, 7),
    (128, 4),
    (129, 5),
    (200, 16),
    (256, 8),
    (300, 9),
    (513, 1),
    (1, 130),
]


def _rand(shape, seed=0):
    rng = np.random.default_rng(seed + 7919 * shape[0] + shape[1])
    # values 1..255 so that a zero in the buffer can only come from padding
    return rng.integers(1, 256, size=shape, dtype=np.uint8)


def to_host(a):
    """NumPy view / copy of a NumPy or CuPy array."""
    return a if isinstance(a, np.ndarray) else a.get()


def _literal_swizzle(scale, transpose=False):
    """Swizzle through the literal index formula of NUMERICS §4 (vectorized scatter)."""
    row = scale.T if transpose else scale
    r_, c_ = row.shape
    rp, cp = round_up(r_, 128), round_up(c_, 4)
    padded = np.zeros((rp, cp), dtype=np.uint8)
    padded[:r_, :c_] = row
    r, c = np.indices((rp, cp))
    idx = ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    out = np.full(rp * cp, 0xAB, dtype=np.uint8)  # sentinel: every byte must be written
    out[idx.ravel()] = padded.ravel()
    # the formula is a bijection onto [0, rp * cp)
    assert np.array_equal(np.sort(idx.ravel()), np.arange(rp * cp))
    return out


# ------------------------------------------------------------------------------------------
# Shapes and padding


def test_constants_match_spec():
    assert (F.SCALE_PAD_ROWS, F.SCALE_PAD_COLS) == (128, 4)
    assert (F.SWIZZLE_TILE_ROWS, F.SWIZZLE_TILE_COLS, F.SWIZZLE_TILE_BYTES) == (128, 4, 512)
    assert F.SWIZZLE_SUBTILE_ROWS == 32


@pytest.mark.parametrize(
    "rows, cols, transpose, expected",
    [
        (1, 1, False, (128, 4)),
        (128, 4, False, (128, 4)),
        (129, 5, False, (256, 8)),
        (0, 3, False, (0, 4)),
        (5, 0, False, (128, 0)),
        (1, 1, True, (4, 128)),
        (4, 128, True, (4, 128)),
        (5, 129, True, (8, 256)),
        (3, 200, True, (4, 256)),
    ],
)
def test_padded_scale_shape(rows, cols, transpose, expected):
    assert padded_scale_shape(rows, cols, transpose=transpose) == expected
    assert swizzled_size(rows, cols, transpose=transpose) == expected[0] * expected[1]


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_pad_scales(shape, transpose):
    s = _rand(shape)
    p = pad_scales(s, transpose=transpose)
    assert p.dtype == np.uint8
    assert p.shape == padded_scale_shape(*shape, transpose=transpose)
    assert p.flags.c_contiguous
    np.testing.assert_array_equal(p[: shape[0], : shape[1]], s)
    mask = np.ones(p.shape, dtype=bool)
    mask[: shape[0], : shape[1]] = False
    assert not p[mask].any()


# ------------------------------------------------------------------------------------------
# Backend selection


def _fn(xp, name):
    """``name`` of the NumPy reference (``<name>_np``) or of the CuPy launchers (``<name>_cp``)."""
    if xp is np:
        from lowprec_moe.backends.numpy import layouts

        return getattr(layouts, name + "_np")
    from lowprec_moe.backends.cupy import layouts

    return getattr(layouts, name + "_cp")


def _is_backend_array(xp, a):
    return isinstance(a, xp.ndarray)


# ------------------------------------------------------------------------------------------
# Swizzle


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_swizzle_matches_literal_formula(xp, shape, transpose):
    s = _rand(shape)
    buf = _fn(xp, "swizzle_scales")(xp.asarray(s), transpose=transpose)
    assert _is_backend_array(xp, buf)
    assert buf.dtype == np.uint8 and buf.ndim == 1
    assert buf.size == swizzled_size(*shape, transpose=transpose)
    np.testing.assert_array_equal(to_host(buf), _literal_swizzle(s, transpose))


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip(xp, shape, transpose):
    s = _rand(shape, seed=1)
    buf = _fn(xp, "swizzle_scales")(xp.asarray(s), transpose=transpose)
    back = _fn(xp, "unswizzle_scales")(buf, shape, transpose=transpose)
    assert _is_backend_array(xp, back)
    assert back.dtype == np.uint8 and back.shape == shape and back.flags.c_contiguous
    np.testing.assert_array_equal(to_host(back), s)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (100, 7), (129, 5), (3, 200)])
def test_padding_bytes_are_zero(xp, shape, transpose):
    s = _rand(shape)  # no zero entries
    buf = to_host(_fn(xp, "swizzle_scales")(xp.asarray(s), transpose=transpose))
    r_, c_ = (shape[1], shape[0]) if transpose else shape
    r, c = np.indices((r_, c_))
    cp_ = round_up(c_, 4)
    real = ((r // 128) * (cp_ // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    is_pad = np.ones(buf.size, dtype=bool)
    is_pad[real.ravel()] = False
    assert is_pad.sum() == buf.size - s.size
    assert not buf[is_pad].any()
    assert buf[~is_pad].all()


def test_swizzle_of_padded_equals_swizzle_of_compact():
    s = _rand((150, 6))
    np.testing.assert_array_equal(swizzle_scales_np(pad_scales(s)), swizzle_scales_np(s))
    t = _rand((5, 150))
    np.testing.assert_array_equal(
        swizzle_scales_np(pad_scales(t, transpose=True), transpose=True),
        swizzle_scales_np(t, transpose=True),
    )


def test_transpose_mode_is_swizzle_of_transpose(xp):
    s = _rand((6, 300))  # MXFP8 columnwise [M/32, K]
    swz = _fn(xp, "swizzle_scales")
    np.testing.assert_array_equal(
        to_host(swz(xp.asarray(s), transpose=True)),
        to_host(swz(xp.asarray(np.ascontiguousarray(s.T)))),
    )


def test_known_positions():
    # entry (r, c) -> ((r//128)*(Cp//4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4
    s = np.zeros((256, 8), dtype=np.uint8)
    s[0, 0], s[1, 0], s[32, 0], s[0, 1], s[0, 4], s[128, 0], s[255, 7] = 1, 2, 3, 4, 5, 6, 7
    buf = swizzle_scales_np(s)
    assert buf[0] == 1
    assert buf[16] == 2
    assert buf[4] == 3
    assert buf[1] == 4
    assert buf[512] == 5
    assert buf[1024] == 6
    assert buf[3 * 512 + 31 * 16 + 3 * 4 + 3] == 7


@pytest.mark.parametrize("transpose", [False, True])
def test_non_contiguous_input(xp, transpose):
    base = _rand((300, 20))
    view = base[::2, 1::3]
    out = _fn(xp, "swizzle_scales")(xp.asarray(base)[::2, 1::3], transpose=transpose)
    np.testing.assert_array_equal(
        to_host(out), swizzle_scales_np(np.ascontiguousarray(view), transpose=transpose)
    )
    # a buffer that is not 1-D (same size) is accepted by unswizzle
    buf = swizzle_scales_np(view, transpose=transpose)
    back = _fn(xp, "unswizzle_scales")(xp.asarray(buf.reshape(-1, 4)), view.shape,
                                       transpose=transpose)
    np.testing.assert_array_equal(to_host(back), view)


def test_input_not_modified(xp):
    s = _rand((50, 3))
    d = xp.asarray(s)
    _fn(xp, "swizzle_scales")(d)
    _fn(xp, "swizzle_scales")(d, transpose=True)
    np.testing.assert_array_equal(to_host(d), s)


# ------------------------------------------------------------------------------------------
# Grouped

GROUP_SHAPES = [(5, 3), (0, 3), (128, 3), (200, 3), (1, 3), (0, 3)]


@pytest.mark.parametrize("transpose", [False, True])
def test_grouped_equals_member_concat(xp, transpose):
    members = [_rand(sh, seed=g) for g, sh in enumerate(GROUP_SHAPES)]
    buf, offsets = _fn(xp, "swizzle_grouped")([xp.asarray(m) for m in members],
                                              transpose=transpose)
    assert _is_backend_array(xp, buf)
    parts = [_literal_swizzle(m, transpose) for m in members]
    assert isinstance(offsets, np.ndarray)  # host metadata on both backends
    assert offsets.dtype == np.int64 and offsets.shape == (len(members) + 1,)
    assert offsets[0] == 0
    np.testing.assert_array_equal(np.diff(offsets), [p.size for p in parts])
    host = to_host(buf)
    np.testing.assert_array_equal(host, np.concatenate(parts))
    for g, p in enumerate(parts):
        np.testing.assert_array_equal(host[offsets[g] : offsets[g + 1]], p)
    back = _fn(xp, "unswizzle_grouped")(buf, GROUP_SHAPES, transpose=transpose)
    assert len(back) == len(members)
    for m, b in zip(members, back):
        assert _is_backend_array(xp, b) and b.shape == m.shape
        np.testing.assert_array_equal(to_host(b), m)


def test_grouped_mixed_shapes(xp):
    # NVFP4 columnwise members: [K, Mg_p/16] -- the column count differs per member
    shapes = [(64, 1), (64, 3), (64, 0), (64, 8)]
    members = [_rand(sh, seed=g) for g, sh in enumerate(shapes)]
    buf, offsets = _fn(xp, "swizzle_grouped")([xp.asarray(m) for m in members])
    assert list(offsets) == [0, 512, 1024, 1024, 2048]
    np.testing.assert_array_equal(
        to_host(buf), np.concatenate([swizzle_scales_np(m) for m in members])
    )
    for m, b in zip(members, _fn(xp, "unswizzle_grouped")(buf, shapes)):
        np.testing.assert_array_equal(to_host(b), m)


def test_grouped_empty(xp):
    buf, offsets = _fn(xp, "swizzle_grouped")([])
    assert _is_backend_array(xp, buf)
    assert buf.dtype == np.uint8 and buf.size == 0
    assert offsets.dtype == np.int64 and list(offsets) == [0]
    assert _fn(xp, "unswizzle_grouped")(buf, []) == []


# ------------------------------------------------------------------------------------------
# Bad input (same exception types on both backends)


def test_bad_dtype(xp):
    swz = _fn(xp, "swizzle_scales")
    with pytest.raises(TypeError, match="int32"):
        swz(xp.zeros((4, 4), dtype=np.int32))
    with pytest.raises(TypeError, match="int16"):
        _fn(xp, "unswizzle_scales")(xp.zeros(512, dtype=np.int16), (1, 1))
    with pytest.raises(TypeError, match=r"scales_list\[1\].*float64"):
        _fn(xp, "swizzle_grouped")([xp.zeros((1, 1), np.uint8), xp.zeros((1, 1))])
    with pytest.raises(TypeError, match="list"):
        swz([[1, 2], [3, 4]])
    with pytest.raises(TypeError, match="float32"):
        pad_scales(np.zeros((4, 4), dtype=np.float32))


@pytest.mark.parametrize("shape", [(), (4,), (2, 2, 2)])
def test_bad_rank(xp, shape):
    x = xp.zeros(shape, dtype=np.uint8)
    with pytest.raises(ValueError, match=f"ndim={len(shape)}"):
        _fn(xp, "swizzle_scales")(x)
    with pytest.raises(ValueError, match=rf"scales_list\[0\].ndim={len(shape)}"):
        _fn(xp, "swizzle_grouped")([x])
    with pytest.raises(ValueError, match=f"ndim={len(shape)}"):
        pad_scales(np.zeros(shape, dtype=np.uint8))


def test_bad_buffer_size(xp):
    unswz = _fn(xp, "unswizzle_scales")
    with pytest.raises(ValueError, match=r"buf.size=511.*512"):
        unswz(xp.zeros(511, dtype=np.uint8), (1, 1))
    with pytest.raises(ValueError, match=r"buf.size=512.*1024"):
        unswz(xp.zeros(512, dtype=np.uint8), (129, 1))
    with pytest.raises(ValueError, match=r"buf.size=512.*1024"):
        unswz(xp.zeros(512, dtype=np.uint8), (1, 129), transpose=True)
    with pytest.raises(ValueError, match=r"buf.size=1000.*1024"):
        _fn(xp, "unswizzle_grouped")(xp.zeros(1000, dtype=np.uint8), [(1, 1), (2, 3)])


def test_bad_shape(xp):
    unswz = _fn(xp, "unswizzle_scales")
    buf = xp.zeros(512, dtype=np.uint8)
    with pytest.raises(ValueError, match="-1"):
        unswz(buf, (-1, 4))
    with pytest.raises(ValueError, match=r"shape=\(1, 1, 1\).*got 3"):
        unswz(buf, (1, 1, 1))
    with pytest.raises(TypeError, match="1.5"):
        unswz(buf, (1.5, 1))
    with pytest.raises(ValueError, match=r"shapes\[1\]\[0\]=-3"):
        _fn(xp, "unswizzle_grouped")(buf, [(1, 1), (-3, 1)])
    with pytest.raises(ValueError, match="rows=-2"):
        padded_scale_shape(-2, 4)


# ------------------------------------------------------------------------------------------
# GPU only: large shapes, zero-copy grouped input, wrong array kind


@pytest.mark.gpu
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", [(4096, 448), (1000, 65), (16384, 224)])
def test_gpu_large_matches_numpy(cp, shape, transpose):
    from lowprec_moe.backends.cupy.layouts import swizzle_scales_cp, unswizzle_scales_cp

    s = _rand(shape, seed=3)
    ref = swizzle_scales_np(s, transpose=transpose)
    out = swizzle_scales_cp(cp.asarray(s), transpose=transpose)
    np.testing.assert_array_equal(cp.asnumpy(out), ref)
    back = unswizzle_scales_cp(cp.asarray(ref), shape, transpose=transpose)
    np.testing.assert_array_equal(cp.asnumpy(back), s)


@pytest.mark.gpu
@pytest.mark.parametrize("transpose", [False, True])
def test_gpu_grouped_views_of_one_buffer(cp, transpose):
    """Members that are row slices of one [M_total, C] array (a grouped tensor's rowwise
    scales) or reshaped slices of a flat buffer (its columnwise scales) are read in place."""
    from lowprec_moe.backends.cupy.layouts import swizzle_grouped_buffer_cp, swizzle_grouped_cp

    splits = [0, 130, 5, 0, 1000, 31]
    offs = np.concatenate([[0], np.cumsum(splits)])
    whole = _rand((int(offs[-1]), 7), seed=11)
    members = [whole[offs[g]:offs[g + 1]] for g in range(len(splits))]
    ref_buf, ref_off = swizzle_grouped_np(members, transpose=transpose)

    d = cp.asarray(whole)
    buf, off = swizzle_grouped_cp([d[offs[g]:offs[g + 1]] for g in range(len(splits))],
                                  transpose=transpose)
    np.testing.assert_array_equal(off, ref_off)
    np.testing.assert_array_equal(cp.asnumpy(buf), ref_buf)

    # members in reverse memory order, and a flat buffer with explicit offsets
    rev = [d[offs[g]:offs[g + 1]] for g in reversed(range(len(splits)))]
    buf2, _ = swizzle_grouped_cp(rev, transpose=transpose)
    ref2, _ = swizzle_grouped_np(members[::-1], transpose=transpose)
    np.testing.assert_array_equal(cp.asnumpy(buf2), ref2)

    shapes = [m.shape for m in members]
    buf3, off3 = swizzle_grouped_buffer_cp(d.reshape(-1), shapes, offs[:-1] * 7,
                                           transpose=transpose)
    np.testing.assert_array_equal(off3, ref_off)
    np.testing.assert_array_equal(cp.asnumpy(buf3), ref_buf)


@pytest.mark.gpu
def test_gpu_grouped_separate_and_strided_members(cp):
    from lowprec_moe.backends.cupy.layouts import swizzle_grouped_cp, unswizzle_grouped_cp

    shapes = [(64, 1), (3000, 7), (0, 7), (129, 130)]
    members = [_rand(sh, seed=g) for g, sh in enumerate(shapes)]
    dev = [cp.asarray(m) for m in members]
    dev[1] = cp.asarray(np.ascontiguousarray(members[1].T)).T  # not C-contiguous
    for transpose in (False, True):
        ref_buf, ref_off = swizzle_grouped_np(members, transpose=transpose)
        buf, off = swizzle_grouped_cp(dev, transpose=transpose)
        np.testing.assert_array_equal(off, ref_off)
        np.testing.assert_array_equal(cp.asnumpy(buf), ref_buf)
        back = unswizzle_grouped_cp(buf, shapes, transpose=transpose)
        for m, b in zip(members, back):
            np.testing.assert_array_equal(cp.asnumpy(b), m)


@pytest.mark.gpu
def test_gpu_rejects_numpy(cp):
    from lowprec_moe.backends.cupy.layouts import swizzle_scales_cp, unswizzle_scales_cp

    with pytest.raises(TypeError, match="numpy"):
        swizzle_scales_cp(np.zeros((4, 4), dtype=np.uint8))
    with pytest.raises(TypeError, match="numpy"):
        unswizzle_scales_cp(np.zeros(512, dtype=np.uint8), (1, 1))
