"""lowprec_moe.jax: custom_vjp wrappers equal the explicit NumPy forward / backward bit for bit,
eagerly and under jit (CPU)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import lowprec_moe as lpm  # noqa: E402
import lowprec_moe.jax as lpj  # noqa: E402

RECIPES = {
    "bf16": lpm.Recipe.bf16(),
    "mxfp8": lpm.Recipe.mxfp8(),
    "nvfp4": lpm.Recipe.nvfp4(),
    "nvfp4_rowscaled": lpm.Recipe.nvfp4(row_scaled_activation=True),
}
SPLITS = [40, 0, 88]


def _data(seed=0, k=64, n=32, f=64, dtype=jnp.bfloat16):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((128, k)), dtype=dtype)
    w = jnp.asarray(rng.standard_normal((3, n, k)) * 0.1, dtype=dtype)
    b = jnp.asarray(rng.standard_normal((3, n)) * 0.1, dtype=dtype)
    w1 = jnp.asarray(rng.standard_normal((3, 2 * f, k)) * 0.1, dtype=dtype)
    w2 = jnp.asarray(rng.standard_normal((3, k, f)) * 0.1, dtype=dtype)
    b1 = jnp.asarray(rng.standard_normal((3, 2 * f)) * 0.1, dtype=dtype)
    b2 = jnp.asarray(rng.standard_normal((3, k)) * 0.1, dtype=dtype)
    p = jnp.asarray(rng.random(128), dtype=jnp.float32)
    return dict(x=x, w=w, b=b, w1=w1, w2=w2, b1=b1, b2=b2, p=p)


def _np(a):
    return None if a is None else np.asarray(a)


def _weights_of(shape):
    """A fixed, non-uniform output gradient: the loss is sum(y * c)."""
    return np.asarray(np.arange(np.prod(shape)).reshape(shape) % 5 - 2, np.float32)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_linear_matches_explicit_api(name, jit):
    recipe, d = RECIPES[name], _data()
    c = _weights_of((128, 32))

    def loss(x, w, b, p):
        y = lpj.grouped_linear(x, SPLITS, w, b, probs=p, recipe=recipe, seed=7)
        return jnp.sum(y.astype(jnp.float32) * c), y

    fn = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
    (_, y), grads = (jax.jit(fn) if jit else fn)(d["x"], d["w"], d["b"], d["p"])

    y_ref, ctx = lpm.grouped_linear_forward(_np(d["x"]), SPLITS, _np(d["w"]), _np(d["b"]),
                                            recipe=recipe, probs=_np(d["p"]), seed=7)
    g = lpm.grouped_linear_backward(c.astype(ml_dtypes.bfloat16), ctx)
    np.testing.assert_array_equal(np.asarray(y), y_ref)
    for got, want, what in zip(grads, (g.dx, g.dweight, g.dbias, g.dprobs),
                               ("dx", "dweight", "dbias", "dprobs")):
        assert got.dtype == want.dtype, what
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=what)


@pytest.mark.parametrize("name", list(RECIPES))
def test_mlp_matches_explicit_api(name):
    recipe, d = RECIPES[name], _data(seed=1)
    c = _weights_of((128, 64))

    @jax.jit
    def step(x, w1, w2, b1, b2, p, splits, seed):
        def loss(*args):
            y = lpj.grouped_mlp(args[0], splits, *args[1:5], probs=args[5], recipe=recipe,
                                seed=seed)
            return jnp.sum(y.astype(jnp.float32) * c), y
        return jax.value_and_grad(loss, argnums=tuple(range(6)), has_aux=True)(
            x, w1, w2, b1, b2, p)

    args = [d[k] for k in ("x", "w1", "w2", "b1", "b2", "p")]
    (_, y), grads = step(*args, jnp.asarray(SPLITS), 5)
    y_ref, ctx = lpm.grouped_mlp_forward(_np(d["x"]), SPLITS, *map(_np, args[1:5]),
                                         probs=_np(d["p"]), recipe=recipe, seed=5)
    g = lpm.grouped_mlp_backward(c.astype(ml_dtypes.bfloat16), ctx)
    np.testing.assert_array_equal(np.asarray(y), y_ref)
    want = (g.dx, g.dfc1_weight, g.dfc2_weight, g.dfc1_bias, g.dfc2_bias, g.dprobs)
    for got, w, what in zip(grads, want, ("dx", "dfc1_w", "dfc2_w", "dfc1_b", "dfc2_b", "dp")):
        np.testing.assert_array_equal(np.asarray(got), w, err_msg=what)


def test_splits_and_seed_are_operands_not_retraced():
    d = _data(seed=2)
    traces = []

    @jax.jit
    def f(x, w, splits, seed):
        traces.append(1)
        return lpj.grouped_linear(x, splits, w, recipe=RECIPES["nvfp4"], seed=seed)

    y1 = f(d["x"], d["w"], jnp.asarray([40, 0, 88]), 0)
    y2 = f(d["x"], d["w"], jnp.asarray([0, 128, 0]), 1)
    assert len(traces) == 1
    ref, _ = lpm.grouped_linear_forward(_np(d["x"]), [0, 128, 0], _np(d["w"]),
                                        recipe=RECIPES["nvfp4"])
    np.testing.assert_array_equal(np.asarray(y2), ref)
    assert not np.array_equal(np.asarray(y1), np.asarray(y2))


def test_bf16_recipe_casts_float32_params():
    d = _data(seed=3)
    w32 = d["w"].astype(jnp.float32)

    def loss(w):
        return jnp.sum(lpj.grouped_linear(d["x"], SPLITS, w, recipe=RECIPES["bf16"])
                       .astype(jnp.float32))

    gw = jax.grad(loss)(w32)
    assert gw.dtype == jnp.float32 and gw.shape == w32.shape
    y_ref, ctx = lpm.grouped_linear_forward(_np(d["x"]), SPLITS, _np(d["w"]),
                                            recipe=RECIPES["bf16"])
    g = lpm.grouped_linear_backward(np.ones_like(y_ref), ctx)
    np.testing.assert_array_equal(np.asarray(gw), g.dweight.astype(np.float32))


def test_rejections():
    d = _data(seed=4)
    with pytest.raises(TypeError, match="Recipe"):
        lpj.grouped_linear(d["x"], SPLITS, d["w"], recipe="nvfp4")
    with pytest.raises(TypeError, match="splits"):
        lpj.grouped_linear(d["x"], jnp.ones(3), d["w"], recipe=RECIPES["mxfp8"])
    q = lpm.GroupedTensor.quantize(_np(d["x"]), SPLITS, "mxfp8")
    with pytest.raises(TypeError, match="GroupedTensor"):
        lpj.grouped_linear(q, SPLITS, d["w"], recipe=RECIPES["mxfp8"])
