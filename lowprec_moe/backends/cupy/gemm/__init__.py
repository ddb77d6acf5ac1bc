"""Grouped GEMMs on the GPU: plan a call, select a kernel config, launch it."""

from .launch import grouped_gemm, kernel_info

__all__ = ["grouped_gemm", "kernel_info"]
