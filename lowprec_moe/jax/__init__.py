"""JAX wrappers of the grouped layers: ``grouped_linear`` and ``grouped_mlp`` with ``custom_vjp``.

Import on request (``import lowprec_moe.jax``); it needs JAX (the ``jax`` extra). Both functions
take and return ``jax.Array``s, work eagerly and under ``jax.jit`` / ``jax.grad``, and call the
library through ``jax.experimental.buffer_callback``: the callback sees XLA's own buffers, as
NumPy arrays on the CPU (the NumPy backend) and as CuPy arrays on a CUDA GPU (the CuPy backend,
launched on XLA's stream), without copying the inputs::

    import jax, jax.numpy as jnp
    import lowprec_moe as lpm
    import lowprec_moe.jax as lpj

    def loss(w1, w2, x, probs):
        y = lpj.grouped_mlp(x, splits, w1, w2, probs=probs, recipe=lpm.Recipe.mxfp8())
        return jnp.mean(y.astype(jnp.float32) ** 2)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(w1, w2, x, probs)

Costs to know:

* The backward recomputes the forward GEMMs' quantized operands: a JAX function cannot carry
  the library's Python context from the forward to the backward callback, so the backward
  callback runs the forward once more (one fprop GEMM per linear layer) before its gradients.
* Every gradient is computed (``custom_vjp`` does not say which are wanted).
* Results are written into XLA's output buffers, one device copy per output.
* ``splits`` and ``seed`` are runtime operands (no retracing when they change); on the GPU the
  callback reads them to the host, which waits for XLA's stream once per call.

``bfloat16`` arrays cross the callback as int16 bit patterns (``lax.bitcast_convert_type``), which
CuPy's and NumPy's array protocols both carry. ``Recipe.bf16()`` computes in x's dtype, so
parameters of another dtype are cast first (differentiably). Stochastic-rounding seeds are
32-bit here.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

import lowprec_moe as lpm

__all__ = ["grouped_linear", "grouped_mlp"]

_DL_CUDA = 2


# ============================================================================================
# the callback bridge


def _bits(a):
    """bfloat16 -> int16 bit pattern (a bitcast: no arithmetic, no copy in compiled code)."""
    return jax.lax.bitcast_convert_type(a, jnp.int16) if a.dtype == jnp.bfloat16 else a


def _is_bf16(dtype) -> bool:
    return np.dtype(dtype) == np.dtype(jnp.bfloat16)


@contextlib.contextmanager
def _backend(ctx, first_buffer):
    """(array module, on_gpu) for a callback; on the GPU, CuPy runs on XLA's stream."""
    dev_type, dev_id = first_buffer.__dlpack_device__()
    if dev_type != _DL_CUDA:
        yield np, False
        return
    import cupy  # noqa: PLC0415

    with cupy.cuda.Device(dev_id), cupy.cuda.ExternalStream(int(ctx.stream), dev_id):
        yield cupy, True


def _view(buf, xp, bf16: bool):
    a = xp.asarray(buf)
    if bf16:
        import ml_dtypes  # noqa: PLC0415

        a = a.view(ml_dtypes.bfloat16)
    return a


def _host_ints(a, on_gpu: bool) -> tuple[int, ...]:
    values = a.get() if on_gpu else a
    return tuple(int(v) for v in np.asarray(values).reshape(-1))


def _call(fn: Callable, operands: list, roles: list, outs: list):
    """Run ``fn`` on the library's arrays inside an XLA buffer callback.

    Parameters
    ----------
    fn : callable
        ``fn(splits, seed, *arrays) -> list of arrays`` (NumPy or CuPy), one per ``outs``.
    operands : list of jax arrays
        ``[splits, seed, *arrays]``.
    roles : list of bool
        Whether each operand of ``arrays`` is bfloat16.
    outs : list of jax.ShapeDtypeStruct
        Result shapes and dtypes.
    """
    out_bf16 = [_is_bf16(o.dtype) for o in outs]
    specs = [jax.ShapeDtypeStruct(o.shape, jnp.int16 if b else o.dtype)
             for o, b in zip(outs, out_bf16)]

    def callback(ctx, out_bufs, splits_buf, seed_buf, *bufs):
        with _backend(ctx, splits_buf) as (xp, on_gpu):
            splits = _host_ints(xp.asarray(splits_buf), on_gpu)
            seed = _host_ints(xp.asarray(seed_buf), on_gpu)[0]
            arrays = [_view(b, xp, bf) for b, bf in zip(bufs, roles)]
            results = fn(splits, seed, *arrays)
            for buf, r, bf in zip(out_bufs, results, out_bf16):
                dst = xp.asarray(buf)
                dst[...] = r.view(xp.int16) if bf else r

    results = buffer_callback(callback, specs)(*[_bits(a) for a in operands])
    return [jax.lax.bitcast_convert_type(r, jnp.bfloat16) if b else r
            for r, b in zip(results, out_bf16)]


def _spec(a):
    return jax.ShapeDtypeStruct(a.shape, a.dtype)


def _operands(splits, seed):
    splits = jnp.asarray(splits)
    if splits.ndim != 1 or not jnp.issubdtype(splits.dtype, jnp.integer):
        raise TypeError(f"splits must be 1-D integers, got {splits.dtype} of shape "
                        f"{splits.shape}")
    return splits.astype(jnp.int32), jnp.asarray(seed, dtype=jnp.uint32).reshape(1)


def _check(x, recipe) -> None:
    if isinstance(x, lpm.GroupedTensor):
        raise TypeError("pre-quantized GroupedTensor inputs are not supported by the JAX "
                        "wrappers; pass a jax.Array")
    if not isinstance(recipe, lpm.Recipe):
        raise TypeError(f"recipe must be a lowprec_moe.Recipe, got {type(recipe).__name__}")


def _cast_params(x, recipe, *params):
    """Recipe.bf16 computes in x's dtype (differentiable cast); quantized recipes take any."""
    if recipe.quantized:
        return params
    return tuple(None if p is None else p.astype(x.dtype) for p in params)


@dataclass(frozen=True)
class _Static:
    """The non-array arguments of one layer (hashable: a custom_vjp nondiff argument)."""

    recipe: lpm.Recipe
    has_bias: tuple
    has_probs: bool
    mlp: tuple = ()                    # (activation, glu_interleave, limit, alpha, fused)

    def mlp_kwargs(self) -> dict:
        act, inter, limit, alpha, fused = self.mlp
        return dict(activation=act, glu_interleave=inter, limit=limit, alpha=alpha, fused=fused)


def _present(*arrays):
    return [a for a in arrays if a is not None]


def _unpack(arrays: list, flags: tuple) -> list:
    """Put None back where an optional array was absent."""
    it = iter(arrays)
    return [next(it) if f else None for f in flags]


# ============================================================================================
# grouped linear


def _linear_forward_lib(st: _Static, splits, seed, x, w, *opt):
    b, p = _unpack(list(opt), (st.has_bias[0], st.has_probs))
    return lpm.grouped_linear_forward(x, splits, w, b, recipe=st.recipe, probs=p, seed=seed)


def _linear_primal(st: _Static, splits, seed, x, w, b, p):
    def fn(spl, sd, *arrays):
        y, _ = _linear_forward_lib(st, spl, sd, *arrays)
        return [y]

    roles = [_is_bf16(a.dtype) for a in _present(x, w, b, p)]
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype)
    return _call(fn, [splits, seed, *_present(x, w, b, p)], roles, [out])[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _linear(st, splits, seed, x, w, b, p):
    return _linear_primal(st, splits, seed, x, w, b, p)


def _linear_fwd(st, splits, seed, x, w, b, p):
    return _linear_primal(st, splits, seed, x, w, b, p), (splits, seed, x, w, b, p)


def _linear_bwd(st, res, dy):
    splits, seed, x, w, b, p = res

    def fn(spl, sd, *arrays):
        *fwd, dy_a = arrays
        _, ctx = _linear_forward_lib(st, spl, sd, *fwd)
        g = lpm.grouped_linear_backward(dy_a, ctx)
        return _present(g.dx, g.dweight, g.dbias, g.dprobs)

    arrays = _present(x, w, b, p) + [dy]
    outs = [_spec(x), _spec(w)] + [_spec(a) for a in _present(b, p)]
    grads = _call(fn, [splits, seed, *arrays], [_is_bf16(a.dtype) for a in arrays], outs)
    dx, dw, db, dp = _unpack(grads, (True, True, b is not None, p is not None))
    return None, None, dx, dw, db, dp


_linear.defvjp(_linear_fwd, _linear_bwd)


def grouped_linear(x, splits, weight, bias=None, *, recipe: lpm.Recipe, probs=None, seed=0):
    """Differentiable :func:`lowprec_moe.grouped_linear_forward` on JAX arrays.

    Parameters
    ----------
    x : jax.Array ``[M, K]`` (float32 / float16 / bfloat16)
        Tokens sorted by expert.
    splits : sequence of int or 1-D integer jax.Array
        Tokens per expert (``G`` entries summing to M); an operand, so changing it does not
        retrace a jitted caller.
    weight : jax.Array ``[G, N, K]``
    bias : jax.Array ``[G, N]``, optional
    recipe : lowprec_moe.Recipe
    probs : jax.Array ``[M]``, optional
        Routing weights scaling the bias.
    seed : int or integer scalar jax.Array
        Stochastic-rounding seed of the backward (NVFP4 with SR), below 2**32.

    Returns
    -------
    jax.Array ``[M, N]`` of x's dtype
    """
    _check(x, recipe)
    weight, bias = _cast_params(x, recipe, weight, bias)
    st = _Static(recipe=recipe, has_bias=(bias is not None,), has_probs=probs is not None)
    spl, sd = _operands(splits, seed)
    return _linear(st, spl, sd, x, weight, bias, probs)


# ============================================================================================
# grouped MLP


def _mlp_forward_lib(st: _Static, splits, seed, x, w1, w2, *opt):
    b1, b2, p = _unpack(list(opt), (*st.has_bias, st.has_probs))
    return lpm.grouped_mlp_forward(x, splits, w1, w2, b1, b2, probs=p, recipe=st.recipe,
                                   seed=seed, **st.mlp_kwargs())


def _mlp_primal(st: _Static, splits, seed, x, w1, w2, b1, b2, p):
    def fn(spl, sd, *arrays):
        y, _ = _mlp_forward_lib(st, spl, sd, *arrays)
        return [y]

    arrays = _present(x, w1, w2, b1, b2, p)
    out = jax.ShapeDtypeStruct((x.shape[0], w2.shape[1]), x.dtype)
    return _call(fn, [splits, seed, *arrays], [_is_bf16(a.dtype) for a in arrays], [out])[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mlp(st, splits, seed, x, w1, w2, b1, b2, p):
    return _mlp_primal(st, splits, seed, x, w1, w2, b1, b2, p)


def _mlp_fwd(st, splits, seed, x, w1, w2, b1, b2, p):
    return (_mlp_primal(st, splits, seed, x, w1, w2, b1, b2, p),
            (splits, seed, x, w1, w2, b1, b2, p))


def _mlp_bwd(st, res, dy):
    splits, seed, x, w1, w2, b1, b2, p = res

    def fn(spl, sd, *arrays):
        *fwd, dy_a = arrays
        _, ctx = _mlp_forward_lib(st, spl, sd, *fwd)
        g = lpm.grouped_mlp_backward(dy_a, ctx)
        return _present(g.dx, g.dfc1_weight, g.dfc2_weight, g.dfc1_bias, g.dfc2_bias, g.dprobs)

    arrays = _present(x, w1, w2, b1, b2, p) + [dy]
    outs = [_spec(a) for a in _present(x, w1, w2, b1, b2, p)]
    grads = _call(fn, [splits, seed, *arrays], [_is_bf16(a.dtype) for a in arrays], outs)
    dx, dw1, dw2, db1, db2, dp = _unpack(grads, (True, True, True, b1 is not None,
                                                 b2 is not None, p is not None))
    return None, None, dx, dw1, dw2, db1, db2, dp


_mlp.defvjp(_mlp_fwd, _mlp_bwd)


def grouped_mlp(x, splits, fc1_weight, fc2_weight, fc1_bias=None, fc2_bias=None, *,
                recipe: lpm.Recipe, probs=None, activation: str = "swiglu",
                glu_interleave: int | None = None, limit=None, alpha=None, seed=0,
                fused: bool = True):
    """Differentiable :func:`lowprec_moe.grouped_mlp_forward` on JAX arrays.

    Parameters
    ----------
    x : jax.Array ``[M, K]`` (float32 / float16 / bfloat16)
        Tokens sorted by expert.
    splits : sequence of int or 1-D integer jax.Array
        Tokens per expert (``G`` entries summing to M).
    fc1_weight : jax.Array ``[G, N1, K]`` (``N1 = 2F`` for GLU activations, ``F`` for srelu)
    fc2_weight : jax.Array ``[G, N2, F]``
    fc1_bias : jax.Array ``[G, N1]``, optional
    fc2_bias : jax.Array ``[G, N2]``, optional
    recipe : lowprec_moe.Recipe
    probs : jax.Array ``[M]``, optional
        Routing weights: ``z = act(h) * probs`` (fc2's bias is scaled by them too).
    activation, glu_interleave, limit, alpha, fused
        As :func:`lowprec_moe.grouped_mlp_forward`.
    seed : int or integer scalar jax.Array
        Stochastic-rounding seed of the backward (NVFP4 with SR), below 2**32.

    Returns
    -------
    jax.Array ``[M, N2]`` of x's dtype
    """
    _check(x, recipe)
    fc1_weight, fc2_weight, fc1_bias, fc2_bias = _cast_params(
        x, recipe, fc1_weight, fc2_weight, fc1_bias, fc2_bias)
    st = _Static(recipe=recipe, has_bias=(fc1_bias is not None, fc2_bias is not None),
                 has_probs=probs is not None,
                 mlp=(activation, glu_interleave, limit, alpha, bool(fused)))
    spl, sd = _operands(splits, seed)
    return _mlp(st, spl, sd, x, fc1_weight, fc2_weight, fc1_bias, fc2_bias, probs)
