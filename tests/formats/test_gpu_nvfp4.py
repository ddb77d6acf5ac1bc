"""GPU NVFP4 kernels (``raw_kernels/nvfp4*.cu``, ``lowprec_moe/backends/cupy/nvfp4.py``) vs the NumPy
reference, byte for byte.

Every test needs CuPy and a CUDA GPU (marked ``gpu``, skipped cleanly otherwise). The launchers
are called directly, so these tests do not depend on the dispatch layer; the last section also
goes through the public API. Tests taking the ``cvt_module`` fixture run twice: with the
production kernels (hardware fp32 -> E4M3 conversion of the block scales) and with the
integer-conversion build ``nvfp4_intcvt``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe.tensors.grouped_tensor import GroupedTensor, _grouped_quantize_reference
from lowprec_moe.backends.numpy import nvfp4 as RN

from conftest import (assert_bytes_equal, cast_host, host_dtype, requires_gpu, spread_random,
                      to_host)

pytestmark = [pytest.mark.gpu, requires_gpu]

f32 = np.float32
DTYPES = ("float32", "float16", "bfloat16")
SPLITS = [0, 37, 128, 5, 90, 0, 48]
MODES = [(True, False), (False, True), (True, True)]  # (rowwise, columnwise)
QKEYS = ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale",
         "amax_rowwise", "amax_columnwise")
GKEYS = QKEYS + ("columnwise_data_offsets", "columnwise_scale_offsets")
# option sets (row_scaled, block_2d, rht, stochastic_rounding); rht needs bf16, block_2d M % 16 == 0
OPTIONS = {
    "tensor": dict(),
    "row_scaled": dict(row_scaled=True),
    "2d": dict(block_2d=True),
    "rht": dict(rht=True),
    "sr": dict(stochastic_rounding=True, seed=1234),
    "2d_sr": dict(block_2d=True, stochastic_rounding=True, seed=2**64 - 1),
    "rht_sr": dict(rht=True, stochastic_rounding=True, seed=99),
    "2d_rht": dict(block_2d=True, rht=True),
}


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def nv():
    from lowprec_moe.backends.cupy import nvfp4

    return nvfp4


@pytest.fixture(params=["nvfp4", "nvfp4_intcvt"])
def cvt_module(request, nv, monkeypatch):
    """Run the test with the hardware E4M3 conversion and with the integer one."""
    monkeypatch.setattr(nv, "MODULE", request.param)
    return request.param


_np_dtype = host_dtype
_cast = cast_host


def _random(shape, seed, spread=20):
    return spread_random(shape, seed, spread)


def _kw(rowwise=True, columnwise=True, **opts):
    kw = dict(rowwise=rowwise, columnwise=columnwise, row_scaled=False, block_2d=False, rht=False,
              stochastic_rounding=False, seed=0)
    kw.update(opts)
    return kw


def _assert_f32_equal(got, ref, what=""):
    """float32 arrays equal bit for bit, except that NaN may have any payload on either side
    (x86 and the GPU write different NaN bit patterns, e.g. for 0 * inf)."""
    a, b = np.asarray(to_host(got)), np.asarray(to_host(ref))
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    na, nb = np.isnan(a), np.isnan(b)
    assert np.array_equal(na, nb), f"{what}: NaN positions differ"
    assert_bytes_equal(np.where(na, f32(0), a), np.where(nb, f32(0), b), what)


def _assert_parts(got: dict, ref: dict, keys=QKEYS, what=""):
    for key in keys:
        assert_bytes_equal(got.get(key), ref.get(key), f"{what} {key}")


def _check(cp, nv, xh, what="", member=0, **kw):
    """GPU quantize of host array xh (uploaded) == reference, every field byte for byte."""
    ref = RN.quantize_nvfp4(xh, member=member, **kw)
    got = nv.quantize_nvfp4(cp.asarray(xh), member=member, **kw)
    _assert_parts(got, ref, what=what)
    return got, ref


# ------------------------------------------------------------------------------ quantize
@pytest.mark.parametrize("shape", [(1, 16), (15, 32), (17, 48), (64, 128), (100, 160),
                                   (129, 272), (300, 1040)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES, ids=["row", "col", "both"])
def test_quantize_random(cp, nv, shape, dtype, mode):
    x = _cast(_random(shape, seed=shape[0] * 7 + shape[1]), dtype)
    _check(cp, nv, x, f"{shape} {dtype}", **_kw(*mode))


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES, ids=["row", "col", "both"])
@pytest.mark.parametrize("shape", [(48, 96), (37, 160), (130, 256)])
def test_quantize_options(cp, nv, option, dtype, mode, shape):
    opts = OPTIONS[option]
    if opts.get("rht") and dtype != "bfloat16":
        pytest.skip("rht is defined for bfloat16 input")
    if opts.get("block_2d") and shape[0] % 16:
        pytest.skip("block_2d needs M % 16 == 0")
    x = _cast(_random(shape, seed=sum(shape) + len(option)), dtype)
    _check(cp, nv, x, f"{option} {dtype} {shape}", **_kw(*mode, **opts))


def test_sr_member_index_and_seeds(cp, nv):
    x = _cast(_random((40, 64), seed=3), "bfloat16")
    for member in (0, 3, 2**31 - 1, 2**32 - 1):
        for seed in (0, 1, 2**32 + 5, 2**64 - 1):
            _check(cp, nv, x, f"member={member} seed={seed}", member=member,
                   **_kw(stochastic_rounding=True, seed=seed))


def _special_tensors(dtype):
    """Host float32 tensors [32, 64] exercising ties, subnormals, inf / NaN, huge / tiny amax."""
    out = {}
    # exact E2M1 ties: amax 2688 gives S_enc = 1; blocks of amax 6 get scale 1.0 and enc = 1
    t = np.zeros((32, 64), f32)
    t[0, 0] = 2688.0
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25, -1.75,
                     -2.5, -3.5, -5.0, -0.0], f32)
    for r in range(1, 32):
        t[r, 16:32] = np.roll(ties, r)
        t[r, 32:48] = np.roll(ties, r) * 0.5       # scale 0.5: same ties one step down
        t[r, 48:64] = np.roll(ties, r) * 2.0 ** -5
    t[1::3, 0:16] = -0.0
    out["ties"] = t
    # specials: inf, NaN, zero rows / blocks, -0.0 blocks, subnormals
    s = _random((32, 64), seed=11, spread=8)
    s[3] = 0.0
    s[5, 16:32] = -0.0
    s[7, 0] = np.inf
    s[8, 5] = -np.inf
    s[9, 9] = np.nan
    s[10, 16:32] = np.nan
    s[11:27, 33] = np.nan                          # a NaN column (columnwise NaN blocks)
    s[12, 40] = np.inf
    s[12, 41] = -np.inf
    sub = {"float32": 1e-42, "float16": 3e-8, "bfloat16": 1e-40}[dtype]
    s[13, :16] = sub * np.arange(1, 17)
    s[14:30, 50] = -sub
    out["specials"] = s
    # tiny amax: all subnormal (f32 / bf16) or fp16-subnormal magnitudes
    tiny = {"float32": 1e-41, "float16": 6e-8, "bfloat16": 1e-39}[dtype]
    out["tiny"] = (_random((32, 64), seed=12, spread=3) * tiny).astype(f32)
    # huge amax
    huge = {"float32": 3.3e38, "float16": 65000.0, "bfloat16": 3.3e38}[dtype]
    h = np.clip(_random((32, 64), seed=13, spread=2), -8, 8) * (huge / 8)
    h[0, 0] = huge
    out["huge"] = h.astype(f32)
    out["zeros"] = np.zeros((32, 64), f32)
    inf1 = _random((32, 64), seed=14)
    inf1[17, 17] = np.inf                          # amax = inf: S_enc = 1
    out["inf_amax"] = inf1
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option", ["tensor", "row_scaled", "2d", "sr", "rht"])
def test_quantize_special_values(cp, nv, cvt_module, dtype, option):
    opts = OPTIONS[option]
    if opts.get("rht") and dtype != "bfloat16":
        pytest.skip("rht is defined for bfloat16 input")
    for name, x32 in _special_tensors(dtype).items():
        x = _cast(x32, dtype)
        _check(cp, nv, x, f"{name} {dtype} {option}", **_kw(**opts))
        _check(cp, nv, x[:29], f"{name} {dtype} {option} M=29", **_kw(**dict(opts, block_2d=False)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("option", ["tensor", "row_scaled", "sr"])
def test_quantize_every_16bit_pattern(cp, nv, cvt_module, dtype, option):
    """All 65536 bit patterns of the input format, as rows of blocks and as columns."""
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(_np_dtype(dtype))
    finite = np.where(np.isfinite(x.astype(f32)), x, _np_dtype(dtype)(0))
    for name, arr in (("all", x), ("finite", finite)):
        for shape in ((4096, 16), (512, 128), (128, 512)):
            _check(cp, nv, np.ascontiguousarray(arr.reshape(shape)), f"{name} {shape} {option}",
                   **_kw(**OPTIONS[option]))


def test_quantize_random_fp32_bit_patterns(cp, nv, cvt_module):
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, size=(256, 256), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    finite = np.where(np.isfinite(x), x, f32(0))
    for arr in (x, finite):
        for option in ("tensor", "row_scaled", "2d", "sr"):
            _check(cp, nv, np.ascontiguousarray(arr), option, **_kw(**OPTIONS[option]))


def test_quantize_rht_wide_exponent_spread(cp, nv):
    """RHT chunks whose float64 sum is not exact (ordered-sum fallback) and with inf / NaN."""
    x = _random((64, 64), seed=21, spread=60)
    x[0:16, 0] = np.exp2(np.arange(16) * 8.0 - 64).astype(f32)   # spread of 120 binades
    x[16, 1], x[17, 1] = np.inf, -np.inf
    x[20, 2] = np.nan
    x[33, 3] = np.inf
    xb = _cast(x, "bfloat16")
    for opts in (dict(rht=True), dict(rht=True, block_2d=True),
                 dict(rht=True, stochastic_rounding=True, seed=5)):
        _check(cp, nv, xb, str(opts), **_kw(**opts))
        _check(cp, nv, xb[:50], f"{opts} M=50", **_kw(**dict(opts, block_2d=False)))


def test_quantize_rejects_bad_input(cp, nv):
    with pytest.raises(ValueError, match="K=40"):
        nv.quantize_nvfp4(cp.zeros((4, 40), cp.float32))
    with pytest.raises(TypeError, match="float64"):
        nv.quantize_nvfp4(cp.zeros((4, 32), cp.float64))
    with pytest.raises(TypeError, match="cupy"):
        nv.quantize_nvfp4(np.zeros((4, 32), np.float32))
    with pytest.raises(TypeError, match="cupy"):
        nv.dequantize_nvfp4(np.zeros((4, 8), np.uint8), cp.zeros((4, 1), cp.uint8),
                            cp.ones(1, cp.float32))


def test_quantize_noncontiguous_and_misaligned_input(cp, nv):
    x = _random((40, 128), seed=5)
    big = cp.asarray(np.concatenate([np.zeros(1, np.float32), x.ravel()]))
    misaligned = big[1:].reshape(40, 128)           # data pointer 4 bytes past an allocation
    strided = cp.asarray(np.ascontiguousarray(x.T)).T  # Fortran order
    kw = _kw()
    ref = RN.quantize_nvfp4(x, **kw)
    for xd in (misaligned, strided):
        _assert_parts(nv.quantize_nvfp4(xd, **kw), ref)


def test_empty_shapes(cp, nv):
    for shape in ((0, 32), (5, 0), (0, 0)):
        x = np.zeros(shape, f32)
        for option in ("tensor", "row_scaled", "sr"):
            _check(cp, nv, x, f"{shape} {option}", **_kw(**OPTIONS[option]))


# -------------------------------------------------------------------------- grouped helpers
def _grouped_ref(x, splits, **kw):
    return _grouped_quantize_reference(x, splits, "nvfp4", fp8_dtype="e4m3", **kw)


def _check_grouped(cp, nv, x, splits, what="", **kw):
    ref = _grouped_ref(x, splits, **kw)
    got = nv.grouped_quantize_nvfp4(cp.asarray(x), splits, **kw)
    assert set(got) == set(ref), f"{what}: keys {sorted(got)} != {sorted(ref)}"
    _assert_parts(got, ref, keys=GKEYS, what=what)
    for key in ("columnwise_data_offsets", "columnwise_scale_offsets"):
        if key in got:
            assert isinstance(got[key], np.ndarray) and got[key].dtype == np.int64
    return got, ref


# ------------------------------------------------------------------------------ dequantize
def test_dequantize_all_bytes_and_scales(cp, nv):
    """Every data byte with every scale byte (0x7F / 0xFF NaN included), rowwise and columnwise."""
    rows = 256
    data = np.tile(np.arange(256, dtype=np.uint8), (rows, 1))          # [256, 256]: K = 512
    scale = np.tile(np.arange(256, dtype=np.uint8)[:, None], (1, 32))  # row r: scale byte r
    for amax in (np.array([1.0], f32), np.array([3.3e38], f32), np.array([1e-40], f32),
                 np.linspace(0, 1000, rows).astype(f32)):
        ref = RN.dequantize_nvfp4(data, scale, amax)
        got = nv.dequantize_nvfp4(cp.asarray(data), cp.asarray(scale), cp.asarray(amax))
        _assert_f32_equal(got, ref, f"rowwise amax={amax[:2]}")
        for m in (None, rows * 2 - 3, rows * 2 - 16, 100, 0):
            ref = RN.dequantize_nvfp4(data, scale, amax, columnwise=True, m=m)
            got = nv.dequantize_nvfp4(cp.asarray(data), cp.asarray(scale), cp.asarray(amax),
                                      columnwise=True, m=m)
            _assert_f32_equal(got, ref, f"columnwise m={m} amax={amax[:2]}")


@pytest.mark.parametrize("option", ["tensor", "row_scaled", "2d", "sr", "rht"])
@pytest.mark.parametrize("shape", [(37, 96), (128, 256), (200, 1040)])
def test_dequantize_round_trip(cp, nv, option, shape):
    opts = OPTIONS[option]
    if opts.get("block_2d") and shape[0] % 16:
        pytest.skip("block_2d needs M % 16 == 0")
    x = _cast(_random(shape, seed=shape[0]), "bfloat16")
    got, ref = _check(cp, nv, x, option, **_kw(**opts))
    m = shape[0]
    r_ref = RN.dequantize_nvfp4(ref["rowwise_data"], ref["rowwise_scale"], ref["amax_rowwise"])
    r_got = nv.dequantize_nvfp4(got["rowwise_data"], got["rowwise_scale"], got["amax_rowwise"])
    assert_bytes_equal(r_got, r_ref, "rowwise")
    c_ref = RN.dequantize_nvfp4(ref["columnwise_data"], ref["columnwise_scale"],
                                ref["amax_columnwise"], columnwise=True, m=m,
                                rht=opts.get("rht", False))
    c_got = nv.dequantize_nvfp4(got["columnwise_data"], got["columnwise_scale"],
                                got["amax_columnwise"], columnwise=True, m=m,
                                rht=opts.get("rht", False))
    if opts.get("rht"):
        np.testing.assert_allclose(to_host(c_got), c_ref, rtol=1e-6, atol=1e-30)
    else:
        assert_bytes_equal(c_got, c_ref, "columnwise")


def _gt_from(parts, splits, k, **opts):
    """GroupedTensor over given fields (GPU or host arrays)."""
    return GroupedTensor(format="nvfp4", shape=(sum(splits), k), splits=tuple(splits),
                         offsets=np.concatenate([[0], np.cumsum(splits)]).astype(np.int64),
                         row_scaled=opts.get("row_scaled", False),
                         block_2d=opts.get("block_2d", False), rht=opts.get("rht", False),
                         stochastic_rounding=opts.get("stochastic_rounding", False),
                         seed=opts.get("seed", 0), **parts)


@pytest.mark.parametrize("option", ["tensor", "row_scaled", "sr", "rht"])
@pytest.mark.parametrize("splits", [SPLITS, [0, 0, 160], [1, 0, 1], [300]])
def test_grouped_dequantize(cp, nv, option, splits):
    opts = OPTIONS[option]
    k = 96
    x = _cast(_random((sum(splits), k), seed=len(splits) + 1), "bfloat16")
    got, ref = _check_grouped(cp, nv, x, splits, option, **_kw(**opts))
    g_gpu = _gt_from(got, splits, k, **opts)
    g_cpu = _gt_from(ref, splits, k, **opts)
    for direction in ("rowwise", "columnwise"):
        a = nv.grouped_dequantize_nvfp4(g_gpu, direction)
        b = g_cpu.dequantize(direction)
        assert a.shape == (sum(splits), k)
        if direction == "columnwise" and opts.get("rht"):
            np.testing.assert_allclose(to_host(a), b, rtol=1e-6, atol=1e-30)
        else:
            assert_bytes_equal(a, b, f"{option} {splits} {direction}")


def test_grouped_dequantize_random_bytes(cp, nv):
    """Arbitrary stored bytes (not produced by a quantizer), per-tensor and row-scaled amax."""
    rng = np.random.default_rng(17)
    k, splits = 64, [0, 37, 128, 5]
    m = sum(splits)
    mp = [-(-s // 16) * 16 for s in splits]
    parts = dict(
        rowwise_data=rng.integers(0, 256, (m, k // 2), dtype=np.uint8),
        rowwise_scale=rng.integers(0, 0x7F, (m, k // 16), dtype=np.uint8),
        columnwise_data=rng.integers(0, 256, k * sum(mp) // 2, dtype=np.uint8),
        columnwise_scale=rng.integers(0, 0x7F, k * sum(mp) // 16, dtype=np.uint8),
        columnwise_data_offsets=np.concatenate([[0], np.cumsum(mp)]).astype(np.int64) * k // 2,
        columnwise_scale_offsets=np.concatenate([[0], np.cumsum(mp)]).astype(np.int64) * k // 16)
    for row_scaled in (False, True):
        p = dict(parts)
        if row_scaled:
            p["amax_rowwise"] = rng.uniform(0, 100, m).astype(f32)
            p["amax_columnwise"] = rng.uniform(0, 100, (len(splits), k)).astype(f32)
        else:
            p["amax_rowwise"] = rng.uniform(0, 100, len(splits)).astype(f32)
            p["amax_columnwise"] = rng.uniform(0, 100, len(splits)).astype(f32)
        g_cpu = _gt_from(p, splits, k, row_scaled=row_scaled)
        g_gpu = _gt_from({kk: (cp.asarray(v) if not kk.endswith("offsets") else v)
                          for kk, v in p.items()}, splits, k, row_scaled=row_scaled)
        for direction in ("rowwise", "columnwise"):
            assert_bytes_equal(nv.grouped_dequantize_nvfp4(g_gpu, direction),
                               g_cpu.dequantize(direction), f"rs={row_scaled} {direction}")


# ----------------------------------------------------------------------------- determinism
def test_run_to_run_determinism(cp, nv):
    x = cp.asarray(_cast(_random((1000, 2048), seed=9), "bfloat16"))
    for option in ("tensor", "row_scaled", "sr", "rht"):
        kw = _kw(**OPTIONS[option])
        a = nv.quantize_nvfp4(x, **kw)
        b = nv.quantize_nvfp4(x, **kw)
        _assert_parts(a, b, what=f"single {option}")
        splits = [100, 0, 333, 67, 500]
        ga = nv.grouped_quantize_nvfp4(x, splits, **kw)
        gb = nv.grouped_quantize_nvfp4(x, splits, **kw)
        _assert_parts(ga, gb, keys=GKEYS, what=f"grouped {option}")


def test_runs_on_current_stream(cp, nv):
    x = cp.asarray(_cast(_random((256, 512), seed=10), "bfloat16"))
    kw = _kw(stochastic_rounding=True, seed=3)
    ref = nv.quantize_nvfp4(x, **kw)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        got = nv.quantize_nvfp4(x, **kw)
        deq = nv.dequantize_nvfp4(got["rowwise_data"], got["rowwise_scale"], got["amax_rowwise"])
    stream.synchronize()
    _assert_parts(got, ref)
    assert_bytes_equal(deq, nv.dequantize_nvfp4(ref["rowwise_data"], ref["rowwise_scale"],
                                                ref["amax_rowwise"]))


# ------------------------------------------------------------------------------ public API
@pytest.mark.parametrize("option", ["tensor", "row_scaled", "2d", "rht", "sr"])
def test_public_api_quantize_dequantize(cp, option):
    pytest.importorskip("lowprec_moe.backends.cupy.nvfp4")
    import lowprec_moe as lpm

    from conftest import assert_quantized_equal

    opts = OPTIONS[option]
    x = _cast(_random((96, 160), seed=31), "bfloat16")
    q_gpu = lpm.quantize(cp.asarray(x), "nvfp4", columnwise=True, **opts)
    q_cpu = lpm.quantize(x, "nvfp4", columnwise=True, **opts)
    assert_quantized_equal(q_gpu, q_cpu, f"quantize {option}")
    for d in ("rowwise", "columnwise"):
        a, b = lpm.dequantize(q_gpu, d), lpm.dequantize(q_cpu, d)
        if d == "columnwise" and opts.get("rht"):
            np.testing.assert_allclose(to_host(a), b, rtol=1e-6, atol=1e-30)
        else:
            assert_bytes_equal(a, b, f"dequantize {option} {d}")
    x3 = _cast(_random((4, 6, 64), seed=32), "float16")   # rank 3 -> [24, 64]
    assert_quantized_equal(lpm.quantize(cp.asarray(x3), "nvfp4"), lpm.quantize(x3, "nvfp4"),
                           "rank 3")


@pytest.mark.parametrize("option", ["tensor", "row_scaled", "sr", "rht"])
def test_public_api_grouped(cp, option):
    pytest.importorskip("lowprec_moe.backends.cupy.grouped")
    import lowprec_moe as lpm

    from conftest import assert_quantized_equal

    opts = OPTIONS[option]
    k, m = 128, sum(SPLITS)
    x = _cast(_random((m, k), seed=12), "bfloat16")
    g_gpu = lpm.GroupedTensor.quantize(cp.asarray(x), SPLITS, "nvfp4", columnwise=True, **opts)
    g_cpu = lpm.GroupedTensor.quantize(x, SPLITS, "nvfp4", columnwise=True, **opts)
    assert_quantized_equal(g_gpu, g_cpu, f"GroupedTensor.quantize {option}")
    np.testing.assert_array_equal(g_gpu.columnwise_data_offsets, g_cpu.columnwise_data_offsets)
    for i in range(len(SPLITS)):
        assert_quantized_equal(g_gpu.member(i), g_cpu.member(i), f"member {i}")
    for d in ("rowwise", "columnwise"):
        a, b = g_gpu.dequantize(d), g_cpu.dequantize(d)
        if d == "columnwise" and opts.get("rht"):
            np.testing.assert_allclose(to_host(a), b, rtol=1e-6, atol=1e-30)
        else:
            assert_bytes_equal(a, b, f"grouped dequantize {option} {d}")


# ------------------------------------------------------------------------------ 64-bit size
@pytest.mark.slow
def test_more_than_2_31_elements(cp, nv):
    """M * K > 2^31 (bf16 [131072, 16400]): single and grouped quantize, rowwise dequantize."""
    if cp.cuda.runtime.memGetInfo()[0] < 24 * 2**30:
        pytest.skip("needs 24 GB of free GPU memory")
    m, k = 131072, 16400
    assert m * k > 2**31
    bits = cp.empty((m, k), dtype=cp.uint16)   # bf16 bit patterns (truncated normals)
    step = 4096
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        rs = cp.random.RandomState(r0)
        v = rs.standard_normal((r1 - r0, k), dtype=cp.float32)
        bits[r0:r1] = (v.view(cp.uint32) >> 16).astype(cp.uint16)
        del v
    bits[m - 1, k - 1] = 0x4480                 # 1024.0: the global amax lies in the tail
    x = bits.view(ml_dtypes.bfloat16)
    del bits
    tail = 100                                  # rows [m - 100, m): M % 16 != 0 for the tail
    r0 = m - tail
    xh = x[r0:].get()
    kw = _kw()
    q = nv.quantize_nvfp4(x, **kw)
    ref = RN.quantize_nvfp4(xh, **kw)
    assert float(q["amax_rowwise"][0]) == 1024.0
    assert_bytes_equal(q["amax_rowwise"], ref["amax_rowwise"], "amax")
    assert_bytes_equal(q["rowwise_data"][r0:], ref["rowwise_data"], "rowwise data")
    assert_bytes_equal(q["rowwise_scale"][r0:], ref["rowwise_scale"], "rowwise scale")
    # columnwise: the tail's 100 rows start at column r0 / 2 of [K, M/2] (r0 % 16 == 12: compare
    # the whole 16-row blocks from r0 - 12 on with the reference of those rows)
    b0 = r0 - r0 % 16
    ref_b = RN.quantize_nvfp4(x[b0:].get(), **kw)
    assert_bytes_equal(q["columnwise_data"][:, b0 // 2:], ref_b["columnwise_data"], "col data")
    assert_bytes_equal(q["columnwise_scale"][:, b0 // 16:], ref_b["columnwise_scale"], "col scale")
    deq = nv.dequantize_nvfp4(q["rowwise_data"], q["rowwise_scale"], q["amax_rowwise"])
    assert_bytes_equal(deq[r0:], RN.dequantize_nvfp4(ref["rowwise_data"], ref["rowwise_scale"],
                                                     ref["amax_rowwise"]), "dequantize")
    del deq, q
    # grouped: member 1 = the tail, starting past element 2^31
    g = nv.grouped_quantize_nvfp4(x, [r0, tail], **kw)
    ref_g = RN.quantize_nvfp4(xh, member=1, **kw)
    assert_bytes_equal(g["rowwise_data"][r0:], ref_g["rowwise_data"], "grouped rowwise")
    d0 = int(g["columnwise_data_offsets"][1])
    s0 = int(g["columnwise_scale_offsets"][1])
    assert d0 == -(-r0 // 16) * 16 * k // 2   # member 0 padded to a multiple of 16 rows
    assert_bytes_equal(g["columnwise_data"][d0:], ref_g["columnwise_data"].reshape(-1), "g col")
    assert_bytes_equal(g["columnwise_scale"][s0:], ref_g["columnwise_scale"].reshape(-1), "g cs")
    assert_bytes_equal(g["amax_rowwise"][1:], ref_g["amax_rowwise"], "grouped amax")
