"""Module-style wrappers: parameters plus forward / backward calls of the grouped layers.

:class:`GroupedLinear` holds one weight (and bias) per expert for
:func:`~lowprec_moe.grouped_linear_forward` / :func:`~lowprec_moe.grouped_linear_backward`;
:class:`GroupedMLP` holds fc1 / fc2 for :func:`~lowprec_moe.grouped_mlp_forward` /
:func:`~lowprec_moe.grouped_mlp_backward`. Both initialise like ``torch.nn.Linear`` (uniform in
``+-1/sqrt(fan_in)``) from a NumPy seed, keep the parameters on ``numpy`` or ``cupy``, and advance
a step counter on every backward call that seeds stochastic rounding.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe.layers.activations import make_activation
from lowprec_moe.layers.linear import (GroupedLinearGrads, _check_recipe, _np_dtype, grouped_linear_backward,
                     grouped_linear_forward)
from lowprec_moe.layers.mlp import GroupedMLPGrads, grouped_mlp_backward, grouped_mlp_forward
from lowprec_moe.layers.recipe import Recipe

__all__ = ["GroupedLinear", "GroupedMLP"]


class GroupedLinear:
    """Parameters of a grouped linear layer plus forward / backward calls.

    Parameters
    ----------
    num_experts, in_features, out_features : int
    bias : bool
    recipe : Recipe
    dtype : str or dtype
        Parameter dtype ("float32", "bfloat16", "float16").
    xp : module
        ``numpy`` or ``cupy``: where the parameters live.
    seed : int
        Initialisation seed (uniform in ``+-1/sqrt(in_features)``, as torch.nn.Linear).

    Each :meth:`backward` call advances an internal step counter used as the stochastic-rounding
    seed, so repeated steps draw fresh random bits while runs stay reproducible.
    """

    def __init__(self, num_experts: int, in_features: int, out_features: int, bias: bool = True,
                 recipe: Recipe | None = None, dtype="float32", xp=np, seed: int = 0):
        for name, v in (("num_experts", num_experts), ("in_features", in_features),
                        ("out_features", out_features)):
            if not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"{name}={v!r} must be a positive int")
        self.recipe = _check_recipe(recipe if recipe is not None else Recipe.bf16())
        dt = _np_dtype(dtype)
        rng = np.random.default_rng(seed)
        bound = 1.0 / np.sqrt(in_features)
        w = rng.uniform(-bound, bound, (num_experts, out_features, in_features))
        self.weight = xp.asarray(w.astype(np.float32).astype(dt))
        self.bias = (xp.asarray(rng.uniform(-bound, bound, (num_experts, out_features))
                                .astype(np.float32).astype(dt)) if bias else None)
        self.step = 0

    def forward(self, x, splits, probs=None, *, input_requires_grad: bool = True,
                weight_requires_grad: bool = True):
        """``(y, ctx)`` of :func:`grouped_linear_forward` with this layer's parameters."""
        return grouped_linear_forward(x, splits, self.weight, self.bias, recipe=self.recipe,
                                      probs=probs, input_requires_grad=input_requires_grad,
                                      weight_requires_grad=weight_requires_grad, seed=self.step)

    __call__ = forward

    def backward(self, dy, ctx) -> GroupedLinearGrads:
        """Gradients of :func:`grouped_linear_backward`; advances the SR step counter."""
        grads = grouped_linear_backward(dy, ctx)
        self.step += 1
        return grads


class GroupedMLP:
    """Parameters of a grouped MLP expert block plus forward / backward calls.

    Parameters
    ----------
    num_experts : int
    hidden_size : int
        K: fc1's input and fc2's output features.
    ffn_hidden_size : int
        F: the activation's output features (fc1 has 2F outputs for GLU activations).
    activation : str
        "swiglu" (default), "clamped_swiglu" or "srelu".
    glu_interleave : int, optional
    bias : bool
        Give fc1 and fc2 a bias.
    recipe : Recipe
    dtype : str or dtype
        Parameter dtype ("float32", "bfloat16", "float16").
    xp : module
        ``numpy`` or ``cupy``: where the parameters live.
    seed : int
        Initialisation seed (uniform in ``+-1/sqrt(fan_in)``, as torch.nn.Linear).
    limit, alpha : float, optional
        clamped_swiglu parameters.

    Each :meth:`backward` call advances an internal step counter used as the stochastic-rounding
    seed, so repeated steps draw fresh random bits while runs stay reproducible.
    """

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int, *,
                 activation: str = "swiglu", glu_interleave: int | None = None,
                 bias: bool = True, recipe: Recipe | None = None, dtype="float32", xp=np,
                 seed: int = 0, limit=None, alpha=None):
        for name, v in (("num_experts", num_experts), ("hidden_size", hidden_size),
                        ("ffn_hidden_size", ffn_hidden_size)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"{name}={v!r} must be a positive int")
        self.activation = make_activation(activation, glu_interleave, limit, alpha)
        if glu_interleave is not None and ffn_hidden_size % glu_interleave:
            raise ValueError(f"glu_interleave={glu_interleave} must divide "
                             f"ffn_hidden_size={ffn_hidden_size}")
        self.recipe = _check_recipe(recipe if recipe is not None else Recipe.bf16())
        dt = _np_dtype(dtype)
        rng = np.random.default_rng(seed)
        e, k, f = int(num_experts), int(hidden_size), int(ffn_hidden_size)
        n1 = self.activation.input_features(f)

        def uniform(shape, fan_in):
            bound = 1.0 / np.sqrt(fan_in)
            return xp.asarray(rng.uniform(-bound, bound, shape).astype(np.float32).astype(dt))

        self.fc1_weight = uniform((e, n1, k), k)
        self.fc2_weight = uniform((e, k, f), f)
        self.fc1_bias = uniform((e, n1), k) if bias else None
        self.fc2_bias = uniform((e, k), f) if bias else None
        self.step = 0

    def forward(self, x, splits, probs=None, *, input_requires_grad: bool = True,
                weight_requires_grad: bool = True, fused: bool = True):
        """``(y, ctx)`` of :func:`grouped_mlp_forward` with this block's parameters."""
        return grouped_mlp_forward(x, splits, self.fc1_weight, self.fc2_weight, self.fc1_bias,
                                   self.fc2_bias, probs=probs, activation=self.activation,
                                   recipe=self.recipe, input_requires_grad=input_requires_grad,
                                   weight_requires_grad=weight_requires_grad, seed=self.step,
                                   fused=fused)

    __call__ = forward

    def backward(self, dy, ctx) -> GroupedMLPGrads:
        """Gradients of :func:`grouped_mlp_backward`; advances the SR step counter."""
        grads = grouped_mlp_backward(dy, ctx)
        self.step += 1
        return grads
