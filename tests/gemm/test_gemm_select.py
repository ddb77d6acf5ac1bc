"""Grouped-GEMM kernel selection (``lowprec_moe.backends.cupy.gemm.select``), checked on the CPU
with the device capabilities passed in: the config tables, which config each kind of problem
gets, the ``kernel=`` override and its refusals, and the generated CUDA modules.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_gemm import HP_DTYPES, MODES, _quantize

H200_CAPS = ((9, 0), 227 * 1024, 132)  # capability, opt-in shared memory, SMs
A100_CAPS = ((8, 0), 163 * 1024, 108)


def _policy_problem(mode, fmt, splits, n=128, k=256, out_dtype="float32", bias=False):
    from lowprec_moe.gemm import _validate

    rng = np.random.default_rng(4)
    m = sum(splits)
    dtype = HP_DTYPES.get(fmt, np.float32)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((len(splits), n, k)).astype(dtype)
    dy = rng.standard_normal((m, n)).astype(dtype)
    if fmt in HP_DTYPES:
        a, b = {"fprop": (x, w), "dgrad": (dy, w), "wgrad": (dy, x)}[mode]
    else:
        xq, wq, dq = _quantize(fmt, x, w, dy, splits)
        a, b = {"fprop": (xq, wq), "dgrad": (dq, wq), "wgrad": (dq, xq)}[mode]
    nc = n if mode == "fprop" else k
    bb = np.zeros((len(splits), nc), np.float32) if bias and mode != "wgrad" else None
    return _validate(mode, a, b, splits, bias=bb, probs=None, out_dtype=out_dtype, out=None,
                     accumulate=False)


def _choose(p, caps=H200_CAPS, kernel="auto", chunk=16, monkeypatch=None):
    from lowprec_moe.backends.cupy.gemm import rules, select
    from lowprec_moe.backends.cupy.gemm.plan import plan

    # host arrays sit at arbitrary addresses; pin the copy chunk the device would allow
    monkeypatch.setattr(rules, "chunk_bytes", lambda op, extent: chunk)
    return select.choose_kernel(p, plan(p), caps=caps, kernel=kernel)


# (mode, format, splits, n, k, out dtype, expected config) on an H200 (132 SMs)
_CASES = [
    # bf16 / fp16: the plain wgmma kernel; the 64-row tile for few tokens per expert
    ("fprop", "bf16", [0, 300, 37, 260, 5, 129], 96, 160, "float32",
     "grouped_gemm_sm90_bf16_wgmma_cpasync_128x256_kk"),
    ("fprop", "bf16", [40, 50, 60], 128, 256, "float32",
     "grouped_gemm_sm90_bf16_wgmma_cpasync_64x256_kk"),
    ("dgrad", "fp16", [0, 300, 37, 260, 5, 129], 96, 160, "float32",
     "grouped_gemm_sm90_fp16_wgmma_cpasync_128x256_kn"),
    ("wgrad", "bf16", [16, 0, 32, 3, 16], 128, 256, "float32",
     "grouped_gemm_sm90_bf16_wgmma_cpasync_128x256_nn"),
    # float32 operands: the SIMT kernel
    ("fprop", "fp32", [100, 0, 56, 100], 128, 256, "float32", "grouped_gemm_simt_64x64"),
    # few tokens per expert on quantized K-major operands: the swapped-operand kernels
    ("fprop", "mxfp8-e4m3", [16, 0, 32, 3, 16], 128, 256, "float32",
     "grouped_gemm_sm90_mxfp8_wgmma_swap_cpasync_32x128_kk"),
    ("fprop", "nvfp4", [16, 0, 32, 3, 16], 128, 256, "float32",
     "grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x128_kk"),
    ("dgrad", "nvfp4", [8] * 40, 512, 768, "float32",
     "grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x128_kk"),
    # MXFP8 dgrad (B MN-major) is no swap case
    ("dgrad", "mxfp8-e4m3", [16, 0, 32, 3, 16], 128, 256, "float32",
     "grouped_gemm_sm90_mxfp8_wgmma_cpasync_64x256_kn"),
    # NVFP4, 128-row tile: warp-specialised; TMA + 384 threads with one stride and length
    ("fprop", "nvfp4", [0, 300, 37, 260, 5, 129], 512, 768, "float32",
     "grouped_gemm_sm90_nvfp4_wgmma_ws_tma_128x256_kk"),
    ("wgrad", "nvfp4", [256, 256, 256], 512, 768, "float32",
     "grouped_gemm_sm90_nvfp4_wgmma_ws_tma_128x256_kk"),
    # ... cp.async where no tensor map covers the experts (uneven wgrad, few tiles)
    ("wgrad", "nvfp4-row-scaled", [0, 300, 37, 260, 5, 129], 96, 160, "float32",
     "grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk"),
    # MXFP8 128-row tile: the plain kernel unless the warp-specialised TMA build applies
    ("fprop", "mxfp8-hybrid", [0, 300, 37, 260, 5, 129], 96, 160, "float32",
     "grouped_gemm_sm90_mxfp8_wgmma_cpasync_128x256_kk"),
    ("fprop", "mxfp8-e4m3", [0, 300, 37, 260, 5, 129], 256, 2048, "float32",
     "grouped_gemm_sm90_mxfp8_wgmma_ws_tma_128x256_kk"),
    ("wgrad", "mxfp8-e4m3", [512, 512, 512, 512], 512, 768, "float32",
     "grouped_gemm_sm90_mxfp8_wgmma_ws_tma_128x256_nn"),
    # ... short wgrad contractions stay on the plain kernel
    ("wgrad", "mxfp8-e4m3", [256, 256, 256], 512, 768, "float32",
     "grouped_gemm_sm90_mxfp8_wgmma_cpasync_128x256_nn"),
]


@pytest.mark.parametrize("mode,fmt,splits,n,k,out_dtype,want", _CASES)
def test_auto_choice(mode, fmt, splits, n, k, out_dtype, want, monkeypatch):
    p = _policy_problem(mode, fmt, splits, n, k, out_dtype)
    ch = _choose(p, monkeypatch=monkeypatch)
    assert ch.config.name == want, ch
    assert ch.grid_cap == 0  # 132 SMs: these problems have fewer tiles


def test_persistent_with_more_tiles_than_sms(monkeypatch):
    """With more 128 x 256 tiles than SMs the persistent forms run, their grid capped at the SM
    count; MXFP8 fprop only up to PERSIST_MX_MAX_KTILES k-tiles and with 16-bit output."""
    from lowprec_moe.backends.cupy.gemm.rules import PERSIST_MX_MAX_KTILES

    few_sms = ((9, 0), 227 * 1024, 4)
    p = _policy_problem("fprop", "nvfp4", [0, 300, 37, 260, 5, 129], 512, 768, "bfloat16")
    ch = _choose(p, few_sms, monkeypatch=monkeypatch)
    assert ch.config.name == "grouped_gemm_sm90_nvfp4_wgmma_ws_tma_persistent_128x256_kk"
    assert ch.grid_cap == 4
    p = _policy_problem("wgrad", "mxfp8-e4m3", [512] * 4, 512, 768, "bfloat16")
    ch = _choose(p, few_sms, monkeypatch=monkeypatch)
    assert ch.config.name == "grouped_gemm_sm90_mxfp8_wgmma_ws_tma_persistent_128x256_nn"
    # fp32 output: no register epilogue, the per-tile kernel
    p = _policy_problem("wgrad", "mxfp8-e4m3", [512] * 4, 512, 768, "float32")
    assert _choose(p, few_sms, monkeypatch=monkeypatch).config.name == \
        "grouped_gemm_sm90_mxfp8_wgmma_ws_tma_128x256_nn"
    k = 512 * (PERSIST_MX_MAX_KTILES // 8 + 1)  # fprop past the persistent form's length
    p = _policy_problem("fprop", "mxfp8-e4m3", [0, 300, 37, 260, 5, 129], 256, k, "bfloat16")
    assert _choose(p, few_sms, monkeypatch=monkeypatch).config.name == \
        "grouped_gemm_sm90_mxfp8_wgmma_ws_tma_128x256_kk"


def test_wide_swap_with_a_full_grid(monkeypatch):
    """The wide swapped-operand NVFP4 build when its grid gives every SM four CTAs; its
    16-token form when no expert has more than 16 tokens."""
    few_sms = ((9, 0), 227 * 1024, 8)
    p = _policy_problem("dgrad", "nvfp4", [8] * 40, 512, 768)
    assert _choose(p, few_sms, monkeypatch=monkeypatch).config.name == \
        "grouped_gemm_sm90_nvfp4_wgmma_swap_tma_16x256_kk"
    p = _policy_problem("dgrad", "nvfp4", [24] * 40, 512, 768)
    assert _choose(p, few_sms, monkeypatch=monkeypatch).config.name == \
        "grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x256_kk"


def test_ragged_nvfp4_wgrad(monkeypatch):
    """NVFP4 wgrad of uneven experts with more tiles than SMs: the ragged persistent row-pair
    TMA build, 16-bit output only."""
    few_sms = ((9, 0), 227 * 1024, 4)
    p = _policy_problem("wgrad", "nvfp4", [0, 300, 37, 260, 5, 129], 512, 768, "bfloat16")
    ch = _choose(p, few_sms, monkeypatch=monkeypatch)
    assert ch.config.name == "grouped_gemm_sm90_nvfp4_wgmma_ws_rowpair_tma_ragged_128x256_kk"
    assert ch.config.ragged and ch.grid_cap == 4
    p = _policy_problem("wgrad", "nvfp4", [0, 300, 37, 260, 5, 129], 512, 768, "float32")
    assert _choose(p, few_sms, monkeypatch=monkeypatch).config.name == \
        "grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk"


def test_chunk8_and_no_chunk(monkeypatch):
    """NVFP4 rows that allow only 8-byte copies take the 8-byte builds; no chunk at all, or
    8 bytes for another format, leaves the SIMT kernel."""
    p = _policy_problem("fprop", "nvfp4", [0, 300, 37, 260, 5, 129], 96, 160)
    assert _choose(p, chunk=8, monkeypatch=monkeypatch).config.name == \
        "grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk_chunk8"
    p = _policy_problem("fprop", "bf16", [0, 300, 37, 260, 5, 129], 96, 160)
    assert _choose(p, chunk=8, monkeypatch=monkeypatch).config.simt
    assert _choose(p, chunk=0, monkeypatch=monkeypatch).config.simt


@pytest.mark.parametrize("mode", MODES)
def test_other_gpus_take_mma_sync(mode, monkeypatch):
    """Without wgmma: mma.sync, the 32-row tile for few tokens per expert, SIMT when nothing
    else fits in shared memory."""
    p = _policy_problem(mode, "nvfp4", [16, 0, 32, 3, 16])
    c = _choose(p, A100_CAPS, monkeypatch=monkeypatch).config
    want_bm = 128 if mode == "wgrad" else 32
    assert c.name == f"grouped_gemm_sm80_nvfp4_mma_cpasync_{want_bm}x256_kk", c
    tiny = ((8, 9), 99 * 1024, 128)  # no mma.sync tile fits
    assert _choose(p, tiny, monkeypatch=monkeypatch).config.simt


def test_override_runs_a_legal_config_and_refuses_others(monkeypatch):
    """``kernel=`` runs the named config when it can compute the problem, else ValueError
    saying why; an unknown name is a ValueError too."""
    p = _policy_problem("fprop", "nvfp4", [0, 300, 37, 260, 5, 129], 512, 768)
    for name in ("grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk",
                 "grouped_gemm_sm90_nvfp4_wgmma_cpasync_64x256_kk",
                 "grouped_gemm_sm80_nvfp4_mma_cpasync_128x256_kk", "grouped_gemm_simt_64x64"):
        assert _choose(p, kernel=name, monkeypatch=monkeypatch).config.name == name
    with pytest.raises(ValueError, match="more than 32 tokens"):
        _choose(p, kernel="grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x128_kk",
                monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match="multiplies mxfp8"):
        _choose(p, kernel="grouped_gemm_sm90_mxfp8_wgmma_cpasync_128x256_kk",
                monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match="sm_90"):
        _choose(p, A100_CAPS, kernel="grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk",
                monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match="not a grouped-GEMM kernel config"):
        _choose(p, kernel="lpm_gg_nvfp4_kk_q", monkeypatch=monkeypatch)
    pw = _policy_problem("wgrad", "nvfp4", [0, 300, 37, 260, 5, 129], 512, 768, "float32")
    with pytest.raises(ValueError, match="16-bit output"):
        _choose(pw, kernel="grouped_gemm_sm90_nvfp4_wgmma_ws_rowpair_tma_ragged_128x256_kk",
                monkeypatch=monkeypatch)


def test_config_options_are_typed_and_scoped():
    from lowprec_moe import config

    assert config.gemm_options() == config.GemmOptions()
    with config.gemm(kernel="grouped_gemm_simt_64x64") as opts:
        assert config.gemm_options() is opts and opts.kernel == "grouped_gemm_simt_64x64"
        with config.gemm(mxfp8_mma="bf16"):
            assert config.gemm_options() == config.GemmOptions("grouped_gemm_simt_64x64", "bf16")
        assert config.gemm_options().mxfp8_mma == "auto"
    assert config.gemm_options().kernel == "auto"
    with pytest.raises(ValueError, match="mxfp8_mma"):
        config.GemmOptions(mxfp8_mma="fp8")
    with pytest.raises(TypeError, match="kernel must be a str"):
        config.GemmOptions(kernel=3)


def test_no_environment_switches():
    """Kernel choice reads no environment variable."""
    import pathlib

    import lowprec_moe

    root = pathlib.Path(lowprec_moe.__file__).parent / "backends"
    for f in root.rglob("*.py"):
        assert "os.environ" not in f.read_text(), f


def test_config_table():
    """Names are unique and spelled out from the fields; every config's module source holds its
    instantiation and shared-memory check; every config is in exactly one module."""
    from lowprec_moe.backends.cupy.gemm import compile as comp
    from lowprec_moe.backends.cupy.gemm.select import ALL_CONFIGS, config_names

    names = config_names()
    assert len(set(names)) == len(names) == len(ALL_CONFIGS)
    for c in ALL_CONFIGS:
        assert c.name.startswith("grouped_gemm_")
        assert f"{c.bm}x{c.bn}" in c.name
        if c.simt:
            assert c.module not in comp.GENERATED
            continue
        src = comp.source(c.module)
        assert src.count(c.instantiation()) == 1, c.name
        assert f"== {c.smem}," in src and c.smem_expr in src
        assert c.smem <= 227 * 1024, c.name
        assert c.arch in ("sm90", "sm80") and c.layout in ("kk", "kn", "nn")
    assert "grouped_gemm_sm90_nvfp4_rowpair_maps" in comp.source(
        "grouped_gemm_sm90_nvfp4_ws_ragged")


def test_write_sources(tmp_path):
    from lowprec_moe.backends.cupy.gemm import compile as comp

    paths = comp.write_sources(tmp_path)
    assert sorted(p.stem for p in paths) == sorted(comp.GENERATED)
    for p in paths:
        assert p.read_text() == comp.source(p.stem)
        assert '#include "grouped_gemm_common.cuh"' in p.read_text()


def test_constant_checks_cover_the_launcher():
    """Every generated module asserts the launcher's constants against the CUDA ones (nvcc in
    CI and NVRTC on first use fail on a mismatch); the checks name each constant once."""
    from lowprec_moe.backends.cupy.gemm import compile as comp
    from lowprec_moe.backends.cupy.gemm import plan as P
    from lowprec_moe.backends.cupy.gemm.configs import constant_checks

    checks = constant_checks()
    names = [c.split("lpm_gg::", 1)[1].split(" ==")[0] for c in checks]
    assert len(set(names)) == len(names)
    for want in ("kBK", "kDescWords", "D_PROBS", "KIND_FP8_MN", "kWsAhead", "kWmxScaleTiles",
                 "kWmxGEntryWords", "kMxRangeThreads", "WsgTmaLayout::AHEAD"):
        assert want in names, want
    assert f"static_assert(lpm_gg::kBK == {P.BK}," in checks[0]
    for m in comp.GENERATED:
        assert all(c in comp.source(m) for c in checks), m
