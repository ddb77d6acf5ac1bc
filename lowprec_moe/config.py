"""Typed options that steer the library's GPU paths, set for a block of code.

Kernel selection is automatic; these options exist for cross-checks, A/B measurements and
debugging::

    import lowprec_moe as lpm
    with lpm.config.gemm(kernel="grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk"):
        y = lpm.gemm.grouped_gemm_fprop(xq, wq, splits)

The GEMM functions also take ``kernel=`` per call, which wins over the block's setting. Options
are held in a :class:`contextvars.ContextVar`, so threads and asyncio tasks each see their own.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, replace
from typing import Iterator

__all__ = ["GemmOptions", "gemm", "gemm_options", "kernel_directory", "kernel_source_dir"]

_MXFP8_MMA = ("auto", "bf16")


@dataclass(frozen=True)
class GemmOptions:
    """Options of the grouped GEMM launcher.

    Attributes
    ----------
    kernel : str
        ``"auto"`` (select by the config table's rules) or the spelled-out name of one kernel
        config (see ``lowprec_moe.backends.cupy.gemm.select.config_names()``); a named config
        that cannot compute a problem raises ``ValueError`` saying why.
    mxfp8_mma : {"auto", "bf16"}
        ``"auto"``: MXFP8 tiles whose block scales fit the fp16 window multiply on fp16 (same
        results as bf16 above ~1e-35, see docs/NUMERICS.md); ``"bf16"``: every MXFP8 tile on
        bf16.
    """

    kernel: str = "auto"
    mxfp8_mma: str = "auto"

    def __post_init__(self):
        if not isinstance(self.kernel, str):
            raise TypeError(f"kernel must be a str, got {type(self.kernel).__name__}")
        if self.mxfp8_mma not in _MXFP8_MMA:
            raise ValueError(f"mxfp8_mma={self.mxfp8_mma!r} must be one of {_MXFP8_MMA}")


_gemm = contextvars.ContextVar("lowprec_moe_gemm_options", default=GemmOptions())


def gemm_options() -> GemmOptions:
    """The GEMM options in force here."""
    return _gemm.get()


@contextlib.contextmanager
def gemm(*, kernel: str | None = None, mxfp8_mma: str | None = None) -> Iterator[GemmOptions]:
    """Set GEMM options for the ``with`` block (unset arguments keep the enclosing value).

    Parameters
    ----------
    kernel : str, optional
        ``"auto"`` or a kernel config name (:class:`GemmOptions`).
    mxfp8_mma : {"auto", "bf16"}, optional

    Yields
    ------
    GemmOptions
        The options in force inside the block.
    """
    changes = {k: v for k, v in (("kernel", kernel), ("mxfp8_mma", mxfp8_mma)) if v is not None}
    opts = replace(_gemm.get(), **changes)
    token = _gemm.set(opts)
    try:
        yield opts
    finally:
        _gemm.reset(token)


_kernel_dir = contextvars.ContextVar("lowprec_moe_kernel_dir", default=None)


def kernel_source_dir() -> str | None:
    """The kernel source directory set with :func:`kernel_directory` here (None: the one that
    ships with the package)."""
    return _kernel_dir.get()


@contextlib.contextmanager
def kernel_directory(directory) -> Iterator[None]:
    """Compile kernels from ``directory`` instead of the package's ``raw_kernels/`` inside the
    ``with`` block (A/B runs against a copy of the sources, loader tests). Modules compiled
    from another directory are cached apart (the source hash is part of the key).

    Parameters
    ----------
    directory : path-like or None
    """
    import os

    if directory is not None and not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a path, got {type(directory).__name__}")
    token = _kernel_dir.set(None if directory is None else os.fspath(directory))
    try:
        yield
    finally:
        _kernel_dir.reset(token)
