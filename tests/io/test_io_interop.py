"""Our serving-layout files decoded the way other stacks decode them.

The files are read with a minimal safetensors parser written here (not the library's reader),
the bytes are decoded with ModelOpt's documented formula (``e2m1 * float(weight_scale) *
weight_scale_2``; MXFP8 ``fp8 * 2^(e8m0 - 127)``) and, when installed, with compressed-tensors'
own unpacker and dequantizer (``e2m1 * (weight_scale / weight_global_scale)``). The packed codes
and the scales must decode exactly as ours; the products may differ by 2 fp32 ulp, because each
stack multiplies the two scales in its own order.
"""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe.io import convert

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
LABELS = {"U8": np.uint8, "F32": np.float32, "BF16": ml_dtypes.bfloat16,
          "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}


def read_safetensors(path) -> dict[str, np.ndarray]:
    """The spec: u64 header length, JSON header, data offsets relative to the data section."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]],
                             LABELS[v["dtype"]]).reshape(v["shape"]) for k, v in header.items()}


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """Two codes per byte, the first element in the low nibble."""
    lo, hi = E2M1[packed & 0xF], E2M1[packed >> 4]
    return np.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in fp32 ulps on the ordered integer line (+0 and -0 are 0 apart)."""
    def ordered(x):
        i = x.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(a) - ordered(b))


def _weights(shape=(96, 256), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x[:, :16] *= 1e-3  # small blocks: small E4M3 scales, subnormal ones included
    x[5] = 0  # an all-zero row
    return x.astype(ml_dtypes.bfloat16)


def _quantize(tmp_path, fmt, layout, x):
    from lowprec_moe import io as lio

    lio.save(tmp_path / "w.safetensors", {"layer.weight": x})
    convert.quantize_file(tmp_path / "w.safetensors", tmp_path / "q.safetensors", fmt,
                          layout=layout, force=True)
    return read_safetensors(tmp_path / "q.safetensors")


@pytest.mark.parametrize("scale", [1.0, 1e-30, 3e4])
def test_modelopt_nvfp4_formula(tmp_path, scale):
    x = (_weights().astype(np.float32) * np.float32(scale)).astype(ml_dtypes.bfloat16)
    t = _quantize(tmp_path, "nvfp4", "modelopt", x)
    assert set(t) == {"layer.weight", "layer.weight_scale", "layer.weight_scale_2"}
    codes = unpack_e2m1(t["layer.weight"])
    block = np.repeat(t["layer.weight_scale"].astype(np.float32), 16, axis=1)
    got = codes * (block * t["layer.weight_scale_2"])
    q = lpm.quantize(x, "nvfp4")
    ours = lpm.dequantize(q)
    # the bytes are ours, read the same way
    assert t["layer.weight"].tobytes() == q.rowwise_data.tobytes()
    assert t["layer.weight_scale"].view(np.uint8).tobytes() == q.rowwise_scale.tobytes()
    assert t["layer.weight_scale_2"] == np.float32(q.amax_rowwise[0] / np.float32(2688))
    assert ulp_distance(got, ours).max() <= 2


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_modelopt_mxfp8_formula(tmp_path, fp8):
    from lowprec_moe import io as lio

    x = _weights()
    lio.save(tmp_path / "w.safetensors", {"layer.weight": x})
    convert.quantize_file(tmp_path / "w.safetensors", tmp_path / "q.safetensors", "mxfp8",
                          fp8_dtype=fp8)
    t = read_safetensors(tmp_path / "q.safetensors")
    assert t["layer.weight"].dtype == (ml_dtypes.float8_e4m3fn if fp8 == "e4m3"
                                       else ml_dtypes.float8_e5m2)
    scale = np.exp2(t["layer.weight_scale"].astype(np.float64) - 127)
    got = t["layer.weight"].astype(np.float64) * np.repeat(scale, 32, axis=1)
    ours = lpm.dequantize(lpm.quantize(x, "mxfp8", fp8_dtype=fp8))
    assert np.array_equal(got.astype(np.float32), ours)


def test_compressed_tensors_formula_without_the_package(tmp_path):
    x = _weights()
    t = _quantize(tmp_path, "nvfp4", "compressed-tensors", x)
    assert set(t) == {"layer.weight_packed", "layer.weight_scale", "layer.weight_global_scale"}
    q = lpm.quantize(x, "nvfp4")
    assert t["layer.weight_global_scale"][0] == np.float32(2688) / q.amax_rowwise[0]
    scale = np.repeat(t["layer.weight_scale"].astype(np.float32), 16, axis=1)
    got = unpack_e2m1(t["layer.weight_packed"]) * (scale / t["layer.weight_global_scale"][0])
    assert ulp_distance(got, lpm.dequantize(q)).max() <= 2


def test_compressed_tensors_own_unpacker(tmp_path):
    torch = pytest.importorskip("torch")
    helpers = pytest.importorskip("compressed_tensors.compressors.nvfp4.helpers")
    forward = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward")
    from compressed_tensors.quantization.quant_scheme import NVFP4A16

    x = _weights()
    t = _quantize(tmp_path, "nvfp4", "compressed-tensors", x)
    packed = torch.from_numpy(t["layer.weight_packed"].copy())
    m, half = packed.shape
    codes = helpers.unpack_fp4_from_uint8(packed, m, 2 * half, dtype=torch.float32)
    assert np.array_equal(codes.numpy(), unpack_e2m1(t["layer.weight_packed"]))
    scale = torch.from_numpy(t["layer.weight_scale"].view(np.uint8).copy()).view(
        torch.float8_e4m3fn).to(torch.float32)
    assert np.array_equal(scale.numpy(), t["layer.weight_scale"].astype(np.float32))
    gs = torch.from_numpy(t["layer.weight_global_scale"].copy())
    got = forward.dequantize(x_q=codes, scale=scale, global_scale=gs,
                             args=NVFP4A16["weights"], dtype=torch.float32)
    ours = lpm.dequantize(lpm.quantize(x, "nvfp4"))
    assert got.shape == ours.shape
    assert ulp_distance(got.numpy(), ours).max() <= 2
