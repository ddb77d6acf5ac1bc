"""GroupedLinear input and state paths, both backends: pre-quantized MXFP8 (wire) inputs equal
their bf16 dequantization fed through the ordinary path, what the context keeps, frozen weight /
input, empty experts, and stochastic rounding as a pure function of the seed.
"""

from __future__ import annotations

import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import GroupedTensor, Recipe

from conftest import assert_bytes_equal, assert_quantized_equal, to_host
from test_linear import (BF16, RECIPES, SEED, SPLITS, assert_close, emulate, forward_backward,
                         make_data, on, quantized_operands)


# ============================================================================================
# pre-quantized MXFP8 (wire format)


@pytest.mark.parametrize("which", ["x", "dy", "both"])
@pytest.mark.parametrize("fp8_format", ["e4m3", "hybrid"])
@pytest.mark.parametrize("bias_dtype", ["bf16", "fp32"])  # an fp32 dbias shows every bit
def test_wire_equals_dequantized(xp, fp8_format, which, bias_dtype):
    recipe = Recipe.mxfp8(fp8_format=fp8_format)
    d = make_data(BF16)
    if bias_dtype == "fp32":
        d["b"] = d["b"].astype(np.float32)
    a = on(xp, d)
    x, dy = a["x"], a["dy"]
    x_in = x_plain = x
    dy_in = dy_plain = dy
    if which in ("x", "both"):
        full = GroupedTensor.quantize(x, SPLITS, "mxfp8")
        x_in = GroupedTensor.from_mxfp8_rowwise(full.rowwise_data, full.rowwise_scale, SPLITS)
        x_plain = x_in.dequantize(dtype="bfloat16")
    if which in ("dy", "both"):
        f8 = recipe.dy_fp8_dtype
        full = GroupedTensor.quantize(dy, SPLITS, "mxfp8", fp8_dtype=f8)
        dy_in = GroupedTensor.from_mxfp8_rowwise(full.rowwise_data, full.rowwise_scale, SPLITS,
                                                 fp8_dtype=f8)
        dy_plain = dy_in.dequantize(dtype="bfloat16")

    kw = dict(recipe=recipe, probs=a["probs"], seed=SEED)
    y_w, ctx_w = lpm.grouped_linear_forward(x_in, None if which != "dy" else SPLITS, a["w"],
                                            a["b"], **kw)
    g_w = lpm.grouped_linear_backward(dy_in, ctx_w)
    y_p, ctx_p = lpm.grouped_linear_forward(x_plain, SPLITS, a["w"], a["b"], **kw)
    g_p = lpm.grouped_linear_backward(dy_plain, ctx_p)
    assert np.dtype(y_w.dtype) == np.dtype(BF16) and np.dtype(g_w.dx.dtype) == np.dtype(BF16)
    assert_bytes_equal(y_w, y_p, "y")
    for name in ("dx", "dweight", "dbias", "dprobs"):
        assert_bytes_equal(getattr(g_w, name), getattr(g_p, name), name)


def test_wire_x_keeps_columnwise_only(xp):
    d = make_data(BF16)
    a = on(xp, d)
    full = GroupedTensor.quantize(a["x"], SPLITS, "mxfp8")
    wire = GroupedTensor.from_mxfp8_rowwise(full.rowwise_data, full.rowwise_scale, SPLITS)
    _, ctx = lpm.grouped_linear_forward(wire, SPLITS, a["w"], recipe=Recipe.mxfp8())
    expect = GroupedTensor.quantize(wire.dequantize(dtype="bfloat16"), SPLITS, "mxfp8",
                                    rowwise=False, columnwise=True)
    assert ctx.x_saved.rowwise_data is None
    assert_bytes_equal(ctx.x_saved.columnwise_data, expect.columnwise_data, "x columnwise")
    assert_bytes_equal(ctx.x_saved.columnwise_scale, expect.columnwise_scale, "x col scale")


# ============================================================================================
# what the context keeps


@pytest.mark.parametrize("rname", list(RECIPES))
def test_dbias_same_bits_whatever_needs_a_gradient(xp, rname):
    """dbias is summed in the order of dy's quantize pass whether or not that pass runs (it
    does not when neither x nor W needs a gradient)."""
    recipe = RECIPES[rname]
    d = make_data()
    d["b"] = d["b"].astype(np.float32)
    _, full, _ = forward_backward(xp, d, recipe)
    for kw in (dict(weight_requires_grad=False), dict(input_requires_grad=False),
               dict(input_requires_grad=False, weight_requires_grad=False)):
        _, grads, _ = forward_backward(xp, d, recipe, **kw)
        assert_bytes_equal(grads.dbias, full.dbias, f"dbias with {kw}")


@pytest.mark.parametrize("rname", list(RECIPES))
def test_frozen_weight_and_input(xp, rname):
    recipe = RECIPES[rname]
    d = make_data()
    y, full, ctx = forward_backward(xp, d, recipe)
    assert ctx.x_saved is None and ctx.w_saved is None  # released by the backward
    y1, frozen, ctx1 = forward_backward(xp, d, recipe, weight_requires_grad=False)
    assert frozen.dweight is None
    assert_bytes_equal(y1, y, "y (frozen weight)")
    assert_bytes_equal(frozen.dx, full.dx, "dx (frozen weight)")
    assert_bytes_equal(frozen.dbias, full.dbias, "dbias (frozen weight)")

    y2, no_dx, _ = forward_backward(xp, d, recipe, input_requires_grad=False)
    assert no_dx.dx is None
    assert_bytes_equal(y2, y, "y (no input grad)")
    assert_bytes_equal(no_dx.dweight, full.dweight, "dweight (no input grad)")
    assert_bytes_equal(no_dx.dprobs, full.dprobs, "dprobs (no input grad)")


@pytest.mark.parametrize("rname", list(RECIPES))
def test_context_contents(xp, rname):
    recipe = RECIPES[rname]
    a = on(xp, make_data())

    def fwd(**kw):
        return lpm.grouped_linear_forward(a["x"], SPLITS, a["w"], a["b"], recipe=recipe, **kw)[1]

    ctx = fwd()
    assert ctx.x_saved is not None and ctx.w_saved is not None
    if recipe.quantized:
        assert ctx.x_saved.rowwise_data is None and ctx.x_saved.columnwise_data is not None
        assert ctx.w_saved.rowwise_data is None and ctx.w_saved.columnwise_data is not None
        assert ctx.x_saved.amax_rowwise is None
    frozen = fwd(weight_requires_grad=False)
    assert frozen.x_saved is None and frozen.w_saved is not None
    no_dx = fwd(input_requires_grad=False)
    assert no_dx.w_saved is None and no_dx.x_saved is not None
    neither = fwd(input_requires_grad=False, weight_requires_grad=False)
    assert neither.x_saved is None and neither.w_saved is None
    grads = lpm.grouped_linear_backward(a["dy"], neither)
    assert grads.dx is None and grads.dweight is None and grads.dbias is not None


@pytest.mark.parametrize("rname", list(RECIPES))
@pytest.mark.parametrize("splits", [(0, 40, 0, 60), (0, 0, 100, 0), (0, 0, 0, 0)],
                         ids=["alternate", "one", "none"])
def test_empty_experts(xp, rname, splits):
    recipe = RECIPES[rname]
    d = make_data(splits=splits)
    y, grads, _ = forward_backward(xp, d, recipe, splits=splits)
    ref = emulate(quantized_operands(xp, d, recipe, splits=splits), d, splits=splits)
    dw, db = to_host(grads.dweight).astype(np.float32), to_host(grads.dbias).astype(np.float32)
    for g, s in enumerate(splits):
        if s == 0:
            assert not dw[g].any() and not db[g].any(), f"expert {g}"
    assert_close(y, *ref["y"], what="y")
    assert_close(grads.dweight, *ref["dweight"], what="dweight")


# ============================================================================================
# stochastic rounding


def _dy_quantizations(monkeypatch, xp, d, seed):
    """Run forward + backward with the nvfp4 recipe; return (grads, the quantized dy)."""
    got = []

    def spying(orig):
        def spy(x, splits, format, **kw):
            out = orig(x, splits, format, **kw)
            if kw.get("stochastic_rounding"):  # (dy with a bias: a (tensor, sums) pair)
                got.append(out[0] if isinstance(out, tuple) else out)
            return out
        return staticmethod(spy)

    for name in ("quantize", "quantize_with_column_sums"):
        monkeypatch.setattr(GroupedTensor, name, spying(getattr(GroupedTensor, name)))
    try:
        _, grads, _ = forward_backward(xp, d, Recipe.nvfp4(), seed=seed)
    finally:
        monkeypatch.undo()
    assert len(got) == 1
    return grads, got[0]


def test_stochastic_rounding_reproducible(xp, monkeypatch):
    d = make_data()
    g1, q1 = _dy_quantizations(monkeypatch, xp, d, 7)
    g2, q2 = _dy_quantizations(monkeypatch, xp, d, 7)
    assert_bytes_equal(g1.dx, g2.dx, "dx")
    assert_bytes_equal(g1.dweight, g2.dweight, "dweight")
    assert_quantized_equal(q1, q2, "dy")
    g3, q3 = _dy_quantizations(monkeypatch, xp, d, 8)
    assert not np.array_equal(to_host(q3.rowwise_data), to_host(q1.rowwise_data))
    assert not np.array_equal(to_host(g3.dx), to_host(g1.dx))
    # CPU == GPU: the random bits are a function of (seed, member, direction, element)
    gc, qc = _dy_quantizations(monkeypatch, np, d, 7)
    assert_quantized_equal(q1, qc, "dy (backend vs NumPy)")
    ref = emulate(quantized_operands(np, d, Recipe.nvfp4(), seed=7), d)
    for name in ("dx", "dweight"):
        assert_close(getattr(g1, name), *ref[name], what=name)


def test_stochastic_rounding_seed_default_and_override(xp):
    d = make_data()
    a = on(xp, d)
    recipe = Recipe.nvfp4()
    _, ctx = lpm.grouped_linear_forward(a["x"], SPLITS, a["w"], recipe=recipe, seed=5)
    g_fwd_seed = lpm.grouped_linear_backward(a["dy"], ctx)
    _, ctx = lpm.grouped_linear_forward(a["x"], SPLITS, a["w"], recipe=recipe)
    g_override = lpm.grouped_linear_backward(a["dy"], ctx, seed=5)
    assert_bytes_equal(g_override.dx, g_fwd_seed.dx, "dx")
    assert_bytes_equal(g_override.dweight, g_fwd_seed.dweight, "dweight")


