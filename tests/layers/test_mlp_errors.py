"""GroupedMLP bad input (NUMERICS §9): the same exception type and message on both backends."""

from __future__ import annotations

import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import Recipe
from lowprec_moe.layers.activations import make_activation

from conftest import requires_gpu
from test_mlp import BF16, F, K, SPLITS, make_data, on
from test_mlp_paths import _wire


FWD_ERRORS = {
    "unknown-activation": (ValueError, "swiglu, clamped_swiglu, srelu",
                           lambda a, xp: dict(activation="geglu")),
    "fc1-not-2F": (ValueError, "needs N = 2\\*F",
                   lambda a, xp: dict(w1=a["w1"][:, :F + 32], b1=None)),
    "fc1-2F-for-srelu": (ValueError, "srelu",
                         lambda a, xp: dict(activation="srelu")),
    "interleave-not-dividing": (ValueError, "glu_interleave=48 must divide F=64",
                                lambda a, xp: dict(glu_interleave=48)),
    "interleave-for-srelu": (ValueError, "applies to GLU",
                             lambda a, xp: dict(activation="srelu", glu_interleave=32)),
    "limit-for-swiglu": (ValueError, "limit", lambda a, xp: dict(limit=3.0)),
    "experts-fc2": (ValueError, "fc2_weight has G=2",
                    lambda a, xp: dict(w2=a["w2"][:2], b2=a["b2"][:2])),
    "experts-splits": (ValueError, "mismatched expert count",
                       lambda a, xp: dict(splits=[40, 57])),
    "experts-bias": (ValueError, "fc1_bias has G=2", lambda a, xp: dict(b1=a["b1"][:2])),
    "bias-shape": (ValueError, "fc2_bias.shape", lambda a, xp: dict(b2=a["b2"][:, :32])),
    "k-mismatch": (ValueError, "K=", lambda a, xp: dict(w1=a["w1"][:, :, :32])),
    "weight-rank": (ValueError, "rank 3", lambda a, xp: dict(w2=a["w2"][0])),
    "probs-shape": (ValueError, "probs", lambda a, xp: dict(probs=a["probs"][:-1])),
    "splits-sum": (ValueError, "sum to", lambda a, xp: dict(splits=[40, 0, 56])),
    "f-block": (ValueError, "F=48 must be a multiple of 32",
                lambda a, xp: dict(w1=a["w1"][:, :96], b1=a["b1"][:, :96],
                                   w2=a["w2"][:, :, :48])),
    "n2-block": (ValueError, "N2=48", lambda a, xp: dict(w2=a["w2"][:, :48], b2=a["b2"][:, :48])),
    "x-int": (TypeError, "x.dtype", lambda a, xp: dict(x=xp.ones((97, K), dtype=xp.int32))),
    "bf16-dtype-mismatch": (TypeError, "fc2_weight.dtype",
                            lambda a, xp: dict(recipe=Recipe.bf16(),
                                               w2=a["w2"].astype(xp.float16))),
    "recipe-string": (TypeError, "recipe", lambda a, xp: dict(recipe="mxfp8")),
    "wire-nvfp4-recipe": (ValueError, "recipe",
                          lambda a, xp: dict(x=_wire(xp, a["x"]), recipe=Recipe.nvfp4())),
    "wire-e5m2": (ValueError, "e5m2", lambda a, xp: dict(x=_wire(xp, a["x"], "e5m2"))),
    "seed": (TypeError, "seed", lambda a, xp: dict(seed=1.5)),
}


@pytest.mark.parametrize("case", list(FWD_ERRORS))
def test_forward_errors(xp, case):
    exc, match, change = FWD_ERRORS[case]
    a = on(xp, make_data(make_activation("swiglu"), dtype=BF16))
    kw = dict(x=a["x"], splits=list(SPLITS), w1=a["w1"], w2=a["w2"], b1=a["b1"], b2=a["b2"],
              probs=a["probs"], activation="swiglu", recipe=Recipe.mxfp8())
    kw.update(change(a, xp))
    args = [kw.pop(k) for k in ("x", "splits", "w1", "w2", "b1", "b2")]
    with pytest.raises(exc, match=match):
        lpm.grouped_mlp_forward(*args, **kw)


def test_backward_errors(xp):
    act = make_activation("swiglu")
    a = on(xp, make_data(act, dtype=BF16))

    def ctx(recipe=None):
        return lpm.grouped_mlp_forward(a["x"], SPLITS, a["w1"], a["w2"], a["b1"], a["b2"],
                                       probs=a["probs"], recipe=recipe or Recipe.mxfp8())[1]

    c = ctx()
    with pytest.raises(ValueError, match="dy.shape"):
        lpm.grouped_mlp_backward(a["dy"][:, :32], c)
    with pytest.raises(TypeError, match="dy.dtype"):
        lpm.grouped_mlp_backward(a["dy"].astype(xp.float32), c)
    with pytest.raises(TypeError, match="ctx"):
        lpm.grouped_mlp_backward(a["dy"], {"splits": SPLITS})
    lpm.grouped_mlp_backward(a["dy"], c)  # failed calls did not consume it
    with pytest.raises(ValueError, match="already used"):
        lpm.grouped_mlp_backward(a["dy"], c)
    with pytest.raises(ValueError, match="e4m3"):
        lpm.grouped_mlp_backward(_wire(xp, a["dy"]), ctx(Recipe.mxfp8("hybrid")))
    with pytest.raises(ValueError, match="recipe"):
        lpm.grouped_mlp_backward(_wire(xp, a["dy"]), ctx(Recipe.nvfp4()))
    with pytest.raises(TypeError, match="seed"):
        lpm.grouped_mlp_backward(a["dy"], ctx(), seed="1")


@requires_gpu
@pytest.mark.gpu
def test_numpy_cupy_mixed():
    import cupy

    act = make_activation("swiglu")
    d = make_data(act)
    a, c = on(np, d), on(cupy, d)
    with pytest.raises(TypeError):
        lpm.grouped_mlp_forward(a["x"], SPLITS, c["w1"], c["w2"], recipe=Recipe.mxfp8())
    with pytest.raises(TypeError):
        lpm.grouped_mlp_forward(c["x"], SPLITS, c["w1"], c["w2"], probs=a["probs"],
                                recipe=Recipe.mxfp8())
    _, ctx = lpm.grouped_mlp_forward(c["x"], SPLITS, c["w1"], c["w2"], recipe=Recipe.mxfp8())
    with pytest.raises(TypeError):
        lpm.grouped_mlp_backward(a["dy"], ctx)
    lpm.grouped_mlp_backward(c["dy"], ctx)
