"""GroupedLinear with an explicit forward / backward (NUMERICS §§6-8).

``y, ctx = grouped_linear_forward(x, splits, weight, bias, recipe=...)`` runs the fprop GEMM and
returns a context holding exactly what the backward needs; ``grouped_linear_backward(dy, ctx)``
runs dgrad and wgrad and returns every gradient. There is no autograd graph: the caller owns the
order of calls, as in any framework.

What is kept between forward and backward (NUMERICS §8):

* the columnwise copy of x, only if the weight needs a gradient (wgrad operand); the rowwise copy
  of x is dropped once fprop is done;
* the columnwise copy of W, only if the input needs a gradient (dgrad operand);
* bias and probs when given (dbias / dprobs).

Pre-quantized MXFP8 inputs ("wire format", a rowwise-only ``GroupedTensor``): fprop uses the
wire bytes as they are; the wgrad operand is ``with_columnwise()`` of the wire tensor. A wire
``dy`` feeds dgrad directly and its columnwise copy feeds wgrad; dbias / dprobs come from
``dequantize(dy)`` in bfloat16. Results equal feeding ``dequantize(wire, "bfloat16")`` through the
ordinary path, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lowprec_moe import _validate as V
from lowprec_moe.backend import get_xp, is_cupy_array
from lowprec_moe.gemm import grouped_gemm_dgrad, grouped_gemm_fprop, grouped_gemm_wgrad
from lowprec_moe.tensors.grouped_tensor import GroupedTensor
from lowprec_moe.layers.recipe import Recipe


@dataclass
class GroupedLinearContext:
    """What :func:`grouped_linear_backward` needs; produced by :func:`grouped_linear_forward`.

    A context can be used for exactly one backward call.
    """

    recipe: Recipe
    splits: tuple
    m: int
    n: int
    k: int
    x_dtype: str
    y_dtype: str
    weight_dtype: str
    input_requires_grad: bool
    weight_requires_grad: bool
    x_saved: Any = None          # wgrad operand: x columnwise (GroupedTensor) or x (bf16 recipe)
    w_saved: Any = None          # dgrad operand: W columnwise (GroupedTensor) or W (bf16 recipe)
    bias: Any = None
    probs: Any = None
    x_rht: bool = False
    seed: int = 0
    first_expert: int = 0
    used: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class GroupedLinearGrads:
    """Gradients of a grouped linear layer (None where not requested).

    Attributes
    ----------
    dx : array ``[M, K]`` (x's dtype; bfloat16 for a pre-quantized x)
    dweight : array ``[G, N, K]`` (weight's dtype)
    dbias : array ``[G, N]`` (bias's dtype)
    dprobs : array ``[M]`` (probs's dtype)
    """

    dx: Any = None
    dweight: Any = None
    dbias: Any = None
    dprobs: Any = None


# ============================================================================================
# validation


def _check_recipe(recipe) -> Recipe:
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a lowprec_moe.Recipe, got {type(recipe).__name__}")
    return recipe


def check_wire(name: str, t: GroupedTensor, recipe: Recipe, fp8_dtype: str) -> None:
    """A pre-quantized operand must be rowwise MXFP8 of the recipe's fp8 dtype."""
    if t.format != "mxfp8" or t.rowwise_data is None:
        raise ValueError(f"{name} is a pre-quantized {t.format} GroupedTensor; only rowwise mxfp8 "
                         "(wire format) is accepted")
    if recipe.name != "mxfp8":
        raise ValueError(f"{name} is pre-quantized mxfp8 but recipe={recipe!r}; use Recipe.mxfp8")
    if t.fp8_dtype != fp8_dtype:
        raise ValueError(f"{name}.fp8_dtype={t.fp8_dtype!r} but recipe {recipe!r} expects "
                         f"{fp8_dtype!r} for {name}")


def _check_weight(weight, bias, probs, num_groups: int, m: int, k: int, xp_args) -> None:
    V.check_array("weight", weight, min_rank=3)
    if weight.ndim != 3:
        raise ValueError(f"weight must be [G, N, K] (rank 3), got shape {tuple(weight.shape)}")
    g, n, kw = weight.shape
    if g != num_groups:
        raise ValueError(f"weight has G={g} experts but splits has G={num_groups} entries")
    if kw != k:
        raise ValueError(f"x has K={k} columns but weight has K={kw}")
    if bias is not None:
        V.check_array("bias", bias, min_rank=2)
        if tuple(bias.shape) != (g, n):
            raise ValueError(f"bias.shape={tuple(bias.shape)} must be (G, N)={(g, n)}")
    if probs is not None:
        V.check_array("probs", probs, min_rank=1)
        if tuple(probs.shape) != (m,):
            raise ValueError(f"probs.shape={tuple(probs.shape)} must be (M,)=({m},)")
    get_xp(*xp_args)


# ============================================================================================
# forward


def grouped_linear_forward(x, splits, weight, bias=None, *, recipe: Recipe, probs=None,
                           input_requires_grad: bool = True, weight_requires_grad: bool = True,
                           seed: int = 0, first_expert: int = 0):
    """Forward of a grouped linear layer: ``y_g = x_g W_g^T (+ bias_g (* probs))``.

    Parameters
    ----------
    x : array ``[M, K]`` (float32 / float16 / bfloat16; rank > 2 flattened) or GroupedTensor
        Tokens sorted by expert, or a pre-quantized rowwise MXFP8 wire tensor.
    splits : sequence of int, 1-D cupy integer array, or None
        Tokens per expert (``G`` host ints summing to M); None takes ``x.splits`` from a wire x.
        On the GPU they may be a device array (every recipe; not with a wire x): neither
        forward nor backward then reads anything back (NUMERICS §7.5; see
        ``grouped_gemm_fprop``).
    weight : array ``[G, N, K]``
    bias : array ``[G, N]``, optional
    recipe : Recipe
    probs : array ``[M]``, optional
        Routing weights scaling the bias: ``y += bias[g(m)] * probs[m]``. Without a bias they
        do not change y (and ``dprobs`` is zero).
    input_requires_grad, weight_requires_grad : bool
        Whether backward computes ``dx`` / ``dweight`` (and so what the context keeps).
    seed : int
        Stochastic-rounding seed used by the backward for dy (NVFP4 recipes with SR).
    first_expert : int
        Global index of this call's first expert, for the stochastic-rounding stream only: with
        the experts spread over processes (expert parallelism), each rank passes the index of
        its first local expert and rounds as one process holding every expert would. 0 otherwise.

    Returns
    -------
    y : array ``[M, N]`` of x's dtype (bfloat16 for a wire x)
    ctx : GroupedLinearContext
    """
    recipe = _check_recipe(recipe)
    seed = V.check_seed(seed)
    wire = isinstance(x, GroupedTensor)
    if wire:
        check_wire("x", x, recipe, recipe.x_fp8_dtype)
        if splits is None:
            splits = x.splits
        splits = V.check_splits(splits, x.shape[0])
        if tuple(splits) != tuple(x.splits):
            raise ValueError(f"splits={list(splits)} differ from x.splits={list(x.splits)}")
        m, k = x.shape
        x_dtype = "bfloat16"
        arrays = [x.rowwise_data, weight, bias, probs]
    else:
        V.check_array("x", x)
        x = V.as_2d(x)
        m, k = x.shape
        splits = check_layer_splits(splits, m, x)
        x_dtype = V.dtype_name(x.dtype)
        arrays = [x, weight, bias, probs]
    _check_weight(weight, bias, probs, len(splits), m, k, arrays)
    g, n, _ = weight.shape
    if recipe.quantized and (input_requires_grad or weight_requires_grad):
        block = V.block_size(recipe.format)
        if n % block:
            raise ValueError(f"weight has N={n} rows per expert; N must be a multiple of {block} "
                             f"for {recipe.format} (the backward quantizes dy [M, N] along N)")
    # probs only scale the bias: without a bias, y does not depend on them (dprobs = 0)
    gemm_probs = probs if bias is not None else None
    ctx = GroupedLinearContext(recipe=recipe, splits=splits, m=m, n=n, k=k, x_dtype=x_dtype,
                               y_dtype=x_dtype, weight_dtype=V.dtype_name(weight.dtype),
                               input_requires_grad=bool(input_requires_grad),
                               weight_requires_grad=bool(weight_requires_grad),
                               bias=bias, probs=probs, seed=seed,
                               first_expert=V.check_first_member(first_expert, len(splits)))
    if not recipe.quantized:
        xh = x.dequantize("rowwise", dtype="bfloat16") if wire else x
        if xh.dtype != weight.dtype:
            raise TypeError(f"x.dtype={V.dtype_name(xh.dtype)} and weight.dtype="
                            f"{V.dtype_name(weight.dtype)} must match for the bf16 recipe")
        y = grouped_gemm_fprop(xh, weight, splits, bias=bias, probs=gemm_probs, out_dtype=x_dtype)
        ctx.x_saved = xh if weight_requires_grad else None
        ctx.w_saved = weight if input_requires_grad else None
        return y, ctx

    fmt = recipe.format
    xq = _quantize_x(x, splits, recipe, wire, columnwise=weight_requires_grad)
    ctx.x_rht = bool(xq.rht)
    wq = quantize_weight(weight, recipe, columnwise=input_requires_grad)
    y = grouped_gemm_fprop(xq, wq, splits, bias=bias, probs=gemm_probs, out_dtype=x_dtype)
    if weight_requires_grad:
        ctx.x_saved = _columnwise_only(xq)
    if input_requires_grad:
        ctx.w_saved = _columnwise_only(wq)
    del fmt
    return y, ctx


def check_layer_splits(splits, m: int, x):
    """Host splits checked against ``m`` (a tuple), or device splits of a GPU layer (the
    layer's own int64 copy, which its backward reads even if the caller refills its buffer;
    their values are not read, NUMERICS §7.5)."""
    if not is_cupy_array(splits):
        return V.check_splits(splits, m)
    return V.check_device_splits(splits, x, copy=True)


def _quantize_x(x, splits, recipe: Recipe, wire: bool, *, columnwise: bool) -> GroupedTensor:
    if wire:
        return x.with_columnwise() if columnwise else x
    return GroupedTensor.quantize(x, splits, **recipe.x_options(V.dtype_name(x.dtype),
                                                                 columnwise=columnwise))


def quantize_weight(weight, recipe: Recipe, *, columnwise: bool) -> GroupedTensor:
    """Quantize a ``[G, N, K]`` weight per expert as the recipe says (rowwise + optional columnwise).

    Returns a GroupedTensor of the ``[G*N, K]`` stacked weight with splits ``[N] * G``.
    """
    g, n, k = weight.shape
    block = V.block_size(recipe.format)
    block_2d = recipe.weight_2d and n % block == 0
    if recipe.weight_2d and not block_2d:
        raise ValueError(f"weight N={n} must be a multiple of {block} for 2-D {recipe.format} "
                         f"weight blocks; use weight_2d=False")
    return GroupedTensor.quantize(weight.reshape(g * n, k), [n] * g, recipe.format,
                                  rowwise=True, columnwise=columnwise, block_2d=block_2d,
                                  fp8_dtype="e4m3")


def _columnwise_only(t: GroupedTensor) -> GroupedTensor:
    """Drop the rowwise copy (and its amax) of a grouped tensor, keeping the columnwise one."""
    return replace(t, rowwise_data=None, rowwise_scale=None, amax_rowwise=None)


# ============================================================================================
# backward


def claim_context(ctx, cls) -> None:
    """``ctx`` must be a ``cls`` (a forward context) not yet used by a backward call."""
    if not isinstance(ctx, cls):
        raise TypeError(f"ctx must be a {cls.__name__}, got {type(ctx).__name__}")
    if ctx.used:
        raise ValueError(f"this {cls.__name__} was already used by a backward call; run the "
                         "forward again")


def saved_arrays(*saved) -> list:
    """The arrays held by a context's saved items (GroupedTensors: their columnwise parts)."""
    out = []
    for t in saved:
        if isinstance(t, GroupedTensor):
            out += [a for a in (t.columnwise_data, t.columnwise_scale, t.amax_columnwise)
                    if a is not None]
        elif t is not None:
            out.append(t)
    return out


def check_backward_dy(dy, recipe: Recipe, m: int, n: int, splits, y_dtype: str):
    """Validate a backward's output gradient (an array or a rowwise MXFP8 wire tensor).

    Returns
    -------
    dy : array ``[M, N]`` or GroupedTensor
        The gradient as the GEMMs take it (arrays viewed as 2-D).
    dy_hp : array ``[M, N]``
        High-precision dy for the bias / probs gradients (``dequantize(dy)`` in bf16 for a wire dy).
    wire : bool
        Whether dy arrived pre-quantized.
    """
    wire = isinstance(dy, GroupedTensor)
    if wire:
        check_wire("dy", dy, recipe, recipe.dy_fp8_dtype)
        if is_cupy_array(splits):
            raise NotImplementedError("a pre-quantized dy with device splits is not implemented")
        if tuple(dy.shape) != (m, n):
            raise ValueError(f"dy.shape={tuple(dy.shape)} must be (M, N)={(m, n)}")
        if tuple(dy.splits) != tuple(splits):
            raise ValueError(f"dy.splits={list(dy.splits)} differ from the forward's "
                             f"splits={list(splits)}")
        return dy, dy.dequantize("rowwise", dtype="bfloat16"), True
    V.check_array("dy", dy)
    dy = V.as_2d(dy)
    if tuple(dy.shape) != (m, n):
        raise ValueError(f"dy.shape={tuple(dy.shape)} must be (M, N)={(m, n)}")
    if V.dtype_name(dy.dtype) != y_dtype:
        raise TypeError(f"dy.dtype={V.dtype_name(dy.dtype)} must match the forward output "
                        f"dtype {y_dtype}")
    return dy, dy, False


def grouped_linear_backward(dy, ctx: GroupedLinearContext, *, seed: int | None = None):
    """Backward of :func:`grouped_linear_forward`.

    Parameters
    ----------
    dy : array ``[M, N]`` of the forward output dtype, or a pre-quantized rowwise MXFP8
        GroupedTensor (E5M2 for the "hybrid" recipe, else E4M3).
    ctx : GroupedLinearContext
        From the forward; usable once.
    seed : int, optional
        Stochastic-rounding seed for dy (default: the forward's ``seed``).

    Returns
    -------
    GroupedLinearGrads
        ``dx [M, K]``, ``dweight [G, N, K]``, ``dbias [G, N]``, ``dprobs [M]``; None where the
        forward said no gradient is needed or no bias / probs were given.
    """
    claim_context(ctx, GroupedLinearContext)
    recipe = ctx.recipe
    seed = ctx.seed if seed is None else V.check_seed(seed)
    dy, dy_hp, wire = check_backward_dy(dy, recipe, ctx.m, ctx.n, ctx.splits, ctx.y_dtype)
    # no NumPy / CuPy mixing with the forward's arrays
    get_xp(dy_hp, *saved_arrays(ctx.x_saved, ctx.w_saved, ctx.bias, ctx.probs))
    ctx.used = True

    dx = dweight = None
    need_dx, need_dw = ctx.input_requires_grad, ctx.weight_requires_grad
    # dbias comes out of the pass that quantizes dy when there is one; otherwise it is summed in
    # that pass's order (recipe.format), so it has the same bits on every path
    fused_dbias = recipe.quantized and not wire and ctx.bias is not None and (need_dx or need_dw)
    dbias, dprobs = _bias_grads(dy_hp, ctx, want_dbias=not fused_dbias, like=recipe.format)
    if not recipe.quantized:
        if wire:
            dy = dy_hp
        if need_dx:
            dx = grouped_gemm_dgrad(dy, ctx.w_saved, ctx.splits, out_dtype=ctx.x_dtype)
        if need_dw:
            dweight = grouped_gemm_wgrad(dy, ctx.x_saved, ctx.splits, out_dtype=ctx.weight_dtype)
        ctx.x_saved = ctx.w_saved = None
        return GroupedLinearGrads(dx=dx, dweight=dweight, dbias=dbias, dprobs=dprobs)

    if need_dx or need_dw:
        dyq, sums = _quantize_dy(dy, ctx, wire, rowwise=need_dx, columnwise=need_dw, seed=seed,
                                 column_sums=fused_dbias)
        if fused_dbias:
            dbias = sums.astype(ctx.bias.dtype)
        if need_dx:
            dx = grouped_gemm_dgrad(dyq, ctx.w_saved, ctx.splits, out_dtype=ctx.x_dtype)
        if need_dw:
            dweight = grouped_gemm_wgrad(dyq, ctx.x_saved, ctx.splits,
                                         out_dtype=ctx.weight_dtype)
    ctx.x_saved = ctx.w_saved = None
    return GroupedLinearGrads(dx=dx, dweight=dweight, dbias=dbias, dprobs=dprobs)


def _quantize_dy(dy, ctx: GroupedLinearContext, wire: bool, *, rowwise: bool, columnwise: bool,
                 seed: int, column_sums: bool):
    """``(dy quantized, its per-expert column sums (* probs) or None)``."""
    recipe = ctx.recipe
    if wire:
        return (dy.with_columnwise() if columnwise else dy), None
    options = recipe.grad_options(rowwise=rowwise, columnwise=columnwise,
                                  rht=ctx.x_rht and columnwise, seed=seed,
                                  first_member=ctx.first_expert)
    return quantize_grad(dy, ctx.splits, options, column_sums=column_sums, probs=ctx.probs)


def quantize_grad(dy, splits, options: dict, *, column_sums: bool, probs=None):
    """``(GroupedTensor.quantize(dy, splits, **options), its per-expert column sums (* probs)
    from the same pass, or None without column_sums)``: the quantized dy and the bias
    gradient of a layer's backward (GroupedLinear, GroupedMLP's fc2)."""
    if column_sums:
        return GroupedTensor.quantize_with_column_sums(dy, splits, probs=probs, **options)
    return GroupedTensor.quantize(dy, splits, **options), None


def expert_index(splits, xp, m: int):
    """int64 ``[M]``: the expert of every token row (device splits: built on the device)."""
    if is_cupy_array(splits):
        from lowprec_moe.backends.cupy.splits import clamped_rows, expert_of_rows

        return expert_of_rows(xp, clamped_rows(xp, splits, m)[1], m)
    return xp.asarray(np.repeat(np.arange(len(splits), dtype=np.int64), splits))


def _bias_grads(dy_hp, ctx: GroupedLinearContext, *, want_dbias: bool = True, like=None):
    """``dbias_g = sum_rows dy_g (* p)`` (unless ``want_dbias=False``: the caller takes it from dy's
    quantize pass; ``like``: summed in the order of that format's quantize pass, so dbias has the
    same bits either way) and ``dprobs_i = sum_j dy_ij b_{g(i), j}`` in fp32."""
    if ctx.bias is None:
        if ctx.probs is None:
            return None, None
        xp = get_xp(dy_hp)
        return None, xp.zeros(ctx.m, dtype=ctx.probs.dtype)
    xp = get_xp(dy_hp)
    dbias = None
    if want_dbias:
        if xp is np:
            from lowprec_moe.backends.numpy.reduce import grouped_colsum as colsum
        else:
            from lowprec_moe.backends.cupy.reduce import grouped_colsum as colsum
        dbias = colsum(dy_hp, ctx.splits, ctx.probs, like=like).astype(ctx.bias.dtype)
    dprobs = None
    if ctx.probs is not None:
        dy32 = dy_hp.astype(xp.float32)
        b_rows = ctx.bias.astype(xp.float32)[expert_index(ctx.splits, xp, ctx.m)]
        dprobs = (dy32 * b_rows).sum(axis=1).astype(ctx.probs.dtype)
    return dbias, dprobs


def _np_dtype(dtype):
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    if name not in ("float32", "float16"):
        raise ValueError(f"dtype={dtype!r} must be float32, bfloat16 or float16")
    return np.dtype(name)
