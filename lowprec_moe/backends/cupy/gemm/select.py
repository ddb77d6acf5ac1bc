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


def _splits_on_host(c: KernelConfig) -> str | None:
    """Why config ``c`` needs the splits on the host (None: it runs from device tables)."""
    if c.role != "plain" or c.persistent or c.tma:
        return ("its schedule or tensor maps are built from the splits on the host (device "
                "splits take the plain cp.async kernels)")
    return None


def choose_kernel(p, pl, caps: tuple | None = None, kernel: str = "auto",
                  device_splits: bool = False, chunk_cap: int | None = None) -> Choice:
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
    device_splits : bool
        The splits live on the device (``pl`` plans a stand-in split): only the configs that
        read nothing of the splits on the host are legal.
    chunk_cap : int, optional
        The largest copy chunk every split allows (device splits: ``pl``'s own split may allow
        a wider one than others).
    """
    cc, optin, sms = caps if caps is not None else device_caps()
    f = Facts(p, pl, tuple(cc), optin, sms)
    if chunk_cap is not None:
        f.__dict__["chunk"] = min(f.chunk, chunk_cap)  # overrides the cached property

    def why_not(c):
        return illegal(c, f) or (_splits_on_host(c) if device_splits else None)

    if kernel != "auto":
        c = config(kernel)
        why = why_not(c)
        if why is not None:
            raise ValueError(f"kernel={kernel!r} cannot run this {p.mode} problem: {why}")
    else:
        legal = [c for c in ALL_CONFIGS if why_not(c) is None]
        if not legal:
            raise NotImplementedError(f"no kernel config computes this {p.mode} problem"
                                      + (" with device splits" if device_splits else ""))
        rank = sm90.rank if f.cc == (9, 0) else generic.rank
        c = min(legal, key=lambda c: rank(c, f))
    return Choice(c, sms if c.persistent else 0)
