"""GroupedMLP forward / backward (NUMERICS §§6-9), on both backends through ``xp``.

Two yardsticks:

* **Analytic float64** (bf16 recipe, float32 inputs): per expert, ``h = x W1^T + b1``,
  ``z = act(h) p``, ``y = z W2^T + b2 p`` and every gradient written out by hand in float64 --
  forward and all six gradients must agree to ~1e-5 (fp32 GEMMs, fp32 activation math).
* **Stage by stage** (quantized recipes): every GEMM the layer runs is recorded and compared with
  the float64 product of its *dequantized* operands (NUMERICS §7 tolerance), and the operands are
  checked to be exactly what the chain should feed them: quantize(x), quantize(act(h) p) of the
  recorded fc1 output, quantize(dy), quantize(act'(h) dz p) of the recorded fc2 dgrad output
  (with the recipe's options and stochastic-rounding seeds). An end-to-end comparison against
  the analytic result, loose, confirms the quantization error is of the expected size.

Also bit for bit: pre-quantized (wire) x / dy == their bf16 dequantization, frozen weights /
input give the same remaining gradients, grouped == per expert, fused == unfused kernels.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe.backends.numpy.reduce import grouped_colsum
import lowprec_moe.layers.mlp as mlp_mod
from lowprec_moe import GroupedTensor, Recipe
from lowprec_moe.layers.activations import make_activation
from lowprec_moe.backends.numpy import activations as R

from conftest import assert_bytes_equal, assert_quantized_equal, to_host

BF16 = ml_dtypes.bfloat16
G, K, F = 3, 64, 64
SPLITS = (40, 0, 57)  # M = 97: an empty expert, no split a multiple of 16 or 32
SEED = 77
RTOL = 1e-5

QUANT_RECIPES = {
    "mxfp8-e4m3": Recipe.mxfp8(),
    "mxfp8-hybrid": Recipe.mxfp8(fp8_format="hybrid"),
    "nvfp4": Recipe.nvfp4(),  # RHT (bf16 inputs) and SR on the gradients
    "nvfp4-row-scaled": Recipe.nvfp4(row_scaled_activation=True),
}
NO_SR_RECIPES = {
    "bf16": Recipe.bf16(),
    "mxfp8-e4m3": Recipe.mxfp8(),
    "nvfp4-no-sr": Recipe.nvfp4(stochastic_rounding=False),
}
ACTS = [("swiglu", None), ("swiglu", 32), ("clamped_swiglu", None), ("clamped_swiglu", 32),
        ("srelu", None)]


# ============================================================================================
# data


def make_data(act, dtype=np.float32, splits=SPLITS, seed=0, k=K, f=F, n2=K):
    rng = np.random.default_rng(seed)
    m, g = int(sum(splits)), len(splits)
    n1 = act.input_features(f)
    x = rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-0.3, 0.3, (m, 1))
    w1 = rng.standard_normal((g, n1, k)) * (2.0 / np.sqrt(k))
    b1 = rng.standard_normal((g, n1)) * 0.5
    w2 = rng.standard_normal((g, n2, f)) / np.sqrt(f)
    b2 = rng.standard_normal((g, n2))
    p = rng.uniform(0.1, 1.0, m)
    dy = rng.standard_normal((m, n2)) * 10.0 ** rng.uniform(-0.5, 0.5, (m, 1))
    cast = lambda a: a.astype(np.float32).astype(dtype)  # noqa: E731
    return dict(x=cast(x), w1=cast(w1), b1=cast(b1), w2=cast(w2), b2=cast(b2),
                probs=p.astype(np.float32), dy=cast(dy))


def on(xp, d):
    return {k: (xp.asarray(v) if v is not None else None) for k, v in d.items()}


def offsets(splits):
    return np.concatenate([[0], np.cumsum(splits)]).astype(np.int64)


def run(xp, d, recipe, act, splits=SPLITS, *, bias=True, probs=True, seed=SEED, **kw):
    a = on(xp, d)
    y, ctx = lpm.grouped_mlp_forward(a["x"], list(splits), a["w1"], a["w2"],
                                     a["b1"] if bias else None, a["b2"] if bias else None,
                                     probs=a["probs"] if probs else None, activation=act.name,
                                     glu_interleave=act.glu_interleave, limit=_lim(act),
                                     recipe=recipe, seed=seed, **kw)
    grads = lpm.grouped_mlp_backward(a["dy"], ctx)
    return y, grads, ctx


def _lim(act):
    return act.limit if act.name == "clamped_swiglu" else None


# ============================================================================================
# analytic float64 reference


def _sig(t):
    return 1.0 / (1.0 + np.exp(-t))


def act64(act, h):
    """float64 (a, dh/da per input column as (fac_gate, fac_lin)) of h [M, N1]."""
    f = h.shape[1] // 2 if act.is_glu else h.shape[1]
    if not act.is_glu:
        return np.where(h > 0, h * h, 0.0), (np.where(h > 0, 2 * h, 0.0), None), None
    gi, li = R.glu_columns(f, act.glu_interleave)
    g, l = h[:, gi], h[:, li]
    if act.name == "swiglu":
        s = _sig(g)
        return g * s * l, (l * s * (1 + g * (1 - s)), g * s), (gi, li)
    lim, alpha = float(np.float32(act.limit)), float(np.float32(act.alpha))
    gc, lc = np.minimum(g, lim), np.clip(l, -lim, lim)
    t = alpha * gc
    s = _sig(t)
    return (gc * s * (lc + 1),
            (np.where(g <= lim, (lc + 1) * s * (1 + t * (1 - s)), 0.0),
             np.where(np.abs(l) <= lim, gc * s, 0.0)), (gi, li))


def analytic(d, act, splits=SPLITS, *, bias=True, probs=True):
    f64 = {k: v.astype(np.float64) for k, v in d.items()}
    x, w1, w2, dy = f64["x"], f64["w1"], f64["w2"], f64["dy"]
    g_count, n1, k = w1.shape
    n2 = w2.shape[1]
    b1 = f64["b1"] if bias else np.zeros((g_count, n1))
    b2 = f64["b2"] if bias else np.zeros((g_count, n2))
    m = x.shape[0]
    p = f64["probs"] if probs else np.ones(m)
    offs = offsets(splits)
    out = dict(y=np.zeros((m, n2)), dx=np.zeros((m, k)), dfc1_weight=np.zeros_like(w1),
               dfc1_bias=np.zeros((g_count, n1)), dfc2_weight=np.zeros_like(w2),
               dfc2_bias=np.zeros((g_count, n2)), dprobs=np.zeros(m))
    for g in range(g_count):
        s = slice(offs[g], offs[g + 1])
        if offs[g + 1] == offs[g]:
            continue
        ps = p[s, None]
        h = x[s] @ w1[g].T + b1[g]
        a, (fg, fl), cols = act64(act, h)
        z = a * ps
        out["y"][s] = z @ w2[g].T + b2[g] * ps
        dz = dy[s] @ w2[g]
        out["dfc2_weight"][g] = dy[s].T @ z
        out["dfc2_bias"][g] = (dy[s] * ps).sum(axis=0)
        out["dprobs"][s] = (a * dz).sum(axis=1) + dy[s] @ b2[g]
        da = dz * ps
        dh = np.zeros_like(h)
        if cols is None:
            dh[:] = da * fg
        else:
            dh[:, cols[0]] = da * fg
            dh[:, cols[1]] = da * fl
        out["dfc1_weight"][g] = dh.T @ x[s]
        out["dfc1_bias"][g] = dh.sum(axis=0)
        out["dx"][s] = dh @ w1[g]
    return out


def assert_near(got, ref, what, rtol):
    """|got - ref| <= rtol * (|ref| + rms(ref))."""
    g = to_host(got).astype(np.float64)
    assert g.shape == ref.shape, f"{what}: shape {g.shape} != {ref.shape}"
    assert np.isfinite(g).all(), f"{what}: non-finite values"
    scale = np.sqrt(np.mean(ref ** 2)) if ref.size else 0.0
    tol = rtol * (np.abs(ref) + scale)
    err = np.abs(g - ref)
    if (err > tol).any():
        i = np.unravel_index(int(np.argmax(err - tol)), err.shape)
        raise AssertionError(f"{what}: {int((err > tol).sum())} of {err.size} out of tolerance; "
                             f"worst at {i}: got {g[i]!r}, expected {ref[i]!r}, tol {tol[i]:.3g}")


GRADS = ("dx", "dfc1_weight", "dfc1_bias", "dfc2_weight", "dfc2_bias", "dprobs")


@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "noprobs"])
@pytest.mark.parametrize("act", ACTS, ids=[f"{a}-il{i}" for a, i in ACTS])
def test_bf16_recipe_matches_analytic(xp, act, with_probs):
    act = make_activation(*act, limit=3.0 if act[0] == "clamped_swiglu" else None)
    d = make_data(act)
    y, grads, _ = run(xp, d, Recipe.bf16(), act, probs=with_probs)
    ref = analytic(d, act, probs=with_probs)
    assert y.dtype == np.float32 and y.shape == (sum(SPLITS), K)
    assert_near(y, ref["y"], "y", 2e-5)
    for name in GRADS:
        got = getattr(grads, name)
        if name == "dprobs" and not with_probs:
            assert got is None
            continue
        assert got.dtype == np.float32, name
        assert_near(got, ref[name], name, 2e-5)
    # empty expert 1: zero weight and bias gradients, exactly
    for name in ("dfc1_weight", "dfc1_bias", "dfc2_weight", "dfc2_bias"):
        assert not to_host(getattr(grads, name))[1].any(), name
    if act.name == "clamped_swiglu":  # the test data does reach the clamps
        h = d["x"].astype(np.float64)[:40] @ d["w1"][0].astype(np.float64).T + d["b1"][0]
        assert (h > 3.0).any() and (h < -3.0).any()


def test_bf16_recipe_without_biases(xp):
    act = make_activation("swiglu", 32)
    d = make_data(act)
    y, grads, _ = run(xp, d, Recipe.bf16(), act, bias=False)
    ref = analytic(d, act, bias=False)
    assert grads.dfc1_bias is None and grads.dfc2_bias is None
    assert_near(y, ref["y"], "y", 2e-5)
    for name in ("dx", "dfc1_weight", "dfc2_weight", "dprobs"):
        assert_near(getattr(grads, name), ref[name], name, 2e-5)


def test_bf16_recipe_bf16_dtypes(xp):
    """bf16 parameters and inputs: outputs keep the dtypes, values near the analytic ones."""
    act = make_activation("swiglu")
    d = make_data(act, dtype=BF16)
    y, grads, _ = run(xp, d, Recipe.bf16(), act)
    ref = analytic(d, act)
    assert np.dtype(y.dtype) == np.dtype(BF16)
    for name in GRADS:
        got = getattr(grads, name)
        want = np.float32 if name == "dprobs" else BF16
        assert np.dtype(got.dtype) == np.dtype(want), name
        assert_near(got, ref[name], name, 3e-2)


# ============================================================================================
# quantized recipes: every GEMM against its dequantized operands


def _ulp(v, dtype_name):
    mant, emin = {"bfloat16": (7, -126), "float16": (10, -14), "float32": (23, -126)}[dtype_name]
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -200)))
    return 2.0 ** (np.maximum(e, emin) - mant)


def _rows(gt):
    return to_host(gt.dequantize("rowwise", dtype="float32")).astype(np.float64)


def _cols(gt, g):
    """Member g's stored columnwise copy as values [Mp, K] (padding rows kept, RHT kept)."""
    q = gt.member(g)
    m, k = q.shape
    block = 16 if gt.format == "nvfp4" else 32
    q = q.replace(rht=False, shape=(-(-m // block) * block, k))
    return to_host(lpm.dequantize(q, "columnwise", dtype="float32")).astype(np.float64)


def _hp(a):
    return to_host(a).astype(np.float64)


def emulate_gemm(call):
    """float64 (value, bound) of one recorded GEMM from its operands (NUMERICS §7)."""
    mode, a, b, splits, kw = call["mode"], call["a"], call["b"], call["splits"], call["kw"]
    offs = offsets(splits)
    quant = isinstance(a, GroupedTensor)
    g_count = len(splits)
    if mode == "wgrad":
        n, k = a.shape[1], b.shape[1]
        val, bnd = np.zeros((g_count, n, k)), np.zeros((g_count, n, k))
        for g in range(g_count):
            if offs[g + 1] == offs[g]:
                continue
            if quant:
                A, B = _cols(a, g), _cols(b, g)
            else:
                s = slice(offs[g], offs[g + 1])
                A, B = _hp(a)[s], _hp(b)[s]
            val[g], bnd[g] = A.T @ B, np.abs(A).T @ np.abs(B)
        return val, bnd
    A = _rows(a) if quant else _hp(a)
    if quant:
        n_w = b.splits[0]
        W = (_rows(b).reshape(g_count, n_w, -1) if mode == "fprop"
             else np.stack([_cols(b, g) for g in range(g_count)]))
    else:
        W = _hp(b)
    out_cols = W.shape[1] if mode == "fprop" else W.shape[2]
    val, bnd = np.zeros((A.shape[0], out_cols)), np.zeros((A.shape[0], out_cols))
    for g in range(g_count):
        s = slice(offs[g], offs[g + 1])
        Wg = W[g].T if mode == "fprop" else W[g]
        val[s], bnd[s] = A[s] @ Wg, np.abs(A[s]) @ np.abs(Wg)
        if kw.get("bias") is not None:
            bias = _hp(kw["bias"])[g][None, :]
            if kw.get("probs") is not None:
                bias = bias * _hp(kw["probs"])[s, None]
            val[s] += bias
            bnd[s] += np.abs(bias)
    return val, bnd


def assert_gemm_close(call, what):
    val, bnd = emulate_gemm(call)
    got = to_host(call["out"])
    name = np.dtype(got.dtype).name
    g = got.astype(np.float64)
    tol = RTOL * bnd + (0 if name == "float32" else _ulp(np.maximum(np.abs(val), np.abs(g)),
                                                         name))
    err = np.abs(g - val)
    if (err > tol).any():
        i = np.unravel_index(int(np.argmax(err - tol)), err.shape)
        raise AssertionError(f"{what}: {int((err > tol).sum())} of {err.size} out of tolerance; "
                             f"worst at {i}: got {g[i]!r}, expected {val[i]!r}")


def record_gemms(monkeypatch):
    calls = []
    for mode in ("fprop", "dgrad", "wgrad"):
        orig = getattr(mlp_mod, f"grouped_gemm_{mode}")

        def spy(a, b, splits=None, *, _orig=orig, _mode=mode, **kw):
            out = _orig(a, b, splits, **kw)
            calls.append(dict(mode=_mode, a=a, b=b, splits=tuple(splits), kw=kw, out=out))
            return out

        monkeypatch.setattr(mlp_mod, f"grouped_gemm_{mode}", spy)
    return calls


def _x_opts(recipe, dtype_name, columnwise=True):
    if recipe.name == "mxfp8":
        return dict(rowwise=True, columnwise=columnwise, fp8_dtype="e4m3")
    return dict(rowwise=True, columnwise=columnwise, row_scaled=recipe.row_scaled_activation,
                rht=recipe.rht and columnwise and dtype_name == "bfloat16")


def _grad_opts(recipe, rht, seed, rowwise=True, columnwise=True):
    if recipe.name == "mxfp8":
        return dict(rowwise=rowwise, columnwise=columnwise, fp8_dtype=recipe.dy_fp8_dtype)
    return dict(rowwise=rowwise, columnwise=columnwise, rht=rht,
                stochastic_rounding=recipe.stochastic_rounding, seed=seed)


def _weight_q(xp, w, recipe):
    g, n, k = w.shape
    return GroupedTensor.quantize(xp.asarray(w).reshape(g * n, k), [n] * g, recipe.format,
                                  rowwise=True, columnwise=True,
                                  block_2d=recipe.weight_2d, fp8_dtype="e4m3")


@pytest.mark.parametrize("act", [("swiglu", None), ("clamped_swiglu", 32), ("srelu", None)],
                         ids=lambda a: f"{a[0]}-il{a[1]}")
@pytest.mark.parametrize("rname", list(QUANT_RECIPES))
def test_quantized_recipe_stage_by_stage(xp, monkeypatch, rname, act):
    recipe = QUANT_RECIPES[rname]
    act = make_activation(*act, limit=3.0 if act[0] == "clamped_swiglu" else None)
    d = make_data(act, dtype=BF16)
    calls = record_gemms(monkeypatch)
    y, grads, _ = run(xp, d, recipe, act)
    monkeypatch.undo()
    assert [c["mode"] for c in calls] == ["fprop", "fprop", "dgrad", "wgrad", "dgrad", "wgrad"]
    fc1, fc2, fc2_dg, fc2_wg, fc1_dg, fc1_wg = calls

    # 1. each GEMM against the float64 product of its dequantized operands
    for c, what in ((fc1, "fc1 fprop"), (fc2, "fc2 fprop"), (fc2_dg, "fc2 dgrad"),
                    (fc2_wg, "fc2 wgrad"), (fc1_dg, "fc1 dgrad"), (fc1_wg, "fc1 wgrad")):
        assert_gemm_close(c, f"{rname} {what}")

    # 2. the operands are the chain's values, quantized as the recipe says
    a = on(xp, d)
    dn = "bfloat16"
    xq = GroupedTensor.quantize(a["x"], SPLITS, recipe.format, **_x_opts(recipe, dn))
    assert_quantized_equal(fc1["a"], xq, "fc1 x")
    assert_quantized_equal(fc1_wg["b"], dataclasses.replace(
        xq, rowwise_data=None, rowwise_scale=None, amax_rowwise=None), "fc1 x columnwise")
    w1q, w2q = _weight_q(xp, d["w1"], recipe), _weight_q(xp, d["w2"], recipe)
    assert_bytes_equal(fc1["b"].rowwise_data, w1q.rowwise_data, "W1 rowwise")
    assert_bytes_equal(fc1_dg["b"].columnwise_data, w1q.columnwise_data, "W1 columnwise")
    assert_bytes_equal(fc2["b"].rowwise_data, w2q.rowwise_data, "W2 rowwise")
    assert_bytes_equal(fc2_dg["b"].columnwise_data, w2q.columnwise_data, "W2 columnwise")

    h = to_host(fc1["out"])
    assert np.dtype(h.dtype) == np.dtype(BF16)
    z_ref = R.forward(h, act, d["probs"])
    zq = GroupedTensor.quantize(xp.asarray(z_ref), SPLITS, recipe.format, **_x_opts(recipe, dn))
    assert_quantized_equal(fc2["a"], zq, "fc2 input")
    assert fc2_wg["b"] is not fc2["a"] and fc2_wg["b"].rowwise_data is None
    assert_bytes_equal(fc2_wg["b"].columnwise_data, zq.columnwise_data, "fc2 input col")

    rht = recipe.name == "nvfp4" and recipe.rht
    dyq = GroupedTensor.quantize(a["dy"], SPLITS, recipe.format, **_grad_opts(recipe, rht, SEED))
    assert_quantized_equal(fc2_dg["a"], dyq, "dy")
    assert fc2_wg["a"] is fc2_dg["a"]

    dz = to_host(fc2_dg["out"])
    dh_ref, dp_act = R.backward(dz, h, act, d["probs"])
    dhq = GroupedTensor.quantize(xp.asarray(dh_ref), SPLITS, recipe.format,
                                 **_grad_opts(recipe, rht, mlp_mod._fc1_seed(SEED)))
    assert_quantized_equal(fc1_dg["a"], dhq, "dh")
    assert fc1_wg["a"] is fc1_dg["a"]

    # 3. the outputs are the GEMM outputs; the reductions are right
    assert y is fc2["out"] and grads.dx is fc1_dg["out"]
    assert grads.dfc1_weight is fc1_wg["out"] and grads.dfc2_weight is fc2_wg["out"]
    db1 = grouped_colsum(dh_ref, SPLITS)
    np.testing.assert_allclose(to_host(grads.dfc1_bias).astype(np.float32), db1,
                               rtol=1e-2, atol=1e-2 * np.abs(db1).max())
    dy64, b2 = d["dy"].astype(np.float64), d["b2"].astype(np.float64)
    rows_b2 = b2[np.repeat(np.arange(G), SPLITS)]
    dp_ref = dp_act.astype(np.float64) + (dy64 * rows_b2).sum(axis=1)
    bound = (np.abs(R.forward(h, act).astype(np.float64)) * np.abs(dz.astype(np.float64))).sum(1)
    bound += (np.abs(dy64) * np.abs(rows_b2)).sum(axis=1)
    assert np.all(np.abs(to_host(grads.dprobs) - dp_ref) <= 1e-5 * bound), "dprobs"
    p = d["probs"].astype(np.float64)
    db2 = np.stack([(dy64[s] * p[s, None]).sum(0) for s in
                    (slice(o0, o1) for o0, o1 in zip(offsets(SPLITS)[:-1], offsets(SPLITS)[1:]))])
    np.testing.assert_allclose(to_host(grads.dfc2_bias).astype(np.float64), db2, rtol=1e-2,
                               atol=1e-2)

    # 4. end to end: a quantization error of the expected size (clamped_swiglu's gradient jumps
    # at the clamps, so quantizing h moves some of its values across them: larger dh errors)
    ref = analytic(d, act)
    limit = 0.3 if recipe.name == "mxfp8" else 0.6
    for name in ("y", "dx", "dfc1_weight", "dfc2_weight"):
        got = to_host(y if name == "y" else getattr(grads, name)).astype(np.float64)
        rel = np.linalg.norm(got - ref[name]) / np.linalg.norm(ref[name])
        assert 1e-3 < rel < limit, f"{rname} {name}: relative error {rel:.3g} vs float64"
