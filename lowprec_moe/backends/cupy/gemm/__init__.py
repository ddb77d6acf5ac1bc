"""Grouped GEMMs on the GPU: plan a call, select a kernel config, launch it."""

from lowprec_moe.backends.cupy.gemm.launch import grouped_gemm, kernel_info

__all__ = ["grouped_gemm", "kernel_info"]
