"""Grouped GEMM on the GPU (CuPy + raw_kernels/grouped_gemm_*.cu).

Operands are quantized on the host with the NumPy reference and uploaded with ``cupy.asarray``
(test setup only), so these tests do not depend on the GPU quantize kernels. Checks:

* GPU vs the float64 product of the dequantized operands: relative error <= 1e-5 for float32
  output, <= 1 ulp for bf16 / fp16 output (relative to ``|A| |B|^T``: accumulation order only);
* the epilogue matches the NumPy reference's float32 arithmetic (scale, bias, probs, accumulate);
* grouped == one call per expert, bit for bit; run-to-run bitwise determinism;
* sizes that are not multiples of the tile, skewed splits with empty experts (zero dW), few
  tokens per expert (the 32-row tile), row-scaled NVFP4 for fprop and wgrad, 8-byte NVFP4 rows,
  the fp32 SIMT path and the SIMT fallback;
* kernel configs named through ``lowprec_moe.config.gemm(kernel=...)`` (names as
  ``lowprec_moe.backends.cupy.gemm.select.config_names()`` lists them) against float64 and bit
  for bit against each other.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import config as lpm_config
from lowprec_moe.gemm import (_validate, grouped_gemm, grouped_gemm_dgrad, grouped_gemm_fprop,
                              grouped_gemm_wgrad)

from conftest import assert_bytes_equal, requires_gpu, set_gemm_options, to_host
from test_gemm import (HP_DTYPES, _data, _expected, _member_operands, _quantize,
                       assert_gemm_close)

pytestmark = [pytest.mark.gpu, requires_gpu]

SPLITS = [0, 37, 300, 5, 0, 130, 16]  # not multiples of any tile, empty experts
M = sum(SPLITS)
G = len(SPLITS)
N, K = 96, 160
MODES = ["fprop", "dgrad", "wgrad"]
FORMATS = ["bf16", "fp16", "fp32", "mxfp8-e4m3", "mxfp8-e5m2", "mxfp8-hybrid", "nvfp4",
           "nvfp4-row-scaled"]


def _cp():
    import cupy

    return cupy


def gpu(obj):
    """Upload an array or every array of a GroupedTensor (offset tables stay on the host)."""
    cp = _cp()
    if obj is None:
        return None
    if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        return cp.asarray(obj)
    fields = {}
    for f in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale",
              "amax_rowwise", "amax_columnwise"):
        v = getattr(obj, f)
        if v is not None:
            fields[f] = cp.asarray(v)
    return dataclasses.replace(obj, **fields)


def _host_operands(mode, fmt, seed=0, splits=SPLITS, n=N, k=K):
    m = sum(splits)
    dtype = HP_DTYPES.get(fmt, np.float32)
    x, w, dy = _data(seed, m, n, k, dtype=dtype if fmt in HP_DTYPES else np.float32)
    if len(splits) != w.shape[0]:
        w = np.random.default_rng(seed + 1).standard_normal((len(splits), n, k)).astype(x.dtype)
    if fmt in HP_DTYPES:
        return {"fprop": (x, w), "dgrad": (dy, w), "wgrad": (dy, x)}[mode]
    xq, wq, dq = _quantize(fmt, x, w, dy, splits)
    return {"fprop": (xq, wq), "dgrad": (dq, wq), "wgrad": (dq, xq)}[mode]


def _problem(mode, a, b, splits, **kw):
    """The validated problem of (host or device) operands; kw: bias, probs, out_dtype, out,
    accumulate (arrays uploaded)."""
    kw = {k: gpu(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    return _validate(mode, gpu(a), gpu(b), splits, bias=kw.get("bias"), probs=kw.get("probs"),
                     out_dtype=kw.get("out_dtype"), out=kw.get("out"),
                     accumulate=kw.get("accumulate", False))


def _choose(mode, a, b, splits, kernel=None, out_dtype="float32"):
    """The kernel config the launcher runs for a problem: ``kernel`` (a config name) or, by
    default, the GEMM options in force."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    p = _problem(mode, a, b, splits, out_dtype=out_dtype)
    kernel = kernel if kernel is not None else lpm_config.gemm_options().kernel
    return C.choose_kernel(p, C.plan(p), kernel=kernel).config


def _facts(mode, a, b, splits):
    """What kernel selection knows about a problem (format, layout, copy chunk, ...)."""
    from lowprec_moe.backends.cupy.gemm.plan import plan
    from lowprec_moe.backends.cupy.gemm.rules import Facts
    from lowprec_moe.backends.cupy.gemm.select import device_caps

    p = _problem(mode, a, b, splits, out_dtype="float32")
    cc, optin, sms = device_caps()
    return Facts(p, plan(p), tuple(cc), optin, sms)


def _plain_kernel(family, bm, mode, a, b, splits):
    """The name of the plain cp.async tensor-core config of ``family`` ("wgmma": sm_90,
    "mma": mma.sync) with a ``bm`` x 256 tile for the problem's format, layout and copy chunk;
    None where the table has no such config."""
    from lowprec_moe.backends.cupy.gemm.select import config_names

    f = _facts(mode, a, b, splits)
    arch = "sm90" if family == "wgmma" else "sm80"
    name = (f"grouped_gemm_{arch}_{f.fmt}_{family}_cpasync_{bm}x256_{f.layout}"
            + ("_chunk8" if f.chunk == 8 else ""))
    return name if name in config_names() else None


def _run(mode, a, b, splits, kernel=None, **kw):
    """One call on the GPU, result on the host. ``kernel``: a config name, or a function
    ``(mode, a, b, splits) -> name`` (per problem: per-expert calls), run with
    ``lowprec_moe.config.gemm(kernel=...)``; None: the options in force."""
    kw = {k: gpu(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    if callable(kernel):
        kernel = kernel(mode, a, b, splits)
        assert kernel is not None
    with lpm_config.gemm(kernel=kernel):
        return to_host(grouped_gemm(gpu(a), gpu(b), splits, mode=mode, **kw))


# ============================================================================================


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
def test_gpu_vs_float64(mode, fmt):
    a, b = _host_operands(mode, fmt)
    got = _run(mode, a, b, SPLITS, out_dtype="float32")
    exp, mag = _expected(mode, a, b, SPLITS)
    assert_gemm_close(got, exp, mag, f"gpu {mode} {fmt}")


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "nvfp4", "mxfp8-hybrid"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_low_precision_output_one_ulp(mode, fmt, out_dtype):
    a, b = _host_operands(mode, fmt, seed=1)
    got = _run(mode, a, b, SPLITS, out_dtype=out_dtype)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16 if out_dtype == "bfloat16" else np.float16)
    exp, mag = _expected(mode, a, b, SPLITS)
    assert_gemm_close(got, exp, mag, f"gpu {mode} {fmt} -> {out_dtype}")


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled", "mxfp8-e4m3", "bf16"])
def test_gpu_bias_probs_accumulate(fmt):
    a, b = _host_operands("fprop", fmt, seed=2)
    rng = np.random.default_rng(3)
    bias = rng.standard_normal((G, N)).astype(np.float32)
    probs = rng.random(M).astype(np.float32)
    got = _run("fprop", a, b, SPLITS, bias=bias, probs=probs, out_dtype="float32")
    exp, mag = _expected("fprop", a, b, SPLITS, bias=bias, probs=probs)
    assert_gemm_close(got, exp, mag, f"bias*probs {fmt}")
    # accumulate: out = base + t, one fp32 addition
    cp = _cp()
    base = rng.standard_normal((M, N)).astype(np.float32)
    out = cp.asarray(base)
    t = _run("fprop", a, b, SPLITS, bias=bias, probs=probs, out_dtype="float32")
    res = grouped_gemm_fprop(gpu(a), gpu(b), SPLITS, bias=gpu(bias), probs=gpu(probs), out=out,
                             accumulate=True)
    assert res is out
    assert_bytes_equal(out, (base + t).astype(np.float32), "accumulate")


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled", "mxfp8-hybrid", "bf16", "fp32"])
def test_gpu_wgrad_empty_experts_zero_and_accumulate(fmt):
    a, b = _host_operands("wgrad", fmt, seed=4)
    got = _run("wgrad", a, b, SPLITS, out_dtype="float32")
    for g, s in enumerate(SPLITS):
        if s == 0:
            assert_bytes_equal(got[g], np.zeros((N, K), np.float32), f"dW[{g}]")
    cp = _cp()
    base = np.random.default_rng(5).standard_normal((G, N, K)).astype(np.float32)
    out = cp.asarray(base)
    grouped_gemm_wgrad(gpu(a), gpu(b), SPLITS, out=out, accumulate=True)
    expect = (base + got).astype(np.float32)
    for g, s in enumerate(SPLITS):
        if s == 0:
            expect[g] = base[g]  # untouched
    assert_bytes_equal(out, expect, "wgrad accumulate")


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt,n,k,shift", [("mxfp8-hybrid", N, K, 0), ("nvfp4", N, K, 0),
                                           ("mxfp8-hybrid", N, K, 1), ("nvfp4", N, K, 1),
                                           ("bf16", 36, 50, 0)])
def test_gpu_wgrad_empty_experts_overwrite(fmt, n, k, shift, out_dtype):
    """An empty expert's dW_g overwrites a NaN-filled output with +0, and the other experts'
    outputs are a fresh output's. The tensor-core kernels (MXFP8, NVFP4) zero a tile in 16-byte
    stores when its rows start and end on 16-byte boundaries (shift 0) and element by element
    otherwise (shift 1: the output one element past a 16-byte boundary); bf16 with K = 50 runs
    the SIMT kernel (rows of 100 bytes), which zeroes its own tiles."""
    a, b = _host_operands("wgrad", fmt, seed=12, n=n, k=k)
    a, b = gpu(a), gpu(b)
    fresh_dev = grouped_gemm_wgrad(a, b, SPLITS, out_dtype=out_dtype)
    fresh = to_host(fresh_dev)
    buf = _cp().empty(fresh_dev.size + shift, dtype=fresh_dev.dtype)
    out = buf[shift:].reshape(fresh_dev.shape)
    out.view(_cp().uint8).fill(0xFF)  # a NaN in every output type
    res = grouped_gemm_wgrad(a, b, SPLITS, out=out)
    assert res is out
    got = to_host(out)
    for g, s in enumerate(SPLITS):
        if s == 0:
            assert_bytes_equal(got[g], np.zeros((n, k), fresh.dtype), f"dW[{g}] {out_dtype}")
    assert_bytes_equal(got, fresh, f"overwrite {out_dtype} shift {shift}")


NVFP4_PLAIN = "grouped_gemm_sm90_nvfp4_wgmma_cpasync_64x256_kk"
NVFP4_WS = "grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk"


def _families():
    from lowprec_moe.backends.cupy.gemm.select import device_caps

    fams = ["mma", "simt"]
    if device_caps()[0] == (9, 0):
        fams.insert(0, "wgmma")
    return fams


#: The row tiles of the plain tensor-core configs of each family (the first is wgrad's).


def _assert_grouped_equals_members(mode, fmt, seed, what, kernel=None):
    """One grouped call == one call per expert (operands quantized per expert), bitwise;
    ``kernel`` as in :func:`_run`."""
    dtype = HP_DTYPES.get(fmt, np.float32)
    x, w, dy = _data(seed, M, N, K, dtype=dtype)
    a, b = _host_operands(mode, fmt, seed=seed)
    full = _run(mode, a, b, SPLITS, kernel=kernel, out_dtype="float32")
    offs = np.concatenate([[0], np.cumsum(SPLITS)])
    for g in range(G):
        lo, hi = int(offs[g]), int(offs[g + 1])
        ag, bg = _member_operands(mode, fmt, x, w, dy, g, lo, hi)
        one = _run(mode, ag, bg, [hi - lo], kernel=kernel, out_dtype="float32")
        ref = full[g:g + 1] if mode == "wgrad" else full[lo:hi]
        assert_bytes_equal(one, ref, f"{what} expert {g}")


@pytest.mark.parametrize("fmt", ["bf16", "fp32", "nvfp4", "nvfp4-row-scaled", "mxfp8-hybrid"])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_grouped_equals_per_expert_bitwise(mode, fmt):
    _assert_grouped_equals_members(mode, fmt, 6, f"{mode} {fmt}")


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "mxfp8-e4m3"])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_deterministic(mode, fmt):
    a, b = _host_operands(mode, fmt, seed=7)
    ga, gb = gpu(a), gpu(b)
    r1 = to_host(grouped_gemm(ga, gb, SPLITS, mode=mode, out_dtype="float32"))
    for _ in range(3):
        r2 = to_host(grouped_gemm(ga, gb, SPLITS, mode=mode, out_dtype="float32"))
        assert_bytes_equal(r2, r1, f"run-to-run {mode} {fmt}")


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "mxfp8-e4m3"])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_few_tokens_per_expert(mode, fmt):
    """16 tokens per expert: the M-grouped GEMMs take a small tile (32 rows with mma.sync,
    64 with wgmma, the 32-token swapped-operand tile for quantized K-major operands)."""
    splits = [16] * 12 + [0, 3, 40]
    a, b = _host_operands(mode, fmt, seed=8, splits=splits, n=64, k=128)
    launch = _choose(mode, a, b, splits)
    if mode != "wgrad":
        assert launch.bm < 128, launch.name
    got = _run(mode, a, b, splits, out_dtype="float32")
    exp, mag = _expected(mode, a, b, splits)
    assert_gemm_close(got, exp, mag, f"few tokens {mode} {fmt}")


@pytest.mark.parametrize("mode", MODES)
def test_gpu_skewed_splits(mode):
    splits = [0, 0, 517, 1, 0, 2, 0, 33]
    for fmt in ("bf16", "nvfp4", "mxfp8-hybrid"):
        a, b = _host_operands(mode, fmt, seed=9, splits=splits)
        got = _run(mode, a, b, splits, out_dtype="float32")
        exp, mag = _expected(mode, a, b, splits)
        assert_gemm_close(got, exp, mag, f"skewed {mode} {fmt}")


@pytest.mark.parametrize("mode", MODES)
def test_gpu_nvfp4_8byte_rows(mode):
    """K = 48: NVFP4 rows of 24 bytes need the 8-byte-copy kernels (``..._chunk8``); wgrad
    members with a padded token count of 16 (mod 32) too."""
    splits = [5, 0, 37, 16]
    a, b = _host_operands(mode, "nvfp4", seed=10, splits=splits, n=48, k=48)
    launch = _choose(mode, a, b, splits)
    assert not launch.simt and launch.chunk == 8, launch.name
    got = _run(mode, a, b, splits, out_dtype="float32")
    exp, mag = _expected(mode, a, b, splits)
    assert_gemm_close(got, exp, mag, f"8-byte rows {mode}")


@pytest.mark.parametrize("mode", MODES)
def test_gpu_bf16_odd_k_uses_simt_fallback(mode):
    splits = [3, 0, 40]
    a, b = _host_operands(mode, "bf16", seed=11, splits=splits, n=36, k=50)
    assert _choose(mode, a, b, splits).simt
    got = _run(mode, a, b, splits, out_dtype="float32")
    exp, mag = _expected(mode, a, b, splits)
    assert_gemm_close(got, exp, mag, f"bf16 odd K {mode}")


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4-row-scaled", "mxfp8-hybrid"])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_simt_forced_matches(mode, fmt, monkeypatch):
    """The SIMT kernel (named: ``grouped_gemm_simt_64x64``) reads the same plan: independent
    cross-check of the tables."""
    a, b = _host_operands(mode, fmt, seed=12)
    set_gemm_options(monkeypatch, kernel="grouped_gemm_simt_64x64")
    assert _choose(mode, a, b, SPLITS).simt
    got = _run(mode, a, b, SPLITS, out_dtype="float32")
    exp, mag = _expected(mode, a, b, SPLITS)
    assert_gemm_close(got, exp, mag, f"simt {mode} {fmt}")


def test_gpu_returns_cupy_and_validates_mixing():
    cp = _cp()
    a, b = _host_operands("fprop", "bf16")
    y = grouped_gemm_fprop(gpu(a), gpu(b), SPLITS)
    assert isinstance(y, cp.ndarray) and y.dtype == np.dtype(ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        grouped_gemm_fprop(gpu(a), b, SPLITS)
    qa, qb = _host_operands("dgrad", "nvfp4")
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        grouped_gemm_dgrad(gpu(qa), qb, SPLITS)


def test_gpu_out_buffer_bf16_in_place():
    cp = _cp()
    a, b = _host_operands("dgrad", "mxfp8-e4m3", seed=13)
    ref = _run("dgrad", a, b, SPLITS, out_dtype="bfloat16")
    out = cp.zeros(ref.shape, dtype=ml_dtypes.bfloat16)
    assert grouped_gemm_dgrad(gpu(a), gpu(b), SPLITS, out=out) is out
    assert_bytes_equal(out, ref, "out=")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_gpu_64bit_offsets(fmt):
    """The last expert's rows start beyond 2**31 bytes of the token operand (64-bit offsets).
    Synthetic operand bytes (no quantization pass); only the last expert is checked."""
    cp = _cp()
    from lowprec_moe.tensors.grouped_tensor import _offsets

    k, n = (1024, 64) if fmt == "bf16" else (4096, 64)
    big = (2**31 // (k * 2 if fmt == "bf16" else k // 2)) + 64  # rows of expert 0
    splits = [big, 0, 37]
    m = sum(splits)
    lo, hi = big, m
    rng = np.random.default_rng(15)
    if fmt == "bf16":
        x = cp.random.standard_normal((m, k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
        w_h = rng.standard_normal((3, n, k)).astype(ml_dtypes.bfloat16)
        y = grouped_gemm_fprop(x, cp.asarray(w_h), splits, out_dtype="float32")
        a = to_host(x[lo:hi]).astype(np.float64)
        exp = a @ w_h[2].astype(np.float64).T
        mag = np.abs(a) @ np.abs(w_h[2].astype(np.float64)).T
        assert_gemm_close(to_host(y[lo:hi]), exp, mag, "bf16 rows past 2**31 bytes")
        return
    data = cp.random.randint(0, 256, (m, k // 2), dtype=cp.uint8)
    scale = cp.random.randint(0x20, 0x50, (m, k // 16), dtype=cp.uint8)  # E4M3 in [2^-4, 8)
    amax = cp.asarray(rng.random(3).astype(np.float32) + 0.5)
    xq = lpm.GroupedTensor(format="nvfp4", shape=(m, k), splits=tuple(splits),
                           offsets=_offsets(splits), rowwise_data=data, rowwise_scale=scale,
                           amax_rowwise=amax)
    wq = lpm.GroupedTensor.quantize(rng.standard_normal((3 * n, k)).astype(np.float32),
                                    [n] * 3, "nvfp4", block_2d=True)
    y = grouped_gemm_fprop(xq, gpu(wq), splits, out_dtype="float32")
    sub = dataclasses.replace(xq, shape=(hi - lo, k), splits=(hi - lo,),
                              offsets=_offsets([hi - lo]), rowwise_data=to_host(data[lo:hi]),
                              rowwise_scale=to_host(scale[lo:hi]),
                              amax_rowwise=to_host(amax[2:3]))
    exp, mag = _expected("fprop", sub, dataclasses.replace(
        wq, shape=(n, k), splits=(n,), offsets=_offsets([n]),
        rowwise_data=wq.rowwise_data[2 * n:], rowwise_scale=wq.rowwise_scale[2 * n:],
        amax_rowwise=wq.amax_rowwise[2:3]), [hi - lo])
    assert_gemm_close(to_host(y[lo:hi]), exp, mag, "nvfp4 rows past 2**31 bytes")
