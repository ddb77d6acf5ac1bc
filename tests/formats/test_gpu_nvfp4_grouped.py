"""NVFP4 grouped GPU quantize against the NumPy reference, byte for byte: one launch for all
members, every scaling / RHT / stochastic-rounding option, edge splits, grouped == per member.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_bytes_equal, requires_gpu
from test_gpu_nvfp4 import (DTYPES, MODES, OPTIONS, SPLITS, _cast, _check_grouped, _kw, _random,
                            nv)  # noqa: F401  (fixture)

pytestmark = [pytest.mark.gpu, requires_gpu]


# ------------------------------------------------------------------------------ grouped
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option", ["tensor", "row_scaled", "sr", "rht", "rht_sr"])
@pytest.mark.parametrize("mode", MODES, ids=["row", "col", "both"])
@pytest.mark.parametrize("k", [48, 256])
def test_grouped_quantize(cp, nv, dtype, option, mode, k):
    opts = OPTIONS[option]
    if opts.get("rht") and dtype != "bfloat16":
        pytest.skip("rht is defined for bfloat16 input")
    x = _cast(_random((sum(SPLITS), k), seed=k + len(option)), dtype)
    _check_grouped(cp, nv, x, SPLITS, f"{dtype} {option} k={k}", **_kw(*mode, **opts))

@pytest.mark.parametrize("splits", [[0, 64, 32, 0, 96], [32], [0, 0, 160], [16] * 9])
@pytest.mark.parametrize("option", ["2d", "2d_sr", "2d_rht"])
def test_grouped_quantize_block_2d(cp, nv, splits, option):
    x = _cast(_random((sum(splits), 160), seed=len(splits)), "bfloat16")
    _check_grouped(cp, nv, x, splits, f"{splits} {option}", **_kw(**OPTIONS[option]))

def test_grouped_edge_splits(cp, nv):
    k = 64
    for splits in ([0], [0, 0, 0], [1], [1, 0, 1], [15, 17, 63, 65, 0, 129], [300]):
        x = _cast(_random((sum(splits), k), seed=sum(splits)), "bfloat16")
        for option in ("tensor", "row_scaled", "sr", "rht"):
            _check_grouped(cp, nv, x, splits, f"{splits} {option}", **_kw(**OPTIONS[option]))

def test_grouped_equals_per_member_quantize(cp, nv):
    """Grouped = dense: member g of the grouped result equals quantizing x_g alone (member=g)."""
    x = cp.asarray(_cast(_random((sum(SPLITS), 128), seed=8), "bfloat16"))
    kw = _kw(stochastic_rounding=True, seed=77)
    g = nv.grouped_quantize_nvfp4(x, SPLITS, **kw)
    off = np.concatenate([[0], np.cumsum(SPLITS)])
    for i in range(len(SPLITS)):
        q = nv.quantize_nvfp4(x[off[i]:off[i + 1]], member=i, **kw)
        assert_bytes_equal(g["rowwise_data"][off[i]:off[i + 1]], q["rowwise_data"], f"m{i} rd")
        d0, d1 = g["columnwise_data_offsets"][i:i + 2]
        s0, s1 = g["columnwise_scale_offsets"][i:i + 2]
        assert_bytes_equal(g["columnwise_data"][d0:d1], q["columnwise_data"].reshape(-1),
                           f"m{i} cd")
        assert_bytes_equal(g["columnwise_scale"][s0:s1], q["columnwise_scale"].reshape(-1),
                           f"m{i} cs")
        assert_bytes_equal(g["amax_rowwise"][i:i + 1], q["amax_rowwise"], f"m{i} amax")
