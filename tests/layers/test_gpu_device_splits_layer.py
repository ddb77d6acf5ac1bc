"""GroupedLinear with device splits on the GPU, every recipe: forward and backward (bias, probs,
empty experts) give the bits of host splits, and a whole step captures into a CUDA graph that,
replayed with other splits of the same experts and new data, gives the eager results."""

from __future__ import annotations

import numpy as np
import pytest

import lowprec_moe as lpm

from conftest import assert_bytes_equal, capture_graph, random_splits, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]


RECIPES = {"bf16": lpm.Recipe.bf16(), "mxfp8": lpm.Recipe.mxfp8(),
           "mxfp8-hybrid": lpm.Recipe.mxfp8(fp8_format="hybrid"), "nvfp4": lpm.Recipe.nvfp4(),
           "nvfp4-row-scaled": lpm.Recipe.nvfp4(row_scaled_activation=True)}


def _step(x, splits, w, bias, probs, dy, recipe=RECIPES["bf16"]):
    y, ctx = lpm.grouped_linear_forward(x, splits, w, bias, recipe=recipe, probs=probs,
                                        seed=7)
    g = lpm.grouped_linear_backward(dy, ctx)
    return y, g.dx, g.dweight, g.dbias, g.dprobs


def _data(cp, rng, m, g, k, n):
    import ml_dtypes

    def rnd(*shape, scale=1.0):
        return cp.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(
            ml_dtypes.bfloat16)

    return (rnd(m, k), rnd(g, n, k, scale=k ** -0.5), rnd(m, n, scale=m ** -0.5),
            cp.asarray(rng.standard_normal((g, n)).astype(np.float32)).astype(ml_dtypes.bfloat16),
            cp.asarray(rng.uniform(0.1, 1.0, m).astype(np.float32)))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_linear_step_with_device_splits_gives_host_bits(recipe):
    import cupy as cp

    rng = np.random.default_rng(3)
    g, m, k, n = 8, 2048, 256, 512
    x, w, dy, bias, probs = _data(cp, rng, m, g, k, n)
    for _ in range(2):
        s = random_splits(rng, m, g)
        got = _step(x, cp.asarray(s), w, bias, probs, dy, RECIPES[recipe])
        want = _step(x, [int(v) for v in s], w, bias, probs, dy, RECIPES[recipe])
        for name, a, b in zip(("y", "dx", "dweight", "dbias", "dprobs"), got, want):
            assert_bytes_equal(a, b, name)


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8", "nvfp4"])
def test_linear_step_captures_into_a_graph(recipe):
    import cupy as cp

    r = RECIPES[recipe]
    rng = np.random.default_rng(4)
    g, m, k, n = 8, 1024, 256, 256
    x, w, dy, bias, probs = _data(cp, rng, m, g, k, n)
    ds = cp.asarray(random_splits(rng, m, g))
    out, replay = capture_graph(lambda: _step(x, ds, w, bias, probs, dy, r))
    for _ in range(3):
        s = random_splits(rng, m, g)
        new = _data(cp, rng, m, g, k, n)
        for dst, src in zip((x, w, dy, bias, probs), new):
            dst[...] = src
        ds[...] = cp.asarray(s)
        replay()
        want = _step(x, [int(v) for v in s], w, bias, probs, dy, r)
        for name, a, b in zip(("y", "dx", "dweight", "dbias", "dprobs"), out, want):
            assert_bytes_equal(a, b, f"replayed {name}")
