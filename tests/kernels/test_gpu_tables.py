"""The cached upload of small host tables (lowprec_moe.backends.cupy.tables) on the GPU."""

import numpy as np
import pytest

from conftest import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]


def test_upload_round_trips_and_is_cached_by_content():
    import cupy as cp

    from lowprec_moe.backends.cupy import tables

    tables.clear()
    rows = np.array([0, 5, 5, 12], np.int64)
    grid = np.arange(6, dtype=np.int64).reshape(3, 2)
    a = tables.upload(rows, grid)
    assert [t.shape for t in a] == [(4,), (3, 2)]
    np.testing.assert_array_equal(cp.asnumpy(a[0]), rows)
    np.testing.assert_array_equal(cp.asnumpy(a[1]), grid)
    b = tables.upload(rows.copy(), grid.copy())  # same bytes, other host arrays
    assert all(x.data.ptr == y.data.ptr for x, y in zip(a, b))
    c = tables.upload(rows + 1, grid)
    assert c[0].data.ptr != a[0].data.ptr
    np.testing.assert_array_equal(cp.asnumpy(c[0]), rows + 1)
    # the same bytes split differently are another layout
    d = tables.upload(np.concatenate([rows, grid.reshape(-1)]))
    assert d[0].shape == (10,) and d[0].data.ptr != a[0].data.ptr
    e = tables.upload(rows.astype(np.int32), dtype=np.int32)
    assert e[0].dtype == np.int32 and e[0].data.ptr != a[0].data.ptr
    np.testing.assert_array_equal(cp.asnumpy(e[0]), rows)
