"""PyTorch modules over the grouped layers: ``GroupedLinear`` and ``GroupedMLP`` as ``nn.Module``.

Import on request (``import lowprec_moe.torch``); it needs PyTorch (the ``torch`` extra). Each
layer is an ``autograd.Function`` whose forward calls :func:`lowprec_moe.grouped_linear_forward`
/ :func:`lowprec_moe.grouped_mlp_forward` and whose backward calls the matching explicit
backward with the forward's context, so gradients land in ``.grad`` as for any torch layer::

    import torch
    import lowprec_moe as lpm
    from lowprec_moe.torch import GroupedMLP

    mlp = GroupedMLP(8, 512, 1024, recipe=lpm.Recipe.nvfp4(), device="cuda")
    y = mlp(x_sorted, splits, probs)          # x_sorted [M, 512] bf16, tokens sorted by expert
    y.float().square().mean().backward()      # mlp.fc1_weight.grad, x_sorted.grad, probs.grad

Tensors cross to NumPy (CPU) / CuPy (CUDA) without copies (:mod:`lowprec_moe.interop`); on the
GPU every library kernel runs on torch's current CUDA stream, so nothing is synchronised. Splits
that arrive as a CUDA tensor stay on the device with every recipe (nothing is read back: such a
layer step can be captured into a CUDA graph); they are not checked, as the library's device
splits are not (negative counts act as 0, counts past M are cut). A pre-quantized MXFP8 input
carries its own host splits.

Dtypes: the layer dtype is x's (float32, float16 or bfloat16); parameters may be float32 master
weights. The quantized recipes quantize them directly and return their gradients in their dtype;
``Recipe.bf16()`` computes in x's dtype, so parameters of another dtype are first cast with torch
(a differentiable cast: gradients still reach the float32 parameters).

``torch.compile``: the layers are opaque to Dynamo (``torch.compiler.disable``); a compiled
model graph-breaks at each layer call and compiles the code around it.

Stochastic rounding (NVFP4): a module seeds it with its ``step`` counter, which every backward
call advances, as :class:`lowprec_moe.GroupedLinear` does. The seed is a kernel argument: a
captured CUDA graph replays the captured step's seed (the same random bits on every replay)
and does not advance ``step``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.autograd.function import once_differentiable

import lowprec_moe as lpm
from lowprec_moe import interop

__all__ = [
    "GroupedLinear",
    "GroupedMLP",
    "grouped_linear",
    "grouped_mlp",
    "host_splits",
    "mxfp8_wire",
]


# ============================================================================================
# helpers


def host_splits(splits) -> tuple[int, ...]:
    """Tokens per expert as host ints, the form the library takes.

    Parameters
    ----------
    splits : list or tuple of int, numpy integer array, or 1-D integer torch.Tensor
        ``G`` entries. A CUDA tensor is copied to the host here, which makes the host wait
        for the work on its stream that produces it (one synchronisation per call); a CPU tensor
        or a host sequence costs nothing. This is the only place the torch layers read splits.

    Returns
    -------
    tuple of int

    Raises
    ------
    TypeError
        For a non-integer or non-1-D tensor, or any other type.
    """
    if isinstance(splits, torch.Tensor):
        if splits.ndim != 1 or splits.dtype.is_floating_point or splits.dtype.is_complex:
            raise TypeError(f"splits must be a 1-D integer tensor, got {splits.dtype} of shape "
                            f"{tuple(splits.shape)}")
        return tuple(int(v) for v in splits.tolist())
    if isinstance(splits, (list, tuple)):
        return tuple(splits)
    if isinstance(splits, np.ndarray):
        return tuple(splits.tolist())
    raise TypeError(f"splits must be a list / tuple of ints, a numpy array or a torch tensor, "
                    f"got {type(splits).__name__}")


def mxfp8_wire(data: torch.Tensor, scale: torch.Tensor, splits,
               fp8_dtype: str = "e4m3") -> lpm.GroupedTensor:
    """Wrap rowwise MXFP8 tokens held in torch tensors as a wire ``GroupedTensor`` (no copy).

    Parameters
    ----------
    data : torch.uint8 ``[M, K]``
        fp8 bytes (E4M3 unless ``fp8_dtype`` says otherwise), tokens sorted by expert.
    scale : torch.uint8 ``[M, K/32]``
        Compact E8M0 scales.
    splits : see :func:`host_splits`
    fp8_dtype : {"e4m3", "e5m2"}

    Returns
    -------
    lowprec_moe.GroupedTensor
        Sharing memory with ``data`` and ``scale`` (C-contiguous inputs).
    """
    for name, t in (("data", data), ("scale", scale)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
            raise TypeError(f"{name} must be a torch.uint8 tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    return lpm.GroupedTensor.from_mxfp8_rowwise(interop.to_xp(data), interop.to_xp(scale),
                                                host_splits(splits), fp8_dtype=fp8_dtype)


def _xp(t):
    return None if t is None else interop.to_xp(t)


def _torch(a):
    return None if a is None else interop.to_torch(a)


def _device_of(*tensors) -> torch.device:
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if len(devices) != 1:
        raise ValueError(f"tensors of one layer call must share a device, got "
                         f"{sorted(str(d) for d in devices)}")
    return devices.pop()


def _check_x(x) -> None:
    if not isinstance(x, (torch.Tensor, lpm.GroupedTensor)):
        raise TypeError(f"x must be a torch.Tensor or a lowprec_moe.GroupedTensor (pre-quantized "
                        f"MXFP8 wire tokens), got {type(x).__name__}")


def _compute_weights(x, recipe: lpm.Recipe, *params):
    """Parameters as the GEMMs take them: cast to x's dtype for the bf16 recipe only."""
    if recipe.quantized or not isinstance(x, torch.Tensor):
        return params
    return tuple(p if p is None or p.dtype == x.dtype else p.to(x.dtype) for p in params)


@dataclass
class _Call:
    """Everything but tensors that one layer call passes to its autograd.Function."""

    splits: Any                        # host ints, or a CUDA tensor
    recipe: lpm.Recipe
    seed: int
    grad_enabled: bool
    wire: Any = None                   # pre-quantized x (GroupedTensor), or None
    counter: Any = None                # module whose ``step`` advances after the backward
    mlp_kwargs: Any = None

    def after_backward(self) -> None:
        if self.counter is not None:
            self.counter.step += 1


# ============================================================================================
# autograd functions


class _GroupedLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, probs, call: _Call):
        need = ctx.needs_input_grad
        ctx.device = _device_of(x, weight, bias, probs)
        with interop.torch_stream(ctx.device):
            y, ctx.lpm_ctx = lpm.grouped_linear_forward(
                call.wire if x is None else interop.to_xp(x), _lib_splits(call.splits),
                interop.to_xp(weight),
                _xp(bias), recipe=call.recipe, probs=_xp(probs),
                input_requires_grad=call.grad_enabled and x is not None and need[0],
                weight_requires_grad=call.grad_enabled and need[1], seed=call.seed)
            y = interop.to_torch(y)
        ctx.call = call
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        need = ctx.needs_input_grad
        with interop.torch_stream(ctx.device):
            g = lpm.grouped_linear_backward(interop.to_xp(dy.contiguous()), ctx.lpm_ctx)
            out = (_torch(g.dx) if need[0] else None, _torch(g.dweight) if need[1] else None,
                   _torch(g.dbias) if need[2] else None, _torch(g.dprobs) if need[3] else None,
                   None)
        ctx.lpm_ctx = None
        ctx.call.after_backward()
        return out


class _GroupedMLPFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fc1_weight, fc2_weight, fc1_bias, fc2_bias, probs, call: _Call):
        need = ctx.needs_input_grad
        ctx.device = _device_of(x, fc1_weight, fc2_weight, fc1_bias, fc2_bias, probs)
        with interop.torch_stream(ctx.device):
            y, ctx.lpm_ctx = lpm.grouped_mlp_forward(
                call.wire if x is None else interop.to_xp(x), _lib_splits(call.splits),
                interop.to_xp(fc1_weight), interop.to_xp(fc2_weight), _xp(fc1_bias),
                _xp(fc2_bias), probs=_xp(probs), recipe=call.recipe,
                input_requires_grad=call.grad_enabled and x is not None and need[0],
                weight_requires_grad=call.grad_enabled and (need[1] or need[2]), seed=call.seed,
                **call.mlp_kwargs)
            y = interop.to_torch(y)
        ctx.call = call
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        need = ctx.needs_input_grad
        with interop.torch_stream(ctx.device):
            g = lpm.grouped_mlp_backward(interop.to_xp(dy.contiguous()), ctx.lpm_ctx)
            out = (_torch(g.dx) if need[0] else None,
                   _torch(g.dfc1_weight) if need[1] else None,
                   _torch(g.dfc2_weight) if need[2] else None,
                   _torch(g.dfc1_bias) if need[3] else None,
                   _torch(g.dfc2_bias) if need[4] else None,
                   _torch(g.dprobs) if need[5] else None,
                   None)
        ctx.lpm_ctx = None
        ctx.call.after_backward()
        return out


# ============================================================================================
# functional API


def _prepare(x, splits):
    """(x tensor or None, wire x or None, splits as the library takes them): a CUDA splits
    tensor stays on the device (a CuPy view), anything else becomes host ints."""
    _check_x(x)
    if isinstance(x, lpm.GroupedTensor):
        return None, x, None if splits is None else host_splits(splits)
    if (isinstance(splits, torch.Tensor) and splits.is_cuda
            and isinstance(x, torch.Tensor) and x.is_cuda):
        if splits.ndim != 1 or splits.dtype.is_floating_point or splits.dtype.is_complex:
            raise TypeError(f"splits must be a 1-D integer tensor, got {splits.dtype} of shape "
                            f"{tuple(splits.shape)}")
        # a copy on torch's stream (no synchronisation): the backward must see the forward's
        # counts even if the router reuses its buffer; crossed to CuPy inside the layer's
        # stream context (_lib_splits)
        return x, None, splits.clone()
    return x, None, None if splits is None else host_splits(splits)


def _lib_splits(splits):
    """The splits as the library takes them, inside ``interop.torch_stream``: a CuPy view of a
    CUDA tensor (on torch's current stream, no cross-stream wait), host ints as they are."""
    return interop.to_xp(splits) if isinstance(splits, torch.Tensor) else splits


@torch.compiler.disable
def grouped_linear(x, splits, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                   recipe: lpm.Recipe, probs: torch.Tensor | None = None, seed: int = 0,
                   _counter=None) -> torch.Tensor:
    """Differentiable :func:`lowprec_moe.grouped_linear_forward` on torch tensors.

    Parameters
    ----------
    x : torch.Tensor ``[M, K]`` (float32 / float16 / bfloat16) or lowprec_moe.GroupedTensor
        Tokens sorted by expert, or pre-quantized rowwise MXFP8 wire tokens (see
        :func:`mxfp8_wire`; no gradient flows to them).
    splits : see :func:`host_splits`, or None for a wire x (its own splits); a CUDA tensor
        stays on the device (see the module docstring)
    weight : torch.Tensor ``[G, N, K]``
    bias : torch.Tensor ``[G, N]``, optional
    recipe : lowprec_moe.Recipe
    probs : torch.Tensor ``[M]``, optional
        Routing weights scaling the bias.
    seed : int
        Stochastic-rounding seed of the backward (NVFP4 with SR).

    Returns
    -------
    torch.Tensor ``[M, N]``
        x's dtype (bfloat16 for a wire x), on x's device. Gradients reach every argument that
        requires grad (``dprobs`` is zero without a bias).
    """
    x_t, wire, splits = _prepare(x, splits)
    weight, bias = _compute_weights(x_t, recipe, weight, bias)
    call = _Call(splits=splits, recipe=recipe, seed=int(seed),
                 grad_enabled=torch.is_grad_enabled(), wire=wire, counter=_counter)
    return _GroupedLinearFn.apply(x_t, weight, bias, probs, call)


@torch.compiler.disable
def grouped_mlp(x, splits, fc1_weight: torch.Tensor, fc2_weight: torch.Tensor,
                fc1_bias: torch.Tensor | None = None, fc2_bias: torch.Tensor | None = None, *,
                recipe: lpm.Recipe, probs: torch.Tensor | None = None,
                activation: str = "swiglu", glu_interleave: int | None = None, limit=None,
                alpha=None, seed: int = 0, fused: bool = True, _counter=None) -> torch.Tensor:
    """Differentiable :func:`lowprec_moe.grouped_mlp_forward` on torch tensors.

    Parameters
    ----------
    x : torch.Tensor ``[M, K]`` (float32 / float16 / bfloat16) or lowprec_moe.GroupedTensor
        Tokens sorted by expert, or pre-quantized rowwise MXFP8 wire tokens (no gradient).
    splits : see :func:`host_splits`, or None for a wire x; a CUDA tensor stays on the device
        (see the module docstring)
    fc1_weight : torch.Tensor ``[G, N1, K]`` (``N1 = 2F`` for GLU activations, ``F`` for srelu)
    fc2_weight : torch.Tensor ``[G, N2, F]``
    fc1_bias : torch.Tensor ``[G, N1]``, optional
    fc2_bias : torch.Tensor ``[G, N2]``, optional
    recipe : lowprec_moe.Recipe
    probs : torch.Tensor ``[M]``, optional
        Routing weights: ``z = act(h) * probs`` (and fc2's bias scaled by them).
    activation, glu_interleave, limit, alpha, fused
        As :func:`lowprec_moe.grouped_mlp_forward`.
    seed : int
        Stochastic-rounding seed of the backward (NVFP4 with SR).

    Returns
    -------
    torch.Tensor ``[M, N2]``
        x's dtype (bfloat16 for a wire x).
    """
    x_t, wire, splits = _prepare(x, splits)
    fc1_weight, fc2_weight, fc1_bias, fc2_bias = _compute_weights(
        x_t, recipe, fc1_weight, fc2_weight, fc1_bias, fc2_bias)
    call = _Call(splits=splits, recipe=recipe, seed=int(seed),
                 grad_enabled=torch.is_grad_enabled(), wire=wire, counter=_counter,
                 mlp_kwargs=dict(activation=activation, glu_interleave=glu_interleave,
                                 limit=limit, alpha=alpha, fused=fused))
    return _GroupedMLPFn.apply(x_t, fc1_weight, fc2_weight, fc1_bias, fc2_bias, probs, call)


# ============================================================================================
# modules


def _positive(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}={v!r} must be a positive int")


def _recipe(recipe) -> lpm.Recipe:
    recipe = lpm.Recipe.bf16() if recipe is None else recipe
    if not isinstance(recipe, lpm.Recipe):
        raise TypeError(f"recipe must be a lowprec_moe.Recipe, got {type(recipe).__name__}")
    return recipe


class GroupedLinear(torch.nn.Module):
    """One linear layer per expert: ``y_g = x_g W_g^T (+ b_g * probs)``.

    Parameters
    ----------
    num_experts, in_features, out_features : int
        ``G``, ``K``, ``N``.
    bias : bool
    recipe : lowprec_moe.Recipe, optional
        Default ``Recipe.bf16()``.
    device, dtype
        Of the parameters (``weight [G, N, K]``, ``bias [G, N]``); default float32.

    Attributes
    ----------
    step : int
        Stochastic-rounding seed of the next backward; each backward advances it.

    Freeze parameters with ``requires_grad_(False)``: their gradient GEMMs are then skipped.
    """

    def __init__(self, num_experts: int, in_features: int, out_features: int, bias: bool = True,
                 *, recipe: lpm.Recipe | None = None, device=None, dtype=None):
        super().__init__()
        _positive(num_experts=num_experts, in_features=in_features, out_features=out_features)
        self.recipe = _recipe(recipe)
        kw = dict(device=device, dtype=dtype)
        self.weight = torch.nn.Parameter(torch.empty(num_experts, out_features, in_features,
                                                     **kw))
        self.bias = (torch.nn.Parameter(torch.empty(num_experts, out_features, **kw))
                     if bias else None)
        self.step = 0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform in ``+-1/sqrt(in_features)`` (torch.nn.Linear's range) from torch's RNG."""
        bound = 1.0 / math.sqrt(self.weight.shape[-1])
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def forward(self, x, splits, probs: torch.Tensor | None = None) -> torch.Tensor:
        """``y [M, N]`` for tokens ``x [M, K]`` sorted by expert (see :func:`grouped_linear`)."""
        return grouped_linear(x, splits, self.weight, self.bias, recipe=self.recipe, probs=probs,
                              seed=self.step, _counter=self)

    def extra_repr(self) -> str:
        g, n, k = self.weight.shape
        return (f"num_experts={g}, in_features={k}, out_features={n}, "
                f"bias={self.bias is not None}, recipe={self.recipe!r}")


class GroupedMLP(torch.nn.Module):
    """One MLP per expert: ``fc2(act(fc1(x)) * probs)``.

    Parameters
    ----------
    num_experts : int
    hidden_size : int
        ``K``: fc1's input and fc2's output features.
    ffn_hidden_size : int
        ``F``: the activation's output features (fc1 has ``2F`` outputs for GLU activations).
    activation : {"swiglu", "clamped_swiglu", "srelu"}
    glu_interleave : int, optional
    bias : bool
        Give fc1 and fc2 a bias (fc2's is scaled by probs).
    recipe : lowprec_moe.Recipe, optional
        Default ``Recipe.bf16()``.
    limit, alpha : float, optional
        clamped_swiglu parameters.
    device, dtype
        Of the parameters (``fc1_weight [G, N1, K]``, ``fc2_weight [G, K, F]``, biases
        ``[G, N1]`` / ``[G, K]``); default float32.

    Attributes
    ----------
    step : int
        Stochastic-rounding seed of the next backward; each backward advances it.
    """

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int, *,
                 activation: str = "swiglu", glu_interleave: int | None = None,
                 bias: bool = True, recipe: lpm.Recipe | None = None, limit=None, alpha=None,
                 device=None, dtype=None):
        super().__init__()
        _positive(num_experts=num_experts, hidden_size=hidden_size,
                  ffn_hidden_size=ffn_hidden_size)
        if activation not in ("swiglu", "clamped_swiglu", "srelu"):
            raise ValueError(f"activation={activation!r} must be 'swiglu', 'clamped_swiglu' or "
                             "'srelu'")
        self.recipe = _recipe(recipe)
        self.activation, self.glu_interleave = activation, glu_interleave
        self.limit, self.alpha = limit, alpha
        n1 = ffn_hidden_size if activation == "srelu" else 2 * ffn_hidden_size
        kw = dict(device=device, dtype=dtype)
        e, k, f = num_experts, hidden_size, ffn_hidden_size
        self.fc1_weight = torch.nn.Parameter(torch.empty(e, n1, k, **kw))
        self.fc2_weight = torch.nn.Parameter(torch.empty(e, k, f, **kw))
        self.fc1_bias = torch.nn.Parameter(torch.empty(e, n1, **kw)) if bias else None
        self.fc2_bias = torch.nn.Parameter(torch.empty(e, k, **kw)) if bias else None
        self.step = 0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform in ``+-1/sqrt(fan_in)`` (torch.nn.Linear's range) from torch's RNG."""
        k, f = self.fc1_weight.shape[-1], self.fc2_weight.shape[-1]
        with torch.no_grad():
            for p, fan_in in ((self.fc1_weight, k), (self.fc1_bias, k), (self.fc2_weight, f),
                              (self.fc2_bias, f)):
                if p is not None:
                    bound = 1.0 / math.sqrt(fan_in)
                    p.uniform_(-bound, bound)

    def forward(self, x, splits, probs: torch.Tensor | None = None) -> torch.Tensor:
        """``y [M, K]`` for tokens ``x [M, K]`` sorted by expert (see :func:`grouped_mlp`)."""
        return grouped_mlp(x, splits, self.fc1_weight, self.fc2_weight, self.fc1_bias,
                           self.fc2_bias, recipe=self.recipe, probs=probs,
                           activation=self.activation, glu_interleave=self.glu_interleave,
                           limit=self.limit, alpha=self.alpha, seed=self.step, _counter=self)

    def extra_repr(self) -> str:
        e, _, k = self.fc1_weight.shape
        return (f"num_experts={e}, hidden_size={k}, ffn_hidden_size={self.fc2_weight.shape[-1]}, "
                f"activation={self.activation!r}, bias={self.fc1_bias is not None}, "
                f"recipe={self.recipe!r}")
