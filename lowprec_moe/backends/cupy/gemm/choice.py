"""Kernel choice of the grouped GEMM launcher (:mod:`lowprec_moe.backends.cupy.gemm.launch`): which kernel, tile,
copy chunk and shared memory a planned problem takes, and the environment overrides. Host-only
(the device capabilities come from CuPy, or from the caller).

Kernel choice
-------------
* bf16 / fp16 operands, NVFP4, MXFP8: the tensor-core kernels (``mma.sync.m16n8k16``, fp32
  accumulation; NVFP4 on fp16 and MXFP8 on bf16 after exact in-kernel dequantization), with a
  128-row CTA tile, or a smaller one for M-grouped GEMMs with few tokens per expert. Operand rows must
  allow 16-byte copies (NVFP4: 8-byte) -- true for every layout the library produces except bf16 /
  fp16 with K (or N) not a multiple of 8.
* float32 operands, and any operand the tensor-core kernels cannot stream: the fp32 SIMT kernel
  (exact fp32 operand values, non-flushing fma.rn.f32 accumulation) -- the fp32-accurate path.
* On sm_90 (H100 / H200) the tensor-core kernels use ``wgmma`` (operands staged in shared memory
  in the 128-byte-swizzle layouts, two warpgroups) with a 128x256 tile (``m64n256k16``: each
  warpgroup owns 64 rows x 256 columns) or, for few tokens per expert, a 64x256 tile
  (``m64n128k16``); other GPUs use ``mma.sync`` with 128x256 / 32x256 tiles. The family depends
  on the device only, and within a family every tile gives each output element the same products
  in the same order (the two wgmma shapes differ only in how many columns one instruction
  covers), so the split-dependent tile choice never changes results (grouped == per-expert,
  bitwise; a GPU test compares the two tiles). GPUs
  whose opt-in shared memory per block is too small for a tensor-core kernel take the SIMT
  kernel.
* On sm_90, NVFP4 operands with the 128x256 tile run the warp-specialised wgmma kernel (512
  threads: two warpgroups copy both quantized tiles and expand B while two warpgroups decode A
  straight into wgmma registers and issue the wgmma), which computes bitwise what the plain
  wgmma kernel computes.
* On sm_90, M-grouped GEMMs on quantized contraction-contiguous operands (NVFP4 fprop / dgrad,
  MXFP8 fprop) with at most 32 tokens per expert run the swapped-operand kernel
  (``grouped_gemm_swap.cuh``): it computes the transposed tile, 128 output columns x 32
  tokens, with the weights on the wgmma M side (``m64n32k16``; NVFP4 weights decoded straight
  into registers) and several CTAs per SM -- bitwise the results of the other wgmma kernels
  (a GPU test compares them). NVFP4 needs each row's block scales of a k-tile 4-byte aligned
  (contraction a multiple of 64), else the 64x256 tile is used. In the default family its
  NVFP4 build ``_kk_u`` loads the two data tiles of each k-tile with TMA (one thread, one
  tensor map per operand passed by value, :mod:`lowprec_moe.backends.cupy.tensor_map`; the block scales stay
  on cp.async) whenever every expert shares one row stride (a multiple of 16 bytes), starts at
  a whole row and contracts the same whole number of k-tiles -- true for every layout the
  library produces; bitwise the cp.async build's results. When its grid would fill every SM
  with at least four CTAs of 256 columns, the wide TMA build ``_kk_r`` runs instead: 32 tokens
  x 256 output columns per CTA, each warpgroup decoding and multiplying two 64-row halves of
  the weights per k-tile, two CTAs per SM -- the per-k-tile work that does not grow with the
  weight rows (barrier, copy issue, token-tile expansion, waits) is shared by twice the
  weights; the same products in the same order, so the same bits. When no expert has more than
  16 tokens its 16-token form ``_kk_p`` (``m64n16k16``) halves the MMA work.
  ``LOWPREC_MOE_GEMM_SWAP_WIDE`` = ``auto`` (default) | ``on`` | ``off`` overrides that choice,
  ``LOWPREC_MOE_GEMM_SWAP_N16`` = ``auto`` (default) | ``off`` the 16-token form.
* On sm_90, the plain wgmma kernel multiplies an MXFP8 tile on fp16 instead of bf16 when every
  row and column of the tile keeps its block codes within the fp16 window (E4M3: 21 codes,
  E5M2: 8, no NaN scale), its scale rows are 16-byte aligned and it contracts at least 32
  k-tiles (``raw_kernels/grouped_gemm_mxf16.cuh``): the elements are staged as
  ``q * 2^(e - e_max(row) + S_MAX)`` (one conversion and one multiply per pair instead of three
  instructions per element) and the epilogue applies the rows' and columns' powers of two. The
  bits are the bf16 path's whenever that path's products are fp32 normals (GPU tests compare
  them), and exact where the bf16 path truncates tiny blocks. Consequence for blocks of
  magnitude below ~1e-35 (E4M3 scale code < 3, E5M2 < 10), where the bf16 path is inexact: an
  output's bits there depend on which path its tile took, i.e. on the other rows / columns of
  the tile and the tile shape, so grouped == per-expert is only guaranteed above that range.
* On sm_90, the warp-specialised NVFP4 kernel has a TMA build too, ``_kk_y``: one producer
  thread loads each k-tile's two data tiles with one tensor-map copy each and the block scales
  four k-tiles at a time (a 16-byte box per row, into three scale slots), all completing on
  mbarriers; the other producer threads only expand B. Chosen in the default family when data
  and scales of both operands have one row stride each (multiples of 16 bytes: K, or the padded
  tokens per expert for wgrad, a multiple of 256), every expert starts at a whole row and all
  experts contract the same whole number of k-tiles; bitwise the cp.async build's results.
  ``LOWPREC_MOE_GEMM_TMA`` = ``auto`` (default) | ``off`` switches both TMA builds off.
  It runs in a 384-thread form by default, ``_kk_q`` (``raw_kernels/grouped_gemm_ws_n256.cuh``:
  one producer warpgroup, the consumers on ``m64n256k16`` with one wgmma group in flight and
  one unit of the next k-tile's B each; bitwise ``_kk_y``); ``LOWPREC_MOE_GEMM_WS_N256`` =
  ``auto`` (default) | ``off`` (``_kk_y``).
  Its persistent form ``_kk_o`` (``raw_kernels/grouped_gemm_ws_persist.cuh``: one CTA per SM
  over many tiles, the next tile's copies and expansion overlapping this tile's end and
  epilogue; bitwise ``_kk_q``) takes its place with more tiles than SMs, for contractions of
  a whole number of scale groups; with ``LOWPREC_MOE_GEMM_WS_N256=off`` the persistent form
  of ``_kk_y``, ``_kk_z``, for contractions of at most ``PERSIST_MAX_KTILES`` k-tiles.
  ``LOWPREC_MOE_GEMM_PERSIST`` = ``auto`` (default) | ``on`` | ``off``.
* On sm_90, MXFP8 GEMMs with the 128-row tile run the warp-specialised MXFP8 kernel
  (fprop ``_kk_y``, dgrad ``_kn_y``, wgrad ``_nn_y``; ``raw_kernels/grouped_gemm_ws_mx.cuh``),
  for the layouts in ``MXFP8_WS_AUTO``, wherever its TMA loads apply (fprop / dgrad: the
  ``_kk_y`` conditions above, the contraction a multiple of 512; wgrad: see below): the whole
  CTA first checks the tile against the fp16 window -- from the block-code range of every
  operand row, which a small kernel computes once per call (``lpm_gg_mx_ranges``,
  :mod:`lowprec_moe.backends.cupy.gemm.ranges`) -- then two producer warpgroups widen B (TMA
  data tiles, 64-byte swizzle) while two consumer warpgroups widen A straight into wgmma
  registers, on fp16 or bf16 per tile as the plain kernel would -- bitwise the plain kernel's
  results. In the dgrad build (B MN-major: W's columnwise copy, two 128-row panels with the
  128-byte swizzle) each producer thread widens 8 columns x 8 lines of one block per k-tile,
  its factors computed from the block codes; the wgrad build (A MN-major too:
  dy's columnwise copy, one 128-row panel) reads its A fragments with ``ldmatrix.trans``, which
  hands each thread two adjacent rows, and its epilogue puts the rows back in place; its experts
  may contract different token counts (any multiple of 16: a last k-tile that ends early
  multiplies zeros past the end, as the plain kernel does); ``auto`` takes it when they contract
  ``MXFP8_WS_WGRAD_MIN_LEN`` tokens or more on average.
  ``LOWPREC_MOE_GEMM_MXFP8_WS``: ``auto`` (default) takes the layouts in ``MXFP8_WS_AUTO``,
  ``all`` all three, ``off`` none.
  Its persistent form (``_kk_o``, ``_kn_o``, ``_nn_o``;
  ``raw_kernels/grouped_gemm_ws_mx_persist.cuh``: one CTA per SM over many tiles, the
  producers widening the next tile's first k-tiles while the consumers finish the current one)
  stages the whole launch in one mode -- fp16 when the range kernel finds every row in the
  window, else bf16 -- so its bits are the per-tile kernel's except for blocks below ~1e-35 in
  a launch with some row outside the window. It takes the per-tile kernel's place with more
  tiles than SMs for 16-bit output without bias, one contraction length of whole k-tiles and a
  whole number of scale groups, and in fprop at most ``PERSIST_MX_MAX_KTILES`` k-tiles
  (``LOWPREC_MOE_GEMM_PERSIST`` as above).
  With ``LOWPREC_MOE_GEMM_PERSIST=on``, MXFP8 wgrad whose experts contract different token
  counts (or one count that is no whole number of scale groups) runs the ragged persistent
  form ``_nn_g`` (``raw_kernels/grouped_gemm_ws_mx_ragged.cuh``) under the same output
  conditions: one CTA per SM over a list of tiles that the launcher balances by contraction
  length (:mod:`lowprec_moe.backends.cupy.gemm.balance`), each tile starting its own scale group, one
  staging mode for the launch without the per-tile kernel's 4-k-tile threshold (so the bits
  are the per-tile kernel's except for blocks below ~1e-35), empty experts' tiles zeroed.
  "auto" does not take it (slower than the per-tile kernel so far; ``_persist_ragged``).
* On sm_90, NVFP4 on the warp-specialised kernel's cp.async build (``_kk_x`` / ``_kk_x8``: no
  tensor map covers the experts -- wgrad of uneven splits, whose experts' token rows each have
  their own stride) runs in its ragged persistent form ``_kk_g`` / ``_kk_g8``
  (``raw_kernels/grouped_gemm_ws_ragged.cuh``): one CTA per SM over the balanced tile list of
  ``_nn_g``, the cp.async pipeline on the CTA's k-tile sequence, so the next tile's copies and
  expansion overlap this tile's end and epilogue; empty experts' tiles zeroed by the
  consumers; bitwise the per-tile build's results. "auto" takes it for wgrad with more tiles
  than SMs, a mean contraction of at most ``PERSIST_RAGGED_FP4_MAX_KTILES`` k-tiles (its
  k-loop is a little slower than the per-tile build's) and 16-bit output without bias or
  accumulation (``_persist_ragged_fp4``), "on" wherever that epilogue applies, "off" never.
  Its TMA build ``_kk_h`` / ``_kk_h8`` takes its place in the default family wherever every
  expert's rows can be mapped in pairs (``_use_pair_tma``: each expert 16-byte aligned, an
  even row count, a stride that is a multiple of 8 bytes -- true for every layout the library
  produces): four tensor maps per expert (:func:`~lowprec_moe.backends.cupy.gemm.tma_rules._pair_maps`, a
  device array that a small kernel builds from templates, cached by the data pointers), one
  thread copying each k-tile's data as four boxes, the block scales loaded as in the cp.async
  build; bitwise the same results; "auto" takes it whatever the contraction length (faster
  than the per-tile build at every length measured). ``LOWPREC_MOE_GEMM_TMA=off`` keeps the
  cp.async build.
* ``LOWPREC_MOE_GEMM_KERNEL`` = ``auto`` (default) | ``wgmma`` | ``mma`` | ``simt`` forces a
  family (debugging, cross-checks); ``wgmma`` is the plain wgmma kernel (and the
  swapped-operand one for few tokens per expert), without the warp-specialised one and without
  TMA loads.
  ``LOWPREC_MOE_MXFP8_MMA`` = ``auto`` (default) | ``bf16`` keeps every MXFP8 tile on bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan import (CONFIGS, KIND_FP4_K, KIND_FP8_K, Operand, Plan, SIMT_TILE, THREADS,
                        WS_N256_THREADS, WS_THREADS, _cdiv, kernel_module, plan)
from .smem import (_smem_bytes, _swap_smem_bytes, _ws_g_tma_smem_bytes, _ws_mx_g_smem_bytes,
                        _ws_mx_p_smem_bytes, _ws_mx_smem_bytes, _ws_p_smem_bytes,
                        _ws_smem_bytes, _ws_tma_smem_bytes)
from .persist import (  # noqa: F401 - re-exported (gemm.py and the tests read them here)
    PERSIST_ENV, PERSIST_MAX_KTILES, PERSIST_MX_MAX_KTILES, PERSIST_N256_MAX_KTILES, _env_mode,
    _persist, _persist_mx, _persist_ragged, _persist_ragged_fp4, _reg_epilogue_ok, num_tiles)
from .tma_rules import _scales_word_aligned, _use_pair_tma, _use_tma, _use_ws_tma

#: Environment variable selecting the kernel family: "auto" (default) or "simt".
KERNEL_ENV = "LOWPREC_MOE_GEMM_KERNEL"
#: Environment variable switching the TMA builds of the default family off: "auto" (default) or
#: "off" (the cp.async builds; A/B comparisons and cross-checks).
TMA_ENV = "LOWPREC_MOE_GEMM_TMA"
_TMA_MODES = ("auto", "off")
#: Environment variable for the 384-thread form of the warp-specialised NVFP4 TMA build
#: (``_kk_q``: one producer warpgroup, consumers on m64n256k16; bitwise ``_kk_y``): "auto"
#: (default: wherever ``_kk_y`` would run) or "off" (``_kk_y``).
WS_N256_ENV = "LOWPREC_MOE_GEMM_WS_N256"
_WS_N256_MODES = ("auto", "off")
#: Environment variable for the wide NVFP4 swapped-operand TMA build (``_kk_r``): "auto"
#: (default: when its grid gives every SM at least SWAP_WIDE_MIN_CTAS_PER_SM CTAs), "on"
#: (wherever ``_kk_u`` would run) or "off".
SWAP_WIDE_ENV = "LOWPREC_MOE_GEMM_SWAP_WIDE"
_SWAP_WIDE_MODES = ("auto", "on", "off")
#: Environment variable for the 16-token form of the wide build (``_kk_p``): "auto" (default:
#: when no expert has more than 16 tokens) or "off" (the 32-token ``_kk_r``).
SWAP_N16_ENV = "LOWPREC_MOE_GEMM_SWAP_N16"
_SWAP_N16_MODES = ("auto", "off")
#: CTAs of the wide build per SM (two resident, two waves) from which "auto" takes it: below
#: that, the 128-column build's twice as many CTAs fill the GPU better.
SWAP_WIDE_MIN_CTAS_PER_SM = 4
#: Environment variable for the MXFP8 wgmma kernels' tensor-core type: "auto" (default: fp16
#: for every tile whose block scales fit the fp16 window, bf16 otherwise; same results, see
#: raw_kernels/grouped_gemm_mxf16.cuh) or "bf16" (every tile on bf16).
MXFP8_MMA_ENV = "LOWPREC_MOE_MXFP8_MMA"
_MXFP8_MMA = ("auto", "bf16")
#: Environment variable for the warp-specialised MXFP8 kernel (``lpm_gg_mxfp8_kk_y`` fprop,
#: ``_kn_y`` dgrad, ``_nn_y`` wgrad): "auto" (default: the layouts in MXFP8_WS_AUTO, with the
#: 128-row tile wherever its TMA loads apply), "all" (all three) or "off" (the plain wgmma
#: kernel; A/B
#: comparisons and cross-checks).
MXFP8_WS_ENV = "LOWPREC_MOE_GEMM_MXFP8_WS"
_MXFP8_WS_MODES = ("auto", "all", "off")
#: Operand layouts that "auto" gives the warp-specialised MXFP8 kernel: fprop ("kk"), dgrad
#: ("kn", B MN-major) and wgrad ("nn", both MN-major) all measured faster than the plain kernel
#: on every compute-bound shape where they apply (fprop 4-15 %, dgrad 8-20 %, wgrad 2-31 %;
#: benchmarks/RESULTS.md).
MXFP8_WS_AUTO = ("kk", "kn", "nn")
#: "auto" gives MXFP8 wgrad the warp-specialised build only when its non-empty experts contract
#: at least this many tokens on average: at 32 (16 tokens per expert, the memory-bound shape) it
#: measured 15 % slower than the plain kernel, at 512 (fine) the same, on the skewed split
#: (mean 683) 11 % faster and from 2560 on (qwen, dsv3) 20-31 % faster (benchmarks/RESULTS.md).
MXFP8_WS_WGRAD_MIN_LEN = 512


def _mx_bf16() -> int:
    """1 when MXFP8_MMA_ENV asks for bf16 MXFP8 tensor cores, else 0."""
    return int(_env_mode(MXFP8_MMA_ENV, _MXFP8_MMA) == "bf16")

_caps: dict = {}


def _cupy():
    import cupy

    return cupy


def _chunk(op: Operand, extent_elems: np.ndarray) -> int:
    """Largest cp.async chunk (16 or 8 bytes) every copy of ``op`` can use, or 0.

    ``extent_elems``: per expert, the number of elements along the operand's contiguous dimension
    (contraction length when K-major, rows when MN-major): a chunk must never straddle it.
    """
    extent = np.asarray(extent_elems, np.int64) * op.es_num
    if np.any(extent % op.es_den):
        return 0
    extent //= op.es_den
    for ch in (16, 8):
        if int(op.data.data.ptr) % ch:
            continue
        if np.any(op.off % ch) or np.any(op.ld % ch) or np.any(extent % ch):
            continue
        return ch
    return 0


def _pick_bm(rows: np.ndarray, small: int) -> int:
    """128 or ``small`` rows per CTA for an M-grouped GEMM: model each row tile as costing its
    rows of MMA work plus a fixed cost for streaming / expanding its B tile (half a 128-row
    tile)."""
    r = rows[rows > 0]
    if r.size == 0:
        return 128
    cost_l = float(np.sum(_cdiv(r, 128))) * (128 + 64)
    cost_s = float(np.sum(_cdiv(r, small))) * (small + 64)
    return small if cost_s < cost_l else 128


def _use_swap(rows: np.ndarray) -> bool:
    """Whether an M-grouped GEMM on quantized K-major operands takes the swapped-operand kernel:
    when no expert has more tokens than its tile (32). Each of its CTAs expands 128 weight rows
    for up to 32 tokens, the 64x256 tile 256 weight rows for up to 64; for a few tokens per
    expert the swapped tile wastes no MMA work and several CTAs share an SM."""
    return bool(rows.size) and int(rows.max()) <= CONFIGS["t"][0]


@dataclass
class Launch:
    module: str
    kernel: str
    simt: bool
    bm: int
    bn: int
    ch: int
    smem: int
    wgmma: bool = False
    threads: int = THREADS
    tma: bool = False
    #: persistent kernel: at most this many CTAs share the tiles (0: one CTA per tile)
    grid_cap: int = 0
    #: the warp-specialised MXFP8 kernels: the rows' block-code ranges follow the tensor maps
    #: (:mod:`lowprec_moe.backends.cupy.gemm.ranges`)
    mx_ranges: bool = False
    #: the ragged persistent MXFP8 wgrad kernel: its tile table is a balanced list
    #: (:mod:`lowprec_moe.backends.cupy.gemm.balance`)
    ragged: bool = False


_FAMILIES = ("auto", "wgmma", "mma", "simt")


def _device_caps() -> tuple[tuple[int, int], int, int]:
    """(compute capability, opt-in shared memory per block, multiprocessors) of the current
    device (cached)."""
    cp = _cupy()
    dev = int(cp.cuda.runtime.getDevice())
    hit = _caps.get(dev)
    if hit is None:
        cc = str(cp.cuda.Device(dev).compute_capability)
        optin = int(cp.cuda.runtime.deviceGetAttribute(
            97, dev))  # cudaDevAttrMaxSharedMemoryPerBlockOptin
        sms = int(cp.cuda.runtime.deviceGetAttribute(16, dev))  # multiprocessor count
        hit = _caps[dev] = ((int(cc[:-1]), int(cc[-1])), optin, sms)
    return hit


def _swap_wide(pl: Plan, sms: int) -> bool:
    """Whether the NVFP4 swapped-operand TMA launch takes the wide build ``_kk_r`` (see
    SWAP_WIDE_ENV): in "auto", when its grid (token tiles x 256-column tiles) gives each of the
    ``sms`` multiprocessors at least SWAP_WIDE_MIN_CTAS_PER_SM CTAs."""
    mode = _env_mode(SWAP_WIDE_ENV, _SWAP_WIDE_MODES)
    if mode != "auto":
        return mode == "on"
    bt, bw = CONFIGS["r"]
    rows = pl.rows[pl.rows > 0]
    ctas = int(np.sum(_cdiv(rows, bt))) * int(_cdiv(pl.n_cols, bw))
    return ctas >= SWAP_WIDE_MIN_CTAS_PER_SM * sms


def choose_kernel(p, pl: Plan, caps: tuple | None = None) -> Launch:
    """Pick the kernel (module, name, tile, copy chunk, shared memory) for a plan.

    ``caps``: (compute capability, opt-in shared memory bytes, multiprocessors); queried from
    the device when omitted. The family comes from ``LOWPREC_MOE_GEMM_KERNEL`` (default
    ``auto``: wgmma for the 128x256 tile on sm_90, mma.sync otherwise; ``simt`` for float32
    operands).
    """
    family, tma_mode = _env_mode(KERNEL_ENV, _FAMILIES), _env_mode(TMA_ENV, _TMA_MODES)
    tma_ok = family == "auto" and tma_mode == "auto"
    simt = Launch("grouped_gemm_simt", "lpm_gg_simt", True, SIMT_TILE, SIMT_TILE, 0, 0)
    if family == "simt" or (p.fmt == "hp" and p.hp_dtype == "float32"):
        return simt
    a_ext = pl.rows if pl.a.mn else pl.length
    b_ext = np.full(len(pl.rows), pl.n_cols, np.int64) if pl.b.mn else pl.length
    ch = min(_chunk(pl.a, a_ext), _chunk(pl.b, b_ext))
    if ch == 0 or (ch == 8 and p.fmt != "nvfp4"):
        return simt
    cc, optin, sms = caps if caps is not None else _device_caps()
    prefix = {"hp": "bf16" if p.hp_dtype == "bfloat16" else "fp16", "nvfp4": "nvfp4",
              "mxfp8": "mxfp8"}[p.fmt]
    layout = ("n" if pl.a.mn else "k") + ("n" if pl.b.mn else "k")
    has_wgmma = tuple(cc) == (9, 0)
    if family == "wgmma" and not has_wgmma:
        raise ValueError(f"{KERNEL_ENV}=wgmma needs an sm_90 GPU, this one is sm_{cc[0]}{cc[1]}")
    # The family depends on the device (and the override) only, never on the splits.
    use_wg = has_wgmma and family in ("auto", "wgmma")
    big, small = ("w", "v") if use_wg else ("l", "s")
    quantized_k = all(op.kind in (KIND_FP4_K, KIND_FP8_K) for op in (pl.a, pl.b))
    if p.mode == "wgrad":
        cfg = big
    elif use_wg and quantized_k and _use_swap(pl.rows) and (
            p.fmt != "nvfp4" or (_scales_word_aligned(pl.a) and _scales_word_aligned(pl.b))):
        cfg = "t"  # few tokens per expert: weights on the wgmma M side
    else:
        cfg = small if _pick_bm(pl.rows, CONFIGS[small][0]) != 128 else big
    # warp-specialised wgmma kernel: NVFP4 (its consumers decode NVFP4 A fragments straight into
    # registers), 128-row tile, the default family
    ws = cfg == "w" and p.fmt == "nvfp4" and family == "auto"
    # ... and MXFP8 fprop / dgrad, whose warp-specialised kernel exists as a TMA build only
    mx_mode = _env_mode(MXFP8_WS_ENV, _MXFP8_WS_MODES)
    mx_layouts = {"auto": MXFP8_WS_AUTO, "all": ("kk", "kn", "nn"), "off": ()}[mx_mode]
    ws_mx = (cfg == "w" and p.fmt == "mxfp8" and layout in mx_layouts and ch == 16 and tma_ok
             and _use_ws_tma(pl, ragged=layout == "nn")
             and (layout != "nn" or mx_mode == "all" or _long_wgrad(pl)))
    if ws or ws_mx:
        cfg = "x"
    bm, bn = CONFIGS[cfg]
    # NVFP4 swapped-operand tiles load their data with TMA where one tensor map per operand
    # covers every expert (the default family only)
    use_tma = cfg == "t" and p.fmt == "nvfp4" and ch == 16 and tma_ok and _use_tma(pl)
    # ... in the wide build when the grid is large enough
    if use_tma and _swap_wide(pl, sms) and _use_tma(pl, wide=True):
        # ... with 16-token tiles when no expert has more
        n16 = _env_mode(SWAP_N16_ENV, _SWAP_N16_MODES) == "auto"
        cfg = "p" if n16 and int(pl.rows.max()) <= CONFIGS["p"][0] else "r"
        bm, bn = CONFIGS[cfg]
    # ... and so does the warp-specialised kernel, block scales included (the _kk_y build)
    ws_tma = ws_mx or (ws and ch == 16 and tma_ok and _use_ws_tma(pl))
    # ... in its 384-thread form (_kk_q) unless switched off
    n256 = ws_tma and not ws_mx and _env_mode(WS_N256_ENV, _WS_N256_MODES) == "auto"
    # ... persistent (_kk_o, or _kk_z in the 512-thread form) when there are more tiles than
    # multiprocessors; the MXFP8 kernel too (_kk_o, _kn_o, _nn_o) where its epilogue can run
    # from registers
    grid_cap = sms if ws_tma and (_persist_mx(p, pl, sms) if ws_mx else
                                  _persist(pl, sms, n256)) else 0
    # ... and, when asked for, MXFP8 wgrad whose experts contract different lengths in the
    # ragged one (_nn_g)
    ragged = ws_mx and layout == "nn" and not grid_cap and _persist_ragged(p, pl, sms)
    # ... and the NVFP4 cp.async build (no tensor map covers the experts) in its ragged one
    # (_kk_g), which loads its data tiles through per-expert row-pair maps where it can (_kk_h)
    pair_ok = ws and not ws_tma and tma_ok and _use_pair_tma(pl)
    ragged_fp4 = ws and not ws_tma and _persist_ragged_fp4(p, pl, sms, tma=pair_ok)
    pair_tma = ragged_fp4 and pair_ok
    ragged = ragged or ragged_fp4
    if ragged:
        grid_cap = sms
    ws = ws or ws_mx
    suffix = (cfg if cfg in ("r", "p") else "u" if use_tma else "h" if pair_tma else
              "g" if ragged else
              ("o" if n256 or ws_mx else "z") if grid_cap else "q" if n256 else "y" if ws_tma
              else cfg)
    use_tma = use_tma or ws_tma or pair_tma
    name = f"lpm_gg_{prefix}_{layout}_{suffix}" + ("8" if ch == 8 else "")
    if cfg in ("t", "r", "p"):
        smem = _swap_smem_bytes(pl.a.kind, pl.b.kind, wide=cfg != "t")
    elif ragged:
        # (the NVFP4 ragged form stages its epilogue in a canonical buffer: _kk_x's bytes)
        smem = (_ws_mx_g_smem_bytes() if ws_mx else _ws_g_tma_smem_bytes() if pair_tma
                else _ws_smem_bytes(pl.a.kind, pl.b.kind))
    elif ws_mx:
        smem = _ws_mx_p_smem_bytes() if grid_cap else _ws_mx_smem_bytes()
    elif grid_cap:  # both persistent NVFP4 forms
        smem = _ws_p_smem_bytes()
    elif ws_tma:
        smem = _ws_tma_smem_bytes()
    elif ws:
        smem = _ws_smem_bytes(pl.a.kind, pl.b.kind)
    else:
        smem = _smem_bytes(pl.a.kind, pl.b.kind, bm, bn, use_wg)
    if smem > optin:  # e.g. consumer GPUs with ~100 KiB per block
        return simt
    return Launch(kernel_module(prefix, suffix), name, False, bm, bn, ch, smem, use_wg,
                  WS_N256_THREADS if n256 else WS_THREADS if ws else THREADS, use_tma,
                  grid_cap, ws_mx, ragged)


def _long_wgrad(pl: Plan) -> bool:
    """Whether the non-empty experts of a wgrad plan contract at least
    ``MXFP8_WS_WGRAD_MIN_LEN`` tokens on average."""
    length = pl.length[pl.length > 0]
    return bool(length.size) and float(length.mean()) >= MXFP8_WS_WGRAD_MIN_LEN


def kernel_info(p) -> dict:
    """Which kernel (and MMA instruction) a validated CuPy problem runs on: for benchmarks."""
    pl = plan(p)
    ln = choose_kernel(p, pl)
    if ln.simt:
        instr = "fma.rn.f32 (SIMT)"
    else:
        mma_type = "f16" if p.fmt == "nvfp4" or p.hp_dtype == "float16" else "bf16"
        # the 512-thread warp-specialised kernel issues m64n128k16 with A from registers (its
        # 384-thread form m64n256k16); the swapped-operand kernel multiplies 64 weight rows by
        # 32 tokens
        shape = ("m64n16k16" if ln.kernel.endswith("_p") else
                 "m64n32k16" if ln.kernel.endswith(("_t", "_t8", "_u", "_r")) else
                 "m64n256k16" if ln.bm == 128 and ln.threads != WS_THREADS else "m64n128k16")
        instr = (f"wgmma.{shape}.{mma_type}" if ln.wgmma
                 else f"mma.sync.m16n8k16.{mma_type}")
        if p.fmt == "mxfp8" and ln.wgmma and not shape.endswith("n32k16") and not _mx_bf16():
            # the plain wgmma kernel: fp16 for tiles inside the fp16 window (grouped_gemm_mxf16)
            instr = f"wgmma.{shape}.f16|bf16"
        if ln.threads in (WS_THREADS, WS_N256_THREADS):
            instr += " ws"
        if ln.tma:
            instr += " tma"
        if ln.grid_cap:
            instr += " persistent" + (" ragged" if ln.ragged else "")
    return dict(module=ln.module, kernel=ln.kernel, instruction=instr, tile=(ln.bm, ln.bn),
                smem=ln.smem)
