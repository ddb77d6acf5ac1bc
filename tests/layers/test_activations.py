"""GroupedMLP activations (NUMERICS §8): the NumPy definition and both backends through ``xp``.

* The reference's fp32 math is checked against float64 formulas (values and gradients, each within
  a few fp32 ulps of an error bound built from the magnitudes of its terms) and its exponential
  against ``numpy.exp`` in float64.
* Every backend must reproduce the reference **bit for bit** for every element of ``z`` and
  ``dh`` (the GPU kernels perform the same fp32 operations), and the quantized outputs must be the
  bytes of ``GroupedTensor.quantize`` applied to the reference values. Reductions (dprobs, the
  per-expert column sums of dh) are compared with a tolerance: the GPU sums in another order.
"""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe import GroupedTensor
from lowprec_moe.layers.activations import (ACTIVATIONS, Activation, activation_backward,
                                     activation_forward, make_activation)
from lowprec_moe.backends.numpy import activations as R
from lowprec_moe.backends.numpy.reduce import grouped_colsum

from conftest import assert_bytes_equal, assert_quantized_equal, to_host
from lowprec_moe import kernels

BF16 = ml_dtypes.bfloat16
DTYPES = {"fp32": np.float32, "bf16": BF16, "fp16": np.float16}
SPLITS = (37, 0, 64, 3, 45)  # M = 149: an empty expert, sizes not multiples of 32
F32_EPS = 2.0 ** -23


def make_h(m, n, seed=0, scale=3.0, dtype=np.float32, specials=True):
    """Random pre-activations with a spread of magnitudes, plus awkward values."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((m, n)) * scale * 10.0 ** rng.uniform(-1, 0.7, (m, 1))
    if specials:
        vals = np.array([0.0, -0.0, 7.0, -7.0, 7.0000005, -7.0000005, 1e-40, -1e-40, 95.0,
                         -95.0, 1e-8, -1e-8, -1.2785, 60.0, -60.0, 1.0])
        idx = np.arange(0, h.size, max(1, h.size // 97))[:vals.size]
        h.flat[idx] = vals[:idx.size]
    return h.astype(np.float32).astype(dtype)


def make_dz(m, f, seed=1, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, f)) * 10.0 ** rng.uniform(-1, 1, (m, 1))).astype(
        np.float32).astype(dtype)


def make_probs(m, seed=2):
    return np.random.default_rng(seed).uniform(0.05, 1.0, m).astype(np.float32)


def f32_ulp(v):
    v = np.abs(np.asarray(v, dtype=np.float64))
    e = np.floor(np.log2(np.maximum(v, 2.0 ** -126)))
    return 2.0 ** (e - 23)


# ============================================================================================
# the reference's exponential and constants


def test_exp_f32_accuracy():
    x = np.concatenate([np.linspace(-87, 88.7, 400_001),
                        np.random.default_rng(0).standard_normal(100_000) * 4]).astype(np.float32)
    got = R.exp_f32(x).astype(np.float64)
    exact = np.exp(x.astype(np.float64))
    err = np.abs(got - exact) / f32_ulp(exact)
    assert err.max() <= 1.5, f"exp_f32 off by {err.max():.2f} ulp"
    # subnormal results: one rounding (at most one unit of 2^-149)
    xs = np.linspace(-103.9, -87.4, 20_001).astype(np.float32)
    d = np.abs(R.exp_f32(xs).astype(np.float64) - np.exp(xs.astype(np.float64)))
    assert d.max() <= 2.0 ** -149


def test_exp_f32_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 89.0, 88.72, 88.73, -104.0, -200.0,
                  1e-40], dtype=np.float32)
    got = R.exp_f32(x)
    assert got[0] == 1.0 and got[1] == 1.0 and got[10] == 1.0
    assert np.isposinf(got[2]) and np.isposinf(got[5]) and np.isposinf(got[7])
    assert got[3] == 0.0 and got[8] == 0.0 and got[9] == 0.0
    assert np.isnan(got[4])
    assert np.isfinite(got[6]) and got[6] > 3.39e38
    s = R.sigmoid_f32(np.array([0.0, 100.0, -100.0, np.inf, -np.inf], dtype=np.float32))
    assert s.tolist() == [0.5, 1.0, 0.0, 1.0, 0.0]


def test_constants_match_cuda_source():
    # exponential constants: activation_math.cuh; activation ids: activation.cu
    math_src = kernels.source_path("activation_math.cuh").read_text()
    found = dict(re.findall(r"constexpr unsigned int LPM_ACT_(\w+)_BITS = (0x[0-9A-Fa-f]+)u;",
                            math_src))
    assert {k: int(v, 16) for k, v in found.items()} == R.EXP_CONST_BITS
    src = kernels.source_path("activation.cu").read_text()
    ids = dict(re.findall(r"constexpr int LPM_ACT_(SWIGLU|CLAMPED_SWIGLU|SRELU) = (\d+);", src))
    from lowprec_moe.backends.cupy import activation as cu

    assert {k.lower(): int(v) for k, v in ids.items()} == cu._ACT_ID


# ============================================================================================
# the reference's math against float64 formulas


def _sig64(t):
    return 1.0 / (1.0 + np.exp(-t))


def float64_act(name, g, l, limit=7.0, alpha=1.702):
    """(a, dg/da-factor, dl/da-factor) in float64, plus an abs-value bound of each."""
    g = g.astype(np.float64)
    l = None if l is None else l.astype(np.float64)
    limit, alpha = float(np.float32(limit)), float(np.float32(alpha))  # the fp32 parameters
    with np.errstate(over="ignore"):
        if name == "swiglu":
            s = _sig64(g)
            a = g * s * l
            dg = l * s * (1 + g * (1 - s))
            dl = g * s
            bounds = (np.abs(a), np.abs(l) * s * (1 + np.abs(g) * (1 - s)), np.abs(dl))
            return a, dg, dl, bounds
        if name == "clamped_swiglu":
            gc = np.minimum(g, limit)
            lc = np.clip(l, -limit, limit)
            t = alpha * gc
            s = _sig64(t)
            a = gc * s * (lc + 1)
            dg = np.where(g <= limit, (lc + 1) * s * (1 + t * (1 - s)), 0.0)
            dl = np.where(np.abs(l) <= limit, gc * s, 0.0)
            bounds = (np.abs(gc) * s * (np.abs(lc) + 1),
                      (np.abs(lc) + 1) * s * (1 + np.abs(t) * (1 - s)), np.abs(gc) * s)
            return a, dg, dl, bounds
        a = np.where(g > 0, g * g, 0.0)
        dg = np.where(g > 0, 2 * g, 0.0)
        return a, dg, None, (np.abs(a), np.abs(dg), None)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_reference_matches_float64(name):
    act = make_activation(name)
    m, f = 64, 48
    h = make_h(m, 2 * f if act.is_glu else f, seed=3, specials=False)
    g, l = (h[:, :f], h[:, f:]) if act.is_glu else (h, None)
    da = make_dz(m, f, seed=4)
    a32 = R.act_forward_f32(g, l, act)
    dg32, dl32 = R.act_backward_f32(g, l, da, act)
    a, dgf, dlf, (ba, bg, bl) = float64_act(name, g, l)
    da64 = da.astype(np.float64)
    tol = 16 * F32_EPS
    assert np.all(np.abs(a32 - a) <= tol * ba + 1e-38), "value"
    assert np.all(np.abs(dg32 - da64 * dgf) <= tol * np.abs(da64) * bg + 1e-38), "gate grad"
    if act.is_glu:
        assert np.all(np.abs(dl32 - da64 * dlf) <= tol * np.abs(da64) * bl + 1e-38), "lin grad"
    else:
        assert dl32 is None


def test_clamped_swiglu_clamps():
    act = make_activation("clamped_swiglu", limit=2.5, alpha=1.5)
    g = np.array([-3.0, 2.0, 2.5, 2.6, 9.0, np.float32(2.5000002)], dtype=np.float32)
    l = np.array([-2.6, -2.5, 0.0, 2.5, 2.6, -9.0], dtype=np.float32)
    da = np.ones_like(g)
    a = R.act_forward_f32(g, l, act)
    dg, dl = R.act_backward_f32(g, l, da, act)
    a64, dg64, dl64, _ = float64_act("clamped_swiglu", g, l, limit=2.5, alpha=1.5)
    np.testing.assert_allclose(a, a64, rtol=1e-6)
    np.testing.assert_allclose(dg, dg64, rtol=1e-6)
    np.testing.assert_allclose(dl, dl64, rtol=1e-6)
    # gradients are zero where clamped (gate above the limit, linear outside +-limit);
    # the boundary itself passes the gradient (as torch.clamp)
    assert dg[3] == 0 and dg[4] == 0 and dg[5] == 0 and dg[2] != 0
    assert dl[0] == 0 and dl[4] == 0 and dl[5] == 0 and dl[1] != 0 and dl[3] != 0
    # the clamped value: gate at the limit, linear at -limit
    assert a[5] == R.act_forward_f32(np.float32([2.5]), np.float32([-2.5]), act)[0]


def test_srelu_and_zero_signs():
    act = make_activation("srelu")
    g = np.array([-1.0, -0.0, 0.0, 1e-30, 3.0], dtype=np.float32)
    a = R.act_forward_f32(g, None, act)
    dg, _ = R.act_backward_f32(g, None, np.full_like(g, 2.0), act)
    assert a.tolist() == [0.0, 0.0, 0.0, np.float32(1e-30) ** 2, 9.0]
    assert dg.tolist() == [0.0, 0.0, 0.0, np.float32(4e-30), 12.0]
    assert not np.signbit(a[:3]).any() and not np.signbit(dg[:3]).any()


@pytest.mark.parametrize("name", ["swiglu", "clamped_swiglu"])
@pytest.mark.parametrize("il", [1, 8, 32])
def test_interleave_is_a_column_permutation(name, il):
    m, f = 20, 64
    h = make_h(m, 2 * f, seed=5)
    dz = make_dz(m, f)
    p = make_probs(m)
    gi, li = R.glu_columns(f, il)
    assert sorted(np.concatenate([gi, li]).tolist()) == list(range(2 * f))
    assert gi[:il].tolist() == list(range(il)) and li[:il].tolist() == list(range(il, 2 * il))
    plain = np.concatenate([h[:, gi], h[:, li]], axis=1)  # gate first, then linear
    act_i, act_p = make_activation(name, glu_interleave=il), make_activation(name)
    assert_bytes_equal(R.forward(h, act_i, p), R.forward(plain, act_p, p), "z")
    dh_i, dp_i = R.backward(dz, h, act_i, p)
    dh_p, dp_p = R.backward(dz, plain, act_p, p)
    assert_bytes_equal(dh_i[:, gi], dh_p[:, :f], "dgate")
    assert_bytes_equal(dh_i[:, li], dh_p[:, f:], "dlin")
    assert_bytes_equal(dp_i, dp_p, "dprobs")


def test_probs_semantics():
    act = make_activation("swiglu")
    m, f = 33, 16
    h = make_h(m, 2 * f, seed=6, specials=False)
    dz = make_dz(m, f)
    p = make_probs(m)
    a = R.act_forward_f32(h[:, :f], h[:, f:], act)
    z = R.forward(h, act, p)
    assert_bytes_equal(z, (a * p[:, None]).astype(np.float32), "z = a * p")
    assert_bytes_equal(R.forward(h, act), a, "z without probs")
    dh, dprobs = R.backward(dz, h, act, p)
    dh1, none = R.backward((dz * p[:, None]).astype(np.float32), h, act)
    assert none is None
    assert_bytes_equal(dh, dh1, "dh = act'(h) (dz * p)")
    ref = (a.astype(np.float64) * dz.astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(dprobs, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())


# ============================================================================================
# both backends: bitwise against the reference


CASES = [  # (activation, interleave, F)
    ("swiglu", None, 96),
    ("swiglu", 32, 64),
    ("clamped_swiglu", None, 160),
    ("clamped_swiglu", 64, 128),
    ("srelu", None, 64),
    ("swiglu", None, 36),   # F not a multiple of 8: element-wise loads for 16-bit dtypes
    ("swiglu", 4, 36),
]


def _ids(c):
    return f"{c[0]}-il{c[1]}-F{c[2]}"


def _on(xp, *arrays):
    return [None if a is None else xp.asarray(a) for a in arrays]


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "noprobs"])
def test_backend_matches_reference(xp, case, dname, with_probs):
    name, il, f = case
    dtype = DTYPES[dname]
    act = make_activation(name, glu_interleave=il)
    m = sum(SPLITS)
    h = make_h(m, act.input_features(f), seed=7, dtype=dtype)
    dz = make_dz(m, f, dtype=dtype)
    p = make_probs(m) if with_probs else None
    hx, dzx, px = _on(xp, h, dz, p)

    z = activation_forward(hx, act, px, splits=SPLITS)
    assert z.dtype == h.dtype and z.shape == (m, f)
    assert_bytes_equal(z, R.forward(h, act, p), "z")

    g = activation_backward(dzx, hx, act, px, splits=SPLITS, want_dbias=True)
    dh_ref, dp_ref = R.backward(dz, h, act, p)
    assert_bytes_equal(g.dh, dh_ref, "dh")
    db_ref = grouped_colsum(dh_ref, SPLITS)
    db = to_host(g.dbias)
    assert db.dtype == np.float32 and db.shape == (len(SPLITS), act.input_features(f))
    bound = grouped_colsum(np.abs(dh_ref.astype(np.float32)), SPLITS)
    assert np.all(np.abs(db - db_ref) <= 1e-5 * bound), "dbias"
    assert not db[1].any(), "empty expert"
    if with_probs:
        a = R.forward(h, act).astype(np.float64)
        bound = (np.abs(a) * np.abs(dz.astype(np.float64))).sum(axis=1)
        assert np.all(np.abs(to_host(g.dprobs) - dp_ref) <= 1e-5 * bound + 1e-30), "dprobs"
    else:
        assert g.dprobs is None


def test_backend_special_and_subnormal_values(xp):
    """Subnormal, huge, clamped-boundary and infinite inputs give the reference's bits."""
    m, f = 64, 32
    vals = np.array([0.0, -0.0, 1e-40, -1e-40, 1e-45, 3e-39, 7.0, -7.0, 7.0000005, 88.0, -88.0,
                     104.0, -104.0, 1000.0, -1000.0, np.inf, -np.inf, 1e-20, -1e-20, 0.5],
                    dtype=np.float32)
    rng = np.random.default_rng(8)
    h = vals[rng.integers(0, vals.size, (m, 2 * f))]
    dz = vals[rng.integers(0, vals.size - 2, (m, f))] * np.float32(1e-3)
    p = rng.uniform(0, 1, m).astype(np.float32)
    p[:4] = [0.0, 1e-40, 1.0, 3e-39]
    hx, dzx, px = _on(xp, h, dz, p)
    for name in ACTIVATIONS:
        act = make_activation(name)
        hh, hhx = (h, hx) if act.is_glu else (h[:, :f].copy(), xp.ascontiguousarray(hx[:, :f]))
        with np.errstate(all="ignore"):
            z_ref = R.forward(hh, act, p)
            dh_ref, _ = R.backward(dz, hh, act, p)
        z = to_host(activation_forward(hhx, act, px))
        dh = to_host(activation_backward(dzx, hhx, act, px).dh)
        for got, ref, what in ((z, z_ref, "z"), (dh, dh_ref, "dh")):
            nan = np.isnan(ref)
            assert np.array_equal(np.isnan(got), nan), f"{name} {what}: NaN positions"
            assert_bytes_equal(np.where(nan, 0, got), np.where(nan, 0, ref), f"{name} {what}")


# ============================================================================================
# both backends: quantized outputs equal the quantization of the reference values


QUANT = {
    "mxfp8-row-col": dict(format="mxfp8", rowwise=True, columnwise=True),
    "mxfp8-col-e5m2": dict(format="mxfp8", rowwise=False, columnwise=True, fp8_dtype="e5m2"),
    "mxfp8-row": dict(format="mxfp8", rowwise=True, columnwise=False),
    "nvfp4": dict(format="nvfp4", rowwise=True, columnwise=True),
    "nvfp4-rht-sr": dict(format="nvfp4", rowwise=True, columnwise=True, rht=True,
                         stochastic_rounding=True, seed=11),
}


@pytest.mark.parametrize("qname", list(QUANT))
@pytest.mark.parametrize("case", [("swiglu", None, 64), ("clamped_swiglu", 32, 96),
                                  ("srelu", None, 32), ("swiglu", 16, 64)],
                         ids=lambda c: _ids(c))
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_quantized_outputs(xp, qname, case, fused):
    name, il, f = case
    q = QUANT[qname]
    act = make_activation(name, glu_interleave=il)
    m = sum(SPLITS)
    h = make_h(m, act.input_features(f), seed=9, dtype=BF16)
    dz = make_dz(m, f, dtype=BF16)
    p = make_probs(m)
    hx, dzx, px = _on(xp, h, dz, p)
    opts = {k: v for k, v in q.items() if k != "format"}

    zq = activation_forward(hx, act, px, splits=SPLITS, quantize=q, fused=fused)
    assert isinstance(zq, GroupedTensor) and zq.shape == (m, f)
    expect = GroupedTensor.quantize(xp.asarray(R.forward(h, act, p)), SPLITS, q["format"],
                                    **opts)
    assert_quantized_equal(zq, expect, "z")

    g = activation_backward(dzx, hx, act, px, splits=SPLITS, quantize=q, want_dbias=True,
                            fused=fused)
    assert g.dh is None  # not asked for: with fused MXFP8 it never exists in memory
    dh_ref, dp_ref = R.backward(dz, h, act, p)
    expect = GroupedTensor.quantize(xp.asarray(dh_ref), SPLITS, q["format"], **opts)
    assert_quantized_equal(g.dh_quantized, expect, "dh")
    np.testing.assert_allclose(to_host(g.dprobs), dp_ref, rtol=1e-4,
                               atol=1e-5 * np.abs(dp_ref).max())
    np.testing.assert_allclose(to_host(g.dbias), grouped_colsum(dh_ref, SPLITS), rtol=1e-4,
                               atol=1e-4)
    g2 = activation_backward(dzx, hx, act, px, splits=SPLITS, quantize=q, want_dh=True,
                             fused=fused)
    assert_bytes_equal(g2.dh, dh_ref, "dh (want_dh)")
    assert_quantized_equal(g2.dh_quantized, expect, "dh (want_dh)")


def test_empty_input(xp):
    act = make_activation("swiglu")
    h = xp.zeros((0, 64), dtype=xp.float32)
    z = activation_forward(h, act, splits=[0, 0])
    assert z.shape == (0, 32)
    g = activation_backward(xp.zeros((0, 32), dtype=xp.float32), h, act,
                            xp.zeros(0, dtype=xp.float32), splits=[0, 0], want_dbias=True)
    assert g.dh.shape == (0, 64) and g.dprobs.shape == (0,)
    assert g.dbias.shape == (2, 64) and not to_host(g.dbias).any()
    zq = activation_forward(h, act, splits=[0, 0],
                            quantize=dict(format="mxfp8", rowwise=True, columnwise=True))
    assert zq.rowwise_data.shape == (0, 32) and zq.columnwise_data.size == 0


# ============================================================================================
# bad input


def test_make_activation_errors():
    with pytest.raises(ValueError, match="swiglu, clamped_swiglu, srelu"):
        make_activation("gelu")
    with pytest.raises(ValueError, match="valid activations"):
        make_activation(None)
    with pytest.raises(ValueError, match="glu_interleave=32 applies to GLU"):
        make_activation("srelu", glu_interleave=32)
    with pytest.raises(TypeError, match="glu_interleave"):
        make_activation("swiglu", glu_interleave=32.0)
    with pytest.raises(ValueError, match="glu_interleave=0"):
        make_activation("swiglu", glu_interleave=0)
    with pytest.raises(ValueError, match="limit=5.0 applies to activation='clamped_swiglu'"):
        make_activation("swiglu", limit=5.0)
    with pytest.raises(ValueError, match="alpha"):
        make_activation("clamped_swiglu", alpha=-1.0)
    with pytest.raises(TypeError, match="limit"):
        make_activation("clamped_swiglu", limit="7")
    with pytest.raises(ValueError, match="inside the Activation"):
        make_activation(Activation("swiglu"), glu_interleave=32)
    a = make_activation("clamped_swiglu", limit=5, alpha=2)
    assert (a.limit, a.alpha, a.is_glu) == (5.0, 2.0, True)
    assert make_activation(a) is a


def test_activation_call_errors(xp):
    h = xp.zeros((10, 64), dtype=xp.float32)
    dz = xp.zeros((10, 32), dtype=xp.float32)
    with pytest.raises(ValueError, match="valid activations"):
        activation_forward(h, "relu")
    with pytest.raises(ValueError, match="glu_interleave=24 must divide F=32"):
        activation_forward(h, "swiglu", glu_interleave=24)
    with pytest.raises(ValueError, match="63 columns"):
        activation_forward(h[:, :63], "swiglu")
    with pytest.raises(ValueError, match="probs"):
        activation_forward(h, "swiglu", xp.zeros(9, dtype=xp.float32))
    with pytest.raises(TypeError, match="h.dtype"):
        activation_forward(xp.zeros((10, 64), dtype=xp.int32), "swiglu")
    with pytest.raises(ValueError, match="sum to"):
        activation_forward(h, "swiglu", splits=[5, 4])
    with pytest.raises(ValueError, match="multiple of 32"):
        activation_forward(h[:, :48], "swiglu", quantize=dict(format="mxfp8"))
    with pytest.raises(TypeError, match="quantize"):
        activation_forward(h, "swiglu", quantize="mxfp8")
    with pytest.raises(ValueError, match="dz.shape"):
        activation_backward(dz[:, :16], h, "swiglu")
    with pytest.raises(TypeError, match="dz.dtype"):
        activation_backward(dz.astype(xp.float16), h, "swiglu")
