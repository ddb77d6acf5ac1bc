"""Block-code range words of MXFP8 operand rows (the warp-specialised MXFP8 kernels' window
check input): the NumPy twin ``mx_code_range_words`` on the CPU, and the GPU range kernel
``grouped_gemm_sm90_mxfp8_block_code_ranges`` bit for bit against it, for the operand layouts of fprop (both K-major),
dgrad (B MN-major) and wgrad (both MN-major; every expert its own token count), ragged and
empty experts, block codes spread over ~200 exponents and NaN scales."""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe import formats as F
from lowprec_moe.backends.numpy.gemm import mx_code_range_words

from conftest import assert_bytes_equal, requires_gpu, to_host


def test_mx_code_range_words():
    codes = np.array([[3, 7, 5], [254, 0, 9], [F.E8M0_NAN, 1, 2], [6, 6, 6]], np.uint8)
    got = mx_code_range_words(codes)
    assert got.dtype == np.uint16
    assert got.tolist() == [7 | 3 << 8, 254, F.E8M0_NAN | 1 << 8, 6 | 6 << 8]
    # no blocks: 0 and the NaN code (the window scan's initial values)
    assert mx_code_range_words(np.zeros((2, 0), np.uint8)).tolist() == [F.E8M0_NAN << 8] * 2
    with pytest.raises(ValueError, match="2-D"):
        mx_code_range_words(np.zeros(3, np.uint8))


def _expected_words(p, pl, arrays, ra):
    """The twin over the bytes the kernel addresses: per expert, A's rows and B's columns of
    its descriptor (K-major: row r's codes at soff + r * sld; MN-major: line j at soff + j *
    sld + r), ceil(len / 32) blocks each."""
    from lowprec_moe.backends.cupy.gemm import plan as P

    d = P.descriptors(pl)
    a_scale, b_scale = (to_host(arrays[1]).view(np.uint8).ravel(),
                        to_host(arrays[4]).view(np.uint8).ravel())
    rb = int(pl.n_cols)
    out = np.zeros(len(pl.rows) * (ra + rb), np.uint16)
    valid = np.zeros(out.shape, bool)
    for g in range(len(pl.rows)):
        nb = -(-int(d[g, P.D_LEN]) // F.MXFP8_BLOCK)
        for op, (flat, mn, rows, soff, sld) in enumerate((
                (a_scale, pl.a.mn, int(d[g, P.D_ROWS]), d[g, P.D_A_SOFF], d[g, P.D_A_SLD]),
                (b_scale, pl.b.mn, rb, d[g, P.D_B_SOFF], d[g, P.D_B_SLD]))):
            r = np.arange(rows)[:, None]
            j = np.arange(nb)[None, :]
            idx = soff + (j * sld + r if mn else r * sld + j)
            base = g * (ra + rb) + (ra if op else 0)
            out[base:base + rows] = mx_code_range_words(flat[idx])
            valid[base:base + rows] = True
    return out, valid


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
def test_gpu_mx_range_words(mode):
    import cupy as cp

    from lowprec_moe.backends.cupy.gemm import launch as C
    from lowprec_moe.backends.cupy.gemm import plan as P
    from lowprec_moe.backends.cupy.gemm.ranges import mx_range_words
    from lowprec_moe.gemm import _validate

    from test_gemm import _data, _quantize
    from test_gpu_gemm import gpu
    from test_ws_mx_producers import _window

    splits = [0, 300, 37, 260, 5, 129] if mode != "wgrad" else [0, 512, 96, 1024]
    x, w, dy = _data(7, sum(splits), 320, 1024)
    rng = np.random.default_rng(8)
    # block magnitudes over most of the E8M0 range, a few NaN blocks
    x *= np.exp2(rng.integers(-100, 100, (x.shape[0], x.shape[1] // 32))).repeat(32, axis=1)
    x[5, 64:96] = np.nan
    dy *= np.exp2(rng.integers(-60, 60, dy.shape[0]))[:, None]
    w = rng.standard_normal((len(splits), 320, 1024)).astype(np.float32)
    xq, wq, dq = _quantize("mxfp8-hybrid", x, w, dy, splits)
    a, b = {"fprop": (xq, wq), "dgrad": (dq, wq), "wgrad": (dq, xq)}[mode]
    p = _validate(mode, gpu(a), gpu(b), splits, bias=None, probs=None, out_dtype="bfloat16",
                  out=None, accumulate=False)
    pl = P.plan(p)
    arrays = C._operand_arrays(p)
    ra = int(pl.rows.max())
    desc = cp.asarray(P.descriptors(pl))
    exp, valid = _expected_words(p, pl, arrays, ra)
    assert valid.any()
    # one thread per row, and grids that make each thread stride over several rows
    for grid_rows in (None, 1, 300):
        words, flag = mx_range_words(desc, arrays[1], arrays[4], pl.a.mn, pl.b.mn, pl.a.e5m2,
                                     pl.b.e5m2, int(pl.n_cols), ra, len(pl.rows),
                                     grid_rows=grid_rows)
        got = to_host(words)
        assert_bytes_equal(got[valid], exp[valid], f"range words, {mode}, grid {grid_rows}")
    # the out-of-window flag: some valid row with a NaN code or codes wider than its format's
    # window (fprop / wgrad: x's blocks span ~200 codes; dgrad: dy's rows are plain rows, each
    # in the window, as are W's columns)
    rb = int(pl.n_cols)
    side_b = (np.arange(exp.size) % (ra + rb)) >= ra
    window = np.where(side_b, _window(pl.b.e5m2), _window(pl.a.e5m2))
    hi, lo = (exp & 0xFF).astype(int), (exp >> 8).astype(int)
    out = valid & ((hi == F.E8M0_NAN) | (hi - lo > window))
    assert int(to_host(flag)[0]) == int(out.any()), mode
    assert out.any() == (mode != "dgrad"), mode
