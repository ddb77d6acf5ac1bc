"""Compiling the grouped-GEMM modules: the generated ones from the config tables
(:func:`.configs.module_source`), the SIMT kernel and the MXFP8 range kernel from their files in
``raw_kernels/``, all through the one kernel loader (:mod:`lowprec_moe.kernels`).

``python -m lowprec_moe.backends.cupy.gemm DIR`` writes the generated modules to
``DIR/<module>.cu``, for an offline ``nvcc`` check (CI compiles them with the kernel folders
as include paths).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from lowprec_moe.backends.cupy import launch_helpers
from lowprec_moe.backends.cupy.gemm.configs import module_source, modules
from lowprec_moe.backends.cupy.gemm.select import ALL_CONFIGS

#: Modules generated from the tables.
GENERATED = tuple(modules(ALL_CONFIGS))


@lru_cache(maxsize=None)
def source(module: str) -> str:
    """The generated CUDA text of a module."""
    return module_source(module, ALL_CONFIGS)


def kernel_function(module: str, name: str):
    """The compiled kernel ``name`` of ``module`` on the current device (memoized per device,
    module and kernel by :func:`~lowprec_moe.backends.cupy.launch_helpers.kernel`)."""
    return launch_helpers.kernel(module, name, source if module in GENERATED else None)


def write_sources(directory: str | Path) -> list[Path]:
    """Write every generated module to ``directory/<module>.cu``; return the paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for m in GENERATED:
        p = out / f"{m}.cu"
        p.write_text(source(m), encoding="utf-8")
        paths.append(p)
    return paths

