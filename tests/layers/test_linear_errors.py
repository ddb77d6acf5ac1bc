"""GroupedLinear bad input (NUMERICS §9): the same exception type and message on both backends."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import GroupedTensor, Recipe

from conftest import requires_gpu
from test_linear import K, N, SPLITS, make_data, on


def _wire(xp, d, fp8_dtype="e4m3"):
    x = xp.asarray(d["x"])
    q = GroupedTensor.quantize(x, SPLITS, "mxfp8", fp8_dtype=fp8_dtype)
    return GroupedTensor.from_mxfp8_rowwise(q.rowwise_data, q.rowwise_scale, SPLITS,
                                            fp8_dtype=fp8_dtype)


FWD_ERRORS = {
    "splits-vs-weight": (ValueError, "G=",
                         lambda a, xp, d: dict(splits=[50, 50, 0], )),
    "bias-vs-weight": (ValueError, "bias",
                       lambda a, xp, d: dict(bias=a["b"][:3])),
    "splits-sum": (ValueError, "sum to",
                   lambda a, xp, d: dict(splits=[30, 0, 45, 24])),
    "splits-negative": (ValueError, "non-negative",
                        lambda a, xp, d: dict(splits=[31, -1, 45, 25])),
    "splits-float": (TypeError, "splits",
                     lambda a, xp, d: dict(splits=[30.0, 0.0, 45.0, 25.0])),
    "probs-shape": (ValueError, "probs",
                    lambda a, xp, d: dict(probs=a["probs"][:-1])),
    "weight-rank": (ValueError, "weight",
                    lambda a, xp, d: dict(weight=a["w"][0])),
    "weight-k": (ValueError, "K=",
                 lambda a, xp, d: dict(weight=a["w"][:, :, :32])),
    "x-int": (TypeError, "x.dtype",
              lambda a, xp, d: dict(x=xp.ones((100, K), dtype=xp.int32))),
    "x-float64": (TypeError, "x.dtype",
                  lambda a, xp, d: dict(x=xp.ones((100, K), dtype=xp.float64))),
    "x-rank1": (ValueError, "rank",
                lambda a, xp, d: dict(x=a["x"][0])),
    "k-block": (ValueError, "multiple of",
                lambda a, xp, d: dict(x=a["x"][:, :48], weight=a["w"][:, :, :48])),
    "n-block": (ValueError, "N=24",
                lambda a, xp, d: dict(weight=a["w"][:, :24], bias=a["b"][:, :24])),
    "bf16-dtype-mismatch": (TypeError, "dtype",
                            lambda a, xp, d: dict(recipe=Recipe.bf16(),
                                                  weight=a["w"].astype(xp.float32))),
    "recipe-string": (TypeError, "recipe",
                      lambda a, xp, d: dict(recipe="mxfp8")),
    "wire-e5m2-for-e4m3": (ValueError, "e5m2",
                           lambda a, xp, d: dict(x=_wire(xp, d, "e5m2"))),
    "wire-for-hybrid-e5m2-x": (ValueError, "fp8_dtype",
                               lambda a, xp, d: dict(x=_wire(xp, d, "e5m2"),
                                                     recipe=Recipe.mxfp8("hybrid"))),
    "wire-nvfp4-recipe": (ValueError, "recipe",
                          lambda a, xp, d: dict(x=_wire(xp, d), recipe=Recipe.nvfp4())),
    "wire-bf16-recipe": (ValueError, "recipe",
                         lambda a, xp, d: dict(x=_wire(xp, d), recipe=Recipe.bf16())),
    "wire-nvfp4-tensor": (ValueError, "nvfp4",
                          lambda a, xp, d: dict(x=GroupedTensor.quantize(a["x"], SPLITS, "nvfp4"),
                                                recipe=Recipe.nvfp4())),
    "wire-splits-differ": (ValueError, "splits",
                           lambda a, xp, d: dict(x=_wire(xp, d), splits=[25, 5, 45, 25])),
    "seed": (TypeError, "seed", lambda a, xp, d: dict(seed=1.5)),
}


@pytest.mark.parametrize("case", list(FWD_ERRORS))
def test_forward_errors(xp, case):
    exc, match, change = FWD_ERRORS[case]
    d = make_data()
    a = on(xp, d)
    kw = dict(x=a["x"], splits=list(SPLITS), weight=a["w"], bias=a["b"], recipe=Recipe.mxfp8(),
              probs=a["probs"])
    kw.update(change(a, xp, d))
    x, splits, weight, bias = kw.pop("x"), kw.pop("splits"), kw.pop("weight"), kw.pop("bias")
    with pytest.raises(exc, match=match):
        lpm.grouped_linear_forward(x, splits, weight, bias, **kw)


def _ctx(xp, a, recipe=None, **kw):
    return lpm.grouped_linear_forward(a["x"], SPLITS, a["w"], a["b"],
                                      recipe=recipe or Recipe.mxfp8(), **kw)[1]


def test_backward_errors(xp):
    d = make_data()
    a = on(xp, d)
    ctx = _ctx(xp, a)
    lpm.grouped_linear_backward(a["dy"], ctx)
    with pytest.raises(ValueError, match="already used"):
        lpm.grouped_linear_backward(a["dy"], ctx)

    ctx = _ctx(xp, a)
    with pytest.raises(ValueError, match="dy.shape"):
        lpm.grouped_linear_backward(a["dy"][:, :16], ctx)
    with pytest.raises(ValueError, match="dy.shape"):
        lpm.grouped_linear_backward(a["dy"][:-1], ctx)
    with pytest.raises(TypeError, match="dy.dtype"):
        lpm.grouped_linear_backward(a["dy"].astype(xp.float32), ctx)
    with pytest.raises(TypeError, match="dy"):
        lpm.grouped_linear_backward(xp.ones((sum(SPLITS), N), dtype=xp.int32), ctx)
    with pytest.raises(TypeError, match="ctx"):
        lpm.grouped_linear_backward(a["dy"], {"splits": SPLITS})
    # failed calls do not consume the context
    lpm.grouped_linear_backward(a["dy"], ctx)

    # pre-quantized dy of the wrong fp8 dtype or for a non-mxfp8 recipe
    dy = a["dy"]
    q4 = GroupedTensor.quantize(dy, SPLITS, "mxfp8", fp8_dtype="e4m3")
    q5 = GroupedTensor.quantize(dy, SPLITS, "mxfp8", fp8_dtype="e5m2")
    with pytest.raises(ValueError, match="e4m3"):
        lpm.grouped_linear_backward(q4, _ctx(xp, a, Recipe.mxfp8("hybrid")))
    with pytest.raises(ValueError, match="e5m2"):
        lpm.grouped_linear_backward(q5, _ctx(xp, a, Recipe.mxfp8()))
    with pytest.raises(ValueError, match="recipe"):
        lpm.grouped_linear_backward(q4, _ctx(xp, a, Recipe.nvfp4()))
    q_split = GroupedTensor.quantize(dy, [25, 5, 45, 25], "mxfp8")
    with pytest.raises(ValueError, match="splits"):
        lpm.grouped_linear_backward(q_split, _ctx(xp, a))
    with pytest.raises(TypeError, match="seed"):
        lpm.grouped_linear_backward(dy, _ctx(xp, a, Recipe.nvfp4()), seed="1")


def test_recipe_conflicts_rejected():
    with pytest.raises(ValueError, match="row_scaled_activation=True cannot be combined with rht"):
        Recipe.nvfp4(row_scaled_activation=True, rht=True)
    with pytest.raises(ValueError, match="stochastic_rounding"):
        Recipe.nvfp4(row_scaled_activation=True, stochastic_rounding=True)
    with pytest.raises(ValueError, match="rht"):
        dataclasses.replace(Recipe.nvfp4(row_scaled_activation=True), rht=True)


@requires_gpu
@pytest.mark.gpu
def test_numpy_cupy_mixed():
    import cupy

    d = make_data()
    a, c = on(np, d), on(cupy, d)
    recipe = Recipe.mxfp8()
    with pytest.raises(TypeError):
        lpm.grouped_linear_forward(a["x"], SPLITS, c["w"], recipe=recipe)
    with pytest.raises(TypeError):
        lpm.grouped_linear_forward(c["x"], SPLITS, c["w"], a["b"], recipe=recipe)
    with pytest.raises(TypeError):
        lpm.grouped_linear_forward(c["x"], SPLITS, c["w"], c["b"], recipe=recipe,
                                   probs=a["probs"])
    for r in (recipe, Recipe.bf16()):
        _, ctx = lpm.grouped_linear_forward(c["x"], SPLITS, c["w"], recipe=r)
        with pytest.raises(TypeError):
            lpm.grouped_linear_backward(a["dy"], ctx)
        lpm.grouped_linear_backward(c["dy"], ctx)  # the failed call did not consume it
