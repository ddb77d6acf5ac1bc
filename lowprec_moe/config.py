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

__all__ = ["GemmOptions", "gemm", "gemm_options"]

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
