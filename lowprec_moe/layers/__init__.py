"""Grouped MoE layers: the explicit forward / backward of GroupedLinear and GroupedMLP, their
activations, the recipes, and module-style wrappers holding parameters."""

from lowprec_moe.layers.modules import GroupedLinear, GroupedMLP

__all__ = ["GroupedLinear", "GroupedMLP"]
