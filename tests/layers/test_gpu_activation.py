"""GPU activation kernels (``raw_kernels/activation/activation.cu``): fused == unfused, GPU == NumPy.

* **Fused == unfused, bitwise**: the fused activation + MXFP8 quantize kernels (forward: z
  rowwise / columnwise; backward: dh rowwise / columnwise, E4M3 / E5M2) against the activation
  kernel writing the layer dtype followed by ``GroupedTensor.quantize`` -- every stored byte, and
  the dprobs / bias-gradient reductions, which both paths sum in the same order.
* **GPU == NumPy, bitwise** for every element of z and dh (the kernels perform the reference's fp32
  operations, including its exponential), on the vector path and on the element-wise path
  (misaligned pointers, F not a multiple of the vector width); the fused quantized outputs equal
  the NumPy quantization of the NumPy reference.

Skipped without CuPy and a GPU.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe import GroupedTensor
from lowprec_moe.layers.activations import activation_backward, activation_forward, make_activation
from lowprec_moe.backends.numpy import activations as R
from lowprec_moe.backends.numpy.reduce import grouped_colsum

from conftest import assert_bytes_equal, assert_quantized_equal, requires_gpu, to_host

pytestmark = [pytest.mark.gpu, requires_gpu]

BF16 = ml_dtypes.bfloat16
DTYPES = {"fp32": np.float32, "bf16": BF16, "fp16": np.float16}
SPLITS = (37, 0, 64, 3, 96, 1)  # M = 201: empty expert, 1-row expert, partial 32-row tiles
CASES = [("swiglu", None, 256), ("swiglu", 32, 96), ("clamped_swiglu", 64, 128),
         ("clamped_swiglu", None, 160), ("srelu", None, 64)]
DIRS = {"row+col": (True, True), "row": (True, False), "col": (False, True)}


def _ids(c):
    return f"{c[0]}-il{c[1]}-F{c[2]}"


def make(act, f, dtype, m, seed=0):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((m, act.input_features(f))) * 4 * 10.0 ** rng.uniform(-1, 0.5, (m, 1))
    dz = rng.standard_normal((m, f)) * 10.0 ** rng.uniform(-1, 1, (m, 1))
    p = rng.uniform(0.05, 1.0, m).astype(np.float32)
    return (h.astype(np.float32).astype(dtype), dz.astype(np.float32).astype(dtype), p)


# ============================================================================================
# fused == unfused


@pytest.mark.parametrize("dirs", list(DIRS))
@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
@pytest.mark.parametrize("dname", list(DTYPES))
def test_fused_equals_unfused(cp, dname, case, fp8, dirs):
    name, il, f = case
    act = make_activation(name, glu_interleave=il)
    m = sum(SPLITS)
    h, dz, p = (cp.asarray(a) for a in make(act, f, DTYPES[dname], m))
    rowwise, columnwise = DIRS[dirs]
    q = dict(format="mxfp8", rowwise=rowwise, columnwise=columnwise, fp8_dtype=fp8)
    for probs in (p, None):
        z1 = activation_forward(h, act, probs, splits=SPLITS, quantize=q, fused=True)
        z0 = activation_forward(h, act, probs, splits=SPLITS, quantize=q, fused=False)
        assert_quantized_equal(z1, z0, "z")
        g1 = activation_backward(dz, h, act, probs, splits=SPLITS, quantize=q, want_dbias=True,
                                 fused=True)
        g0 = activation_backward(dz, h, act, probs, splits=SPLITS, quantize=q, want_dbias=True,
                                 fused=False)
        assert g1.dh is None
        assert_quantized_equal(g1.dh_quantized, g0.dh_quantized, "dh")
        assert_bytes_equal(g1.dbias, g0.dbias, "dbias")
        assert_bytes_equal(g1.dprobs, g0.dprobs, "dprobs")
        # the fused kernel can also write dh (the same bits as the plain kernel)
        g2 = activation_backward(dz, h, act, probs, splits=SPLITS, quantize=q, want_dh=True,
                                 fused=True)
        plain = activation_backward(dz, h, act, probs, splits=SPLITS)
        assert_bytes_equal(g2.dh, plain.dh, "dh (fused kernel, want_dh)")
        assert_quantized_equal(g2.dh_quantized, g0.dh_quantized, "dh (want_dh)")


# ============================================================================================
# GPU == NumPy


@pytest.mark.parametrize("case", CASES + [("swiglu", None, 36), ("swiglu", 4, 36),
                                          ("srelu", None, 20)], ids=_ids)
@pytest.mark.parametrize("dname", list(DTYPES))
def test_matches_numpy(cp, dname, case):
    name, il, f = case
    act = make_activation(name, glu_interleave=il)
    splits = (1000, 0, 517, 31, 2000)
    m = sum(splits)
    h, dz, p = make(act, f, DTYPES[dname], m, seed=1)
    hx, dzx, px = cp.asarray(h), cp.asarray(dz), cp.asarray(p)
    assert_bytes_equal(activation_forward(hx, act, px, splits=splits), R.forward(h, act, p), "z")
    g = activation_backward(dzx, hx, act, px, splits=splits, want_dbias=True)
    dh_ref, dp_ref = R.backward(dz, h, act, p)
    assert_bytes_equal(g.dh, dh_ref, "dh")
    a = np.abs(R.forward(h, act).astype(np.float64))
    bound = (a * np.abs(dz.astype(np.float64))).sum(axis=1)
    assert np.all(np.abs(to_host(g.dprobs) - dp_ref) <= 2e-6 * bound + 1e-37), "dprobs"
    bound = grouped_colsum(np.abs(dh_ref.astype(np.float32)), splits).astype(np.float64)
    err = np.abs(to_host(g.dbias).astype(np.float64) - grouped_colsum(dh_ref, splits))
    assert np.all(err <= 1e-5 * bound + 1e-37), "dbias"


@pytest.mark.parametrize("dname", list(DTYPES))
def test_misaligned_pointers_take_the_elementwise_path(cp, dname):
    act = make_activation("clamped_swiglu", glu_interleave=32)
    f, m = 128, 150
    h, dz, p = make(act, f, DTYPES[dname], m, seed=2)
    hx = cp.asarray(h)
    buf = cp.empty(h.size + 1, dtype=hx.dtype)
    buf[1:] = hx.reshape(-1)
    h_off = buf[1:].reshape(h.shape)  # contiguous, data pointer not 16-byte aligned
    assert h_off.data.ptr % 16 and h_off.flags.c_contiguous
    splits = (50, 100)
    z_ref = R.forward(h, act, p)
    assert_bytes_equal(activation_forward(h_off, act, cp.asarray(p), splits=splits), z_ref, "z")
    q = dict(format="mxfp8", rowwise=True, columnwise=True)
    zq = activation_forward(h_off, act, cp.asarray(p), splits=splits, quantize=q)
    assert_quantized_equal(zq, GroupedTensor.quantize(z_ref, splits, "mxfp8", columnwise=True),
                           "zq")
    g = activation_backward(cp.asarray(dz), h_off, act, cp.asarray(p), splits=splits)
    assert_bytes_equal(g.dh, R.backward(dz, h, act, p)[0], "dh")


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", [("swiglu", 32, 128), ("clamped_swiglu", None, 96),
                                  ("srelu", None, 64), ("swiglu", 16, 64)], ids=_ids)
def test_fused_matches_numpy_quantization(cp, case, fp8):
    """GPU fused output == NumPy quantization of the NumPy reference (il=16: unfused fallback)."""
    name, il, f = case
    act = make_activation(name, glu_interleave=il)
    m = sum(SPLITS)
    h, dz, p = make(act, f, BF16, m, seed=3)
    q = dict(format="mxfp8", rowwise=True, columnwise=True, fp8_dtype=fp8)
    opts = dict(columnwise=True, fp8_dtype=fp8)
    zq = activation_forward(cp.asarray(h), act, cp.asarray(p), splits=SPLITS, quantize=q)
    assert_quantized_equal(zq, GroupedTensor.quantize(R.forward(h, act, p), SPLITS, "mxfp8",
                                                      **opts), "z")
    g = activation_backward(cp.asarray(dz), cp.asarray(h), act, cp.asarray(p), splits=SPLITS,
                            quantize=q)
    dh_ref, _ = R.backward(dz, h, act, p)
    assert_quantized_equal(g.dh_quantized, GroupedTensor.quantize(dh_ref, SPLITS, "mxfp8",
                                                                  **opts), "dh")


def test_nvfp4_output_equals_quantize_of_reference(cp):
    act = make_activation("swiglu", glu_interleave=32)
    f, m = 128, sum(SPLITS)
    h, dz, p = make(act, f, BF16, m, seed=4)
    q = dict(format="nvfp4", rowwise=True, columnwise=True, rht=True)
    zq = activation_forward(cp.asarray(h), act, cp.asarray(p), splits=SPLITS, quantize=q)
    expect = GroupedTensor.quantize(R.forward(h, act, p), SPLITS, "nvfp4", columnwise=True,
                                    rht=True)
    assert_quantized_equal(zq, expect, "z")
    q = dict(format="nvfp4", rowwise=True, columnwise=True, stochastic_rounding=True, seed=3)
    g = activation_backward(cp.asarray(dz), cp.asarray(h), act, cp.asarray(p), splits=SPLITS,
                            quantize=q)
    expect = GroupedTensor.quantize(R.backward(dz, h, act, p)[0], SPLITS, "nvfp4",
                                    columnwise=True, stochastic_rounding=True, seed=3)
    assert_quantized_equal(g.dh_quantized, expect, "dh")


def test_deterministic(cp):
    act = make_activation("swiglu")
    h, dz, p = (cp.asarray(a) for a in make(act, 512, BF16, 4096, seed=5))
    splits = (1024, 1024, 0, 2048)
    q = dict(format="mxfp8", rowwise=True, columnwise=True)
    runs = [activation_backward(dz, h, act, p, splits=splits, quantize=q, want_dbias=True)
            for _ in range(2)]
    assert_quantized_equal(runs[0].dh_quantized, runs[1].dh_quantized, "dh")
    assert_bytes_equal(runs[0].dprobs, runs[1].dprobs, "dprobs")
    assert_bytes_equal(runs[0].dbias, runs[1].dbias, "dbias")


# ============================================================================================
# NVFP4: amax taken by the activation kernel == the quantizer's own amax pass

NV_OPTS = {
    "tensor": dict(rowwise=True, columnwise=True),
    "tensor-row": dict(rowwise=True, columnwise=False),
    "tensor-col": dict(rowwise=False, columnwise=True),
    "sr": dict(rowwise=True, columnwise=True, stochastic_rounding=True, seed=11),
    "rht": dict(rowwise=True, columnwise=True, rht=True),
    "rht-sr": dict(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True, seed=5),
    "rht-col": dict(rowwise=False, columnwise=True, rht=True),
    "row-scaled": dict(rowwise=True, columnwise=True, row_scaled=True),
}


def _with_specials(h, xp):
    """A few NaN / inf / subnormal / huge inputs in h (NaN must not reach the amax)."""
    h = h.copy()
    n = h.shape[1]
    h[3, 0] = np.nan
    h[40, n - 1] = np.inf
    h[41, 1] = -np.inf
    h[70, 2] = 1e-40 if h.dtype == np.float32 else 1e-7
    h[100, 5] = 3e4
    return xp.asarray(h)


@pytest.mark.parametrize("opts", list(NV_OPTS))
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
@pytest.mark.parametrize("dname", list(DTYPES))
def test_nvfp4_fused_amax_equals_unfused(cp, dname, case, opts):
    o = NV_OPTS[opts]
    if o.get("rht") and dname != "bf16":
        pytest.skip("RHT needs bfloat16")
    name, il, f = case
    act = make_activation(name, glu_interleave=il)
    m = sum(SPLITS)
    h, dz, p = make(act, f, DTYPES[dname], m, seed=7)
    dz = cp.asarray(dz)
    q = dict(format="nvfp4", **o)
    for hx in (cp.asarray(h), _with_specials(h, cp)):
        for probs in (cp.asarray(p), None):
            z1 = activation_forward(hx, act, probs, splits=SPLITS, quantize=q, fused=True)
            z0 = activation_forward(hx, act, probs, splits=SPLITS, quantize=q, fused=False)
            assert_quantized_equal(z1, z0, f"z {opts}")
            g1 = activation_backward(dz, hx, act, probs, splits=SPLITS, quantize=q,
                                     want_dbias=True, fused=True)
            g0 = activation_backward(dz, hx, act, probs, splits=SPLITS, quantize=q,
                                     want_dbias=True, fused=False)
            assert g1.dh is None
            assert_quantized_equal(g1.dh_quantized, g0.dh_quantized, f"dh {opts}")
            assert_bytes_equal(g1.dbias, g0.dbias, "dbias")
            if probs is not None:
                assert_bytes_equal(g1.dprobs, g0.dprobs, "dprobs")


@pytest.mark.parametrize("dname", list(DTYPES))
def test_mxfp8_fused_with_nan_and_inf(cp, dname):
    """The fused MXFP8 kernels' NaN path (canonical NaN bytes, NaN-free scales) == unfused."""
    act = make_activation("swiglu", glu_interleave=32)
    f, m = 128, sum(SPLITS)
    h, dz, p = make(act, f, DTYPES[dname], m, seed=8)
    hx, dzx = _with_specials(h, cp), cp.asarray(dz)
    for fp8 in ("e4m3", "e5m2"):
        q = dict(format="mxfp8", rowwise=True, columnwise=True, fp8_dtype=fp8)
        z1 = activation_forward(hx, act, cp.asarray(p), splits=SPLITS, quantize=q)
        z0 = activation_forward(hx, act, cp.asarray(p), splits=SPLITS, quantize=q, fused=False)
        assert_quantized_equal(z1, z0, "z")
        g1 = activation_backward(dzx, hx, act, cp.asarray(p), splits=SPLITS, quantize=q)
        g0 = activation_backward(dzx, hx, act, cp.asarray(p), splits=SPLITS, quantize=q,
                                 fused=False)
        assert_quantized_equal(g1.dh_quantized, g0.dh_quantized, "dh")


def test_nvfp4_precomputed_amax_is_validated(cp):
    from lowprec_moe.backends.cupy.nvfp4 import grouped_quantize_nvfp4

    x = cp.asarray(np.ones((48, 32), dtype=np.float32))
    splits = [16, 32]
    a = cp.ones(2, dtype=cp.float32)
    ref = grouped_quantize_nvfp4(x, splits, columnwise=True)
    got = grouped_quantize_nvfp4(x, splits, columnwise=True, amax=(a, a))
    for k in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        assert_bytes_equal(got[k], ref[k], k)
    with pytest.raises(TypeError, match="pair"):
        grouped_quantize_nvfp4(x, splits, amax=a)
    with pytest.raises(TypeError, match="float64"):
        grouped_quantize_nvfp4(x, splits, amax=(a, a.astype(cp.float64)))
    with pytest.raises(TypeError, match="cupy.ndarray"):
        grouped_quantize_nvfp4(x, splits, amax=(a, np.ones(2, np.float32)))
    with pytest.raises(ValueError, match=r"shape=\(3,\)"):
        grouped_quantize_nvfp4(x, splits, amax=(cp.ones(3, dtype=cp.float32), a))
    with pytest.raises(ValueError, match=r"amax_columnwise.shape"):
        grouped_quantize_nvfp4(x, splits, row_scaled=True,
                               amax=(cp.ones(48, dtype=cp.float32), a))
