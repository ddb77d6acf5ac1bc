"""The format constants: formats.py vs the CUDA header vs ml_dtypes vs first principles."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe import formats as F

HEADER = Path(__file__).resolve().parents[2] / "raw_kernels" / "common" / "lpm_formats.cuh"

_DECL = re.compile(
    r"^\s*(?:__device__\s+)?constexpr\s+(?P<type>float|double|int|unsigned int|long long)\s+"
    r"LPM_(?P<name>[A-Z0-9_]+)\s*(?:\[(?P<len>\d+)\])?\s*=\s*(?P<value>[^;]+);",
    re.MULTILINE,
)


def _parse_scalar(text: str, ctype: str):
    text = text.strip()
    if ctype in ("float", "double"):
        return float(text.rstrip("fF"))
    return int(text.rstrip("uUlL"), 0)


def parse_header(path: Path = HEADER) -> dict[str, tuple[str, object]]:
    """``{NAME: (c_type, value)}`` of every ``constexpr ... LPM_NAME = ...;`` in the header."""
    out: dict[str, tuple[str, object]] = {}
    for m in _DECL.finditer(path.read_text()):
        name, ctype, value = m["name"], m["type"], m["value"].strip()
        assert name not in out, f"LPM_{name} defined twice"
        if m["len"] is not None:
            assert value.startswith("{") and value.endswith("}"), value
            items = [v for v in value[1:-1].split(",") if v.strip()]
            parsed = tuple(_parse_scalar(v, ctype) for v in items)
            assert len(parsed) == int(m["len"]), f"LPM_{name}: length {len(parsed)}"
            out[name] = (ctype, parsed)
        else:
            out[name] = (ctype, _parse_scalar(value, ctype))
    return out


def python_constants() -> dict[str, object]:
    """Every upper-case numeric constant (or tuple of numbers) of formats.py."""
    out = {}
    for name in dir(F):
        if not name.isupper() or name.startswith("_"):
            continue
        v = getattr(F, name)
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[name] = v
        elif isinstance(v, tuple) and v and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v
        ):
            out[name] = v
    return out


HEADER_CONSTANTS = parse_header()
PY_CONSTANTS = python_constants()


def f32_bits(x) -> int:
    return int(np.asarray(x, dtype=np.float32).reshape(1).view(np.uint32)[0])


def fp32_reciprocal_bits(n: float) -> int:
    # fp32 division of two exactly representable values is correctly rounded.
    return f32_bits(np.float32(1.0) / np.float32(n))


# ------------------------------------------------------------------------------------------
# Header <-> formats.py


def test_header_parses_and_is_nonempty():
    assert len(HEADER_CONSTANTS) >= 40
    assert "FP32_ONE_SIXTH_BITS" in HEADER_CONSTANTS
    assert "NVFP4_GEMM_FACTOR" in HEADER_CONSTANTS


def test_every_python_constant_is_in_header():
    missing = sorted(set(PY_CONSTANTS) - set(HEADER_CONSTANTS))
    assert not missing, f"constants of formats.py missing from lpm_formats.cuh: {missing}"


def test_every_header_constant_is_in_formats_py():
    extra = sorted(set(HEADER_CONSTANTS) - set(PY_CONSTANTS))
    assert not extra, f"LPM_ constants of lpm_formats.cuh not defined in formats.py: {extra}"


@pytest.mark.parametrize("name", sorted(PY_CONSTANTS))
def test_header_value_matches(name):
    if name not in HEADER_CONSTANTS:
        pytest.skip(f"{name} missing (reported by test_every_python_constant_is_in_header)")
    ctype, hval = HEADER_CONSTANTS[name]
    pval = PY_CONSTANTS[name]
    if isinstance(pval, tuple):
        assert isinstance(hval, tuple) and len(hval) == len(pval), name
        assert all(float(a) == float(b) for a, b in zip(hval, pval)), (name, hval, pval)
        return
    if isinstance(pval, float):
        assert ctype in ("float", "double"), f"LPM_{name} is {ctype}, formats.py has a float"
        assert hval == pval, (name, hval, pval)
        if ctype == "float":
            # the literal must be an exact fp32 value, so kernels see exactly pval
            assert float(np.float32(hval)) == hval, name
    else:
        assert ctype in ("int", "unsigned int", "long long"), (
            f"LPM_{name} is {ctype}, formats.py has an int"
        )
        assert hval == pval, (name, hval, pval)
        if ctype == "int":
            assert -(2**31) <= pval < 2**31, name
        elif ctype == "unsigned int":
            assert 0 <= pval < 2**32, name


# ------------------------------------------------------------------------------------------
# formats.py against ml_dtypes and first principles


def test_element_maxima_match_ml_dtypes():
    assert F.E4M3_MAX == float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max) == 448.0
    assert F.E5M2_MAX == float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max) == 57344.0
    assert F.FP4_MAX == float(ml_dtypes.finfo(ml_dtypes.float4_e2m1fn).max) == 6.0
    assert F.FLT_MAX == float(np.finfo(np.float32).max)
    assert F.FP8_MAX == {"e4m3": F.E4M3_MAX, "e5m2": F.E5M2_MAX}


def test_derived_nvfp4_constants():
    assert F.NVFP4_AMAX_DIVISOR == F.FP4_MAX * F.E4M3_MAX == 2688
    assert F.NVFP4_GEMM_FACTOR == 6 * 6 * 448 * 448 == 7225344
    assert F.NVFP4_GEMM_FACTOR == F.NVFP4_AMAX_DIVISOR**2


def test_fp32_bit_constants():
    assert F.FP32_ONE_SIXTH_BITS == 0x3E2AAAAB
    assert F.FP32_ONE_SIXTH_BITS == fp32_reciprocal_bits(6.0)
    assert f32_bits(F.fp32_one_sixth()) == F.FP32_ONE_SIXTH_BITS
    assert F.fp32_one_sixth().dtype == np.float32
    recips = {
        "FP32_INV_NVFP4_AMAX_DIVISOR_BITS": F.NVFP4_AMAX_DIVISOR,
        "FP32_INV_NVFP4_GEMM_FACTOR_BITS": F.NVFP4_GEMM_FACTOR,
        "FP32_INV_E4M3_MAX_BITS": F.E4M3_MAX,
        "FP32_INV_E5M2_MAX_BITS": F.E5M2_MAX,
    }
    for name, n in recips.items():
        if hasattr(F, name):
            assert getattr(F, name) == fp32_reciprocal_bits(n), name
    # every FP32_INV_*_BITS constant is covered above
    inv_names = {n for n in PY_CONSTANTS if n.startswith("FP32_INV_") and n.endswith("_BITS")}
    assert inv_names <= set(recips), sorted(inv_names - set(recips))


def test_e2m1_table_matches_ml_dtypes():
    codes = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert F.E2M1_NUM_CODES == 16
    assert tuple(float(v) for v in codes[:8]) == F.E2M1_MAGNITUDES
    assert np.array_equal(codes[8:], -codes[:8])
    assert np.signbit(codes[F.E2M1_SIGN_BIT])  # code 8 is -0
    assert float(codes[F.E2M1_MAX_CODE]) == F.FP4_MAX
    assert F.E2M1_MAGNITUDES[-1] == F.FP4_MAX


@pytest.mark.parametrize(
    "fp8, bias, mant, nan_code",
    [
        ("e4m3", "E4M3_EXP_BIAS", "E4M3_MANT_BITS", "E4M3_NAN_CODE"),
        ("e5m2", "E5M2_EXP_BIAS", "E5M2_MANT_BITS", "E5M2_NAN_CODE"),
    ],
)
def test_fp8_layout_matches_ml_dtypes(fp8, bias, mant, nan_code):
    dt = F.ml_fp8_dtype(fp8)
    fi = ml_dtypes.finfo(dt)
    assert getattr(F, mant) == fi.nmant
    # smallest normal is 2**(1 - bias)
    assert float(fi.smallest_normal) == 2.0 ** (1 - getattr(F, bias))
    assert float(fi.smallest_subnormal) == 2.0 ** (1 - getattr(F, bias) - getattr(F, mant))
    if hasattr(F, nan_code):
        code = np.array([getattr(F, nan_code)], dtype=np.uint8).view(dt)
        assert np.isnan(code.astype(np.float32))[0]
    assert F.fp8_max(fp8) == float(fi.max)


def test_e4m3_smallest_subnormal_is_2_pow_minus_9():
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).smallest_subnormal) == 2.0**-9


def test_fp8_name_errors():
    with pytest.raises(ValueError, match="e4m4"):
        F.fp8_max("e4m4")
    with pytest.raises(ValueError, match="bf16"):
        F.ml_fp8_dtype("bf16")


def test_e8m0_matches_ml_dtypes():
    b = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    assert np.isnan(b[F.E8M0_NAN])
    assert F.E8M0_MAX_FINITE == F.E8M0_NAN - 1
    assert b[F.E8M0_MAX_FINITE] == 2.0**127
    assert b[0] == 2.0**-127  # code 0 is not zero
    assert b[F.E8M0_BIAS] == 1.0
    e = np.arange(255)
    assert np.array_equal(b[:255], 2.0 ** (e - F.E8M0_BIAS))


def test_fp32_layout():
    fi = np.finfo(np.float32)
    assert F.FP32_MANT_BITS == fi.nmant == 23
    assert F.FP32_MANT_MASK == (1 << 23) - 1
    assert F.FP32_EXP_MASK == 0xFF
    assert F.FP32_EXP_BIAS == 127
    assert f32_bits(np.float32(1.0)) == F.FP32_EXP_BIAS << F.FP32_MANT_BITS


def test_bfloat16_is_upper_half_of_fp32():
    bf = ml_dtypes.bfloat16
    assert ml_dtypes.finfo(bf).nmant == 7
    vals = np.array([1.0, -2.5, 3.0e38, 1.0e-40, 6.0], dtype=np.float32)  # exact in bf16
    as_bf = vals.astype(bf)
    from_bits = (as_bf.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(from_bits, as_bf.astype(np.float32))
    assert float(ml_dtypes.finfo(bf).max) == float(
        np.array([0x7F7F0000], dtype=np.uint32).view(np.float32)[0]
    )


def test_block_sizes():
    assert F.NVFP4_BLOCK == 16
    assert F.MXFP8_BLOCK == 32


def test_swizzle_constants():
    assert F.SWIZZLE_TILE_BYTES == F.SWIZZLE_TILE_ROWS * F.SWIZZLE_TILE_COLS == 512
    assert F.SWIZZLE_TILE_ROWS == 4 * F.SWIZZLE_SUBTILE_ROWS
    assert (F.SCALE_PAD_ROWS, F.SCALE_PAD_COLS) == (F.SWIZZLE_TILE_ROWS, F.SWIZZLE_TILE_COLS)


def test_swizzle_offset_formula_is_a_permutation_of_a_tile():
    # The formula of NUMERICS §4 (mirrored by lpm_swizzle_offset in the header) maps each
    # 128x4 tile onto its own 512 bytes, one to one.
    R, C = 2 * F.SWIZZLE_TILE_ROWS, 3 * F.SWIZZLE_TILE_COLS
    r, c = np.meshgrid(np.arange(R), np.arange(C), indexing="ij")
    off = (
        ((r // 128) * (C // 4) + c // 4) * F.SWIZZLE_TILE_BYTES
        + (r % F.SWIZZLE_SUBTILE_ROWS) * 16
        + ((r % 128) // F.SWIZZLE_SUBTILE_ROWS) * 4
        + c % 4
    )
    assert np.array_equal(np.sort(off.ravel()), np.arange(R * C))


# ------------------------------------------------------------------------------------------
# RHT


SPEC_SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]


def test_rht_signs_match_mask_and_spec():
    s = F.rht_signs()
    assert s.dtype == np.float32 and s.shape == (F.RHT_SIZE,)
    assert s.tolist() == SPEC_SIGNS
    mask = sum(1 << i for i, v in enumerate(SPEC_SIGNS) if v == -1)
    assert mask == F.RHT_SIGN_MASK == 0xD7E8


def test_hadamard16():
    h = F.hadamard16().astype(np.float64)
    assert h.shape == (16, 16)
    i = np.arange(16)
    expected = np.array([[(-1) ** bin(a & b).count("1") for b in i] for a in i], dtype=np.float64)
    assert np.array_equal(h, expected)
    assert np.array_equal(h, h.T)
    assert np.array_equal(h @ h.T, 16 * np.eye(16))
    assert F.RHT_NORM == np.sqrt(F.RHT_SIZE)


def test_rht_matrix_is_orthogonal():
    m = np.diag(F.rht_signs().astype(np.float64)) @ F.hadamard16().astype(np.float64) / F.RHT_NORM
    assert np.allclose(m @ m.T, np.eye(16), atol=0, rtol=0)


# ------------------------------------------------------------------------------------------
# Philox constants: the standard Philox4x32-10 known-answer vectors (Random123)


def philox4x32_10_py(ctr, key):
    """Plain-Python Philox4x32 with the constants of formats.py."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    m32 = 0xFFFFFFFF
    for r in range(F.PHILOX_ROUNDS):
        if r:
            k0 = (k0 + F.PHILOX_W0) & m32
            k1 = (k1 + F.PHILOX_W1) & m32
        p0 = F.PHILOX_M0 * c0
        p1 = F.PHILOX_M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & m32, (p0 >> 32) ^ c3 ^ k1, p0 & m32
    return c0, c1, c2, c3


PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("ctr, key, expected", PHILOX_KAT)
def test_philox_constants_known_answers(ctr, key, expected):
    assert (F.PHILOX_M0, F.PHILOX_M1) == (0xD2511F53, 0xCD9E8D57)
    assert (F.PHILOX_W0, F.PHILOX_W1) == (0x9E3779B9, 0xBB67AE85)
    assert F.PHILOX_ROUNDS == 10
    assert philox4x32_10_py(ctr, key) == expected


def test_sr_random_bits():
    assert F.SR_RANDOM_BITS == 8


def test_public_names():
    assert F.FORMATS == ("nvfp4", "mxfp8")
    assert F.FP8_DTYPES == ("e4m3", "e5m2")
    assert set(F.DEQUANT_DTYPES) == {"float32", "bfloat16", "float16"}
