"""The GPU GEMM kernel choice (``lowprec_moe.backends.cupy.gemm.launch.choose_kernel``), checked on the CPU: the
device capabilities are passed in, so no GPU is needed. Which kernel, tile, copy chunk and shared
memory each problem takes, and the environment overrides (TMA conditions and tensor maps:
test_gemm_tma.py; shared-memory formulas: test_gemm_smem.py; the persistent forms:
test_gemm_choice_persist.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from test_gemm import HP_DTYPES, MODES, _quantize

H200_CAPS = ((9, 0), 227 * 1024, 132)  # capability, opt-in shared memory, SMs


def _policy_problem(mode, fmt, splits, n=128, k=256):
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
    return _validate(mode, a, b, splits, bias=None, probs=None, out_dtype="float32", out=None,
                     accumulate=False)


@pytest.mark.parametrize("family", ["auto", "wgmma", "mma"])
@pytest.mark.parametrize("fmt", ["bf16", "mxfp8-hybrid", "nvfp4", "nvfp4-row-scaled"])
@pytest.mark.parametrize("mode", MODES)
def test_choose_kernel_policy(mode, fmt, family, monkeypatch):
    """sm_90: NVFP4 with the 128-row tile takes the warp-specialised kernel (512 threads) by
    default; MXFP8 (fprop / dgrad here contract 160, not a multiple of 512; wgrad experts
    average fewer than MXFP8_WS_WGRAD_MIN_LEN tokens) and bf16 take the plain wgmma kernel;
    forcing ``wgmma`` / ``mma`` selects those families. The shared memory equals the kernel's
    formula for the tile."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setenv(C.KERNEL_ENV, family)
    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: 16)  # host arrays have no device pointer
    # the 128-row tile for every mode
    p = _policy_problem(mode, fmt, [0, 300, 37, 260, 5, 129], n=96, k=160)
    pl = C.plan(p)
    ln = C.choose_kernel(p, pl, caps=H200_CAPS)
    assert not ln.simt and (ln.bm, ln.bn) == (128, 256), ln
    ws = family == "auto" and fmt.startswith("nvfp4")
    cfg = "x" if ws else "w" if family in ("auto", "wgmma") else "l"
    assert ln.kernel.endswith(f"_{cfg}"), ln
    assert ln.wgmma == (family != "mma"), ln
    assert ln.threads == (C.WS_THREADS if ws else C.THREADS), ln
    if ws:
        assert ln.smem == C._ws_smem_bytes(pl.a.kind, pl.b.kind), ln
    else:
        assert ln.smem == C._smem_bytes(pl.a.kind, pl.b.kind, 128, 256, family != "mma"), ln


@pytest.mark.parametrize("family", ["auto", "wgmma", "mma"])
@pytest.mark.parametrize("fmt", ["bf16", "mxfp8-e4m3", "mxfp8-hybrid", "nvfp4",
                                 "nvfp4-row-scaled"])
@pytest.mark.parametrize("mode", MODES)
def test_choose_kernel_few_tokens_swap(mode, fmt, family, monkeypatch):
    """sm_90, at most 32 tokens per expert: M-grouped GEMMs on K-major quantized operands
    (NVFP4 fprop / dgrad, MXFP8 fprop) take the swapped-operand kernel (32 tokens x 128 output
    columns, its own shared-memory formula); bf16, MXFP8 dgrad (MN-major W), wgrad and the
    mma.sync family do not. One expert above 32 tokens turns it off. NVFP4 in the default family
    loads its data tiles with TMA (the ``_kk_u`` build)."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setenv(C.KERNEL_ENV, family)
    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: 16)
    p = _policy_problem(mode, fmt, [16, 0, 32, 3, 16])
    pl = C.plan(p)
    ln = C.choose_kernel(p, pl, caps=H200_CAPS)
    swap = (family != "mma" and mode != "wgrad" and fmt != "bf16"
            and not (mode == "dgrad" and fmt.startswith("mxfp8")))
    assert ln.kernel.endswith(("_kk_t", "_kk_u")) == swap, ln
    tma = swap and family == "auto" and fmt.startswith("nvfp4")
    assert ln.tma == tma and ln.kernel.endswith("_kk_u") == tma, ln
    if swap:
        assert (ln.bm, ln.bn) == C.CONFIGS["t"] == (32, 128) and ln.threads == C.THREADS, ln
        assert ln.wgmma and not ln.simt, ln
        assert ln.smem == C._swap_smem_bytes(pl.a.kind, pl.b.kind), ln
        p2 = _policy_problem(mode, fmt, [16, 0, 33, 3, 16])
        assert not C.choose_kernel(p2, C.plan(p2), caps=H200_CAPS).kernel.endswith(
            ("_t", "_u"))
        # NVFP4 copies each row's 4 block-scale bytes of a k-tile as one word: a contraction
        # that is not a multiple of 64 (scale rows of K/16 bytes) keeps the other kernels
        p3 = _policy_problem(mode, fmt, [16, 0, 32, 3, 16], n=160, k=160)
        ln3 = C.choose_kernel(p3, C.plan(p3), caps=H200_CAPS)
        assert ln3.kernel.endswith("_t") == (not fmt.startswith("nvfp4")), ln3


@pytest.mark.parametrize("mode", MODES)
def test_choose_kernel_ws_tma(mode, monkeypatch):
    """sm_90, NVFP4 with the 128-row tile: the warp-specialised kernel's TMA build in its
    384-thread form (``_kk_q``; ``_kk_y`` with ``LOWPREC_MOE_GEMM_WS_N256=off``; both with
    their own shared-memory formula) when data and scales of both operands have uniform strides
    that are multiples of 16 bytes (K and N multiples of 256; wgrad: equal splits, multiples of
    256) and one contraction length; the cp.async build ``_kk_x`` otherwise, with
    ``LOWPREC_MOE_GEMM_TMA=off`` and outside the default family."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: 16)
    ok = [256, 256, 256] if mode == "wgrad" else [0, 300, 37, 260, 5, 129]
    for fmt in ("nvfp4", "nvfp4-row-scaled"):
        p = _policy_problem(mode, fmt, ok, n=512, k=768)
        pl = C.plan(p)
        assert C._use_ws_tma(pl)
        ln = C.choose_kernel(p, pl, caps=H200_CAPS)
        assert ln.kernel == "lpm_gg_nvfp4_kk_q" and ln.tma and ln.threads == 384, ln
        assert ln.smem == C._ws_tma_smem_bytes(), ln
        monkeypatch.setenv(C.WS_N256_ENV, "off")
        ln = C.choose_kernel(p, pl, caps=H200_CAPS)
        assert ln.kernel == "lpm_gg_nvfp4_kk_y" and ln.tma and ln.threads == C.WS_THREADS, ln
        assert ln.smem == C._ws_tma_smem_bytes(), ln
        monkeypatch.setenv(C.WS_N256_ENV, "sometimes")
        with pytest.raises(ValueError, match="LOWPREC_MOE_GEMM_WS_N256"):
            C.choose_kernel(p, pl, caps=H200_CAPS)
        monkeypatch.delenv(C.WS_N256_ENV)
        monkeypatch.setenv(C.TMA_ENV, "off")
        ln = C.choose_kernel(p, pl, caps=H200_CAPS)
        assert ln.kernel == "lpm_gg_nvfp4_kk_x" and not ln.tma, ln
        monkeypatch.setenv(C.TMA_ENV, "sometimes")
        with pytest.raises(ValueError, match="LOWPREC_MOE_GEMM_TMA"):
            C.choose_kernel(p, pl, caps=H200_CAPS)
        monkeypatch.delenv(C.TMA_ENV)
        monkeypatch.setenv(C.KERNEL_ENV, "wgmma")
        assert not C.choose_kernel(p, pl, caps=H200_CAPS).tma
        monkeypatch.delenv(C.KERNEL_ENV)
    # scale rows of K/16 (or N/16, tokens/16) bytes that are not 16-byte multiples
    bad = [128, 128, 128] if mode == "wgrad" else ok
    p = _policy_problem(mode, "nvfp4", bad, n=512 if mode != "dgrad" else 640,
                        k=640 if mode != "dgrad" else 512)
    assert C.choose_kernel(p, C.plan(p), caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_x"
    if mode == "wgrad":  # unequal splits: per-expert strides differ
        p = _policy_problem(mode, "nvfp4", [256, 512, 256], n=512, k=768)
        assert C.choose_kernel(p, C.plan(p), caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_x"
        # every expert empty: columnwise rows of stride 0 get no tensor map
        p = _policy_problem(mode, "nvfp4", [0, 0, 0], n=512, k=768)
        assert not C._use_ws_tma(C.plan(p))


@pytest.mark.parametrize("fmt", ["mxfp8-e4m3", "mxfp8-hybrid"])
def test_choose_kernel_mxfp8_ws(fmt, monkeypatch):
    """sm_90, MXFP8 fprop / dgrad with the 128-row tile: the warp-specialised kernel ``_kk_y`` /
    ``_kn_y`` (its own shared-memory formula, TMA loads) when data and scales map (contraction a
    multiple of 512: scale rows of 16-byte multiples) and every expert contracts the same whole
    k-tiles, for the layouts ``LOWPREC_MOE_GEMM_MXFP8_WS`` selects; the plain wgmma kernel
    otherwise, for wgrad, with ``=off``, ``LOWPREC_MOE_GEMM_TMA=off`` and outside the default
    family."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: 16)
    splits = [0, 300, 37, 260, 5, 129]
    p = _policy_problem("fprop", fmt, splits, n=512, k=1024)
    pl = C.plan(p)
    ln = C.choose_kernel(p, pl, caps=H200_CAPS)
    assert ln.kernel == "lpm_gg_mxfp8_kk_y" and ln.tma and ln.threads == C.WS_THREADS, ln
    assert (ln.bm, ln.bn) == (128, 256) and ln.smem == C._ws_mx_smem_bytes(), ln
    for env, value in ((C.MXFP8_WS_ENV, "off"), (C.TMA_ENV, "off"), (C.KERNEL_ENV, "wgmma")):
        monkeypatch.setenv(env, value)
        ln = C.choose_kernel(p, pl, caps=H200_CAPS)
        assert ln.kernel == "lpm_gg_mxfp8_kk_w" and not ln.tma, (env, ln)
        assert ln.threads == C.THREADS, (env, ln)
        monkeypatch.delenv(env)
    monkeypatch.setenv(C.MXFP8_WS_ENV, "never")
    with pytest.raises(ValueError, match="LOWPREC_MOE_GEMM_MXFP8_WS"):
        C.choose_kernel(p, pl, caps=H200_CAPS)
    monkeypatch.delenv(C.MXFP8_WS_ENV)
    # scale rows of K / 32 = 24 bytes: no scale map
    p = _policy_problem("fprop", fmt, splits, n=512, k=768)
    assert C.choose_kernel(p, C.plan(p), caps=H200_CAPS).kernel == "lpm_gg_mxfp8_kk_w"
    # dgrad (B MN-major: W's columnwise copy) has its build, taken by "auto" when its layout is
    # in MXFP8_WS_AUTO, and by "all"; so has wgrad (both MN-major)
    p = _policy_problem("dgrad", fmt, splits, n=1024, k=512)
    for mode in ("auto", "all"):
        monkeypatch.setenv(C.MXFP8_WS_ENV, mode)
        ln = C.choose_kernel(p, C.plan(p), caps=H200_CAPS)
        if mode == "all" or "kn" in C.MXFP8_WS_AUTO:
            assert ln.kernel == "lpm_gg_mxfp8_kn_y" and ln.tma, ln
            assert ln.smem == C._ws_mx_smem_bytes(), ln
        else:
            assert ln.kernel == "lpm_gg_mxfp8_kn_w" and not ln.tma, ln
    p = _policy_problem("wgrad", fmt, [512, 512, 512], n=512, k=1024)
    for mode in ("auto", "all", "off"):
        monkeypatch.setenv(C.MXFP8_WS_ENV, mode)
        ln = C.choose_kernel(p, C.plan(p), caps=H200_CAPS)
        if mode == "all" or (mode == "auto" and "nn" in C.MXFP8_WS_AUTO):
            assert ln.kernel == "lpm_gg_mxfp8_nn_y" and ln.tma, ln
            assert ln.smem == C._ws_mx_smem_bytes() and ln.threads == C.WS_THREADS, ln
        else:
            assert ln.kernel == "lpm_gg_mxfp8_nn_w" and ln.threads == C.THREADS, ln
    # experts of different token counts (K-grouped, padded to 32: a last k-tile may end early)
    # keep the build; no tokens at all leave nothing to map; "auto" asks for a mean of at least
    # MXFP8_WS_WGRAD_MIN_LEN tokens over the non-empty experts, "all" does not
    for mode, splits, kernel in (("all", [0, 37, 300, 5], "y"), ("all", [0, 0, 0], "w"),
                                 ("auto", [0, 37, 300, 5], "w"), ("auto", [0, 480, 600], "y"),
                                 ("auto", [16] * 8, "w")):
        monkeypatch.setenv(C.MXFP8_WS_ENV, mode)
        p = _policy_problem("wgrad", fmt, splits, n=512, k=1024)
        ln = C.choose_kernel(p, C.plan(p), caps=H200_CAPS)
        if "nn" in C.MXFP8_WS_AUTO or mode == "all":
            assert ln.kernel == "lpm_gg_mxfp8_nn_" + kernel, (mode, splits, ln)
    monkeypatch.delenv(C.MXFP8_WS_ENV)


@pytest.mark.parametrize("mode", ["fprop", "dgrad"])
def test_choose_kernel_swap_wide(mode, monkeypatch):
    """sm_90, few tokens per expert, NVFP4 in the default family: the wide swapped-operand TMA
    build (``_kk_r``: 32 tokens x 256 columns, its own shared-memory formula; ``_kk_p``, 16
    tokens, when no expert has more) once its grid gives every SM at least four CTAs, the
    128-column ``_kk_u`` below that;
    ``LOWPREC_MOE_GEMM_SWAP_WIDE`` forces either and rejects other values; the cp.async and
    ``wgmma`` paths never take it."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: 16)
    sms = H200_CAPS[2]
    # 64 experts x 16 tokens x 2 columns tiles of 256 = 128 CTAs: below 4 per SM
    small = _policy_problem(mode, "nvfp4", [16] * 64, n=512, k=512)
    ln = C.choose_kernel(small, C.plan(small), caps=H200_CAPS)
    assert ln.kernel == "lpm_gg_nvfp4_kk_u" and (ln.bm, ln.bn) == (32, 128), ln
    # the same with a grid of exactly 4 CTAs per SM (the threshold) takes the wide build
    assert not C._swap_wide(C.plan(small), 1 + 128 // C.SWAP_WIDE_MIN_CTAS_PER_SM)
    assert C._swap_wide(C.plan(small), 128 // C.SWAP_WIDE_MIN_CTAS_PER_SM)
    for fmt in ("nvfp4", "nvfp4-row-scaled"):
        if fmt == "nvfp4-row-scaled" and mode == "dgrad":
            continue
        # 2 x 264 token tiles x 2 column tiles of 256 (partial second tile) = 1056 CTAs
        big = _policy_problem(mode, fmt, [16] * 263 + [0, 3, 32], n=320, k=320)
        pl = C.plan(big)
        assert int(np.sum(C._cdiv(pl.rows[pl.rows > 0], 32))) * 2 >= 4 * sms
        ln = C.choose_kernel(big, pl, caps=H200_CAPS)
        assert ln.kernel == "lpm_gg_nvfp4_kk_r" and ln.tma and ln.wgmma, ln
        assert (ln.bm, ln.bn) == C.CONFIGS["r"] == (32, 256) and ln.threads == C.THREADS, ln
        assert ln.smem == C._swap_smem_bytes(pl.a.kind, pl.b.kind, wide=True), ln
        monkeypatch.setenv(C.SWAP_WIDE_ENV, "off")
        assert C.choose_kernel(big, pl, caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_u"
        # at most 16 tokens per expert: the 16-token tile, same shared memory
        monkeypatch.delenv(C.SWAP_WIDE_ENV)
        p16 = _policy_problem(mode, fmt, [16] * 265 + [0, 3], n=320, k=320)
        ln = C.choose_kernel(p16, C.plan(p16), caps=H200_CAPS)
        assert ln.kernel == "lpm_gg_nvfp4_kk_p" and ln.tma, ln
        assert (ln.bm, ln.bn) == C.CONFIGS["p"] == (16, 256), ln
        assert ln.smem == C._swap_smem_bytes(pl.a.kind, pl.b.kind, wide=True), ln
        monkeypatch.setenv(C.SWAP_N16_ENV, "off")
        assert C.choose_kernel(p16, C.plan(p16), caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_r"
        monkeypatch.setenv(C.SWAP_N16_ENV, "sometimes")
        with pytest.raises(ValueError, match="LOWPREC_MOE_GEMM_SWAP_N16='sometimes'"):
            C.choose_kernel(p16, C.plan(p16), caps=H200_CAPS)
        monkeypatch.delenv(C.SWAP_N16_ENV)
        monkeypatch.setenv(C.SWAP_WIDE_ENV, "on")
        assert C.choose_kernel(small, C.plan(small), caps=H200_CAPS).kernel == \
            "lpm_gg_nvfp4_kk_p"
        monkeypatch.setenv(C.SWAP_WIDE_ENV, "wider")
        with pytest.raises(ValueError, match="LOWPREC_MOE_GEMM_SWAP_WIDE='wider'"):
            C.choose_kernel(big, pl, caps=H200_CAPS)
        monkeypatch.setenv(C.SWAP_WIDE_ENV, "on")
        monkeypatch.setenv(C.TMA_ENV, "off")  # the cp.async build has no wide form
        assert C.choose_kernel(big, pl, caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_t"
        monkeypatch.delenv(C.TMA_ENV)
        monkeypatch.setenv(C.KERNEL_ENV, "wgmma")
        assert C.choose_kernel(big, pl, caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_t"
        monkeypatch.delenv(C.KERNEL_ENV)
        monkeypatch.delenv(C.SWAP_WIDE_ENV)


def test_mxfp8_mma_env(monkeypatch):
    """LOWPREC_MOE_MXFP8_MMA: "auto" (default) lets MXFP8 tiles use the fp16 window, "bf16"
    forbids it (the kernel's mx_bf16 argument); anything else is an error naming the value."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.delenv(C.MXFP8_MMA_ENV, raising=False)
    assert C._mx_bf16() == 0
    monkeypatch.setenv(C.MXFP8_MMA_ENV, " BF16 ")
    assert C._mx_bf16() == 1
    monkeypatch.setenv(C.MXFP8_MMA_ENV, "fp16")
    with pytest.raises(ValueError, match="LOWPREC_MOE_MXFP8_MMA='fp16'"):
        C._mx_bf16()


def _defined_kernels() -> dict:
    """Every grouped-GEMM kernel defined in raw_kernels/grouped_gemm_*.cu -> its file's stem."""
    import re

    from lowprec_moe import kernels

    found = {}
    for path in sorted(kernels.kernel_dir().glob("grouped_gemm_*.cu")):
        text = path.read_text()
        names = re.findall(r"^LPM_GG_DEFINE\w*\(\s*(lpm_gg_\w+)", text, re.M)
        names += re.findall(r"__global__ void(?: __launch_bounds__\(\d+\))?\s+(lpm_gg_\w+)\(", text)
        for name in names:
            assert name not in found, f"{name} defined in {found.get(name)} and {path.stem}"
            found[name] = path.stem
    return found


def test_every_kernel_in_its_module():
    """The module the launcher loads each kernel from (kernel_module, RANGES_MODULE, the SIMT
    kernel's, the ragged TMA build's map builder) is the file that defines it, for every grouped-GEMM kernel; the warp-specialised
    families have modules of their own."""
    import re

    from lowprec_moe.backends.cupy.gemm import plan as G

    from lowprec_moe.backends.cupy.gemm import tma_rules as T

    found = _defined_kernels()
    assert found.pop("lpm_gg_mx_ranges") == G.RANGES_MODULE
    assert found.pop("lpm_gg_simt") == "grouped_gemm_simt"
    assert found.pop(T.PAIR_MAPS_KERNEL) == T.PAIR_MAPS_MODULE == G.kernel_module("nvfp4", "h")
    for name, stem in found.items():
        m = re.fullmatch(r"lpm_gg_(bf16|fp16|mxfp8|nvfp4)_(kk|kn|nn)_([a-z])8?", name)
        assert m, name
        assert G.kernel_module(m.group(1), m.group(3)) == stem, name
    assert {found[n] for n in ("lpm_gg_mxfp8_kk_y", "lpm_gg_mxfp8_kk_o", "lpm_gg_mxfp8_kk_w",
                               "lpm_gg_nvfp4_kk_o", "lpm_gg_nvfp4_kk_w")} == {
        "grouped_gemm_mxfp8_ws", "grouped_gemm_mxfp8_wsp", "grouped_gemm_mxfp8",
        "grouped_gemm_nvfp4_ws", "grouped_gemm_nvfp4"}


@pytest.mark.parametrize("fmt", ["bf16", "mxfp8-hybrid", "nvfp4"])
@pytest.mark.parametrize("mode", MODES)
def test_launch_module_defines_kernel(mode, fmt, monkeypatch):
    """The launch choose_kernel returns names a module that defines its kernel (per-tile,
    persistent, swapped and plain choices)."""
    from dataclasses import replace

    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: 16)
    found = _defined_kernels()
    caps = H200_CAPS[:2] + (8,)  # 8 SMs: the persistent forms from 9 tiles
    for splits, n, k in (([0, 37, 300, 5], 128, 256), ([512] * 4, 512, 1024),
                         ([4] * 64, 1024, 512)):
        p = replace(_policy_problem(mode, fmt, splits, n=n, k=k), out_dtype="bfloat16")
        for env in ("auto", "on"):
            monkeypatch.setenv(C.PERSIST_ENV, env)
            ln = C.choose_kernel(p, C.plan(p), caps=caps)
            assert found.get(ln.kernel) == ln.module, (splits, env, ln)
