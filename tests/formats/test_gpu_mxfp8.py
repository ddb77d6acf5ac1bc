"""GPU MXFP8 kernels (``raw_kernels/mxfp8*.cu``, ``lowprec_moe/backends/cupy/mxfp8.py``) vs the NumPy
reference, byte for byte.

Every test needs CuPy and a CUDA GPU (marked ``gpu``, skipped cleanly otherwise). The launchers
are called directly, so these tests do not depend on the dispatch layer; the last section also
goes through the public API. Tests marked with the ``cvt_module`` fixture run twice: with the
production kernels (hardware fp32 -> fp8 conversion) and with the integer-conversion build.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe import formats as F
from lowprec_moe.tensors.grouped_tensor import _grouped_quantize_reference
from lowprec_moe.backends.numpy import fp as RF
from lowprec_moe.backends.numpy import mxfp8 as RM

from conftest import (assert_bytes_equal, cast_host, host_dtype, requires_gpu, spread_random,
                      to_host)

pytestmark = [pytest.mark.gpu, requires_gpu]

f32 = np.float32
FP8 = ("e4m3", "e5m2")
DTYPES = ("float32", "float16", "bfloat16")
SPLITS = [0, 37, 128, 5, 90, 0, 48]
MODES = [(True, False), (False, True), (True, True)]  # (rowwise, columnwise)
QKEYS = ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale")


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def mx():
    from lowprec_moe.backends.cupy import mxfp8

    return mxfp8


@pytest.fixture(params=["mxfp8", "mxfp8_intcvt"])
def cvt_module(request, mx, monkeypatch):
    """Run the test with the hardware-conversion kernels and with the integer ones."""
    monkeypatch.setattr(mx, "MODULE", request.param)
    return request.param


_np_dtype = host_dtype
_cast = cast_host


def _random(shape, seed, spread=30):
    return spread_random(shape, seed, spread)


def _assert_parts(got: dict, ref: dict, keys=QKEYS, what=""):
    for key in keys:
        assert_bytes_equal(got.get(key), ref.get(key), f"{what} {key}")


# --------------------------------------------------------------------------- special values
def _fp8_grid(fp8_dtype):
    """Positive finite fp8 values, ascending (float32)."""
    v = RF.fp8_to_f32(np.arange(128, dtype=np.uint8), fp8_dtype)
    return np.unique(v[np.isfinite(v)])


def _tie_blocks(fp8_dtype, scale_exp):
    """Blocks of 32: [+-max, 31 midpoints of the fp8 grid (and below/above it)] * 2^scale_exp.

    The block amax is max * 2^scale_exp, so v = fp32(1.0) * 2^scale_exp exactly, e = 127 +
    scale_exp and the multiplier undoes the scaling: every midpoint is an exact rounding tie.
    """
    grid = _fp8_grid(fp8_dtype)
    mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    extra = np.array([grid[1] / 2, grid[-1] + (grid[-1] - grid[-2]) / 2,  # 0|min, max|beyond
                      grid[1] / 4, grid[1] * 0.75], np.float32)           # below / above 1st tie
    vals = np.concatenate([mids, extra, -mids])
    nblk = -(-vals.size // 31)
    vals = np.concatenate([vals, np.zeros(nblk * 31 - vals.size, np.float32)])
    blocks = vals.reshape(nblk, 31)
    mx = np.float32(F.fp8_max(fp8_dtype))
    first = np.where(np.arange(nblk) % 2 == 0, mx, -mx).astype(np.float32)[:, None]
    out = np.concatenate([first, blocks], axis=1).astype(np.float64) * 2.0 ** scale_exp
    return out.astype(np.float32).reshape(1, -1)


def _special_rows(fp8_dtype):
    """Rows of 32-element blocks with non-finite values and extreme scales (float32)."""
    mx = float(F.fp8_max(fp8_dtype))
    fmax = float(np.finfo(np.float32).max)
    tiny = float(np.finfo(np.float32).smallest_subnormal)
    nan = float(np.nan)
    neg_nan = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
    snan = np.array([0x7F800001], np.uint32).view(np.float32)[0]
    blocks = [
        [0.0] * 32,                                               # zero block -> e = 0
        [-0.0, 0.0, -0.0] + [0.0] * 29,                           # signed zeros
        [np.inf, fmax, -fmax, 3e38, 1.7e38, 1.0, nan, -np.inf],   # e = 254: multiplier 2^-127
        [-np.inf, 2e38, 1e38, 7e37, 1e-30],
        [fmax, -fmax, fmax / 3, 1.0, -2.0 ** -149],               # amax FLT_MAX
        [mx * 2.0 ** -127, 2.0 ** -127, -(2.0 ** -130), 2.0 ** -136, tiny, -tiny],  # e = 0
        [(mx + 1) * 2.0 ** -127, 2.0 ** -140, 2.0 ** -128],        # subnormal v > 2^-127 -> 1
        [mx * 2.0 ** -126, 2.0 ** -126, 2.0 ** -133, 2.0 ** -135],  # e = 1 exactly
        [tiny, -tiny, 2 * tiny],                                  # v underflows to 0
        [nan, 2.0, -nan, 1.5, snan, neg_nan, -3.0],               # NaN ignored by the amax
        [nan] * 32,                                               # all NaN -> amax 0
        [neg_nan] * 16 + [np.inf] * 16,
        [mx * 1.0000001, mx, mx * 0.9999999, -mx * 1.5],          # overflow after scaling
        [2.0 ** 100, 2.0 ** 100 * 1.25, 2.0 ** 99 * 1.125],
        [1e-40, -1e-41, 3e-39, 1.1754942e-38, 1.1754944e-38],     # fp32 subnormal inputs
    ]
    rows = []
    for b in blocks:
        b = np.asarray(b, np.float32)
        rows.append(np.concatenate([b, np.zeros(32 - b.size, np.float32)]))
    return np.stack(rows).astype(np.float32)  # [n, 32]


def _special_matrix(fp8_dtype, dtype):
    """[M, K] mixing tie blocks (several scales), special blocks and random blocks.

    float16 / bfloat16 versions use scales that keep the ties representable.
    """
    scales = {"float32": [0, -120, 40, -60], "float16": [0, -10, -14], "bfloat16": [0, -120, 60]}
    if fp8_dtype == "e5m2" and dtype == "float16":
        scales["float16"] = [0, -1]
    ties = np.concatenate([_tie_blocks(fp8_dtype, s) for s in scales[dtype]], axis=1)
    spec = _special_rows(fp8_dtype).reshape(1, -1)
    k = 256
    flat = np.concatenate([ties.ravel(), spec.ravel()])
    rows = -(-flat.size // k)
    m = rows + 41  # plus random rows; M >= 32, not a multiple of 32
    x = _random((m, k), seed=11, spread=20)
    flat = np.concatenate([flat, np.zeros(rows * k - flat.size, np.float32)])
    x[:rows] = flat.reshape(rows, k)
    return x


# ----------------------------------------------------------------------- element conversion
def test_cvt_probe_hw_and_integer_vs_reference(cp, mx):
    """The hardware cvt and the integer conversion against ml_dtypes (reference)."""
    from lowprec_moe import kernels

    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 2 ** 32, 1 << 22, dtype=np.uint64).astype(np.uint32)]
    for fmt in FP8:
        grid = _fp8_grid(fmt).astype(np.float64)
        mids = (grid[1:] + grid[:-1]) / 2
        near = np.concatenate([grid, mids, np.nextafter(mids.astype(np.float32), 0),
                               np.nextafter(mids.astype(np.float32), np.inf)])
        parts.append(np.asarray(near, np.float32).view(np.uint32))
    # every fp32 bit pattern with exponent field 100..150 and a few mantissas, and specials
    ex = np.arange(100, 151, dtype=np.uint32)
    mant = rng.integers(0, 1 << 23, 4096, dtype=np.uint64).astype(np.uint32)
    parts.append(((ex[:, None] << 23) | mant[None, :]).reshape(-1))
    parts.append(np.array([0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x7F800000, 0xFF800000,
                           0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7F7FFFFF,
                           0xFF7FFFFF], np.uint32))
    bits = np.concatenate(parts)
    bits = np.concatenate([bits, bits ^ np.uint32(0x80000000)])
    x = bits.view(np.float32)
    fn = kernels.get_function("mxfp8_intcvt", "lpm_mxfp8_cvt_probe")
    xd = cp.asarray(x)
    for fmt in FP8:
        out = cp.empty(x.size, dtype=cp.uint16)
        fn(((x.size + 255) // 256,), (256,), (xd, out, np.int64(x.size), np.int32(fmt == "e5m2")))
        out = out.get()
        hw, integer = (out & 0xFF).astype(np.uint8), (out >> 8).astype(np.uint8)
        ref = RF.f32_to_fp8(x, fmt)
        assert_bytes_equal(integer, ref, f"{fmt} integer conversion")
        nan = np.isnan(x)
        assert_bytes_equal(hw[~nan], ref[~nan], f"{fmt} hardware conversion (non-NaN)")
        # NaN: the kernels canonicalise any NaN byte to 0x7F; the hardware must give one
        mag = hw[nan] & 0x7F
        assert ((mag == 0x7F) if fmt == "e4m3" else (mag > 0x7C)).all(), \
            f"{fmt}: hardware NaN bytes {np.unique(hw[nan])}"


# --------------------------------------------------------------------------------- quantize
@pytest.mark.parametrize("shape", [(1, 32), (31, 64), (33, 96), (100, 160), (129, 288),
                                   (64, 128), (257, 1056), (0, 64)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_quantize_random(cp, mx, shape, dtype, fp8_dtype):
    x = _cast(_random(shape, seed=shape[0] * 7 + shape[1]), dtype)
    xd = cp.asarray(x)
    for rowwise, columnwise in MODES:
        kw = dict(rowwise=rowwise, columnwise=columnwise, block_2d=False, fp8_dtype=fp8_dtype)
        got = mx.quantize_mxfp8(xd, **kw)
        _assert_parts(got, RM.quantize_mxfp8(x, **kw), what=f"{shape} {dtype} {kw}")
        assert got["amax_rowwise"] is None and got["amax_columnwise"] is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_quantize_special_values(cp, mx, cvt_module, dtype, fp8_dtype):
    """Ties, subnormals, +-inf, NaN, zero blocks, e = 0 / 1 / 254, FLT_MAX; both directions."""
    x32 = _special_matrix(fp8_dtype, dtype)
    # the matrix, and its transpose (250 x 32) so that the columnwise blocks see them too
    for x in (_cast(x32, dtype), _cast(np.ascontiguousarray(x32[:32, :250].T), dtype)):
        xd = cp.asarray(x)
        for rowwise, columnwise in MODES:
            kw = dict(rowwise=rowwise, columnwise=columnwise, block_2d=False,
                      fp8_dtype=fp8_dtype)
            _assert_parts(mx.quantize_mxfp8(xd, **kw), RM.quantize_mxfp8(x, **kw),
                          what=f"{cvt_module} {dtype} {x.shape} {kw}")


def test_scale_exponent_edges(cp, mx):
    """Block amaxes around every power of two (and the extremes) give the reference scale."""
    amax = []
    for fmt_max in (448.0, 57344.0):
        p = fmt_max * np.exp2(np.arange(-149, 128, dtype=np.float64))
        p = p[np.isfinite(p.astype(np.float32))].astype(np.float32)
        amax += [p, np.nextafter(p, 0), np.nextafter(p, np.inf)]
    amax.append(np.array([0, 1e-45, 2e-45, np.finfo(np.float32).max, np.inf], np.float32))
    amax = np.concatenate(amax).astype(np.float32)
    amax = amax[np.isfinite(amax) | np.isinf(amax)]
    x = np.zeros((amax.size, 32), np.float32)
    x[:, 7] = amax
    x[1::2, 7] *= -1
    xd = cp.asarray(x)
    for fmt in FP8:
        kw = dict(rowwise=True, columnwise=False, block_2d=False, fp8_dtype=fmt)
        got = mx.quantize_mxfp8(xd, **kw)
        ref = RM.quantize_mxfp8(x, **kw)
        assert_bytes_equal(got["rowwise_scale"][:, 0], RM.scale_exponent(np.abs(x[:, 7]), fmt))
        _assert_parts(got, ref, what=fmt)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_quantize_block_2d(cp, mx, cvt_module, dtype, fp8_dtype):
    x = _random((96, 320), seed=3)
    x[32:64, 64:96] *= f32(2.0 ** -120)       # a tiny tile
    x[64, 200] = np.inf
    x[70, 10] = np.nan
    x[0:32, 288:320] = 0
    x = _cast(x, dtype)
    xd = cp.asarray(x)
    for rowwise, columnwise in MODES:
        kw = dict(rowwise=rowwise, columnwise=columnwise, block_2d=True, fp8_dtype=fp8_dtype)
        got = mx.quantize_mxfp8(xd, **kw)
        _assert_parts(got, RM.quantize_mxfp8(x, **kw), what=f"{cvt_module} {dtype} {kw}")
        if rowwise and columnwise:
            assert_bytes_equal(got["rowwise_data"], got["columnwise_data"], "2-D row == col")


def test_quantize_rejects_bad_input(cp, mx):
    with pytest.raises(ValueError, match="K=48"):
        mx.quantize_mxfp8(cp.zeros((4, 48), cp.float32), rowwise=True, columnwise=False,
                          block_2d=False, fp8_dtype="e4m3")
    with pytest.raises(TypeError, match="float64"):
        mx.quantize_mxfp8(cp.zeros((4, 32), cp.float64), rowwise=True, columnwise=False,
                          block_2d=False, fp8_dtype="e4m3")
    with pytest.raises(TypeError, match="cupy"):
        mx.quantize_mxfp8(np.zeros((4, 32), np.float32), rowwise=True, columnwise=False,
                          block_2d=False, fp8_dtype="e4m3")
    with pytest.raises(ValueError, match="fp8_dtype"):
        mx.quantize_mxfp8(cp.zeros((4, 32), cp.float32), rowwise=True, columnwise=False,
                          block_2d=False, fp8_dtype="e3m4")


def test_quantize_noncontiguous_and_misaligned_input(cp, mx):
    x = _random((40, 128), seed=5)
    big = cp.asarray(np.concatenate([np.zeros(1, np.float32), x.ravel()]))
    misaligned = big[1:].reshape(40, 128)          # data pointer 4 bytes past an allocation
    strided = cp.asarray(np.ascontiguousarray(x.T)).T  # Fortran order
    kw = dict(rowwise=True, columnwise=True, block_2d=False, fp8_dtype="e4m3")
    ref = RM.quantize_mxfp8(x, **kw)
    for xd in (misaligned, strided):
        _assert_parts(mx.quantize_mxfp8(xd, **kw), ref)


# ------------------------------------------------------------------------------ dequantize
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_dequantize_all_bytes_and_scales(cp, mx, fp8_dtype):
    """Every (byte, scale) pair, NaN bytes and scale 255 included, bit for bit."""
    b = np.arange(256, dtype=np.uint8)
    data = np.tile(b, (256, 1)).reshape(256, 256)                     # [e, byte]
    scale_row = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 8, axis=1)  # [256, 8]
    got = mx.dequantize_mxfp8(cp.asarray(data), cp.asarray(scale_row), fp8_dtype=fp8_dtype)
    assert got.dtype == cp.float32
    assert_bytes_equal(got, RM.dequantize_mxfp8(data, scale_row, fp8_dtype=fp8_dtype),
                       "rowwise")
    # columnwise: the same pairs with blocks along M
    data_c = np.ascontiguousarray(np.repeat(b[None, :], 64, axis=0))   # [64, 256]
    rng = np.random.default_rng(1)
    scale_c = rng.integers(0, 256, (2, 256), dtype=np.uint8)
    scale_c[0] = np.arange(256, dtype=np.uint8)
    for m in (None, 64, 40, 33, 1, 0):
        got = mx.dequantize_mxfp8(cp.asarray(data_c), cp.asarray(scale_c), columnwise=True,
                                  m=m, fp8_dtype=fp8_dtype)
        ref = RM.dequantize_mxfp8(data_c, scale_c, columnwise=True, m=m, fp8_dtype=fp8_dtype)
        assert_bytes_equal(got, ref, f"columnwise m={m}")


@pytest.mark.parametrize("k", [32, 96, 4096, 8224])
def test_dequantize_random_round_trip(cp, mx, k):
    x = _cast(_random((75, k), seed=k), "bfloat16")
    for fmt in FP8:
        q = mx.quantize_mxfp8(cp.asarray(x), rowwise=True, columnwise=True, block_2d=False,
                              fp8_dtype=fmt)
        rd, rs = to_host(q["rowwise_data"]), to_host(q["rowwise_scale"])
        cd, cs = to_host(q["columnwise_data"]), to_host(q["columnwise_scale"])
        assert_bytes_equal(mx.dequantize_mxfp8(q["rowwise_data"], q["rowwise_scale"],
                                               fp8_dtype=fmt),
                           RM.dequantize_mxfp8(rd, rs, fp8_dtype=fmt), f"{fmt} rowwise")
        assert_bytes_equal(mx.dequantize_mxfp8(q["columnwise_data"], q["columnwise_scale"],
                                               columnwise=True, m=75, fp8_dtype=fmt),
                           RM.dequantize_mxfp8(cd, cs, columnwise=True, m=75, fp8_dtype=fmt),
                           f"{fmt} columnwise")


# -------------------------------------------------------------------------- grouped helpers
class _GT:
    """The fields of a GroupedTensor the grouped launchers read."""

    def __init__(self, parts, splits, k, fp8_dtype):
        self.format = "mxfp8"
        self.fp8_dtype = fp8_dtype
        self.splits = tuple(splits)
        self.offsets = np.concatenate([[0], np.cumsum(splits)]).astype(np.int64)
        self.shape = (int(self.offsets[-1]), k)
        for key in QKEYS + ("columnwise_data_offsets", "columnwise_scale_offsets"):
            setattr(self, key, parts.get(key))


def _grouped_ref(x, splits, **kw):
    return _grouped_quantize_reference(x, splits, "mxfp8", row_scaled=False, rht=False,
                                       stochastic_rounding=False, seed=0, **kw)


def _wire(seed, m, k, fmt, kind):
    rng = np.random.default_rng(seed)
    if kind == "quantized":  # realistic: rowwise quantization of bf16 activations
        x = _cast(_random((m, k), seed=seed, spread=12), "bfloat16")
        q = RM.quantize_mxfp8(x, rowwise=True, fp8_dtype=fmt)
        return q["rowwise_data"], q["rowwise_scale"]
    data = rng.integers(0, 256, (m, k), dtype=np.uint8)         # every byte, NaN / inf too
    scale = rng.integers(0, 256, (m, k // 32), dtype=np.uint8)  # every scale, 255 too
    scale[::3] = rng.integers(0, 20, scale[::3].shape)          # small scales: subnormal values
    scale[1::7] = rng.integers(240, 255, scale[1::7].shape)     # large: overflow to inf
    return data, scale


def _unfused_reference(data, scale, splits, wire_fmt, out_fmt):
    bf16 = RM.dequantize_mxfp8(data, scale, fp8_dtype=wire_fmt).astype(ml_dtypes.bfloat16)
    return _grouped_ref(bf16, splits, rowwise=False, columnwise=True, block_2d=False,
                        fp8_dtype=out_fmt)


# ----------------------------------------------------------------------------- determinism
def test_run_to_run_determinism(cp, mx):
    x = cp.asarray(_cast(_random((1000, 2048), seed=9), "bfloat16"))
    kw = dict(rowwise=True, columnwise=True, block_2d=False, fp8_dtype="e4m3")
    a = mx.quantize_mxfp8(x, **kw)
    b = mx.quantize_mxfp8(x, **kw)
    _assert_parts(a, b, what="single")
    splits = [100, 0, 333, 67, 500]
    ga = mx.grouped_quantize_mxfp8(x, splits, **kw)
    gb = mx.grouped_quantize_mxfp8(x, splits, **kw)
    _assert_parts(ga, gb, what="grouped")
    gt = _GT(dict(rowwise_data=a["rowwise_data"], rowwise_scale=a["rowwise_scale"]), splits,
             2048, "e4m3")
    fa = mx.grouped_mxfp8_columnwise_from_rowwise(gt, "e4m3", swizzle_rowwise=True)
    fb = mx.grouped_mxfp8_columnwise_from_rowwise(gt, "e4m3", swizzle_rowwise=True)
    _assert_parts(fa, fb, keys=("columnwise_data", "columnwise_scale", "rowwise_scale_swizzled"))


def test_runs_on_current_stream(cp, mx):
    x = cp.asarray(_cast(_random((256, 512), seed=10), "bfloat16"))
    kw = dict(rowwise=True, columnwise=True, block_2d=False, fp8_dtype="e4m3")
    ref = mx.quantize_mxfp8(x, **kw)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        got = mx.quantize_mxfp8(x, **kw)
        deq = mx.dequantize_mxfp8(got["rowwise_data"], got["rowwise_scale"])
    stream.synchronize()
    _assert_parts(got, ref)
    assert_bytes_equal(deq, mx.dequantize_mxfp8(ref["rowwise_data"], ref["rowwise_scale"]))


# ------------------------------------------------------------------------------ public API
def test_public_api_grouped_and_with_columnwise(cp):
    import lowprec_moe as lpm

    k, m = 128, sum(SPLITS)
    x = _cast(_random((m, k), seed=12), "bfloat16")
    g_gpu = lpm.GroupedTensor.quantize(cp.asarray(x), SPLITS, "mxfp8", columnwise=True)
    g_cpu = lpm.GroupedTensor.quantize(x, SPLITS, "mxfp8", columnwise=True)
    _assert_parts(vars(g_gpu), vars(g_cpu), what="GroupedTensor.quantize")
    data, scale = _wire(13, m, k, "e4m3", "random_bytes")
    w_gpu = lpm.GroupedTensor.from_mxfp8_rowwise(cp.asarray(data), cp.asarray(scale), SPLITS)
    w_cpu = lpm.GroupedTensor.from_mxfp8_rowwise(data, scale, SPLITS)
    a, b = w_gpu.with_columnwise(), w_cpu.with_columnwise()
    _assert_parts(vars(a), vars(b), what="with_columnwise")
    np.testing.assert_array_equal(a.columnwise_data_offsets, b.columnwise_data_offsets)
    for d in ("rowwise", "columnwise"):
        assert_bytes_equal(a.dequantize(d), b.dequantize(d), f"dequantize {d}")


# ------------------------------------------------------------------------------ 64-bit size
@pytest.mark.slow
def test_more_than_2_31_elements(cp, mx):
    """M * K > 2^31: quantize, dequantize and the fused path check the last rows."""
    if cp.cuda.runtime.memGetInfo()[0] < 24 * 2 ** 30:
        pytest.skip("needs 24 GB of free GPU memory")
    m, k = 65601, 32768                        # M*K = 2^31 + 1056768 elements; M % 32 == 1
    assert m * k > 2 ** 31
    bits = cp.empty((m, k), dtype=cp.uint16)   # bf16 bit patterns (truncated normals)
    step = 4096
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        rs = cp.random.RandomState(r0)
        v = rs.standard_normal((r1 - r0, k), dtype=cp.float32)
        bits[r0:r1] = (v.view(cp.uint32) >> 16).astype(cp.uint16)
        del v
    x = bits.view(ml_dtypes.bfloat16)
    del bits
    kw = dict(rowwise=True, columnwise=True, block_2d=False, fp8_dtype="e4m3")
    q = mx.quantize_mxfp8(x, **kw)
    tail = 65 + 32                              # rows [m - 97, m): tiles 2047.. 2050
    r0 = m - tail                               # = 65504 = 2047 * 32: a tile boundary
    xh = x[r0:].get()
    ref = RM.quantize_mxfp8(xh, **kw)
    assert_bytes_equal(q["rowwise_data"][r0:], ref["rowwise_data"], "rowwise data")
    assert_bytes_equal(q["rowwise_scale"][r0:], ref["rowwise_scale"], "rowwise scale")
    assert_bytes_equal(q["columnwise_data"][r0:], ref["columnwise_data"], "columnwise data")
    assert_bytes_equal(q["columnwise_scale"][r0 // 32:], ref["columnwise_scale"], "col scale")
    del x
    deq = mx.dequantize_mxfp8(q["rowwise_data"], q["rowwise_scale"])
    assert_bytes_equal(deq[r0:], RM.dequantize_mxfp8(ref["rowwise_data"], ref["rowwise_scale"]),
                       "dequantize")
    del deq
    splits = [r0, tail]
    gt = _GT(dict(rowwise_data=q["rowwise_data"], rowwise_scale=q["rowwise_scale"]), splits, k,
             "e4m3")
    fused = mx.grouped_mxfp8_columnwise_from_rowwise(gt, "e4m3")
    ref_f = _unfused_reference(ref["rowwise_data"], ref["rowwise_scale"], [tail], "e4m3", "e4m3")
    d0 = int(fused["columnwise_data_offsets"][1])
    s0 = int(fused["columnwise_scale_offsets"][1])
    assert d0 == r0 * k
    assert_bytes_equal(fused["columnwise_data"][d0:], ref_f["columnwise_data"], "fused data")
    assert_bytes_equal(fused["columnwise_scale"][s0:], ref_f["columnwise_scale"], "fused scale")
