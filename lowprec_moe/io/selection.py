"""Which tensors of a model are quantized, and how expert stacks are named once split.

Serving stacks keep some weights in high precision: token embeddings, the output head, router
(gate) weights, norms and biases. They are left alone unless a ``--keys`` pattern names them;
``--exclude`` patterns add to the list. A 3-D float tensor ``[G, N, K]`` is a stack of G expert
matrices: by default each expert becomes its own tensor, named as per-expert checkpoints name them
(``...experts.{i}.w1.weight``), so loaders that expect one weight per expert find them.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from lowprec_moe import _validate as V

__all__ = ["DEFAULT_EXCLUDE", "Decision", "decide", "expert_name", "module_name"]

#: Patterns (shell-style, matched against the whole tensor name) excluded unless named.
DEFAULT_EXCLUDE = (
    "*embed_tokens*", "*embeddings*", "*.wte.*", "*.wpe.*", "wte.*", "wpe.*", "*tok_embeddings*",
    "*lm_head*", "output.weight",
    "*router*", "*.gate.weight", "*.gate.bias", "*_gate.weight", "*gate.e_score_correction*",
    "*norm*", "*.bias", "*_bias",
)
_FLOATS = ("float32", "float16", "bfloat16")


@dataclass
class Decision:
    """What happens to one input tensor.

    ``action`` is ``"quantize"`` (one matrix, rank > 2 flattened to ``[prod(shape[:-1]), K]``),
    ``"split"`` (an expert stack, one tensor per expert), ``"fused"`` (an expert stack kept
    as one grouped tensor with one amax per expert) or ``"copy"`` (unchanged; ``reason`` says
    why).
    """

    action: str
    reason: str | None = None


def _matches(name: str, patterns: Sequence[str] | None) -> bool:
    return bool(patterns) and any(fnmatch.fnmatchcase(name, p) for p in patterns)


def why_not(dtype: np.dtype, shape: tuple, format: str, opts: dict, rows: int) -> str | None:
    """Why a matrix cannot be quantized with these options (None: it can)."""
    b = V.block_size(format)
    if dtype.name not in _FLOATS:
        return f"dtype {dtype.name} (only float32, float16 and bfloat16 are quantized)"
    if len(shape) < 2:
        return f"rank {len(shape)} (only matrices are quantized)"
    if math.prod(shape) == 0:
        return f"empty shape {list(shape)}"
    if shape[-1] % b:
        return f"K={shape[-1]} is not a multiple of {b} for {format}"
    if opts.get("block_2d") and rows % b:
        return f"M={rows} is not a multiple of {b} for 2-D blocks"
    return None


def decide(name: str, dtype: np.dtype, shape: tuple, format: str, opts: dict, *,
           keys: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
           experts: str = "split") -> Decision:
    """Decide what to do with tensor ``name`` (see :class:`Decision`).

    Parameters
    ----------
    keys : sequence of str, optional
        Only matching tensors are quantized; a match also overrides :data:`DEFAULT_EXCLUDE`.
    exclude : sequence of str, optional
        Matching tensors are never quantized.
    experts : {"split", "fused", "flat"}
        What a 3-D stack becomes: per-expert tensors, one grouped tensor, or one matrix.
    """
    if keys and not _matches(name, keys):
        return Decision("copy", "not selected by --keys")
    if _matches(name, exclude):
        return Decision("copy", "excluded by --exclude")
    if not keys and _matches(name, DEFAULT_EXCLUDE):
        return Decision("copy", "excluded by default (embeddings, lm_head, router gates, norms "
                                "and biases stay in high precision; name it with --keys to "
                                "quantize it)")
    stack = len(shape) == 3 and experts in ("split", "fused")
    rows = shape[-2] if stack else math.prod(shape[:-1])
    reason = why_not(np.dtype(dtype), tuple(shape), format, opts, rows)
    if reason is not None:
        return Decision("copy", reason)
    if stack:
        return Decision(experts)
    return Decision("quantize")


_EXPERTS = re.compile(r"(^|\.)experts(\.|$)")


def expert_name(name: str, index: int | str) -> str:
    """The name of expert ``index`` of the stack ``name``.

    The index goes right after an ``experts`` component (``mlp.experts.w1.weight`` ->
    ``mlp.experts.3.w1.weight``, ``mlp.experts.gate_up_proj`` -> ``mlp.experts.3.gate_up_proj``);
    without one, before a final ``.weight`` (``moe.w1.weight`` -> ``moe.w1.3.weight``), else at
    the end (``w1`` -> ``w1.3``).
    """
    matches = list(_EXPERTS.finditer(name))
    if matches:
        m = matches[-1]
        cut = m.end() if m.group(2) else len(name)
        head, tail = name[:cut].rstrip("."), name[cut:]
        return f"{head}.{index}" + (f".{tail}" if tail else "")
    if name.endswith(".weight"):
        return f"{name[:-len('.weight')]}.{index}.weight"
    return f"{name}.{index}"


def module_name(tensor: str) -> str:
    """The module a weight belongs to (``a.b.weight`` -> ``a.b``), as exclude lists name it."""
    return tensor[:-len(".weight")] if tensor.endswith(".weight") else tensor
