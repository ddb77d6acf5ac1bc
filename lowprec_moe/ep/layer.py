"""The expert-parallel MoE layer: dispatch, the local experts' GroupedMLP, combine; and back.

The router stays with the caller (it is a small dense layer of the framework): the layer takes
the router's top-k experts and weights of this rank's tokens and the weights of this rank's
experts (``E / W`` of them, rank ``r`` holding experts ``r E/W .. (r+1) E/W - 1``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lowprec_moe.ep.dispatch import (DispatchHandle, _check_group, _check_wire, combine,
                                     combine_backward, dispatch, dispatch_backward)
from lowprec_moe.layers.mlp import grouped_mlp_backward, grouped_mlp_forward
from lowprec_moe.layers.recipe import Recipe

__all__ = ["MoEContext", "MoEGrads", "moe_backward", "moe_forward"]


@dataclass
class MoEContext:
    """What :func:`moe_backward` needs; used once.

    Attributes
    ----------
    handle : DispatchHandle
    mlp : GroupedMLPContext
        The local experts' context.
    expert_out : array ``[R, N]``
        The local experts' outputs (combine's input).
    dy_wire : {"mxfp8", "bf16"}
    dy_fp8_dtype : str
    """

    handle: DispatchHandle
    mlp: Any
    expert_out: Any
    dy_wire: str
    dy_fp8_dtype: str
    used: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class MoEGrads:
    """Gradients of the expert-parallel MoE layer on one rank.

    Attributes
    ----------
    dx : array ``[T, K]``
        This rank's tokens.
    dtopk_weights : float32 array ``[T, k]``
        The routing weights of this rank's tokens (for the router's backward).
    dfc1_weight, dfc2_weight : arrays ``[E/W, ...]``
        This rank's experts.
    dfc1_bias, dfc2_bias : arrays ``[E/W, ...]`` or None
    """

    dx: Any
    dtopk_weights: Any
    dfc1_weight: Any
    dfc2_weight: Any
    dfc1_bias: Any = None
    dfc2_bias: Any = None


def moe_forward(x, topk_idx, topk_weights, fc1_weight, fc2_weight, fc1_bias=None,
                fc2_bias=None, *, recipe: Recipe, group=None, wire: str = "mxfp8",
                dy_wire: str | None = None, activation="swiglu", glu_interleave=None,
                seed: int = 0):
    """Forward of the expert-parallel MoE layer on one rank.

    ``dispatch`` (the tokens to their experts' ranks, as ``wire``) -> ``grouped_mlp_forward``
    on this rank's experts -> ``combine`` (the outputs back, weighted, summed in slot order).

    Parameters
    ----------
    x : array ``[T, K]``
        This rank's tokens (bfloat16 for the usual layer; any float dtype ``dispatch`` takes).
    topk_idx : integer array ``[T, k]``
        Global expert ids from the router.
    topk_weights : float array ``[T, k]``
        The router's weights of those experts.
    fc1_weight : array ``[E/W, N1, K]``
        This rank's experts (``E/W = E`` without a group).
    fc2_weight : array ``[E/W, N2, F]``
    fc1_bias, fc2_bias : arrays ``[E/W, N1]`` / ``[E/W, N2]``, optional
    recipe : Recipe
        The local experts' recipe. ``wire="mxfp8"`` needs ``Recipe.mxfp8`` (its fprop takes the
        wire bytes as they are).
    group : None or Group
        None: one process, every expert here.
    wire : {"mxfp8", "bf16"}
        How the tokens travel.
    dy_wire : {None, "mxfp8", "bf16"}
        How the experts' output gradient travels in the backward (None: as ``wire``).
    activation, glu_interleave
        As :func:`lowprec_moe.grouped_mlp_forward`.
    seed : int
        Stochastic-rounding seed of the backward (NVFP4 recipes with SR): pass a new one every
        step, the same on every rank.

    Returns
    -------
    y : array ``[T, N2]``
        This rank's tokens, in the experts' output dtype (bfloat16 for a bf16 layer).
    ctx : MoEContext
    """
    size = _check_group(group)
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a lowprec_moe.Recipe, got {type(recipe).__name__}")
    _check_wire(wire)
    dy_wire = wire if dy_wire is None else _check_wire(dy_wire)
    for name, value in (("wire", wire), ("dy_wire", dy_wire)):
        if value == "mxfp8" and recipe.name != "mxfp8":
            raise ValueError(f"{name}='mxfp8' needs Recipe.mxfp8 (the experts take the wire "
                             f"bytes as their MXFP8 operand), got recipe={recipe!r}")
    if getattr(fc1_weight, "ndim", 0) != 3:
        raise ValueError(f"fc1_weight must be [E/W, N1, K], got shape "
                         f"{tuple(getattr(fc1_weight, 'shape', ()))}")
    local = int(fc1_weight.shape[0])
    num_experts = local * size
    tokens, splits, handle = dispatch(x, topk_idx, topk_weights, num_experts, group=group,
                                      wire=wire, fp8_dtype=recipe.x_fp8_dtype)
    # the local experts round (NVFP4 SR) as experts rank * E/W ... of one process
    out, mlp = grouped_mlp_forward(tokens, splits, fc1_weight, fc2_weight, fc1_bias, fc2_bias,
                                   activation=activation, glu_interleave=glu_interleave,
                                   recipe=recipe, seed=seed,
                                   first_expert=0 if group is None else group.rank * local)
    y = combine(out, handle)
    return y, MoEContext(handle, mlp, out, dy_wire, recipe.dy_fp8_dtype)


def moe_backward(dy, ctx: MoEContext) -> MoEGrads:
    """Backward of :func:`moe_forward` on one rank.

    ``combine_backward`` (the weighted output gradient to the experts' ranks, as ``dy_wire``;
    the routing weights' gradient here) -> ``grouped_mlp_backward`` -> ``dispatch_backward``
    (the tokens' gradients back, their copies summed in slot order).

    Parameters
    ----------
    dy : array ``[T, N2]``
    ctx : MoEContext
        From :func:`moe_forward`; used once.

    Returns
    -------
    MoEGrads
    """
    if not isinstance(ctx, MoEContext):
        raise TypeError(f"ctx must be the MoEContext moe_forward returned, got "
                        f"{type(ctx).__name__}")
    if ctx.used:
        raise ValueError("ctx was already used by a backward call (a context is used once)")
    d_out, d_w = combine_backward(dy, ctx.expert_out, ctx.handle, wire=ctx.dy_wire,
                                  fp8_dtype=ctx.dy_fp8_dtype)
    ctx.used = True
    g = grouped_mlp_backward(d_out, ctx.mlp)
    dx = dispatch_backward(g.dx, ctx.handle)
    return MoEGrads(dx, d_w, g.dfc1_weight, g.dfc2_weight, g.dfc1_bias, g.dfc2_bias)
