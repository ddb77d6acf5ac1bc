"""lowprec_moe.backends.cupy.launch_helpers: ceiling division on the CPU; on the GPU, kernel
handles memoized per device and zero-filled buffers."""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe.backends.cupy import launch_helpers as H

from conftest import requires_gpu


def test_cdiv():
    for a in range(0, 70):
        for b in (1, 2, 16, 32, 64):
            assert H.cdiv(a, b) == -(-a // b) == int(np.ceil(a / b))


@pytest.mark.gpu
@requires_gpu
def test_kernel_handles_are_memoized_and_zeros_are_zero():
    import cupy as cp

    from lowprec_moe import kernels

    fn = H.kernel("smoke", "lpm_smoke_decode")
    assert H.kernel("smoke", "lpm_smoke_decode") is fn
    assert fn is not None and kernels.get_function("smoke", "lpm_smoke_decode") is not None
    for dtype in (cp.uint32, cp.float32, cp.int64):
        buf = cp.full(37, 7, dtype=dtype)  # fill the pool with non-zero bytes first
        del buf
        z = H.zeros(37, dtype)
        assert z.dtype == dtype and z.shape == (37,) and not bool(z.any())
    assert H.zeros(0, cp.float32).size == 0
    assert H.sm_count() == cp.cuda.Device().attributes["MultiProcessorCount"]


def test_clear_cache_empties_the_launchers_handle_memos():
    from lowprec_moe import kernels

    table = kernels.handle_table()
    table[(0, "m", "k")] = object()
    H._kernels[(0, "probe", "k")] = object()
    kernels.clear_cache()
    assert table == {} and (0, "probe", "k") not in H._kernels
