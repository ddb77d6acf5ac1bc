"""GroupedMLP input and state paths, both backends: pre-quantized MXFP8 (wire) x / dy equal their
bf16 dequantization, what the context keeps, frozen weights, empty experts, grouped == per
expert, fused == unfused activation kernels, stochastic-rounding seeds, rank-3 inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import GroupedTensor, Recipe
from lowprec_moe.layers.activations import make_activation

from conftest import assert_bytes_equal, to_host
from test_mlp import (BF16, F, G, GRADS, K, NO_SR_RECIPES, QUANT_RECIPES, SEED, SPLITS, analytic,
                      make_data, offsets, on, run)


# ============================================================================================
# pre-quantized MXFP8 (wire) inputs


def _wire(xp, t, fp8_dtype="e4m3"):
    full = GroupedTensor.quantize(xp.asarray(t), SPLITS, "mxfp8", fp8_dtype=fp8_dtype)
    return GroupedTensor.from_mxfp8_rowwise(full.rowwise_data, full.rowwise_scale, SPLITS,
                                            fp8_dtype=fp8_dtype)


@pytest.mark.parametrize("which", ["x", "dy", "both"])
@pytest.mark.parametrize("fp8_format", ["e4m3", "hybrid"])
@pytest.mark.parametrize("bias_dtype", ["bf16", "fp32"])  # an fp32 dbias shows every bit
def test_wire_equals_dequantized(xp, fp8_format, which, bias_dtype):
    recipe = Recipe.mxfp8(fp8_format=fp8_format)
    act = make_activation("swiglu", 32)
    d = make_data(act, dtype=BF16)
    if bias_dtype == "fp32":
        d["b2"] = d["b2"].astype(np.float32)
    a = on(xp, d)
    x_in = x_plain = a["x"]
    dy_in = dy_plain = a["dy"]
    if which in ("x", "both"):
        x_in = _wire(xp, d["x"])
        x_plain = x_in.dequantize(dtype="bfloat16")
    if which in ("dy", "both"):
        dy_in = _wire(xp, d["dy"], recipe.dy_fp8_dtype)
        dy_plain = dy_in.dequantize(dtype="bfloat16")
    kw = dict(probs=a["probs"], activation="swiglu", glu_interleave=32, recipe=recipe, seed=SEED)
    y_w, ctx_w = lpm.grouped_mlp_forward(x_in, None if which != "dy" else SPLITS, a["w1"],
                                         a["w2"], a["b1"], a["b2"], **kw)
    g_w = lpm.grouped_mlp_backward(dy_in, ctx_w)
    y_p, ctx_p = lpm.grouped_mlp_forward(x_plain, SPLITS, a["w1"], a["w2"], a["b1"], a["b2"],
                                         **kw)
    g_p = lpm.grouped_mlp_backward(dy_plain, ctx_p)
    assert np.dtype(y_w.dtype) == np.dtype(BF16) and np.dtype(g_w.dx.dtype) == np.dtype(BF16)
    assert_bytes_equal(y_w, y_p, "y")
    for name in GRADS:
        assert_bytes_equal(getattr(g_w, name), getattr(g_p, name), name)


def test_wire_x_keeps_columnwise_only(xp):
    act = make_activation("swiglu")
    d = make_data(act, dtype=BF16)
    a = on(xp, d)
    wire = _wire(xp, d["x"])
    _, ctx = lpm.grouped_mlp_forward(wire, SPLITS, a["w1"], a["w2"], recipe=Recipe.mxfp8())
    expect = GroupedTensor.quantize(wire.dequantize(dtype="bfloat16"), SPLITS, "mxfp8",
                                    rowwise=False, columnwise=True)
    assert ctx.x_saved.rowwise_data is None and ctx.dtype == "bfloat16"
    assert_bytes_equal(ctx.x_saved.columnwise_data, expect.columnwise_data, "x columnwise")


# ============================================================================================
# what the context keeps; frozen weights; empty experts; grouped == per expert


RECIPES = {"bf16": Recipe.bf16(), **QUANT_RECIPES}


@pytest.mark.parametrize("rname", list(RECIPES))
def test_frozen_weights_and_input(xp, rname):
    recipe = RECIPES[rname]
    act = make_activation("swiglu")
    d = make_data(act, dtype=BF16)
    y, full, ctx = run(xp, d, recipe, act)
    assert ctx.x_saved is None and ctx.h is None and ctx.z_saved is None  # released
    y1, frozen, ctx1 = run(xp, d, recipe, act, weight_requires_grad=False)
    assert frozen.dfc1_weight is None and frozen.dfc2_weight is None
    assert_bytes_equal(y1, y, "y (frozen)")
    for name in ("dx", "dfc1_bias", "dfc2_bias", "dprobs"):
        assert_bytes_equal(getattr(frozen, name), getattr(full, name), f"{name} (frozen)")
    y2, no_dx, _ = run(xp, d, recipe, act, input_requires_grad=False)
    assert no_dx.dx is None
    assert_bytes_equal(y2, y, "y (no input grad)")
    for name in ("dfc1_weight", "dfc1_bias", "dfc2_weight", "dfc2_bias", "dprobs"):
        assert_bytes_equal(getattr(no_dx, name), getattr(full, name), f"{name} (no dx)")


@pytest.mark.parametrize("rname", ["bf16", "mxfp8-e4m3", "nvfp4"])
def test_context_contents(xp, rname):
    recipe = RECIPES[rname]
    act = make_activation("swiglu")
    a = on(xp, make_data(act, dtype=BF16))

    def fwd(bias=True, probs=True, **kw):
        return lpm.grouped_mlp_forward(a["x"], SPLITS, a["w1"], a["w2"],
                                       a["b1"] if bias else None, a["b2"] if bias else None,
                                       probs=a["probs"] if probs else None, recipe=recipe,
                                       **kw)[1]

    ctx = fwd()
    assert all(t is not None for t in (ctx.x_saved, ctx.w1_saved, ctx.h, ctx.z_saved,
                                       ctx.w2_saved))
    assert np.dtype(ctx.h.dtype) == np.dtype(BF16) and ctx.h.shape == (sum(SPLITS), 2 * F)
    if recipe.quantized:
        for t in (ctx.x_saved, ctx.w1_saved, ctx.z_saved, ctx.w2_saved):
            assert t.rowwise_data is None and t.columnwise_data is not None
    frozen = fwd(weight_requires_grad=False)
    assert frozen.x_saved is None and frozen.z_saved is None and frozen.w1_saved is not None
    no_dx = fwd(input_requires_grad=False)
    assert no_dx.w1_saved is None and no_dx.x_saved is not None and no_dx.h is not None
    # nothing that needs dz: no h, no fc2 dgrad operand
    inert = fwd(bias=False, probs=False, input_requires_grad=False, weight_requires_grad=False)
    assert inert.h is None and inert.w2_saved is None and inert.w1_saved is None
    grads = lpm.grouped_mlp_backward(a["dy"], inert)
    assert all(getattr(grads, n) is None for n in GRADS)
    # probs only: dprobs still needs dz and h
    only_p = fwd(bias=False, input_requires_grad=False, weight_requires_grad=False)
    assert only_p.h is not None and only_p.w2_saved is not None
    grads = lpm.grouped_mlp_backward(a["dy"], only_p)
    assert grads.dprobs is not None and grads.dx is None


@pytest.mark.parametrize("rname", ["bf16", "mxfp8-e4m3", "nvfp4"])
@pytest.mark.parametrize("splits", [(0, 40, 57), (0, 97, 0), (0, 0, 0)],
                         ids=["first-empty", "one", "none"])
def test_empty_experts(xp, rname, splits):
    recipe = RECIPES[rname]
    act = make_activation("clamped_swiglu")
    d = make_data(act, dtype=BF16, splits=splits)
    y, grads, _ = run(xp, d, recipe, act, splits=splits)
    assert y.shape == (sum(splits), K)
    for name in ("dfc1_weight", "dfc1_bias", "dfc2_weight", "dfc2_bias"):
        got = to_host(getattr(grads, name)).astype(np.float32)
        for g, s in enumerate(splits):
            if s == 0:
                assert not got[g].any(), f"{name} expert {g}"
    if sum(splits):
        ref = analytic(d, act, splits)
        rel = np.linalg.norm(to_host(y).astype(np.float64) - ref["y"]) / np.linalg.norm(ref["y"])
        assert rel < 0.35


@pytest.mark.parametrize("rname", list(NO_SR_RECIPES))
def test_grouped_equals_per_expert(xp, rname):
    recipe = NO_SR_RECIPES[rname]
    act = make_activation("swiglu", 32)
    d = make_data(act, dtype=BF16)
    y, grads, _ = run(xp, d, recipe, act)
    a = on(xp, d)
    offs = offsets(SPLITS)
    for g in range(G):
        lo, hi = int(offs[g]), int(offs[g + 1])
        if hi == lo:
            continue
        yg, ctx = lpm.grouped_mlp_forward(a["x"][lo:hi], [hi - lo], a["w1"][g:g + 1],
                                          a["w2"][g:g + 1], a["b1"][g:g + 1], a["b2"][g:g + 1],
                                          probs=a["probs"][lo:hi], glu_interleave=32,
                                          recipe=recipe, seed=SEED)
        gg = lpm.grouped_mlp_backward(a["dy"][lo:hi], ctx)
        what = f"{rname} expert {g}"
        assert_bytes_equal(yg, y[lo:hi], f"{what} y")
        assert_bytes_equal(gg.dx, grads.dx[lo:hi], f"{what} dx")
        assert_bytes_equal(gg.dprobs, grads.dprobs[lo:hi], f"{what} dprobs")
        for name in ("dfc1_weight", "dfc1_bias", "dfc2_weight", "dfc2_bias"):
            assert_bytes_equal(getattr(gg, name)[0], getattr(grads, name)[g], f"{what} {name}")


@pytest.mark.parametrize("rname", ["bf16", "mxfp8-e4m3", "mxfp8-hybrid", "nvfp4"])
@pytest.mark.parametrize("act", [("swiglu", None), ("clamped_swiglu", 32), ("srelu", None)],
                         ids=lambda a: f"{a[0]}-il{a[1]}")
def test_fused_equals_unfused(xp, rname, act):
    """The fused activation + quantize kernels give the unfused chain's bytes (GPU; on the CPU
    both are one code path)."""
    recipe = RECIPES[rname]
    act = make_activation(*act)
    d = make_data(act, dtype=BF16)
    y0, g0, _ = run(xp, d, recipe, act, fused=False)
    y1, g1, _ = run(xp, d, recipe, act, fused=True)
    assert_bytes_equal(y1, y0, "y")
    for name in GRADS:
        assert_bytes_equal(getattr(g1, name), getattr(g0, name), name)


def test_stochastic_rounding_seeds(xp):
    act = make_activation("swiglu")
    d = make_data(act, dtype=BF16)
    _, g1, _ = run(xp, d, Recipe.nvfp4(), act, seed=5)
    _, g2, _ = run(xp, d, Recipe.nvfp4(), act, seed=5)
    _, g3, _ = run(xp, d, Recipe.nvfp4(), act, seed=6)
    for name in ("dx", "dfc1_weight", "dfc2_weight"):
        assert_bytes_equal(getattr(g1, name), getattr(g2, name), name)
        assert not np.array_equal(to_host(getattr(g1, name)), to_host(getattr(g3, name)))
    a = on(xp, d)
    _, ctx = lpm.grouped_mlp_forward(a["x"], SPLITS, a["w1"], a["w2"], recipe=Recipe.nvfp4(),
                                     seed=5)
    g_default = lpm.grouped_mlp_backward(a["dy"], ctx)
    _, ctx = lpm.grouped_mlp_forward(a["x"], SPLITS, a["w1"], a["w2"], recipe=Recipe.nvfp4())
    g_override = lpm.grouped_mlp_backward(a["dy"], ctx, seed=5)
    assert_bytes_equal(g_override.dx, g_default.dx, "dx")


def test_rank3_input_is_flattened(xp):
    act = make_activation("swiglu")
    d = make_data(act, splits=(40, 0, 56))
    a = on(xp, d)
    y2, _ = lpm.grouped_mlp_forward(a["x"], (40, 0, 56), a["w1"], a["w2"], recipe=Recipe.mxfp8())
    y3, _ = lpm.grouped_mlp_forward(a["x"].reshape(2, 48, K), (40, 0, 56), a["w1"], a["w2"],
                                    recipe=Recipe.mxfp8())
    assert_bytes_equal(y3, y2, "y")
