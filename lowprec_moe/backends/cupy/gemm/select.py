"""Kernel selection of the grouped GEMM: enumerate the configs of the device's tables, filter
the legal ones, rank them (:mod:`.sm90`, :mod:`.generic`).

:func:`choose_kernel` is host-only given the device capabilities, so the choice is testable on
the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowprec_moe.backends.cupy.gemm import generic, sm90
from lowprec_moe.backends.cupy.gemm.configs import KernelConfig
from lowprec_moe.backends.cupy.gemm.rules import Facts
from lowprec_moe.backends.cupy.gemm.tma_rules import tma_geometry, tma_map_specs

#: Every config, Hopper's first.
ALL_CONFIGS: tuple[KernelConfig, ...] = sm90.CONFIGS + generic.CONFIGS
_BY_NAME = {c.name: c for c in ALL_CONFIGS}
assert len(_BY_NAME) == len(ALL_CONFIGS), "two kernel configs share a name"

_caps: dict = {}


def config_names() -> list[str]:
    """The names of every kernel config, for ``kernel=`` requests."""
    return list(_BY_NAME)


def config(name: str) -> KernelConfig:
    """The config of a kernel name; ``ValueError`` naming the unknown value otherwise."""
    c = _BY_NAME.get(name)
    if c is None:
        raise ValueError(f"kernel={name!r} is not a grouped-GEMM kernel config; "
                         f"see lowprec_moe.backends.cupy.gemm.select.config_names()")
    return c


def device_caps() -> tuple[tuple[int, int], int, int]:
    """(compute capability, opt-in shared memory per block, multiprocessors) of the current
    device (cached)."""
    import cupy as cp

    dev = int(cp.cuda.runtime.getDevice())
    hit = _caps.get(dev)
    if hit is None:
        cc = str(cp.cuda.Device(dev).compute_capability)
        optin = int(cp.cuda.runtime.deviceGetAttribute(
            97, dev))  # cudaDevAttrMaxSharedMemoryPerBlockOptin
        sms = int(cp.cuda.runtime.deviceGetAttribute(16, dev))  # multiprocessor count
        hit = _caps[dev] = ((int(cc[:-1]), int(cc[-1])), optin, sms)
    return hit


@dataclass(frozen=True)
class Choice:
    """The selected config and the launch's grid cap (persistent configs: at most this many
    CTAs share the tiles; 0: one CTA per tile)."""

    config: KernelConfig
    grid_cap: int


def illegal(c: KernelConfig, f: Facts) -> str | None:
    """Why config ``c`` cannot compute ``f`` on this device (None: it can)."""
    why = sm90.illegal(c, f) if c.arch == "sm90" else generic.illegal(c, f)
    if why is None and c.smem > f.optin:
        why = f"it needs {c.smem} bytes of shared memory, the device allows {f.optin}"
    return why


def _needs_host_tables(c: KernelConfig) -> str | None:
    """Why config ``c`` cannot run from tables built on the device (None: it can)."""
    if c.persistent or c.loader == "rowpair_tma":
        return ("its tile schedule or row-pair tensor maps are built from the splits on the "
                "host")
    return None


def choose_kernel(p, pl, caps: tuple | None = None, kernel: str = "auto",
                  probes: list | None = None) -> Choice:
    """Select the kernel config of a planned problem.

    Parameters
    ----------
    p : GemmProblem
        The validated problem.
    pl : Plan
        Its plan (:func:`.plan.plan`).
    caps : tuple, optional
        (compute capability, opt-in shared memory bytes, multiprocessors); queried from the
        current device when omitted.
    kernel : str
        ``"auto"``, or the name of the config to run (``ValueError`` if it cannot compute the
        problem, naming why).
    probes : list of (GemmProblem, Plan), optional
        Device splits: ``p`` / ``pl`` stand for one split of the experts' rows and ``probes``
        for others (:func:`.device_splits.probe_splits`). A config must then compute every one
        of them, run from the device-built tables (no persistent schedule, no per-expert tensor
        maps), build the same tensor maps for each, and copy with a width every one allows.
        Ranking uses ``p``.
    """
    cc, optin, sms = caps if caps is not None else device_caps()
    f = Facts(p, pl, tuple(cc), optin, sms)
    others = [Facts(q, ql, tuple(cc), optin, sms) for q, ql in (probes or ())]
    if probes is not None:
        cap = min([f.chunk] + [o.chunk for o in others])
        for x in [f] + others:
            x.__dict__["chunk"] = cap  # overrides the cached property

    def why_not(c):
        why = illegal(c, f)
        if why is not None or probes is None:
            return why
        why = _needs_host_tables(c)
        if why is not None:
            return why
        for o in others:
            why = illegal(c, o)
            if why is not None:
                return f"{why} (for some split of the experts)"
        if c.tma:
            spec = tma_map_specs(c, tma_geometry(pl))
            if any(tma_map_specs(c, tma_geometry(o.pl)) != spec for o in others):
                return "its tensor maps depend on the splits"
        return None

    if kernel != "auto":
        c = config(kernel)
        why = why_not(c)
        if why is not None:
            raise ValueError(f"kernel={kernel!r} cannot run this {p.mode} problem: {why}")
    else:
        legal = [c for c in ALL_CONFIGS if why_not(c) is None]
        if not legal:
            raise NotImplementedError(f"no kernel config computes this {p.mode} problem"
                                      + (" with device splits" if probes is not None else ""))
        rank = sm90.rank if f.cc == (9, 0) else generic.rank
        c = min(legal, key=lambda c: rank(c, f))
    return Choice(c, sms if c.persistent else 0)
