"""GroupedMLP and the activation kernels with device splits on the GPU, every recipe (the fused
MXFP8 activation quantizer and the fused NVFP4 amax included): the bits of host splits (biases,
probs, an empty expert), and a whole step captured into a CUDA graph and replayed with new
splits and data."""

from __future__ import annotations

import numpy as np
import pytest

import lowprec_moe as lpm

from conftest import assert_bytes_equal, capture_graph, random_splits, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

_NAMES = ("y", "dx", "dfc1_weight", "dfc2_weight", "dfc1_bias", "dfc2_bias", "dprobs")


def _data(cp, rng, m, g, k, f):
    import ml_dtypes

    def rnd(*shape, scale=1.0):
        return cp.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(
            ml_dtypes.bfloat16)

    return dict(x=rnd(m, k), w1=rnd(g, 2 * f, k, scale=k ** -0.5),
                w2=rnd(g, k, f, scale=f ** -0.5), b1=rnd(g, 2 * f), b2=rnd(g, k),
                dy=rnd(m, k, scale=m ** -0.5),
                probs=cp.asarray(rng.uniform(0.1, 1.0, m).astype(np.float32)))


RECIPES = {"bf16": lpm.Recipe.bf16(), "mxfp8": lpm.Recipe.mxfp8(),
           "mxfp8-hybrid": lpm.Recipe.mxfp8(fp8_format="hybrid"), "nvfp4": lpm.Recipe.nvfp4(),
           "nvfp4-row-scaled": lpm.Recipe.nvfp4(row_scaled_activation=True)}


def _step(d, splits, recipe=None):
    y, ctx = lpm.grouped_mlp_forward(d["x"], splits, d["w1"], d["w2"], d["b1"], d["b2"],
                                     probs=d["probs"], recipe=recipe or lpm.Recipe.bf16(),
                                     seed=3)
    g = lpm.grouped_mlp_backward(d["dy"], ctx)
    return (y, g.dx, g.dfc1_weight, g.dfc2_weight, g.dfc1_bias, g.dfc2_bias, g.dprobs)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_mlp_step_with_device_splits_gives_host_bits(recipe):
    import cupy as cp

    rng = np.random.default_rng(21)
    g, m, k, f = 8, 1536, 256, 256
    d = _data(cp, rng, m, g, k, f)
    for _ in range(2):
        s = random_splits(rng, m, g)
        got = _step(d, cp.asarray(s), RECIPES[recipe])
        want = _step(d, [int(v) for v in s], RECIPES[recipe])
        for name, a, b in zip(_NAMES, got, want):
            assert_bytes_equal(a, b, name)


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8", "nvfp4"])
def test_mlp_step_captures_into_a_graph(recipe):
    import cupy as cp

    r = RECIPES[recipe]
    rng = np.random.default_rng(22)
    g, m, k, f = 8, 1024, 256, 128
    d = _data(cp, rng, m, g, k, f)
    ds = cp.asarray(random_splits(rng, m, g))
    out, replay = capture_graph(lambda: _step(d, ds, r))
    for _ in range(2):
        s = random_splits(rng, m, g)
        for key, val in _data(cp, rng, m, g, k, f).items():
            d[key][...] = val
        ds[...] = cp.asarray(s)
        replay()
        want = _step(d, [int(v) for v in s], r)
        for name, a, b in zip(_NAMES, out, want):
            assert_bytes_equal(a, b, f"replayed {name}")
