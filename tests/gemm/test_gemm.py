"""Grouped GEMM (NUMERICS §7), NumPy reference path.

Expected values are float64 products of the dequantized operands, decoded here independently of
the library (E2M1 table, ``ml_dtypes`` E4M3 / E5M2, ``2**(e-127)``), times the NVFP4 global
factors, plus bias. Tolerances (NUMERICS §7): relative error <= 1e-5 for float32 output and <= 1 output
ulp for bf16 / fp16, relative to ``|A| |B|^T`` (the accumulation-order error bound) so that
cancellation does not make the check meaningless.

The GPU launch plan is checked on the CPU in ``test_gemm_plan.py``, the kernel choice in
``test_gemm_choice.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import formats as F
from lowprec_moe.gemm import (grouped_gemm, grouped_gemm_dgrad, grouped_gemm_fprop,
                              grouped_gemm_wgrad)

from conftest import assert_bytes_equal

SPLITS = [0, 37, 128, 5, 90, 0, 48]  # skewed, with empty experts
M = sum(SPLITS)
G = len(SPLITS)
N, K = 64, 96
INV_FACTOR = float(F.f32_from_bits(F.FP32_INV_NVFP4_GEMM_FACTOR_BITS))
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])

FORMATS = ["bf16", "fp16", "fp32", "mxfp8-e4m3", "mxfp8-e5m2", "mxfp8-hybrid", "nvfp4",
           "nvfp4-row-scaled"]
MODES = ["fprop", "dgrad", "wgrad"]
HP_DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}


# ============================================================================================
# Data and independent decoding


def _data(seed, m=M, n=N, k=K, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-2, 3, (m, 1)))
    w = rng.standard_normal((G, n, k)) * 0.5
    dy = rng.standard_normal((m, n)) * np.exp2(rng.integers(-2, 3, (m, 1)))
    return x.astype(dtype), w.astype(dtype), dy.astype(dtype)


def _quantize(fmt, x, w, dy, splits=SPLITS):
    """GroupedTensors for x (row + col), W [G*N, K] (row + col) and dy (row + col)."""
    g, n, k = w.shape
    if fmt.startswith("nvfp4"):
        rs = fmt == "nvfp4-row-scaled"
        xq = lpm.GroupedTensor.quantize(x, splits, "nvfp4", columnwise=True, row_scaled=rs)
        wq = lpm.GroupedTensor.quantize(w.reshape(g * n, k), [n] * g, "nvfp4", columnwise=True,
                                        block_2d=True)
        dq = lpm.GroupedTensor.quantize(dy, splits, "nvfp4", columnwise=True)
        return xq, wq, dq
    x_dt = "e5m2" if fmt == "mxfp8-e5m2" else "e4m3"
    dy_dt = "e4m3" if fmt == "mxfp8-e4m3" else "e5m2"
    xq = lpm.GroupedTensor.quantize(x, splits, "mxfp8", columnwise=True, fp8_dtype=x_dt)
    wq = lpm.GroupedTensor.quantize(w.reshape(g * n, k), [n] * g, "mxfp8", columnwise=True,
                                    fp8_dtype=x_dt)
    dq = lpm.GroupedTensor.quantize(dy, splits, "mxfp8", columnwise=True, fp8_dtype=dy_dt)
    return xq, wq, dq


def _fp4_vals(data, scale):
    codes = np.stack([data & 0xF, data >> 4], axis=-1).reshape(data.shape[0], 2 * data.shape[1])
    s = scale.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return E2M1[codes] * np.repeat(s, 16, axis=1)


def _fp8_vals(data, scale, fp8_dtype, columnwise):
    t = ml_dtypes.float8_e4m3fn if fp8_dtype == "e4m3" else ml_dtypes.float8_e5m2
    v = data.view(t).astype(np.float64)
    f = np.exp2(scale.astype(np.float64) - 127)
    return v * (np.repeat(f, 32, axis=0) if columnwise else np.repeat(f, 32, axis=1))


def _row_vals(gt, lo, hi):
    d, s = gt.rowwise_data[lo:hi], gt.rowwise_scale[lo:hi]
    if gt.format == "nvfp4":
        return _fp4_vals(d, s)
    return _fp8_vals(d, s, gt.fp8_dtype, False)


def _col_vals(gt, g):
    """Member g's columnwise operand values as [cols of x, padded rows]."""
    q = gt.member(g)
    if gt.format == "nvfp4":
        return _fp4_vals(q.columnwise_data, q.columnwise_scale)
    return _fp8_vals(q.columnwise_data, q.columnwise_scale, gt.fp8_dtype, True).T


def _expected(mode, a, b, splits, *, bias=None, probs=None):
    """(float64 expected output, float64 magnitude bound |A||B|*|scale| + |bias term|)."""
    offs = np.concatenate([[0], np.cumsum(splits)])
    q = not isinstance(a, np.ndarray)
    if mode == "wgrad":
        n_out, k_out = a.shape[1], b.shape[1]
        exp = np.zeros((len(splits), n_out, k_out))
    else:
        n_w, k_w = (b.shape[1], b.shape[2]) if not q else (b.shape[0] // len(splits), b.shape[1])
        exp = np.zeros((a.shape[0], n_w if mode == "fprop" else k_w))
    mag = np.zeros_like(exp)
    for g in range(len(splits)):
        lo, hi = int(offs[g]), int(offs[g + 1])
        if not q:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            if mode == "fprop":
                A, B = a64[lo:hi], b64[g]
            elif mode == "dgrad":
                A, B = a64[lo:hi], b64[g].T
            else:
                A, B = a64[lo:hi].T, b64[lo:hi].T
            sa, sb = 1.0, 1.0
        else:
            nw = b.shape[0] // len(splits) if mode != "wgrad" else None
            if mode == "fprop":
                A, B = _row_vals(a, lo, hi), _row_vals(b, g * nw, (g + 1) * nw)
                sa = (a.amax_rowwise[lo:hi, None] if a.row_scaled else a.amax_rowwise[g]) \
                    if a.format == "nvfp4" else 1.0
                sb = b.amax_rowwise[g] if b.format == "nvfp4" else 1.0
            elif mode == "dgrad":
                A, B = _row_vals(a, lo, hi), _col_vals(b, g)[:, :nw]
                sa = (a.amax_rowwise[lo:hi, None] if a.row_scaled else a.amax_rowwise[g]) \
                    if a.format == "nvfp4" else 1.0
                sb = b.amax_columnwise[g] if b.format == "nvfp4" else 1.0
            else:
                A, B = _col_vals(a, g), _col_vals(b, g)
                sa = a.amax_columnwise[g] if a.format == "nvfp4" else 1.0
                sb = (b.amax_columnwise[g][None, :] if b.row_scaled else b.amax_columnwise[g]) \
                    if b.format == "nvfp4" else 1.0
            if a.format == "nvfp4":
                sa = np.asarray(sa, np.float64) * INV_FACTOR
        s = np.asarray(sa, np.float64) * np.asarray(sb, np.float64)
        val = (A @ B.T) * s
        m = (np.abs(A) @ np.abs(B).T) * np.abs(s)
        if bias is not None:
            bterm = bias[g].astype(np.float64)[None, :]
            if probs is not None:
                bterm = bterm * probs[lo:hi].astype(np.float64)[:, None]
            val = val + bterm
            m = m + np.abs(bterm)
        if mode == "wgrad":
            exp[g], mag[g] = val, m
        else:
            exp[lo:hi], mag[lo:hi] = val, m
    return exp, mag


def _ulp(v, dtype):
    """Spacing of the output dtype at |v| (float64)."""
    mant = {np.dtype(ml_dtypes.bfloat16): 7, np.dtype(np.float16): 10,
            np.dtype(np.float32): 23}[np.dtype(dtype)]
    min_exp = {np.dtype(ml_dtypes.bfloat16): -126, np.dtype(np.float16): -14,
               np.dtype(np.float32): -126}[np.dtype(dtype)]
    e = np.floor(np.log2(np.maximum(np.abs(v), 1e-300)))
    return np.exp2(np.maximum(e, min_exp) - mant)


def assert_gemm_close(got, exp, mag, what=""):
    got = np.asarray(got)
    assert got.shape == exp.shape, f"{what}: shape {got.shape} != {exp.shape}"
    g64 = got.astype(np.float64)
    tol = 1e-5 * mag + 1e-30
    if got.dtype != np.float32:
        tol = tol + _ulp(exp, got.dtype)
    err = np.abs(g64 - exp)
    bad = ~(err <= tol)
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, err / tol, 0))), bad.shape)
        raise AssertionError(f"{what}: {int(bad.sum())} elements out of tolerance; worst at {i}: "
                             f"got {g64[i]!r}, expected {exp[i]!r}, tol {tol[i]!r}")


def _operands(mode, fmt, seed=0, splits=SPLITS, m=M, n=N, k=K):
    """(a, b, numpy float32 reference arrays) for a mode and format."""
    dtype = HP_DTYPES.get(fmt, np.float32)
    x, w, dy = _data(seed, m, n, k, dtype=dtype if fmt in HP_DTYPES else np.float32)
    if fmt in HP_DTYPES:
        return {"fprop": (x, w), "dgrad": (dy, w), "wgrad": (dy, x)}[mode]
    xq, wq, dq = _quantize(fmt, x, w, dy, splits)
    return {"fprop": (xq, wq), "dgrad": (dq, wq), "wgrad": (dq, xq)}[mode]


# ============================================================================================
# Accuracy per mode x format


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
def test_modes_formats(mode, fmt):
    a, b = _operands(mode, fmt)
    out = grouped_gemm(a, b, SPLITS, mode=mode, out_dtype="float32")
    exp, mag = _expected(mode, a, b, SPLITS)
    assert out.dtype == np.float32
    assert_gemm_close(out, exp, mag, f"{mode} {fmt}")


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "nvfp4", "mxfp8-e4m3"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
def test_low_precision_output_within_one_ulp(fmt, out_dtype):
    a, b = _operands("fprop", fmt, seed=3)
    out = grouped_gemm_fprop(a, b, SPLITS, out_dtype=out_dtype)
    exp, mag = _expected("fprop", a, b, SPLITS)
    assert_gemm_close(out, exp, mag, f"fprop {fmt} -> {out_dtype}")


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
def test_default_out_dtype_is_input_dtype(fmt):
    a, b = _operands("fprop", fmt)
    assert grouped_gemm_fprop(a, b, SPLITS).dtype == np.dtype(HP_DTYPES[fmt])


def test_default_out_dtype_quantized_is_float32():
    a, b = _operands("fprop", "nvfp4")
    assert grouped_gemm_fprop(a, b).dtype == np.float32  # splits default to x.splits


def test_row_scaled_dgrad_generic():
    """A row-scaled dy is honoured by dgrad as well (per-row amax of the A side)."""
    x, w, dy = _data(5)
    dq = lpm.GroupedTensor.quantize(dy, SPLITS, "nvfp4", row_scaled=True)
    wq = lpm.GroupedTensor.quantize(w.reshape(G * N, K), [N] * G, "nvfp4", columnwise=True,
                                    block_2d=True)
    out = grouped_gemm_dgrad(dq, wq, SPLITS)
    exp, mag = _expected("dgrad", dq, wq, SPLITS)
    assert_gemm_close(out, exp, mag, "dgrad row-scaled dy")


def test_rht_wgrad_contracts_transformed_copies():
    x, w, dy = _data(6, dtype=ml_dtypes.bfloat16)
    xq = lpm.GroupedTensor.quantize(x, SPLITS, "nvfp4", rowwise=False, columnwise=True, rht=True)
    dq = lpm.GroupedTensor.quantize(dy, SPLITS, "nvfp4", rowwise=False, columnwise=True,
                                    rht=True, stochastic_rounding=True, seed=3)
    out = grouped_gemm_wgrad(dq, xq)
    exp, mag = _expected("wgrad", dq, xq, SPLITS)
    assert_gemm_close(out, exp, mag, "wgrad rht")
    # and it approximates dy^T x (the transform cancels)
    ref = np.stack([dy[lo:hi].astype(np.float64).T @ x[lo:hi].astype(np.float64)
                    for lo, hi in zip(np.cumsum([0] + SPLITS[:-1]), np.cumsum(SPLITS))])
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert rel < 0.2, rel


# ============================================================================================
# Epilogue order, bias, probs, accumulate


def _acc32(mode, a, b, splits):
    """The float32 accumulator of the reference: float64 product of the operands, rounded."""
    from lowprec_moe.gemm import _validate
    from lowprec_moe.backends.numpy import gemm as R

    p = _validate(mode, a, b, splits, bias=None, probs=None, out_dtype=None, out=None,
                  accumulate=False)
    return p, R


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled", "mxfp8-e4m3", "bf16"])
def test_epilogue_order_bit_exact(fmt):
    """fp32 epilogue in NUMERICS order: scale, then + bias * probs, one rounding at the end."""
    a, b = _operands("fprop", fmt, seed=11)
    rng = np.random.default_rng(2)
    bias = rng.standard_normal((G, N)).astype(np.float32)
    probs = rng.random(M).astype(np.float32)
    got = grouped_gemm_fprop(a, b, SPLITS, bias=bias, probs=probs, out_dtype="float32")
    p, R = _acc32("fprop", a, b, SPLITS)
    inv = F.f32_from_bits(F.FP32_INV_NVFP4_GEMM_FACTOR_BITS)
    offs = p.offsets
    for g in range(G):
        lo, hi = int(offs[g]), int(offs[g + 1])
        if lo == hi:
            continue
        A, B = R.operand_matrices(p, g)
        acc = (A @ B.T).astype(np.float32)
        t = acc
        if fmt == "nvfp4":
            alpha = np.float32(np.float32(a.amax_rowwise[g] * b.amax_rowwise[g]) * inv)
            t = (t * alpha).astype(np.float32)
        elif fmt == "nvfp4-row-scaled":
            t = (t * inv).astype(np.float32)
            f = (a.amax_rowwise[lo:hi, None] * b.amax_rowwise[g]).astype(np.float32)
            t = (t * f).astype(np.float32)
        t = (t + (bias[g][None, :] * probs[lo:hi, None]).astype(np.float32)).astype(np.float32)
        assert_bytes_equal(got[lo:hi], t, f"expert {g}")


def test_bias_and_probs_accuracy():
    a, b = _operands("fprop", "nvfp4")
    rng = np.random.default_rng(4)
    bias = rng.standard_normal((G, N)).astype(ml_dtypes.bfloat16)
    probs = rng.random(M).astype(np.float32)
    out = grouped_gemm_fprop(a, b, SPLITS, bias=bias, probs=probs)
    exp, mag = _expected("fprop", a, b, SPLITS, bias=bias, probs=probs)
    assert_gemm_close(out, exp, mag, "bias*probs")
    out2 = grouped_gemm_fprop(a, b, SPLITS, bias=bias)
    exp2, mag2 = _expected("fprop", a, b, SPLITS, bias=bias)
    assert_gemm_close(out2, exp2, mag2, "bias")


@pytest.mark.parametrize("mode", MODES)
def test_accumulate_adds_once_in_fp32(mode):
    a, b = _operands(mode, "nvfp4", seed=8)
    t = grouped_gemm(a, b, SPLITS, mode=mode, out_dtype="float32")
    base = np.random.default_rng(9).standard_normal(t.shape).astype(np.float32)
    out = base.copy()
    res = grouped_gemm(a, b, SPLITS, mode=mode, out=out, accumulate=True)
    assert res is out
    expect = (base + t).astype(np.float32)
    if mode == "wgrad":  # experts without tokens are left untouched
        for g, s in enumerate(SPLITS):
            if s == 0:
                expect[g] = base[g]
    assert_bytes_equal(out, expect, f"accumulate {mode}")


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "mxfp8-e4m3", "fp32"])
def test_out_buffer_written_in_place(fmt):
    a, b = _operands("dgrad", fmt)
    ref = grouped_gemm_dgrad(a, b, SPLITS, out_dtype="bfloat16")
    out = np.full(ref.shape, np.nan, dtype=ml_dtypes.bfloat16)
    assert grouped_gemm_dgrad(a, b, SPLITS, out=out) is out
    assert_bytes_equal(out, ref, "out=")


# ============================================================================================
# Empty experts, skew, grouped == per expert


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "nvfp4-row-scaled", "mxfp8-hybrid"])
def test_wgrad_empty_experts_are_zero(fmt):
    a, b = _operands("wgrad", fmt)
    out = grouped_gemm_wgrad(a, b, SPLITS, out_dtype="float32")
    for g, s in enumerate(SPLITS):
        if s == 0:
            assert_bytes_equal(out[g], np.zeros((N, K), np.float32), f"dW[{g}]")
        else:
            assert np.abs(out[g]).max() > 0


def test_all_experts_empty():
    x, w, dy = _data(0, m=0)
    splits = [0] * G
    assert grouped_gemm_fprop(x, w, splits).shape == (0, N)
    assert grouped_gemm_dgrad(dy, w, splits).shape == (0, K)
    dw = grouped_gemm_wgrad(dy, x, splits)
    assert dw.shape == (G, N, K) and not dw.any()


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "mxfp8-e4m3"])
@pytest.mark.parametrize("mode", MODES)
def test_skewed_splits(mode, fmt):
    splits = [0, 0, 301, 1, 0, 2, 0]
    m = sum(splits)
    a, b = _operands(mode, fmt, seed=12, splits=splits, m=m)
    out = grouped_gemm(a, b, splits, mode=mode, out_dtype="float32")
    exp, mag = _expected(mode, a, b, splits)
    assert_gemm_close(out, exp, mag, f"skewed {mode} {fmt}")


def _member_operands(mode, fmt, x, w, dy, g, lo, hi):
    """Operands of expert g alone (quantized alone), with splits [hi - lo]."""
    if fmt in HP_DTYPES:
        return {"fprop": (x[lo:hi], w[g:g + 1]), "dgrad": (dy[lo:hi], w[g:g + 1]),
                "wgrad": (dy[lo:hi], x[lo:hi])}[mode]
    xq, wq, dq = _quantize(fmt, x[lo:hi], w[g:g + 1], dy[lo:hi], [hi - lo])
    return {"fprop": (xq, wq), "dgrad": (dq, wq), "wgrad": (dq, xq)}[mode]


@pytest.mark.parametrize("fmt", ["bf16", "fp32", "nvfp4", "nvfp4-row-scaled", "mxfp8-hybrid"])
@pytest.mark.parametrize("mode", MODES)
def test_grouped_equals_per_expert_bitwise(mode, fmt):
    dtype = HP_DTYPES.get(fmt, np.float32)
    x, w, dy = _data(13, dtype=dtype)
    a, b = _operands(mode, fmt, seed=13)
    rng = np.random.default_rng(1)
    kw = {}
    if mode == "fprop":
        kw = dict(bias=rng.standard_normal((G, N)).astype(np.float32),
                  probs=rng.random(M).astype(np.float32))
    full = grouped_gemm(a, b, SPLITS, mode=mode, out_dtype="bfloat16", **kw)
    offs = np.concatenate([[0], np.cumsum(SPLITS)])
    for g in range(G):
        lo, hi = int(offs[g]), int(offs[g + 1])
        ag, bg = _member_operands(mode, fmt, x, w, dy, g, lo, hi)
        kwg = {}
        if kw:
            kwg = dict(bias=kw["bias"][g:g + 1], probs=kw["probs"][lo:hi])
        one = grouped_gemm(ag, bg, [hi - lo], mode=mode, out_dtype="bfloat16", **kwg)
        ref = full[g:g + 1] if mode == "wgrad" else full[lo:hi]
        assert_bytes_equal(one, ref, f"{mode} {fmt} expert {g}")


# ============================================================================================
# Errors


def test_errors_name_the_problem():
    for mode, args, kw, exc, msg in _err_cases_list():
        with pytest.raises(exc, match=msg):
            grouped_gemm(*args, mode=mode, **kw)


def _err_cases_list():
    x, w, dy = _data(0)
    xq, wq, dq = _quantize("nvfp4", x, w, dy)
    mq = _quantize("mxfp8-e4m3", x, w, dy)
    x_rowonly = lpm.GroupedTensor.quantize(x, SPLITS, "nvfp4")
    w_rowonly = lpm.GroupedTensor.quantize(w.reshape(G * N, K), [N] * G, "nvfp4")
    w_uneven = lpm.GroupedTensor.quantize(w.reshape(G * N, K), [N - 16, N + 16] + [N] * (G - 2),
                                          "nvfp4")
    xb = x.astype(ml_dtypes.bfloat16)
    x_rht = lpm.GroupedTensor.quantize(xb, SPLITS, "nvfp4", rowwise=False, columnwise=True,
                                       rht=True)
    w_rht = lpm.GroupedTensor.quantize(w.reshape(G * N, K).astype(ml_dtypes.bfloat16), [N] * G,
                                       "nvfp4", columnwise=True, rht=True)
    return [
        ("fprop", (x, w[:-1], SPLITS), {}, ValueError, "G=6 experts but splits has G=7"),
        ("fprop", (x, w, SPLITS[:-1]), {}, ValueError, "sum to"),
        ("fprop", (x, w, [-1, 1] + SPLITS[2:]), {}, ValueError, "non-negative"),
        ("fprop", (x[:, :K - 2], w, SPLITS), {}, ValueError, "K mismatch"),
        ("dgrad", (dy[:, :N - 1], w, SPLITS), {}, ValueError, "N mismatch"),
        ("wgrad", (dy[:-1], x, SPLITS), {}, ValueError, "rows"),
        ("fprop", (x, w[0], SPLITS), {}, ValueError, "rank 3"),
        ("fprop", (xb, w, SPLITS), {}, TypeError, "share one dtype"),
        ("fprop", (x.astype(np.float64), w, SPLITS), {}, TypeError, "float64"),
        ("fprop", (x.astype(np.int32), w, SPLITS), {}, TypeError, "int32"),
        ("fprop", (x[:, 0], w, SPLITS), {}, ValueError, "rank >= 2"),
        ("fprop", (xq, w, SPLITS), {}, TypeError, "formats mixed"),
        ("fprop", (x, wq, SPLITS), {}, TypeError, "formats mixed"),
        ("fprop", (xq, mq[1], SPLITS), {}, ValueError, "formats mixed"),
        ("fprop", (xq, wq, [1] + SPLITS[1:-1] + [47]), {}, ValueError, "differ from x.splits"),
        ("fprop", (x, w, None), {}, ValueError, "splits=None"),
        ("fprop", (xq, w_uneven, SPLITS), {}, ValueError, "must all be equal"),
        ("dgrad", (dq, w_rowonly, SPLITS), {}, ValueError, "columnwise copy of weight"),
        ("wgrad", (dq, x_rowonly, SPLITS), {}, ValueError, "columnwise copy of x"),
        ("wgrad", (dq, x_rht, SPLITS), {}, ValueError, "rht"),
        ("dgrad", (dq, w_rht, SPLITS), {}, ValueError, "Hadamard"),
        ("fprop", (x, w, SPLITS), dict(bias=np.zeros((G - 1, N), np.float32)), ValueError,
         "bias has G=6"),
        ("fprop", (x, w, SPLITS), dict(bias=np.zeros((G, N + 1), np.float32)), ValueError,
         "bias.shape"),
        ("fprop", (x, w, SPLITS), dict(bias=np.zeros((G, N), np.float64)), TypeError,
         "bias.dtype=float64"),
        ("fprop", (x, w, SPLITS), dict(probs=np.ones(M, np.float32)), ValueError, "pass bias"),
        ("fprop", (x, w, SPLITS), dict(bias=np.zeros((G, N), np.float32),
                                       probs=np.ones(M + 1, np.float32)), ValueError, "probs"),
        ("fprop", (x, w, SPLITS), dict(out_dtype="int8"), ValueError, "out_dtype"),
        ("fprop", (x, w, SPLITS), dict(out=np.zeros((M, N + 1), np.float32)), ValueError,
         "out.shape"),
        ("fprop", (x, w, SPLITS), dict(out=np.zeros((M, N), np.float32), out_dtype="float16"),
         ValueError, "out_dtype"),
        ("fprop", (x, w, SPLITS), dict(out=np.zeros((M, N), np.int32)), TypeError, "out.dtype"),
        ("fprop", (x, w, SPLITS), dict(out=np.zeros((N, M), np.float32).T), ValueError,
         "C-contiguous"),
        ("fprop", (x, w, SPLITS), dict(accumulate=True), ValueError, "needs an out buffer"),
        ("fprop", (x, w, SPLITS), dict(out=np.zeros((M, N), np.float16), accumulate=True),
         TypeError, "float32 out buffer"),
        ("fprop", (x, w, SPLITS), dict(accumulate=1), TypeError, "accumulate"),
        ("fprop", ([[1.0]], w, SPLITS), {}, TypeError, "x must be"),
        ("wgrad", (dy, x, SPLITS), dict(out_dtype="bfloat16", out=np.zeros((G, N, K),
                                                                           np.float32)),
         ValueError, "out_dtype"),
    ]


def test_bad_mode():
    x, w, _ = _data(0)
    with pytest.raises(ValueError, match="mode='bwd'"):
        grouped_gemm(x, w, SPLITS, mode="bwd")


def test_numpy_cupy_mixed_is_type_error():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except Exception:
        pytest.skip("no GPU")
    x, w, _ = _data(0)
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy"):
        grouped_gemm_fprop(cupy.asarray(x), w, SPLITS)
