"""The persistent form of the warp-specialised MXFP8 kernel
(``grouped_gemm_sm90_mxfp8_wgmma_ws_tma_persistent_128x256_kk`` / ``_kn`` / ``_nn``,
raw_kernels/gemm/grouped_gemm_ws_mx_persist.cuh) on the GPU: each CTA runs many tiles as
one sequence of k-tiles in the launch's staging mode (fp16 window when every row is in it, from
the range kernel's verdict), its producers write each next tile's window exponents while the
consumers finish the current one, and the epilogue runs from registers through a canonical
buffer.

The grid is capped at 3 CTAs (the launcher sees 3 multiprocessors), so every CTA runs 6-7
tiles and the rings, window slots and barrier phases wrap across tile boundaries. Checks, bit
for bit against the one-CTA-per-tile kernel (``..._ws_tma_128x256_kk`` / ``_kn`` / ``_nn``,
itself bitwise the plain wgmma kernel) and within tolerance of float64, for fprop, dgrad and wgrad:

* 8, 16 and 32 k-tiles on the fp16 window (the range kernel's flag asserted clear), E4M3 and
  hybrid (E5M2 gradients), bf16 and fp16 output, ragged experts with partial row and column
  tiles;
* rows spanning more than the window in some tiles (the flag asserted set: the per-tile kernel
  stages the others on fp16, the persistent one the whole launch on bf16: the same bits on
  such data);
* the bf16 path forced (``mxfp8_mma="bf16"``);
* with the real multiprocessor count, "auto" choosing the persistent form for many tiles.
"""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe import config
from lowprec_moe.gemm import _validate, grouped_gemm

from conftest import assert_bytes_equal, requires_gpu, set_gemm_options, to_host
from test_gemm import _data, _expected, _quantize, assert_gemm_close
from test_gpu_gemm import gpu
from test_gpu_gemm_mxfp8_ws import SPLITS, W_IN, W_OUT, _require_wgmma, ws_kernel
from test_gpu_gemm_persist import NUM_CTAS, few_ctas  # noqa: F401 - fixture

pytestmark = [pytest.mark.gpu, requires_gpu]

def _operands(mode, fmt, length, seed, *, wide=False):
    """(A, B, splits): fprop (contraction K = length, 320 output columns), dgrad (contraction N
    = length, 320 output columns) over SPLITS, or wgrad (three experts of `length` tokens, a
    320 x 384 output each). ``wide``: some rows of A span ~40 block codes (every 7th block
    scaled by 2^40), so the tiles holding them leave the fp16 window while the others keep it."""
    splits = [length] * 3 if mode == "wgrad" else SPLITS
    m = sum(splits)
    if mode == "wgrad":
        x, _, dy = _data(seed, m, W_OUT, W_IN)
    else:
        n, k = (320, length) if mode == "fprop" else (length, 320)
        x, _, dy = _data(seed, m, n, k)
    if wide:
        big = np.float32(2.0 ** 40)
        if mode == "fprop":
            x[300:337, ::7 * 32] *= big  # expert 2's rows
        elif mode == "dgrad":
            dy[600:640, ::7 * 32] *= big  # rows of expert 3
        else:
            dy[::7 * 32, 130:140] *= big  # dy columns = output rows of the second row tile
    if mode == "wgrad":
        w = np.zeros((1, W_OUT, W_IN), np.float32)
    else:
        w = np.random.default_rng(seed + 1).standard_normal(
            (len(splits),) + ((320, length) if mode == "fprop" else (length, 320)))
        w = w.astype(np.float32)
    xq, wq, dq = _quantize(fmt, x, w, dy, splits)
    if mode == "fprop":
        return xq, wq, splits
    if mode == "dgrad":
        return dq, wq, splits
    return dq, xq, splits


def _run(mode, a, b, splits, *, persist, out_dtype="bfloat16"):
    """One call on the persistent form or the per-tile kernel (named); checks which kernel
    ran."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    want = ws_kernel(mode, persistent=persist)
    ga, gb = gpu(a), gpu(b)
    with config.gemm(kernel=want):
        info = C.kernel_info(_validate(mode, ga, gb, splits, bias=None, probs=None,
                                       out_dtype=out_dtype, out=None, accumulate=False))
        assert info["kernel"] == want, info
        return to_host(grouped_gemm(ga, gb, splits, mode=mode, out_dtype=out_dtype))


def _out_of_window(mode, a, b, splits) -> int:
    """The range kernel's flag for a launch: 1 when some row leaves the fp16 window (the
    persistent form then stages the launch on bf16), else 0."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    p = _validate(mode, gpu(a), gpu(b), splits, bias=None, probs=None, out_dtype="bfloat16",
                  out=None, accumulate=False)
    arrays = C._operand_arrays(p)
    _, flag = C._range_words(C._prepare(p, arrays, ws_kernel(mode)), arrays[1], arrays[4])
    return int(to_host(flag)[0])


def _check(mode, a, b, splits, what, out_dtype="bfloat16"):
    got = _run(mode, a, b, splits, persist=True, out_dtype=out_dtype)
    assert_bytes_equal(got, _run(mode, a, b, splits, persist=True,
                                 out_dtype=out_dtype), f"{what}, run to run")
    per_tile = _run(mode, a, b, splits, persist=False, out_dtype=out_dtype)
    assert_bytes_equal(got, per_tile, f"{what} vs the per-tile kernel")
    exp, mag = _expected(mode, a, b, splits)
    assert_gemm_close(got, exp, mag, what)


@pytest.mark.parametrize("length", [512, 1024, 2048])
@pytest.mark.parametrize("fmt", ["mxfp8-e4m3", "mxfp8-hybrid"])
@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
def test_gpu_mxfp8_persistent_equals_per_tile(mode, fmt, length, few_ctas):
    """8, 16 and 32 k-tiles per tile, every row in the fp16 window (so the launch stages on
    fp16), bf16 output; fp16 output at 16."""
    _require_wgmma()
    a, b, splits = _operands(mode, fmt, length, 80 + length)
    assert _out_of_window(mode, a, b, splits) == 0
    _check(mode, a, b, splits, f"persistent {mode} {fmt} {length}")
    if length == 1024:
        _check(mode, a, b, splits, f"persistent {mode} {fmt} {length} fp16 out",
               out_dtype="float16")


@pytest.mark.parametrize("mma", ["auto", "bf16"])
@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
def test_gpu_mxfp8_persistent_mixed_modes(mode, mma, monkeypatch, few_ctas):
    """Some rows beyond the window (the launch on bf16, the per-tile kernel's other tiles on
    fp16), and every tile on bf16 when forced."""
    _require_wgmma()
    set_gemm_options(monkeypatch, mxfp8_mma=mma)
    a, b, splits = _operands(mode, "mxfp8-e4m3", 2048, 90, wide=True)
    assert _out_of_window(mode, a, b, splits) == 1
    _check(mode, a, b, splits, f"persistent {mode} wide rows {mma}")


@pytest.mark.parametrize("mode", ["fprop", "dgrad"])
def test_gpu_mxfp8_persistent_many_tiles_default(monkeypatch, mode):
    """With the real multiprocessor count and more tiles than multiprocessors, "auto" takes the
    persistent form for bf16 output -- fprop up to PERSIST_MX_MAX_KTILES k-tiles (here that
    many), dgrad at any length (here twice that) -- and the per-tile one for fp32 output; the
    two agree bit for bit on bf16 output."""
    _require_wgmma()
    from lowprec_moe.backends.cupy.gemm import launch as C
    from lowprec_moe.backends.cupy.gemm.plan import BK
    from lowprec_moe.backends.cupy.gemm.rules import PERSIST_MX_MAX_KTILES

    splits = [512, 0, 1000, 384, 130, 700] * 6  # ~165 row tiles x 2 column tiles
    length = PERSIST_MX_MAX_KTILES * BK * (1 if mode == "fprop" else 2)
    n, k = (512, length) if mode == "fprop" else (length, 512)
    x, _, dy = _data(91, sum(splits), n, k)
    w = np.random.default_rng(92).standard_normal((len(splits), n, k)).astype(np.float32)
    xq, wq, dq = _quantize("mxfp8-e4m3", x, w, dy, splits)
    ga, gb = gpu(xq if mode == "fprop" else dq), gpu(wq)
    def kernel(out_dtype):
        return C.kernel_info(_validate(mode, ga, gb, splits, bias=None, probs=None,
                                       out_dtype=out_dtype, out=None, accumulate=False))["kernel"]

    assert kernel("bfloat16") == ws_kernel(mode, persistent=True)
    assert kernel("float32") == ws_kernel(mode)
    got = to_host(grouped_gemm(ga, gb, splits, mode=mode, out_dtype="bfloat16"))
    set_gemm_options(monkeypatch, kernel=ws_kernel(mode))
    assert kernel("bfloat16") == ws_kernel(mode)
    assert_bytes_equal(got, to_host(grouped_gemm(ga, gb, splits, mode=mode,
                                                 out_dtype="bfloat16")),
                       f"persistent (auto) vs per-tile, {mode}")
