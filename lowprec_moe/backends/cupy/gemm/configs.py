"""Grouped-GEMM kernel configs: what a kernel is, its name, and the CUDA source that builds it.

A :class:`KernelConfig` is one compiled kernel: format, operand layout, MMA family, the role
split of its warps, how it loads operands, how it schedules tiles, the CTA tile, threads, copy
chunk and dynamic shared memory. The tables of configs live in :mod:`.sm90` (Hopper) and
:mod:`.generic` (``mma.sync`` and SIMT kernels for every other GPU); :mod:`.select` filters and
ranks them.

Kernel names are spelled out from the fields, e.g.
``grouped_gemm_sm90_nvfp4_wgmma_ws_tma_persistent_128x256_kk``. The CUDA entry points are not
written by hand: :func:`module_source` generates each module's source from the table -- one
instantiation macro per config, its sizes and operand kinds as compile-time arguments -- plus a
``static_assert`` per config that the host's shared-memory and thread counts equal the CUDA
constants, so a mismatch fails to compile instead of failing at run time.

Layouts: ``kk`` both operands contraction-contiguous (K-major), ``kn`` B MN-major, ``nn`` both
MN-major (see :mod:`.launch` for how fprop / dgrad / wgrad map onto them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lowprec_moe.backends.cupy.gemm.plan import KIND_FP4_K, KIND_FP8_K, KIND_FP8_MN, KIND_HP_K, KIND_HP_MN

#: Operand kinds (A, B) of each format and layout, as the CUDA kernels name them.
_KINDS = {
    ("bf16", "kk"): (KIND_HP_K, KIND_HP_K), ("bf16", "kn"): (KIND_HP_K, KIND_HP_MN),
    ("bf16", "nn"): (KIND_HP_MN, KIND_HP_MN),
    ("fp16", "kk"): (KIND_HP_K, KIND_HP_K), ("fp16", "kn"): (KIND_HP_K, KIND_HP_MN),
    ("fp16", "nn"): (KIND_HP_MN, KIND_HP_MN),
    ("mxfp8", "kk"): (KIND_FP8_K, KIND_FP8_K), ("mxfp8", "kn"): (KIND_FP8_K, KIND_FP8_MN),
    ("mxfp8", "nn"): (KIND_FP8_MN, KIND_FP8_MN),
    ("nvfp4", "kk"): (KIND_FP4_K, KIND_FP4_K),
}
_KIND_NAMES = {KIND_HP_K: "KIND_HP_K", KIND_HP_MN: "KIND_HP_MN", KIND_FP4_K: "KIND_FP4_K",
               KIND_FP8_K: "KIND_FP8_K", KIND_FP8_MN: "KIND_FP8_MN"}
#: Formats whose tensor-core kernels multiply on fp16 (NVFP4 decodes exactly to fp16) rather
#: than bf16.
_F16 = {"bf16": False, "fp16": True, "mxfp8": False, "nvfp4": True}


def operand_kinds(fmt: str, layout: str) -> tuple[int, int]:
    """The CUDA operand kinds (A, B) of a format and layout."""
    return _KINDS[(fmt, layout)]


@dataclass(frozen=True)
class KernelConfig:
    """One grouped-GEMM kernel.

    Attributes
    ----------
    arch : {"sm90", "sm80", "any"}
        Where it runs: ``sm90`` needs Hopper's ``wgmma`` (sm_90a); ``sm80`` kernels use
        ``mma.sync`` and run on any GPU from sm_80 on; ``any`` is the SIMT kernel.
    fmt : {"bf16", "fp16", "mxfp8", "nvfp4", "any"}
        Operand format (``any``: the SIMT kernel reads every format, fp32 included).
    layout : {"kk", "kn", "nn", "any"}
        Operand majorness (module docstring).
    mma : {"wgmma", "mma", "simt"}
        Tensor-core instruction family, or CUDA-core fma.
    role : {"plain", "ws", "swap"}
        ``plain``: every warp copies, converts and multiplies; ``ws``: warp-specialised
        producers (copies, B expansion) and consumers (A decode, wgmma); ``swap``: weights on the
        MMA's M side, tokens on N (few tokens per expert).
    loader : {"cpasync", "tma", "rowpair_tma"}
        How operand tiles reach shared memory: ``cp.async``, one tensor map per operand, or two
        row-pair maps per expert and operand (ragged NVFP4 wgrad).
    schedule : {"tile", "persistent", "ragged"}
        One CTA per output tile; one CTA per SM over the tile table; one CTA per SM over a list
        of tiles balanced by contraction length.
    bm, bn : int
        CTA tile: output rows (A side) x output columns (B side).
    threads : int
        Threads per CTA.
    chunk : int
        cp.async copy size in bytes (16, or 8 for NVFP4 rows that are only 8-byte aligned);
        0 for the SIMT kernel, which reads elements.
    smem : int
        Dynamic shared memory in bytes, computed once on the host (:mod:`.smem`) and checked
        against the CUDA constant at compile time.
    module : str
        The compiled module (``raw_kernels`` headers plus the generated instantiations) holding
        it; a call compiles only the module it runs.
    macro, macro_args : str, tuple of str
        The CUDA instantiation macro and its arguments after the name.
    smem_expr : str
        The CUDA constant expression ``smem`` must equal (empty: no check).
    threads_expr : str
        The CUDA constant ``threads`` must equal.
    """

    arch: str
    fmt: str
    layout: str
    mma: str
    role: str
    loader: str
    schedule: str
    bm: int
    bn: int
    threads: int
    chunk: int
    smem: int
    module: str
    macro: str
    macro_args: tuple = ()
    smem_expr: str = ""
    threads_expr: str = ""
    min_ctas_per_sm: int = field(default=1, compare=False)

    @property
    def name(self) -> str:
        """The spelled-out kernel name (also the CUDA entry point)."""
        if self.mma == "simt":
            return f"grouped_gemm_simt_{self.bm}x{self.bn}"
        parts = ["grouped_gemm", self.arch, self.fmt, self.mma]
        if self.role != "plain":
            parts.append(self.role)
        parts.append(self.loader)
        if self.schedule != "tile":
            parts.append(self.schedule)
        parts += [f"{self.bm}x{self.bn}", self.layout]
        if self.chunk == 8:
            parts.append("chunk8")
        return "_".join(parts)

    # ---- properties the launcher reads ----------------------------------------------------
    @property
    def simt(self) -> bool:
        return self.mma == "simt"

    @property
    def wgmma(self) -> bool:
        return self.mma == "wgmma"

    @property
    def tma(self) -> bool:
        return self.loader != "cpasync"

    @property
    def persistent(self) -> bool:
        """One CTA per SM over many tiles (the launcher caps the grid at the SM count)."""
        return self.schedule != "tile"

    @property
    def ragged(self) -> bool:
        """Its tile table is a balanced list (:mod:`.balance`)."""
        return self.schedule == "ragged"

    @property
    def mx_ranges(self) -> bool:
        """The warp-specialised MXFP8 kernels read the rows' block-code ranges
        (:mod:`.ranges`)."""
        return self.fmt == "mxfp8" and self.role == "ws"

    @property
    def a_mn(self) -> bool:
        return self.layout == "nn"

    @property
    def b_mn(self) -> bool:
        return self.layout in ("kn", "nn")

    def instantiation(self) -> str:
        """The CUDA line that defines this kernel."""
        return f"{self.macro}({', '.join((self.name, *self.macro_args))})"

    def checks(self) -> list[str]:
        """``static_assert`` lines tying the host's numbers to the CUDA constants."""
        out = []
        if self.smem_expr:
            out.append(f'static_assert({self.smem_expr} == {self.smem}, '
                       f'"{self.name}: host shared-memory size differs from the kernel\'s");')
        if self.threads_expr:
            out.append(f'static_assert({self.threads_expr} == {self.threads}, '
                       f'"{self.name}: host thread count differs from the kernel\'s");')
        return out


def kind_args(fmt: str, layout: str) -> tuple[str, str]:
    """The CUDA spelling of a format's operand kinds, for macro arguments."""
    a, b = operand_kinds(fmt, layout)
    return f"lpm_gg::{_KIND_NAMES[a]}", f"lpm_gg::{_KIND_NAMES[b]}"


def f16_arg(fmt: str) -> str:
    """The CUDA ``F16`` macro argument of a format (tensor-core type fp16 rather than bf16)."""
    return "true" if _F16[fmt] else "false"


#: Kernels a module holds besides its configs (helpers the launcher calls by name).
EXTRA_ENTRIES: dict[str, tuple[str, ...]] = {}


def constant_checks() -> list[str]:
    """``static_assert`` lines tying every host constant of the launcher (:mod:`.plan`,
    :mod:`.smem`, :mod:`.ranges`) to the CUDA constant it mirrors; every generated module
    carries them, so a change on one side alone fails to compile."""
    from . import plan as P
    from . import smem as S

    pairs = [("kBK", P.BK), ("kDescWords", P.DESC_WORDS), ("kThreads", P.THREADS),
             ("kWsThreads", P.WS_THREADS), ("kWnThreads", P.WS_N256_THREADS),
             ("kWsAhead", P.WS_AHEAD), ("kWsCanonBuffers", P.WS_CANON_BUFFERS),
             ("kSwapTokens", P.SWAP_TILE[0]), ("kSwapCols", P.SWAP_TILE[1]),
             ("swap_stages(lpm_gg::KIND_FP4_K, lpm_gg::KIND_FP4_K)", P.SWAP_STAGES["nvfp4"]),
             ("swap_stages(lpm_gg::KIND_FP8_K, lpm_gg::KIND_FP8_K)", P.SWAP_STAGES["mxfp8"]),
             ("kMaxSmem", S.MAX_SMEM), ("kWsScaleTiles", S.WS_SCALE_TILES),
             ("kWsScaleSlots", S.WS_SCALE_SLOTS), ("kWsFragSteps", S.WS_FRAG_STEPS),
             ("kEpiWarpLd", S.EPI_WARP_LD), ("kEpiColTable", S.EPI_COL_TABLE),
             ("kWmxAhead", S.WMX_AHEAD), ("kWmxCanonBuffers", S.WMX_CANON_BUFFERS),
             ("kWmxAStages", S.WMX_A_STAGES), ("kWmxBStages", S.WMX_B_STAGES),
             ("kWmxScaleTiles", S.WMX_SCALE_TILES), ("kWmxScaleSlots", S.WMX_SCALE_SLOTS),
             ("kWmxPAhead", S.WMX_P_AHEAD), ("kWmxEpiStaging", S.WMX_EPI_STAGING),
             ("kWmxWinSlot", S.WMX_WIN_SLOT), ("WsgTmaLayout::AHEAD", S.WS_G_TMA_AHEAD)]
    pairs += [(f"{name}", getattr(P, name)) for name in (
        "D_A_OFF", "D_A_LD", "D_A_SOFF", "D_A_SLD", "D_B_OFF", "D_B_LD", "D_B_SOFF", "D_B_SLD",
        "D_ROWS", "D_LEN", "D_OUT_OFF", "D_AMAX_A", "D_AMAX_B", "D_BIAS", "D_PROBS",
        "KIND_HP_K", "KIND_HP_MN", "KIND_FP4_K", "KIND_FP8_K", "KIND_FP8_MN")]
    pairs += [("OUT_F32", P.OUT_TYPES["float32"]), ("OUT_BF16", P.OUT_TYPES["bfloat16"]),
              ("OUT_F16", P.OUT_TYPES["float16"])]
    from .balance import ENTRY_WORDS
    from .ranges import RANGE_THREADS

    pairs += [("kMxRangeThreads", RANGE_THREADS), ("kWmxGEntryWords", ENTRY_WORDS)]
    return [f'static_assert(lpm_gg::{c} == {v}, "host constant for lpm_gg::{c} differs");'
            for c, v in pairs]


def module_source(module: str, configs) -> str:
    """The CUDA source of one generated module: the shared headers, the host constants'
    checks, then every config's instantiation and checks, then the module's helper entries."""
    mine = [c for c in configs if c.module == module]
    if not mine and module not in EXTRA_ENTRIES:
        raise ValueError(f"no kernel config is in module {module!r}")
    lines = ["// Generated from the grouped-GEMM kernel config tables "
             "(lowprec_moe/backends/cupy/gemm); not a file in raw_kernels/.",
             '#include "grouped_gemm_common.cuh"', ""]
    lines += constant_checks() + [""]
    for c in mine:
        lines += c.checks()
        lines.append(c.instantiation())
    lines += list(EXTRA_ENTRIES.get(module, ()))
    return "\n".join(lines) + "\n"


def modules(configs) -> list[str]:
    """The generated modules of a table, in first-use order."""
    seen: dict[str, None] = {}
    for c in configs:
        if c.macro:
            seen.setdefault(c.module, None)
    for m in EXTRA_ENTRIES:
        seen.setdefault(m, None)
    return list(seen)
