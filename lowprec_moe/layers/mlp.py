"""GroupedMLP: fc1 -> activation x routing probs -> fc2, explicit forward / backward (NUMERICS §6-8).

Per expert ``g`` (rows ``offsets[g]:offsets[g+1]`` of the expert-sorted tokens)::

    h = x W1_g^T + b1_g                    fc1: K -> 2F (GLU activations) or K -> F (srelu)
    z = act(h) * probs[:, None]            activation (exact fp32 math, one rounding)
    y = z W2_g^T + b2_g * probs[:, None]   fc2: F -> N2 (N2 = K in a transformer block)

``y, ctx = grouped_mlp_forward(x, splits, fc1_weight, fc2_weight, ...)`` and
``grads = grouped_mlp_backward(dy, ctx)``; ``grads.dprobs`` collects the activation's share
``sum_f act(h)_f * dz_f`` and fc2's scaled-bias share ``sum_j dy_j * b2_j``.

Each GEMM follows the recipe exactly as :func:`~lowprec_moe.grouped_linear_forward` does (NUMERICS §7:
fprop x / W rowwise, dgrad dy rowwise / W columnwise, wgrad dy / x columnwise), and the
activation is fused with the quantization of its output (see :mod:`lowprec_moe.layers.activations`):

* forward: ``h`` (layer dtype) -> fc2's input quantized rowwise (fprop) and columnwise (wgrad of
  fc2, only if the weights need a gradient);
* backward: ``dz`` (fc2's dgrad output, layer dtype) and the saved ``h`` -> ``dh`` quantized
  rowwise (fc1 dgrad, if x needs a gradient) and columnwise (fc1 wgrad), the activation's dprobs
  and fc1's bias gradient ``sum_rows dh``.

What the context keeps: fc1's x columnwise (weight gradients only), fc1's W columnwise (input
gradient only), the pre-activation ``h`` in the layer dtype (as TE does), fc2's input columnwise
(weight gradients only) and fc2's W columnwise, plus fc2's bias and the probs. Nothing is
re-quantized in the backward that the forward already holds in the needed direction.

Layer dtype: x's dtype (bfloat16 for a pre-quantized wire x); ``h``, ``z``, ``y``, ``dx`` and the
intermediate gradients have it. Weight / bias gradients have the parameter's dtype, ``dprobs``
the probs' dtype.

Pre-quantized MXFP8 inputs (rowwise wire ``GroupedTensor``): a wire ``x`` feeds fc1's fprop as it
is and its ``with_columnwise()`` copy fc1's wgrad; a wire ``dy`` feeds fc2's dgrad and (through
``with_columnwise()``) its wgrad, and fc2's bias gradient / dprobs come from ``dequantize(dy)``
in bfloat16. Results equal feeding ``dequantize(wire, "bfloat16")`` through the ordinary path, bit
for bit.

Stochastic rounding (NVFP4): fc2's ``dy`` draws from ``seed``, fc1's ``dh`` from
``(seed + 0x9E3779B97F4A7C15) mod 2**64``, so the two gradients never share random bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


from lowprec_moe import _validate as V
from lowprec_moe.layers.activations import Activation, activation_backward, activation_forward, make_activation
from lowprec_moe.backend import get_xp
from lowprec_moe.gemm import grouped_gemm_dgrad, grouped_gemm_fprop, grouped_gemm_wgrad
from lowprec_moe.tensors.grouped_tensor import GroupedTensor
from lowprec_moe.layers.linear import (_bias_grads, _check_recipe, _columnwise_only, _np_dtype, _quantize_x,
                     check_backward_dy, check_layer_splits, check_wire, claim_context,
                     quantize_grad, quantize_weight, saved_arrays)
from lowprec_moe.layers.recipe import Recipe

__all__ = [
    "GroupedMLPContext",
    "GroupedMLPGrads",
    "grouped_mlp_backward",
    "grouped_mlp_forward",
]

#: Offset between the stochastic-rounding seeds of fc2's dy and fc1's dh.
FC1_SEED_OFFSET = 0x9E3779B97F4A7C15


@dataclass
class GroupedMLPContext:
    """What :func:`grouped_mlp_backward` needs; produced by :func:`grouped_mlp_forward`.

    A context can be used for exactly one backward call.
    """

    recipe: Recipe
    splits: tuple
    m: int
    k: int
    f: int
    n1: int
    n2: int
    activation: Activation
    dtype: str
    fc1_weight_dtype: str
    fc2_weight_dtype: str
    fc1_bias_dtype: str | None
    input_requires_grad: bool
    weight_requires_grad: bool
    need_dz: bool
    x_saved: Any = None      # fc1 wgrad operand: x columnwise (GroupedTensor) or x (bf16 recipe)
    w1_saved: Any = None     # fc1 dgrad operand
    h: Any = None            # pre-activation [M, N1], layer dtype
    z_saved: Any = None      # fc2 wgrad operand: z columnwise or z
    w2_saved: Any = None     # fc2 dgrad operand
    fc2_bias: Any = None
    probs: Any = None
    x_rht: bool = False
    z_rht: bool = False
    seed: int = 0
    fused: bool = True
    first_expert: int = 0
    used: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class GroupedMLPGrads:
    """Gradients of a grouped MLP (None where not requested or not applicable).

    Attributes
    ----------
    dx : array ``[M, K]`` (layer dtype)
    dfc1_weight : array ``[G, N1, K]``
    dfc1_bias : array ``[G, N1]``
    dfc2_weight : array ``[G, N2, F]``
    dfc2_bias : array ``[G, N2]``
    dprobs : array ``[M]`` (probs' dtype)
    """

    dx: Any = None
    dfc1_weight: Any = None
    dfc1_bias: Any = None
    dfc2_weight: Any = None
    dfc2_bias: Any = None
    dprobs: Any = None


# ============================================================================================
# validation


def _check_weights(fc1_weight, fc2_weight, fc1_bias, fc2_bias, probs, act: Activation,
                   num_groups: int, m: int, k: int) -> tuple[int, int, int]:
    for name, w in (("fc1_weight", fc1_weight), ("fc2_weight", fc2_weight)):
        V.check_array(name, w, min_rank=1)
        if w.ndim != 3:
            raise ValueError(f"{name} must be [G, N, K] (rank 3), got shape {tuple(w.shape)}")
    g1, n1, k1 = (int(v) for v in fc1_weight.shape)
    g2, n2, f = (int(v) for v in fc2_weight.shape)
    for name, gw in (("fc1_weight", g1), ("fc2_weight", g2)):
        if gw != num_groups:
            raise ValueError(f"{name} has G={gw} experts but splits has G={num_groups} entries: "
                             "mismatched expert count")
    if k1 != k:
        raise ValueError(f"x has K={k} columns but fc1_weight has K={k1} "
                         f"(fc1_weight.shape={tuple(fc1_weight.shape)})")
    if f <= 0 or n2 <= 0:
        raise ValueError(f"fc2_weight.shape={tuple(fc2_weight.shape)} must have positive N and F")
    want = act.input_features(f)
    if n1 != want:
        how = "2*F (gate and linear halves)" if act.is_glu else "F"
        raise ValueError(f"fc1_weight has N={n1} rows per expert but activation={act.name!r} "
                         f"needs N = {how} = {want} for fc2_weight's F={f} input features")
    if act.glu_interleave is not None and f % act.glu_interleave:
        raise ValueError(f"glu_interleave={act.glu_interleave} must divide F={f}")
    for name, b, n in (("fc1_bias", fc1_bias, n1), ("fc2_bias", fc2_bias, n2)):
        if b is None:
            continue
        V.check_array(name, b, min_rank=1)
        if tuple(b.shape) != (num_groups, n):
            if b.ndim == 2 and b.shape[0] != num_groups:
                raise ValueError(f"{name} has G={b.shape[0]} experts but splits has "
                                 f"G={num_groups} entries: mismatched expert count")
            raise ValueError(f"{name}.shape={tuple(b.shape)} must be (G, N)={(num_groups, n)}")
    if probs is not None:
        V.check_array("probs", probs, min_rank=1)
        if tuple(probs.shape) != (m,):
            raise ValueError(f"probs.shape={tuple(probs.shape)} must be (M,)=({m},)")
    return n1, n2, f


def _check_blocks(recipe: Recipe, k: int, f: int, n2: int) -> None:
    if not recipe.quantized:
        return
    b = V.block_size(recipe.format)
    for what, v in (("K", k), ("F", f), ("N2", n2)):
        if v % b:
            role = {"K": "x and fc1_weight are quantized along K",
                    "F": "fc2's input and fc2_weight are quantized along F",
                    "N2": "dy is quantized along fc2's N2 output features"}[what]
            raise ValueError(f"{what}={v} must be a multiple of {b} for {recipe.format} ({role})")


# ============================================================================================
# seeds


def _fc1_seed(seed: int) -> int:
    return (int(seed) + FC1_SEED_OFFSET) % 2**64


# ============================================================================================
# forward


def grouped_mlp_forward(x, splits, fc1_weight, fc2_weight, fc1_bias=None, fc2_bias=None, *,
                        probs=None, activation="swiglu", glu_interleave=None, recipe: Recipe,
                        limit=None, alpha=None, input_requires_grad: bool = True,
                        weight_requires_grad: bool = True, seed: int = 0, fused: bool = True,
                        first_expert: int = 0):
    """Forward of a grouped MLP expert block.

    Parameters
    ----------
    x : array ``[M, K]`` (float32 / float16 / bfloat16; rank > 2 flattened) or GroupedTensor
        Tokens sorted by expert, or a pre-quantized rowwise MXFP8 wire tensor.
    splits : sequence of int, 1-D cupy integer array, or None
        Tokens per expert (G host ints summing to M); None takes ``x.splits`` from a wire x.
        On the GPU they may be a device array (every recipe; not with a wire x): neither
        forward nor backward then reads anything back (NUMERICS §7.5).
    fc1_weight : array ``[G, N1, K]``
        ``N1 = 2F`` for GLU activations (gate rows first, then linear rows, or interleaved in
        blocks of ``glu_interleave``), ``N1 = F`` for srelu.
    fc2_weight : array ``[G, N2, F]``
    fc1_bias : array ``[G, N1]``, optional
    fc2_bias : array ``[G, N2]``, optional
        Scaled by probs like the activation output (``+ b2 * probs[m]``).
    probs : array ``[M]``, optional
        Routing weights: ``z = act(h) * probs``.
    activation : {"swiglu", "clamped_swiglu", "srelu"} or Activation
    glu_interleave : int, optional
        Gate / linear columns of fc1's output alternate in blocks of this many (e.g. 32).
    recipe : Recipe
    limit, alpha : float, optional
        clamped_swiglu parameters (default 7 and 1.702).
    input_requires_grad, weight_requires_grad : bool
        Whether the backward computes ``dx`` / the weight gradients of both GEMMs (and so what
        the context keeps). Bias gradients are always returned when biases are given.
    seed : int
        Stochastic-rounding seed of the backward (NVFP4 recipes with SR).
    fused : bool
        GPU: use the fused activation + quantize kernels where available (same results).
    first_expert : int
        Global index of this call's first expert, for the stochastic-rounding stream only: with
        the experts spread over processes (expert parallelism), each rank passes the index of
        its first local expert and rounds as one process holding every expert would. 0 otherwise.

    Returns
    -------
    y : array ``[M, N2]`` of the layer dtype (x's; bfloat16 for a wire x)
    ctx : GroupedMLPContext
    """
    recipe = _check_recipe(recipe)
    act = make_activation(activation, glu_interleave, limit, alpha)
    seed = V.check_seed(seed)
    wire = isinstance(x, GroupedTensor)
    if wire:
        check_wire("x", x, recipe, recipe.x_fp8_dtype)
        if splits is None:
            splits = x.splits
        m, k = (int(v) for v in x.shape)
        splits = V.check_splits(splits, m)
        if tuple(splits) != tuple(x.splits):
            raise ValueError(f"splits={list(splits)} differ from x.splits={list(x.splits)}")
        dtype = "bfloat16"
        x_arrays = [x.rowwise_data, x.rowwise_scale]
    else:
        V.check_array("x", x)
        x = V.as_2d(x)
        m, k = (int(v) for v in x.shape)
        splits = check_layer_splits(splits, m, x)
        dtype = V.dtype_name(x.dtype)
        x_arrays = [x]
    n1, n2, f = _check_weights(fc1_weight, fc2_weight, fc1_bias, fc2_bias, probs, act,
                               len(splits), m, k)
    _check_blocks(recipe, k, f, n2)
    if not recipe.quantized:
        for name, w in (("fc1_weight", fc1_weight), ("fc2_weight", fc2_weight)):
            if V.dtype_name(w.dtype) != dtype:
                raise TypeError(f"x.dtype={dtype} and {name}.dtype={V.dtype_name(w.dtype)} must "
                                "match for the bf16 recipe")
    get_xp(*x_arrays, fc1_weight, fc2_weight, fc1_bias, fc2_bias, probs)

    input_requires_grad = bool(input_requires_grad)
    weight_requires_grad = bool(weight_requires_grad)
    need_dz = (input_requires_grad or weight_requires_grad or probs is not None
               or fc1_bias is not None)
    ctx = GroupedMLPContext(
        recipe=recipe, splits=splits, m=m, k=k, f=f, n1=n1, n2=n2, activation=act, dtype=dtype,
        fc1_weight_dtype=V.dtype_name(fc1_weight.dtype),
        fc2_weight_dtype=V.dtype_name(fc2_weight.dtype),
        fc1_bias_dtype=None if fc1_bias is None else V.dtype_name(fc1_bias.dtype),
        input_requires_grad=input_requires_grad, weight_requires_grad=weight_requires_grad,
        need_dz=need_dz, fc2_bias=fc2_bias, probs=probs, seed=seed, fused=bool(fused),
        first_expert=V.check_first_member(first_expert, len(splits)))
    fc2_probs = probs if fc2_bias is not None else None

    if not recipe.quantized:
        xh = x.dequantize("rowwise", dtype="bfloat16") if wire else x
        h = grouped_gemm_fprop(xh, fc1_weight, splits, bias=fc1_bias, out_dtype=dtype)
        z = activation_forward(h, act, probs, splits=splits, fused=fused)
        y = grouped_gemm_fprop(z, fc2_weight, splits, bias=fc2_bias, probs=fc2_probs,
                               out_dtype=dtype)
        ctx.x_saved = xh if weight_requires_grad else None
        ctx.w1_saved = fc1_weight if input_requires_grad else None
        ctx.z_saved = z if weight_requires_grad else None
        ctx.w2_saved = fc2_weight if need_dz else None
        ctx.h = h if need_dz else None
        return y, ctx

    # fc1
    xq = _quantize_x(x, splits, recipe, wire, columnwise=weight_requires_grad)
    ctx.x_rht = bool(xq.rht)
    w1q = quantize_weight(fc1_weight, recipe, columnwise=input_requires_grad)
    h = grouped_gemm_fprop(xq, w1q, splits, bias=fc1_bias, out_dtype=dtype)
    if weight_requires_grad:
        ctx.x_saved = _columnwise_only(xq)
    if input_requires_grad:
        ctx.w1_saved = _columnwise_only(w1q)
    del xq, w1q
    # activation x probs, quantized for fc2 (rowwise: fprop, columnwise: fc2's wgrad)
    zq = activation_forward(h, act, probs, splits=splits,
                            quantize=recipe.x_options(dtype, columnwise=weight_requires_grad),
                            fused=fused)
    ctx.z_rht = bool(zq.rht)
    w2q = quantize_weight(fc2_weight, recipe, columnwise=need_dz)
    y = grouped_gemm_fprop(zq, w2q, splits, bias=fc2_bias, probs=fc2_probs, out_dtype=dtype)
    if weight_requires_grad:
        ctx.z_saved = _columnwise_only(zq)
    if need_dz:
        ctx.w2_saved = _columnwise_only(w2q)
        ctx.h = h
    return y, ctx


# ============================================================================================
# backward


def grouped_mlp_backward(dy, ctx: GroupedMLPContext, *, seed: int | None = None):
    """Backward of :func:`grouped_mlp_forward`.

    Parameters
    ----------
    dy : array ``[M, N2]`` of the layer dtype, or a pre-quantized rowwise MXFP8 GroupedTensor
        (E5M2 for the "hybrid" recipe, else E4M3).
    ctx : GroupedMLPContext
        From the forward; usable once.
    seed : int, optional
        Stochastic-rounding seed (default: the forward's ``seed``).

    Returns
    -------
    GroupedMLPGrads
    """
    claim_context(ctx, GroupedMLPContext)
    recipe = ctx.recipe
    seed = ctx.seed if seed is None else V.check_seed(seed)
    dy, dy_hp, wire = check_backward_dy(dy, recipe, ctx.m, ctx.n2, ctx.splits, ctx.dtype)
    # no NumPy / CuPy mixing with the forward's arrays
    xp = get_xp(dy_hp, *saved_arrays(ctx.x_saved, ctx.w1_saved, ctx.h, ctx.z_saved,
                                     ctx.w2_saved, ctx.fc2_bias, ctx.probs))
    ctx.used = True

    splits, dt = ctx.splits, ctx.dtype
    need_dx, need_dw = ctx.input_requires_grad, ctx.weight_requires_grad
    probs = ctx.probs

    # fc2's scaled bias: dbias2_g = sum dy_g * p (out of the pass that quantizes dy when there
    # is one, else in that pass's order), dprobs_i = sum_j dy_ij b2_j (fp32)
    dfc2_bias = dprobs_fc2 = None
    fused_dbias = (recipe.quantized and not wire and ctx.fc2_bias is not None
                   and (ctx.need_dz or need_dw))
    if ctx.fc2_bias is not None:
        ns = SimpleNamespace(bias=ctx.fc2_bias, splits=splits, m=ctx.m, n=ctx.n2,
                             probs=None if probs is None else probs.astype(xp.float32))
        dfc2_bias, dprobs_fc2 = _bias_grads(dy_hp, ns, want_dbias=not fused_dbias,
                                            like=recipe.format)

    # fc2 dgrad / wgrad
    dz = dfc2_weight = None
    if not recipe.quantized:
        if ctx.need_dz:
            dz = grouped_gemm_dgrad(dy_hp, ctx.w2_saved, splits, out_dtype=dt)
        if need_dw:
            dfc2_weight = grouped_gemm_wgrad(dy_hp, ctx.z_saved, splits,
                                             out_dtype=ctx.fc2_weight_dtype)
    elif ctx.need_dz or need_dw:
        if wire:
            dyq = dy.with_columnwise() if need_dw else dy
        else:
            q = recipe.grad_options(rowwise=ctx.need_dz, columnwise=need_dw,
                                    rht=ctx.z_rht and need_dw, seed=seed,
                                    first_member=ctx.first_expert)
            dyq, sums = quantize_grad(dy, splits, q, column_sums=fused_dbias, probs=probs)
            if fused_dbias:
                dfc2_bias = sums.astype(ctx.fc2_bias.dtype)
        if ctx.need_dz:
            dz = grouped_gemm_dgrad(dyq, ctx.w2_saved, splits, out_dtype=dt)
        if need_dw:
            dfc2_weight = grouped_gemm_wgrad(dyq, ctx.z_saved, splits,
                                             out_dtype=ctx.fc2_weight_dtype)
        del dyq

    # activation backward (fused with dh's quantization), fc1 dgrad / wgrad
    dx = dfc1_weight = dfc1_bias = dprobs_act = None
    if ctx.need_dz:
        q = None
        if recipe.quantized and (need_dx or need_dw):
            q = recipe.grad_options(rowwise=need_dx, columnwise=need_dw,
                                    rht=ctx.x_rht and need_dw, seed=_fc1_seed(seed),
                                    first_member=ctx.first_expert)
        ag = activation_backward(dz, ctx.h, ctx.activation, probs, splits=splits, quantize=q,
                                 want_dh=not recipe.quantized and (need_dx or need_dw),
                                 want_dprobs=True, want_dbias=ctx.fc1_bias_dtype is not None,
                                 fused=ctx.fused)
        del dz
        dh = ag.dh_quantized if recipe.quantized else ag.dh
        if need_dx:
            dx = grouped_gemm_dgrad(dh, ctx.w1_saved, splits, out_dtype=dt)
        if need_dw:
            dfc1_weight = grouped_gemm_wgrad(dh, ctx.x_saved, splits,
                                             out_dtype=ctx.fc1_weight_dtype)
        if ag.dbias is not None:
            dfc1_bias = ag.dbias.astype(_np_dtype(ctx.fc1_bias_dtype))
        dprobs_act = ag.dprobs

    dprobs = None
    if probs is not None:  # fp32 sum of the two shares, one rounding to the probs' dtype
        total = xp.zeros(ctx.m, dtype=xp.float32)
        for share in (dprobs_act, dprobs_fc2):
            if share is not None:
                total = total + share
        dprobs = total.astype(probs.dtype)
    ctx.x_saved = ctx.w1_saved = ctx.h = ctx.z_saved = ctx.w2_saved = None
    return GroupedMLPGrads(dx=dx, dfc1_weight=dfc1_weight, dfc1_bias=dfc1_bias,
                           dfc2_weight=dfc2_weight, dfc2_bias=dfc2_bias, dprobs=dprobs)
