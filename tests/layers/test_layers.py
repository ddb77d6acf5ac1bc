"""Module-style wrappers (lowprec_moe/layers/modules.py): GroupedLinear and GroupedMLP, both backends.

Initialisation is seeded and shaped as documented, forward / backward match the functional API
(bitwise for y), each backward advances the stochastic-rounding step, bad arguments raise.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
import test_linear as lt
import test_mlp as mt
from conftest import assert_bytes_equal, to_host
from lowprec_moe import Recipe
from lowprec_moe.layers.activations import make_activation

BF16 = ml_dtypes.bfloat16


def test_grouped_linear_module(xp):
    layer = lpm.GroupedLinear(lt.G, lt.K, lt.N, bias=True, recipe=Recipe.nvfp4(), dtype="bfloat16",
                              xp=xp, seed=3)
    assert layer.weight.shape == (lt.G, lt.N, lt.K) and layer.bias.shape == (lt.G, lt.N)
    assert np.dtype(layer.weight.dtype) == np.dtype(BF16)
    d = lt.make_data()
    a = lt.on(xp, d)
    y, ctx = layer(a["x"], lt.SPLITS)
    g1 = layer.backward(a["dy"], ctx)
    assert layer.step == 1 and g1.dweight.shape == (lt.G, lt.N, lt.K)
    y2, ctx2 = layer.forward(a["x"], lt.SPLITS)
    assert_bytes_equal(y2, y, "y")
    g2 = layer.backward(a["dy"], ctx2)  # fresh SR bits per step
    assert not np.array_equal(to_host(g2.dweight), to_host(g1.dweight))
    again = lpm.GroupedLinear(lt.G, lt.K, lt.N, recipe=Recipe.nvfp4(), dtype="bfloat16", xp=xp, seed=3)
    assert_bytes_equal(again.weight, layer.weight, "init is seeded")
    assert lpm.GroupedLinear(lt.G, lt.K, lt.N, bias=False, xp=xp).bias is None
    with pytest.raises(ValueError, match="num_experts"):
        lpm.GroupedLinear(0, lt.K, lt.N)
    with pytest.raises(ValueError, match="dtype"):
        lpm.GroupedLinear(lt.G, lt.K, lt.N, dtype="float64")
    with pytest.raises(TypeError, match="recipe"):
        lpm.GroupedLinear(lt.G, lt.K, lt.N, recipe="nvfp4")


def test_grouped_mlp_module(xp):
    layer = lpm.GroupedMLP(mt.G, mt.K, mt.F, activation="swiglu", glu_interleave=32,
                           recipe=Recipe.nvfp4(), dtype="bfloat16", xp=xp, seed=3)
    assert layer.fc1_weight.shape == (mt.G, 2 * mt.F, mt.K) and layer.fc2_weight.shape == (mt.G, mt.K, mt.F)
    assert layer.fc1_bias.shape == (mt.G, 2 * mt.F) and layer.fc2_bias.shape == (mt.G, mt.K)
    assert np.dtype(layer.fc1_weight.dtype) == np.dtype(BF16)
    d = mt.make_data(make_activation("swiglu"), dtype=BF16)
    a = mt.on(xp, d)
    y, ctx = layer(a["x"], mt.SPLITS, a["probs"])
    g1 = layer.backward(a["dy"], ctx)
    assert layer.step == 1 and g1.dfc1_weight.shape == (mt.G, 2 * mt.F, mt.K)
    y2, ctx2 = layer.forward(a["x"], mt.SPLITS, a["probs"])
    assert_bytes_equal(y2, y, "y")
    g2 = layer.backward(a["dy"], ctx2)  # fresh SR bits per step
    assert not np.array_equal(to_host(g2.dfc1_weight), to_host(g1.dfc1_weight))
    again = lpm.GroupedMLP(mt.G, mt.K, mt.F, glu_interleave=32, recipe=Recipe.nvfp4(), dtype="bfloat16",
                           xp=xp, seed=3)
    assert_bytes_equal(again.fc1_weight, layer.fc1_weight, "init is seeded")
    srelu = lpm.GroupedMLP(mt.G, mt.K, mt.F, activation="srelu", bias=False, xp=xp)
    assert srelu.fc1_weight.shape == (mt.G, mt.F, mt.K) and srelu.fc1_bias is None
    with pytest.raises(ValueError, match="num_experts"):
        lpm.GroupedMLP(0, mt.K, mt.F)
    with pytest.raises(ValueError, match="glu_interleave=24 must divide"):
        lpm.GroupedMLP(mt.G, mt.K, mt.F, glu_interleave=24)
    with pytest.raises(ValueError, match="valid activations"):
        lpm.GroupedMLP(mt.G, mt.K, mt.F, activation="gelu")
    with pytest.raises(TypeError, match="recipe"):
        lpm.GroupedMLP(mt.G, mt.K, mt.F, recipe="mxfp8")
