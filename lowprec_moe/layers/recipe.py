"""Quantization recipes for GroupedLinear / GroupedMLP (NUMERICS §§6-8).

A recipe says which tensor of a linear layer is quantized how, per GEMM (NUMERICS §7)::

    fprop  y_g  = x_g  W_g^T     A = x rowwise,    B = W rowwise
    dgrad  dx_g = dy_g W_g       A = dy rowwise,   B = W columnwise
    wgrad  dW_g = dy_g^T x_g     A = dy columnwise, B = x columnwise

* ``Recipe.bf16()``: nothing is quantized; GEMMs run on the input dtype.
* ``Recipe.mxfp8(fp8_format="e4m3" | "hybrid", weight_2d=False)``: x, W and dy are quantized
  rowwise and columnwise to MXFP8 (32-element blocks, E8M0 scales); "hybrid" stores dy in E5M2.
  ``weight_2d`` gives W 32x32 blocks.
* ``Recipe.nvfp4(row_scaled_activation=False, weight_2d=True, rht=None, stochastic_rounding=None)``:
  W with 16x16 blocks by default (its columnwise copy is then the transpose of the rowwise one);
  x rowwise (per-row amax when ``row_scaled_activation``) and columnwise (per-column amax when
  row-scaled); dy rowwise and columnwise, never row-scaled. As in TE, the random Hadamard
  transform is applied to the two wgrad operands (x and dy columnwise, bfloat16 tensors only: the
  transform is defined on bf16 data) and stochastic rounding to the gradient dy; both default to
  on, and to off when ``row_scaled_activation`` is set (asking for them together is an error).
"""

from __future__ import annotations

from dataclasses import dataclass

_NAMES = ("bf16", "mxfp8", "nvfp4")


@dataclass(frozen=True)
class Recipe:
    """How a grouped linear layer quantizes its operands (build with the static methods)."""

    name: str
    fp8_format: str = "e4m3"
    weight_2d: bool = False
    row_scaled_activation: bool = False
    rht: bool = False
    stochastic_rounding: bool = False

    def __post_init__(self):
        # The builders below are the intended way in; a direct ``Recipe(...)`` is checked too so
        # that no conflicting combination reaches the layers.
        if self.name not in _NAMES:
            raise ValueError(f"recipe name={self.name!r} must be one of {_NAMES}")
        if self.fp8_format not in ("e4m3", "hybrid"):
            raise ValueError(f"fp8_format={self.fp8_format!r} must be 'e4m3' or 'hybrid'")
        if self.name != "mxfp8" and self.fp8_format != "e4m3":
            raise ValueError(f"fp8_format={self.fp8_format!r} is an mxfp8 option; it does not "
                             f"apply to the {self.name} recipe")
        if self.name != "nvfp4":
            for opt in ("row_scaled_activation", "rht", "stochastic_rounding"):
                if getattr(self, opt):
                    raise ValueError(f"{opt}=True is an nvfp4 option; it does not apply to the "
                                     f"{self.name} recipe")
        if self.name == "bf16" and self.weight_2d:
            raise ValueError("weight_2d=True does not apply to the bf16 recipe (no quantization)")
        if self.row_scaled_activation:
            for opt in ("rht", "stochastic_rounding"):
                if getattr(self, opt):
                    raise ValueError(f"row_scaled_activation=True cannot be combined with "
                                     f"{opt}=True")

    # ------------------------------------------------------------------------------- builders
    @staticmethod
    def bf16() -> "Recipe":
        """No quantization: GEMMs on the input dtype with fp32 accumulation."""
        return Recipe("bf16")

    @staticmethod
    def mxfp8(fp8_format: str = "e4m3", weight_2d: bool = False) -> "Recipe":
        """MXFP8 for x, W and dy; ``fp8_format="hybrid"`` stores dy in E5M2."""
        if fp8_format not in ("e4m3", "hybrid"):
            raise ValueError(f"fp8_format={fp8_format!r} must be 'e4m3' or 'hybrid'")
        return Recipe("mxfp8", fp8_format=fp8_format, weight_2d=bool(weight_2d))

    @staticmethod
    def nvfp4(row_scaled_activation: bool = False, weight_2d: bool = True,
              rht: bool | None = None, stochastic_rounding: bool | None = None) -> "Recipe":
        """NVFP4 for x, W and dy (see the module docstring for the defaults)."""
        if row_scaled_activation:
            for opt, val in (("rht", rht), ("stochastic_rounding", stochastic_rounding)):
                if val:
                    raise ValueError(f"row_scaled_activation=True cannot be combined with "
                                     f"{opt}=True")
            rht, stochastic_rounding = False, False
        else:
            rht = True if rht is None else bool(rht)
            stochastic_rounding = True if stochastic_rounding is None else bool(stochastic_rounding)
        return Recipe("nvfp4", weight_2d=bool(weight_2d),
                      row_scaled_activation=bool(row_scaled_activation), rht=rht,
                      stochastic_rounding=stochastic_rounding)

    # ------------------------------------------------------------------------------- queries
    @property
    def quantized(self) -> bool:
        return self.name != "bf16"

    @property
    def format(self) -> str | None:
        """The quantized format ("nvfp4" / "mxfp8"), or None for bf16."""
        return self.name if self.quantized else None

    @property
    def x_fp8_dtype(self) -> str:
        return "e4m3"

    @property
    def dy_fp8_dtype(self) -> str:
        return "e5m2" if self.fp8_format == "hybrid" else "e4m3"

    def x_options(self, dtype: str, *, columnwise: bool) -> dict:
        """``GroupedTensor.quantize`` options of an x operand (a layer's input or fc2's
        activation) of dtype name ``dtype``; the columnwise copy feeds wgrad (NUMERICS §7)."""
        if self.name == "mxfp8":
            return dict(format="mxfp8", rowwise=True, columnwise=columnwise,
                        fp8_dtype=self.x_fp8_dtype)
        return dict(format="nvfp4", rowwise=True, columnwise=columnwise,
                    row_scaled=self.row_scaled_activation,
                    rht=bool(self.rht and columnwise and dtype == "bfloat16"))

    def grad_options(self, *, rowwise: bool, columnwise: bool, rht: bool, seed: int,
                     first_member: int = 0) -> dict:
        """``GroupedTensor.quantize`` options of a gradient operand (dy, fc1's dh): rowwise for
        dgrad, columnwise for wgrad, Hadamard-transformed when x's columnwise copy was
        (``rht``), stochastically rounded with ``seed`` when the recipe says, the experts
        numbered from ``first_member`` in the rounding stream (NUMERICS §7)."""
        if self.name == "mxfp8":
            return dict(format="mxfp8", rowwise=rowwise, columnwise=columnwise,
                        fp8_dtype=self.dy_fp8_dtype)
        return dict(format="nvfp4", rowwise=rowwise, columnwise=columnwise, rht=bool(rht),
                    stochastic_rounding=self.stochastic_rounding, seed=seed,
                    first_member=first_member)

    def __repr__(self) -> str:
        if self.name == "bf16":
            return "Recipe.bf16()"
        if self.name == "mxfp8":
            return f"Recipe.mxfp8(fp8_format={self.fp8_format!r}, weight_2d={self.weight_2d})"
        return (f"Recipe.nvfp4(row_scaled_activation={self.row_scaled_activation}, "
                f"weight_2d={self.weight_2d}, rht={self.rht}, "
                f"stochastic_rounding={self.stochastic_rounding})")
