"""lowprec_moe.kernels on the GPU: the real sources compile through NVRTC, modules are memoized,
errors name the module / kernel / source, and the non-flushing fp32 helpers, the decoders and
Philox of lpm_formats.cuh agree with NumPy. Skipped without CuPy and a CUDA device.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from lowprec_moe import kernels

from conftest import requires_gpu, set_kernel_dir
# _fresh_caches: the loader tests' autouse fixture (clean module caches around every test)
from test_kernels_loader import RAW, _fresh_caches, _write  # noqa: F401



def _f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def _bits(x):
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


@pytest.mark.gpu
@requires_gpu
def test_smoke_module_compiles_and_is_memoized():
    m1 = kernels.get_module("smoke")
    m2 = kernels.get_module("smoke")
    assert m1 is m2
    f1 = kernels.get_function("smoke", "lpm_smoke_decode")
    assert kernels.get_function("smoke", "lpm_smoke_decode") is f1


@pytest.mark.gpu
@requires_gpu
def test_missing_module_and_kernel():
    with pytest.raises(FileNotFoundError, match="no_such_module"):
        kernels.get_module("no_such_module")
    with pytest.raises(ValueError, match="no_such_kernel"):
        kernels.get_function("smoke", "no_such_kernel")


@pytest.mark.gpu
@requires_gpu
def test_compile_error_is_runtime_error_with_log_and_source(monkeypatch, tmp_path):
    d = tmp_path / "k"
    d.mkdir()
    shutil.copy(kernels.source_path("lpm_formats.cuh"), d / "lpm_formats.cuh")
    _write(
        d / "broken.cu",
        """\
        #include "lpm_formats.cuh"
        extern "C" __global__ void broken(float* x) {
            x[0] = this_is_not_declared;
        }
        """,
    )
    set_kernel_dir(monkeypatch, str(d))
    with pytest.raises(RuntimeError) as info:
        kernels.get_module("broken")
    msg = str(info.value)
    assert "broken.cu" in msg
    assert "this_is_not_declared" in msg  # from the compiler log and the source
    assert "3 |     x[0] = this_is_not_declared;" in msg  # numbered source line
    assert "-DLPM_SOURCE_HASH=" in msg


@pytest.mark.gpu
@requires_gpu
def test_sm90a_features_compile_on_hopper(monkeypatch, tmp_path):
    import cupy

    cc = str(cupy.cuda.Device().compute_capability)
    if cc != "90":
        pytest.skip(f"compute capability {cc} is not 9.0")
    d = tmp_path / "k"
    d.mkdir()
    shutil.copy(kernels.source_path("lpm_formats.cuh"), d / "lpm_formats.cuh")
    _write(
        d / "wg.cu",
        """\
        #include "lpm_formats.cuh"
        extern "C" __global__ void wg(int* out) {
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            out[threadIdx.x] = 1;
        }
        """,
    )
    set_kernel_dir(monkeypatch, str(d))
    fn = kernels.get_function("wg", "wg")
    out = cupy.zeros(128, dtype=cupy.int32)
    fn((1,), (128,), (out,))
    assert int(out.sum()) == 128


def _special_floats():
    # normals, subnormals (both signs), zeros, infinities, NaN, extremes
    bits = [
        0x00000001, 0x80000001, 0x007FFFFF, 0x00400000, 0x00800000, 0x00000000, 0x80000000,
        0x7F800000, 0xFF800000, 0x7FC00000, 0x7F7FFFFF, 0x3F800000, 0xBF800000, 0x3E2AAAAB,
        0x00000003, 0x0000FFFF, 0x01000000, 0x7E000000,
    ]
    return _f32(bits)


@pytest.mark.gpu
@requires_gpu
def test_fp32_helpers_do_not_flush_subnormals():
    import cupy

    rng = np.random.default_rng(0)
    special = _special_floats()
    a = np.concatenate([np.repeat(special, special.size), rng.standard_normal(4096, np.float32),
                        (rng.standard_normal(4096) * 1e-39).astype(np.float32)])
    b = np.concatenate([np.tile(special, special.size), rng.standard_normal(4096, np.float32),
                        (rng.standard_normal(4096) * 1e-3).astype(np.float32)])
    n = a.size
    out = cupy.zeros(8 * n, dtype=cupy.float32)
    fn = kernels.get_function("smoke", "lpm_smoke_fp32_ops")
    fn(((n + 255) // 256,), (256,), (cupy.asarray(a), cupy.asarray(b), out, np.int64(n)))
    got = out.get().reshape(n, 8)
    with np.errstate(all="ignore"):
        expected = np.stack(
            [a * b, a + b, a - b, a / b, np.float32(1) / a, np.fmax(a, b), np.fmin(a, b),
             np.abs(a)], axis=1).astype(np.float32)
    names = ["mul", "add", "sub", "div", "rcp", "fmax", "fmin", "fabs"]
    for j, name in enumerate(names):
        g, e = got[:, j], expected[:, j]
        both_nan = np.isnan(g) & np.isnan(e)
        same = (_bits(g) == _bits(e)) | both_nan
        if name in ("fmax", "fmin"):
            # the sign of a zero result of max(+0, -0) is unspecified by IEEE 754 maxNum; PTX
            # orders -0 < +0, NumPy returns either operand. Values compare equal.
            same |= (g == 0) & (e == 0)
        bad = np.flatnonzero(~same)
        assert bad.size == 0, (
            f"{name}: {bad.size} mismatches, first a={a[bad[0]]!r} b={b[bad[0]]!r} "
            f"got={g[bad[0]]!r} expected={e[bad[0]]!r}")


@pytest.mark.gpu
@requires_gpu
def test_fmax_orders_signed_zeros():
    import cupy

    a = np.array([0.0, -0.0, -0.0, 0.0], np.float32)
    b = np.array([-0.0, 0.0, -0.0, 0.0], np.float32)
    out = cupy.zeros(8 * a.size, dtype=cupy.float32)
    kernels.get_function("smoke", "lpm_smoke_fp32_ops")(
        (1,), (32,), (cupy.asarray(a), cupy.asarray(b), out, np.int64(a.size)))
    got = out.get().reshape(a.size, 8)
    assert np.signbit(got[:, 5]).tolist() == [False, False, True, False]  # fmax
    assert np.signbit(got[:, 6]).tolist() == [True, True, True, False]  # fmin


@pytest.mark.gpu
@requires_gpu
def test_decoders_match_ml_dtypes():
    import cupy
    import ml_dtypes

    e2m1 = cupy.zeros(256, dtype=cupy.float32)
    e8m0 = cupy.zeros(256, dtype=cupy.float32)
    kernels.get_function("smoke", "lpm_smoke_decode")((1,), (256,), (e2m1, e8m0))
    codes = np.arange(256, dtype=np.uint8)
    exp_e2m1 = (codes & 15).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(_bits(e2m1.get()), _bits(exp_e2m1))  # includes -0 for code 8
    exp_e8m0 = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    g = e8m0.get()
    assert np.isnan(g[255]) and np.isnan(exp_e8m0[255])
    assert np.array_equal(_bits(g[:255]), _bits(exp_e8m0[:255]))
    assert _bits(g[:1])[0] == 0x00400000  # 2^-127, a subnormal


@pytest.mark.gpu
@requires_gpu
def test_philox_device_matches_known_answers_and_python():
    import cupy

    spec = importlib.util.spec_from_file_location("_lpm_test_formats",
                                                  Path(__file__).parents[1] / "formats" / "test_formats.py")
    tf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tf)
    PHILOX_KAT, philox4x32_10_py = tf.PHILOX_KAT, tf.philox4x32_10_py

    rng = np.random.default_rng(1)
    rows = [list(c) + list(k) for c, k, _ in PHILOX_KAT]
    rows += rng.integers(0, 2**32, size=(61, 6), dtype=np.uint64).tolist()
    ck = np.asarray(rows, dtype=np.uint32)
    n = ck.shape[0]
    out = cupy.zeros(4 * n, dtype=cupy.uint32)
    kernels.get_function("smoke", "lpm_smoke_philox")((1,), (128,), (cupy.asarray(ck), out,
                                                                     np.int64(n)))
    got = out.get().reshape(n, 4)
    for i, (c, k, expected) in enumerate(PHILOX_KAT):
        assert tuple(int(v) for v in got[i]) == expected
    for i in range(n):
        row = [int(v) for v in ck[i]]
        assert tuple(int(v) for v in got[i]) == philox4x32_10_py(row[:4], row[4:])


@pytest.mark.gpu
@requires_gpu
def test_hardware_bf16_conversions_round_to_nearest_even():
    """cvt.rn.bf16.f32 and cvt.rn.bf16x2.f32 (the GEMM epilogues' bf16 packing) give the bits of
    the integer round-to-nearest-even for every non-NaN fp32 pattern."""
    import cupy

    counts = cupy.zeros(2, dtype=cupy.uint64)
    first = cupy.full(2, 0xFFFFFFFF, dtype=cupy.uint32)
    fn = kernels.get_function("smoke", "lpm_smoke_bf16_conversions")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    fn((8 * sms,), (256,), (np.uint32(0), np.uint64(2**32), counts, first))
    c, f = counts.get(), first.get()
    assert int(c[0]) == 0, f"cvt.rn.bf16.f32: {int(c[0])} patterns differ, first 0x{int(f[0]):08X}"
    assert int(c[1]) == 0, f"cvt.rn.bf16x2.f32: {int(c[1])} patterns differ, first 0x{int(f[1]):08X}"
