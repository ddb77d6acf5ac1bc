"""GroupedLinear forward / backward (NUMERICS §§6-9), on both backends through ``xp``.

The yardstick is an emulation written from NUMERICS §7 alone: quantize the operands each GEMM
names (fprop: x rowwise, W rowwise; dgrad: dy rowwise, W columnwise; wgrad: dy columnwise,
x columnwise) with the public ``GroupedTensor.quantize``, dequantize them and multiply in float64,
then add the bias (scaled by probs) in float64. The layer must agree to 1e-5 of ``|A| |B|^T``
(fp32 accumulation order) plus one output ulp for bf16 outputs.

Other properties checked bit for bit: grouped == one call per expert, pre-quantized (wire) MXFP8
inputs == their bf16 dequantization fed through the ordinary path, frozen weight / input give the
same remaining gradients, stochastic rounding is a pure function of the seed (and CPU == GPU).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import GroupedTensor, Recipe
from lowprec_moe.backends.numpy.fp import e2m1_to_f32, e4m3_to_f32, unpack_fp4

from conftest import assert_bytes_equal, to_host

BF16 = ml_dtypes.bfloat16
G, K, N = 4, 64, 32
SPLITS = (30, 0, 45, 25)  # M = 100: an empty expert, no split a multiple of 16 or 32
SEED = 1234
RTOL = 1e-5

RECIPES = {
    "bf16": Recipe.bf16(),
    "mxfp8-e4m3": Recipe.mxfp8(),
    "mxfp8-hybrid": Recipe.mxfp8(fp8_format="hybrid"),
    "nvfp4": Recipe.nvfp4(),  # 16x16 weight blocks, RHT (bf16 inputs) and SR on dy
    "nvfp4-row-scaled": Recipe.nvfp4(row_scaled_activation=True),
}
EXTRA_RECIPES = {
    "mxfp8-weight-2d": Recipe.mxfp8(weight_2d=True),
    "nvfp4-weight-1d": Recipe.nvfp4(weight_2d=False),
}
# SR draws its bits from (seed, member index, direction, element): a single-expert call is
# member 0, so grouped == per-expert holds bitwise only without SR (or for expert 0).
NO_SR_RECIPES = {
    "bf16": Recipe.bf16(),
    "mxfp8-e4m3": Recipe.mxfp8(),
    "mxfp8-hybrid": Recipe.mxfp8(fp8_format="hybrid"),
    "nvfp4-rht": Recipe.nvfp4(stochastic_rounding=False),
    "nvfp4-row-scaled": Recipe.nvfp4(row_scaled_activation=True),
}


# ============================================================================================
# data and helpers


def make_data(dtype=BF16, splits=SPLITS, seed=0):
    """Host arrays x [M, K], w [G, N, K], b [G, N], probs [M] (float32), dy [M, N]."""
    rng = np.random.default_rng(seed)
    m = int(sum(splits))
    g = len(splits)
    x = (rng.standard_normal((m, K)) * 10.0 ** rng.uniform(-1, 1, (m, 1))
         * 10.0 ** rng.uniform(-0.5, 0.5, (1, K)))
    w = rng.standard_normal((g, N, K)) * 0.125 * 10.0 ** rng.uniform(-0.5, 0.5, (g, 1, 1))
    b = rng.standard_normal((g, N))
    p = rng.uniform(0.1, 1.0, m)
    dy = rng.standard_normal((m, N)) * 10.0 ** rng.uniform(-1, 1, (m, 1))
    cast = lambda a: a.astype(np.float32).astype(dtype)  # noqa: E731
    return dict(x=cast(x), w=cast(w), b=cast(b), probs=p.astype(np.float32), dy=cast(dy))


def on(xp, d):
    """The arrays of ``d`` on ``xp``'s device."""
    return {k: (xp.asarray(v) if v is not None else None) for k, v in d.items()}


def offsets(splits):
    return np.concatenate([[0], np.cumsum(splits)]).astype(np.int64)


def forward_backward(xp, d, recipe, splits=SPLITS, *, bias=True, probs=True, seed=SEED, **kw):
    a = on(xp, d)
    y, ctx = lpm.grouped_linear_forward(a["x"], list(splits), a["w"], a["b"] if bias else None,
                                        recipe=recipe, probs=a["probs"] if probs else None,
                                        seed=seed, **kw)
    grads = lpm.grouped_linear_backward(a["dy"], ctx)
    return y, grads, ctx


def _ulp(v, dtype_name):
    mant, emin = {"bfloat16": (7, -126), "float16": (10, -14), "float32": (23, -126)}[dtype_name]
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -200)))
    return 2.0 ** (np.maximum(e, emin) - mant)


def assert_close(got, ref, bound, what, rtol=RTOL):
    """|got - ref| <= rtol * bound (+ one output ulp for bf16 / fp16 outputs)."""
    g = to_host(got)
    name = np.dtype(g.dtype).name
    g = g.astype(np.float64)
    assert g.shape == ref.shape, f"{what}: shape {g.shape} != {ref.shape}"
    assert np.isfinite(g).all(), f"{what}: non-finite values"
    tol = rtol * bound
    if name != "float32":
        tol = tol + _ulp(np.maximum(np.abs(ref), np.abs(g)), name)
    err = np.abs(g - ref)
    bad = err > tol
    if bad.any():
        i = np.unravel_index(int(np.argmax(err - tol)), err.shape)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements out of tolerance; "
                             f"worst at {i}: got {g[i]!r}, expected {ref[i]!r}, tol {tol[i]:.3g}")


def _rows(gt):
    return to_host(gt.dequantize("rowwise", dtype="float32")).astype(np.float64)


def _cols(gt, g):
    """Member g's stored columnwise copy as values ``[Mp, K]`` (padding rows kept).

    A Hadamard-transformed copy is *not* transformed back: NUMERICS §7 contracts the stored operands,
    and the transform cancels in ``dy^T x`` when both carry it.
    """
    q = gt.member(g)
    m, k = q.shape
    block = 16 if gt.format == "nvfp4" else 32
    mp = -(-m // block) * block
    q = q.replace(rht=False, shape=(mp, k))
    return to_host(lpm.dequantize(q, "columnwise", dtype="float32")).astype(np.float64)


def quantized_operands(xp, d, recipe, splits=SPLITS, seed=SEED, dy_fp8_dtype=None):
    """float64 operand values per NUMERICS §7: dict x_row [M,K], w_row [G,N,K], w_col [G,N,K],
    dy_row [M,N], and per expert x_col[g] [Mp,K], dy_col[g] [Mp,N]."""
    a = on(xp, d)
    x, w, dy = a["x"], a["w"], a["dy"]
    g_count, n, k = w.shape
    w2 = w.reshape(g_count * n, k)
    wsplits = [n] * g_count
    if not recipe.quantized:
        h = {key: to_host(v).astype(np.float64) for key, v in (("x", x), ("w", w), ("dy", dy))}
        offs = offsets(splits)
        sl = [slice(offs[g], offs[g + 1]) for g in range(g_count)]
        return dict(x_row=h["x"], w_row=h["w"], w_col=h["w"], dy_row=h["dy"],
                    x_col=[h["x"][s] for s in sl], dy_col=[h["dy"][s] for s in sl])
    if recipe.name == "mxfp8":
        dy_fp8 = dy_fp8_dtype or ("e5m2" if recipe.fp8_format == "hybrid" else "e4m3")
        xq = GroupedTensor.quantize(x, splits, "mxfp8", columnwise=True, fp8_dtype="e4m3")
        wq = GroupedTensor.quantize(w2, wsplits, "mxfp8", columnwise=True,
                                    block_2d=recipe.weight_2d, fp8_dtype="e4m3")
        dyq = GroupedTensor.quantize(dy, splits, "mxfp8", columnwise=True, fp8_dtype=dy_fp8)
    else:
        rht = recipe.rht and np.dtype(d["x"].dtype) == np.dtype(BF16)
        xq = GroupedTensor.quantize(x, splits, "nvfp4", columnwise=True,
                                    row_scaled=recipe.row_scaled_activation, rht=rht)
        wq = GroupedTensor.quantize(w2, wsplits, "nvfp4", columnwise=True,
                                    block_2d=recipe.weight_2d)
        dyq = GroupedTensor.quantize(dy, splits, "nvfp4", columnwise=True, rht=rht,
                                     stochastic_rounding=recipe.stochastic_rounding, seed=seed)
    w_col = np.stack([_cols(wq, g) for g in range(g_count)])
    return dict(x_row=_rows(xq), w_row=_rows(wq).reshape(g_count, n, k), w_col=w_col,
                dy_row=_rows(dyq), x_col=[_cols(xq, g) for g in range(g_count)],
                dy_col=[_cols(dyq, g) for g in range(g_count)])


def emulate(ops, d, splits=SPLITS, *, bias=True, probs=True):
    """float64 (value, bound) pairs of y, dx, dW, dbias, dprobs from the operand values."""
    offs = offsets(splits)
    g_count, n, k = ops["w_row"].shape
    m = int(offs[-1])
    b = d["b"].astype(np.float64) if bias else np.zeros((g_count, n))
    p = d["probs"].astype(np.float64) if probs else np.ones(m)
    dy_hp = d["dy"].astype(np.float64)
    y, y_b = np.zeros((m, n)), np.zeros((m, n))
    dx, dx_b = np.zeros((m, k)), np.zeros((m, k))
    dw, dw_b = np.zeros((g_count, n, k)), np.zeros((g_count, n, k))
    db, db_b = np.zeros((g_count, n)), np.zeros((g_count, n))
    for g in range(g_count):
        s = slice(offs[g], offs[g + 1])
        xr, wr, wc, dyr = ops["x_row"][s], ops["w_row"][g], ops["w_col"][g], ops["dy_row"][s]
        bp = p[s, None] * b[g][None, :]
        y[s] = xr @ wr.T + bp
        y_b[s] = np.abs(xr) @ np.abs(wr).T + np.abs(bp)
        dx[s] = dyr @ wc
        dx_b[s] = np.abs(dyr) @ np.abs(wc)
        if offs[g + 1] > offs[g]:
            dyc, xc = ops["dy_col"][g], ops["x_col"][g]
            dw[g] = dyc.T @ xc
            dw_b[g] = np.abs(dyc).T @ np.abs(xc)
        db[g] = (dy_hp[s] * p[s, None]).sum(axis=0)
        db_b[g] = (np.abs(dy_hp[s]) * p[s, None]).sum(axis=0)
    rows_b = b[np.repeat(np.arange(g_count), np.diff(offs))]
    dp = (dy_hp * rows_b).sum(axis=1)
    dp_b = (np.abs(dy_hp) * np.abs(rows_b)).sum(axis=1)
    return dict(y=(y, y_b), dx=(dx, dx_b), dweight=(dw, dw_b), dbias=(db, db_b),
                dprobs=(dp, dp_b))


# ============================================================================================
# numerics against NUMERICS §7 emulation


@pytest.mark.parametrize("dtype", [BF16, np.float32], ids=["bf16-in", "fp32-in"])
@pytest.mark.parametrize("rname", list(RECIPES) + list(EXTRA_RECIPES))
def test_matches_emulation(xp, rname, dtype):
    recipe = {**RECIPES, **EXTRA_RECIPES}[rname]
    d = make_data(dtype)
    y, grads, _ = forward_backward(xp, d, recipe)
    ref = emulate(quantized_operands(xp, d, recipe), d)

    dn = np.dtype(dtype).name
    assert np.dtype(y.dtype).name == dn and np.dtype(grads.dx.dtype).name == dn
    assert np.dtype(grads.dweight.dtype).name == dn and np.dtype(grads.dbias.dtype).name == dn
    assert grads.dprobs.dtype == np.float32
    for name in ("y", "dx", "dweight", "dbias", "dprobs"):
        got = y if name == "y" else getattr(grads, name)
        assert_close(got, *ref[name], what=f"{rname} {name}")

    # empty expert 1: zero dW and dbias, exactly
    assert not to_host(grads.dweight)[1].astype(np.float32).any()
    assert not to_host(grads.dbias)[1].astype(np.float32).any()

    if recipe.quantized:  # the emulation is not the unquantized product (the test has teeth)
        hp = emulate(quantized_operands(xp, d, Recipe.bf16()), d)
        for name in ("y", "dx", "dweight"):
            got = to_host(y if name == "y" else getattr(grads, name)).astype(np.float64)
            rel = np.linalg.norm(got - hp[name][0]) / np.linalg.norm(hp[name][0])
            assert rel > 1e-3, f"{rname} {name}: no quantization error ({rel:.2e})"


@pytest.mark.parametrize("rname", ["nvfp4", "mxfp8-e4m3"])
def test_without_bias_and_probs(xp, rname):
    recipe = RECIPES[rname]
    d = make_data()
    y, grads, _ = forward_backward(xp, d, recipe, bias=False, probs=False)
    ref = emulate(quantized_operands(xp, d, recipe), d, bias=False, probs=False)
    assert grads.dbias is None and grads.dprobs is None
    for name in ("y", "dx", "dweight"):
        got = y if name == "y" else getattr(grads, name)
        assert_close(got, *ref[name], what=f"{rname} {name}")


def test_probs_without_bias(xp):
    """probs only scale the bias: without one, y ignores them and dprobs is zero."""
    d = make_data()
    recipe = Recipe.mxfp8()
    y0, g0, _ = forward_backward(xp, d, recipe, bias=False, probs=False)
    y1, g1, _ = forward_backward(xp, d, recipe, bias=False, probs=True)
    assert_bytes_equal(y1, y0, "y")
    assert_bytes_equal(g1.dx, g0.dx, "dx")
    assert g1.dbias is None
    assert g1.dprobs.shape == (sum(SPLITS),) and not to_host(g1.dprobs).any()


def test_rank3_input_is_flattened(xp):
    d = make_data()
    a = on(xp, d)
    recipe = Recipe.mxfp8()
    y2, _ = lpm.grouped_linear_forward(a["x"], SPLITS, a["w"], a["b"], recipe=recipe)
    y3, _ = lpm.grouped_linear_forward(a["x"].reshape(2, 50, K), SPLITS, a["w"], a["b"],
                                       recipe=recipe)
    assert y3.shape == (100, N)
    assert_bytes_equal(y3, y2, "y")


def test_hybrid_quantizes_dy_as_e5m2(xp, monkeypatch):
    """"hybrid": x and W in E4M3, dy (both copies) in E5M2 -- checked on the quantize calls and on
    the numbers (dx / dW match the E5M2 emulation, not the E4M3 one)."""
    calls = []

    def spying(orig):
        def spy(x, splits, format, **kw):
            calls.append((tuple(x.shape), format, kw.get("fp8_dtype", "e4m3"),
                          kw.get("rowwise", True), kw.get("columnwise", False)))
            return orig(x, splits, format, **kw)
        return staticmethod(spy)

    d = make_data()
    a = on(xp, d)
    # dy (with a bias) goes through quantize_with_column_sums, x and W through quantize
    for name in ("quantize", "quantize_with_column_sums"):
        monkeypatch.setattr(GroupedTensor, name, spying(getattr(GroupedTensor, name)))
    y, ctx = lpm.grouped_linear_forward(a["x"], SPLITS, a["w"], a["b"],
                                        recipe=Recipe.mxfp8(fp8_format="hybrid"))
    fwd = list(calls)
    grads = lpm.grouped_linear_backward(a["dy"], ctx)
    bwd = calls[len(fwd):]
    monkeypatch.undo()

    assert {c[2] for c in fwd} == {"e4m3"} and len(fwd) == 2  # x and W
    assert len(bwd) == 1 and bwd[0][0] == (sum(SPLITS), N)
    assert bwd[0][1:] == ("mxfp8", "e5m2", True, True)

    ops5 = quantized_operands(xp, d, Recipe.mxfp8("hybrid"))
    ops4 = quantized_operands(xp, d, Recipe.mxfp8("hybrid"), dy_fp8_dtype="e4m3")
    ref5, ref4 = emulate(ops5, d), emulate(ops4, d)
    for name in ("dx", "dweight"):
        got = getattr(grads, name)
        assert_close(got, *ref5[name], what=f"hybrid {name}")
        with pytest.raises(AssertionError):
            assert_close(got, *ref4[name], what=f"hybrid {name} vs e4m3")


# ============================================================================================
# row-scaled NVFP4 wgrad


def _nvfp4_values(data, scale):
    """e2m1(code) * e4m3(block scale), float64 ``[R, 2 * data.shape[1]]`` (no global factor)."""
    data, scale = to_host(data), to_host(scale)
    v = e2m1_to_f32(unpack_fp4(data)).reshape(data.shape[0], -1, 16).astype(np.float64)
    return (v * e4m3_to_f32(scale).astype(np.float64)[:, :, None]).reshape(data.shape[0], -1)


def test_row_scaled_wgrad_is_nvfp4(xp):
    """wgrad with row-scaled activations runs in NVFP4: dy^T x of the stored columnwise codes,
    then column k scaled by amax_xcol[k] * amax_dy (NUMERICS §7), never a high-precision fallback."""
    d = make_data(np.float32)
    recipe = Recipe.nvfp4(row_scaled_activation=True)
    _, grads, _ = forward_backward(xp, d, recipe)
    a = on(xp, d)
    xq = GroupedTensor.quantize(a["x"], SPLITS, "nvfp4", rowwise=False, columnwise=True,
                                row_scaled=True)
    dyq = GroupedTensor.quantize(a["dy"], SPLITS, "nvfp4", rowwise=False, columnwise=True)
    inv = np.float32(1.0 / 7225344.0)
    offs = offsets(SPLITS)
    got = to_host(grads.dweight).astype(np.float64)
    for g in range(G):
        if SPLITS[g] == 0:
            assert not got[g].any()
            continue
        xm, dm = xq.member(g), dyq.member(g)
        A = _nvfp4_values(dm.columnwise_data, dm.columnwise_scale)  # [N, Mp]
        B = _nvfp4_values(xm.columnwise_data, xm.columnwise_scale)  # [K, Mp]
        amax_dy = to_host(dm.amax_columnwise).astype(np.float32)  # (1,)
        amax_xcol = to_host(xm.amax_columnwise).astype(np.float32)  # (K,)
        assert amax_xcol.shape == (K,)
        with np.errstate(under="ignore"):
            acc = (A @ B.T).astype(np.float32)
            t = (acc * inv).astype(np.float32)
            emul = (t * (amax_dy[None, :] * amax_xcol[None, :]).astype(np.float32))
        fac = (np.float64(inv) * amax_dy.astype(np.float64) * amax_xcol.astype(np.float64))
        bound = (np.abs(A) @ np.abs(B).T) * fac[None, :]
        assert_close(got[g].astype(np.float32), emul.astype(np.float64), bound,
                     what=f"row-scaled wgrad expert {g}")
        # measurably different from the unquantized product
        s = slice(offs[g], offs[g + 1])
        exact = d["dy"][s].astype(np.float64).T @ d["x"][s].astype(np.float64)
        rel = np.linalg.norm(got[g] - exact) / np.linalg.norm(exact)
        assert 1e-2 < rel < 0.5, f"expert {g}: relative error {rel:.3g} vs unquantized dy^T x"


# ============================================================================================
# grouped == per expert


@pytest.mark.parametrize("rname", list(NO_SR_RECIPES))
def test_grouped_equals_per_expert(xp, rname):
    recipe = NO_SR_RECIPES[rname]
    d = make_data()
    y, grads, _ = forward_backward(xp, d, recipe)
    a = on(xp, d)
    offs = offsets(SPLITS)
    for g in range(G):
        lo, hi = int(offs[g]), int(offs[g + 1])
        if hi == lo:
            continue
        yg, ctx = lpm.grouped_linear_forward(a["x"][lo:hi], [hi - lo], a["w"][g:g + 1],
                                             a["b"][g:g + 1], recipe=recipe,
                                             probs=a["probs"][lo:hi], seed=SEED)
        gg = lpm.grouped_linear_backward(a["dy"][lo:hi], ctx)
        what = f"{rname} expert {g}"
        assert_bytes_equal(yg, y[lo:hi], f"{what} y")
        assert_bytes_equal(gg.dx, grads.dx[lo:hi], f"{what} dx")
        assert_bytes_equal(gg.dweight[0], grads.dweight[g], f"{what} dweight")
        assert_bytes_equal(gg.dbias[0], grads.dbias[g], f"{what} dbias")
        assert_bytes_equal(gg.dprobs, grads.dprobs[lo:hi], f"{what} dprobs")


def test_grouped_equals_per_expert_sr_member0(xp):
    """With stochastic rounding only expert 0 shares its random stream (member index 0) with a
    single-expert call; the other experts draw different bits by design."""
    recipe = Recipe.nvfp4()
    d = make_data()
    _, grads, _ = forward_backward(xp, d, recipe)
    a = on(xp, d)
    m0 = SPLITS[0]
    _, ctx = lpm.grouped_linear_forward(a["x"][:m0], [m0], a["w"][:1], a["b"][:1],
                                        recipe=recipe, probs=a["probs"][:m0], seed=SEED)
    gg = lpm.grouped_linear_backward(a["dy"][:m0], ctx)
    assert_bytes_equal(gg.dx, grads.dx[:m0], "dx")
    assert_bytes_equal(gg.dweight[0], grads.dweight[0], "dweight")


# ============================================================================================
# demo section


def test_linear_demo_cpu():
    import io

    from lowprec_moe.demo import run_linear_demo

    buf = io.StringIO()
    rows = run_linear_demo("cpu", experts=4, tokens=96, k=64, n=32, repeats=1, file=buf)
    text = buf.getvalue()
    assert "GroupedLinear forward + backward on cpu" in text
    by = {r["recipe"]: r for r in rows}
    assert len(rows) == 5 and all(r["error"] is None for r in rows)
    assert by["bf16"]["err_y"] < 1e-2
    assert by["bf16"]["err_y"] < by["mxfp8 e4m3"]["err_y"] < by["nvfp4 (RHT + SR)"]["err_y"] < 0.5
    assert by["mxfp8 e4m3"]["err_dx"] < by["mxfp8 hybrid (dy e5m2)"]["err_dx"]
    with pytest.raises(ValueError, match="k=48"):
        run_linear_demo("cpu", k=48, file=buf)
