"""Block-code ranges of MXFP8 GEMM operand rows on the GPU (``RANGES_KERNEL`` of
:mod:`.sm90`, raw_kernels/gemm/grouped_gemm_mx_ranges.cuh), which the warp-specialised MXFP8 kernels check their
tiles against the fp16 window with.

Per expert ``g`` the words are ``ra`` entries for A's rows (the expert's output rows), then
``rb`` for B's (the output columns), at ``g * (ra + rb) + row``: ``uint16`` with the row's
largest E8M0 block code along the expert's contraction in the low byte and its smallest in the
high byte (0 and 255 over no block). NumPy twin:
:func:`lowprec_moe.backends.numpy.gemm.mx_code_range_words`.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe.backends.cupy.gemm.sm90 import RANGES_KERNEL, RANGES_MODULE

#: rows per CTA of the range kernel (kMxRangeThreads)
RANGE_THREADS = 256


def mx_range_words(desc, a_scale, b_scale, a_mn: bool, b_mn: bool, a_e5m2: bool, b_e5m2: bool,
                   n_cols: int, ra: int, num_experts: int, grid_rows: int | None = None):
    """The range words of a grouped MXFP8 GEMM launch and whether any row leaves the fp16 window
    (one kernel launch, on the current stream).

    Parameters
    ----------
    desc : cupy.ndarray
        The launch's int64 ``[G, 16]`` descriptor table (scale offsets and strides, rows,
        contraction lengths).
    a_scale, b_scale : cupy.ndarray
        The operands' E8M0 block scales, as the GEMM kernel reads them.
    a_mn, b_mn : bool
        Whether each operand's scales are MN-major (block lines of all rows) or K-major (rows).
    a_e5m2, b_e5m2 : bool
        Each operand's element format (E5M2 or E4M3), which sets its fp16 window.
    n_cols : int
        B's rows (the output columns), the same for every expert.
    ra : int
        Words per expert for A's rows: the most output rows of any expert.
    num_experts : int
        G.
    grid_rows : int, optional
        Rows per expert and operand that the grid covers at once (each thread then strides
        over the rest); default ``max(ra, n_cols)``, one thread per row. With device splits
        ``ra`` is M while a typical expert has far fewer rows: a smaller grid saves launching
        CTAs that find no row.

    Returns
    -------
    words : cupy.ndarray
        ``uint16 [G * (ra + n_cols)]`` (layout above).
    out_of_window : cupy.ndarray
        ``uint32 [1]``: 1 when some row's codes span more than its format's fp16 window or hold
        a NaN scale, else 0 (the persistent kernel's staging mode for the whole launch).
    """
    import cupy as cp

    rb = int(n_cols)
    words = cp.empty(num_experts * (ra + rb), dtype=cp.uint16)
    flag = cp.zeros(1, dtype=cp.uint32)
    if words.size == 0:
        return words, flag
    from lowprec_moe.backends.cupy.gemm.compile import kernel_function

    fn = kernel_function(RANGES_MODULE, RANGES_KERNEL)
    rows = max(ra, rb) if grid_rows is None else max(1, min(int(grid_rows), max(ra, rb)))
    grid = (-(-rows // RANGE_THREADS), num_experts, 2)
    fn(grid, (RANGE_THREADS,), (desc, a_scale, b_scale, np.int32(a_mn), np.int32(b_mn),
                                np.int32(a_e5m2), np.int32(b_e5m2), np.int64(n_cols),
                                np.int32(ra), np.int32(rb), words, flag))
    return words, flag
