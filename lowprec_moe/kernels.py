"""The one loader of the CUDA sources in ``raw_kernels/``.

Each ``raw_kernels/<name>.cu`` is compiled at run time by NVRTC through ``cupy.RawModule`` and
memoized per (device, module name, source hash). Kernels include ``lpm_formats.cuh`` and other
headers of the same directory.

CuPy's on-disk kernel cache is keyed on the ``.cu`` text and the options, not on the headers the
source includes; :func:`build_options` therefore adds ``-DLPM_SOURCE_HASH=<hash>``, a digest of
every ``*.cu`` and ``*.cuh`` file, so that a change to any header compiles afresh.

CuPy is imported inside the functions that need it only: importing this module works on a
machine without CuPy.

Examples
--------
>>> from lowprec_moe import kernels
>>> fn = kernels.get_function("smoke", "lpm_smoke_decode")       # doctest: +SKIP
>>> fn((1,), (256,), (e2m1_out, e8m0_out))                       # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path
from typing import Any

__all__ = [
    "kernel_dir",
    "kernel_sources",
    "source_path",
    "source_hash",
    "arch_flag",
    "build_options",
    "get_module",
    "get_function",
    "clear_cache",
    "handle_table",
]


#: Number of hex digits of the source hash passed to the compiler as ``LPM_SOURCE_HASH``.
_HASH_DIGITS = 16

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_lock = threading.Lock()
_dir_cache: dict[str | None, Path] = {}
_hash_cache: dict[str, str] = {}
_modules: dict[tuple[int, str, str], Any] = {}
_functions: dict[tuple[int, str, str, str], Any] = {}
_handle_tables: list[dict] = []  # launchers' handle memos (handle_table), emptied by clear_cache


# ---------------------------------------------------------------------------------------------
# Locating and hashing the sources


def _has_sources(path: Path) -> bool:
    return path.is_dir() and any(path.rglob("*.cuh"))


def kernel_dir() -> Path:
    """The directory holding the CUDA sources.

    Looked for, in order: the directory set with :func:`lowprec_moe.config.kernel_directory`;
    ``raw_kernels/`` inside the installed package
    (``lowprec_moe/raw_kernels``); ``raw_kernels/`` at the top of the source tree (next to the
    ``lowprec_moe`` package directory, as in an editable install or a checkout).

    Returns
    -------
    pathlib.Path
        Absolute path of the directory.

    Raises
    ------
    FileNotFoundError
        If none of the candidates holds ``*.cuh`` files, listing the places looked at.
    """
    from lowprec_moe import config

    env = config.kernel_source_dir()
    with _lock:
        cached = _dir_cache.get(env)
    if cached is not None:
        return cached
    found = _find_kernel_dir(env)
    with _lock:
        _dir_cache[env] = found
    return found


def _find_kernel_dir(env: str | None) -> Path:
    if env:
        path = Path(env).expanduser().resolve()
        if not path.is_dir():
            raise FileNotFoundError(
                f"kernel source directory={env!r} is not a directory"
            )
        return path
    pkg = Path(__file__).resolve().parent
    candidates = [pkg / "raw_kernels", pkg.parent / "raw_kernels"]
    for cand in candidates:
        if _has_sources(cand):
            return cand
    looked = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"CUDA kernel sources (*.cuh) not found; looked in: {looked}")


def _resolve_dir(directory: str | os.PathLike[str] | None) -> Path:
    if directory is None:
        return kernel_dir()
    path = Path(directory).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"directory={str(directory)!r} is not a directory")
    return path


def kernel_sources(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """All ``*.cu`` and ``*.cuh`` files of the kernel directory and its family folders
    (``gemm/``, ``nvfp4/``, ...), sorted by path.

    Parameters
    ----------
    directory : path-like, optional
        The directory to list; :func:`kernel_dir` when omitted.

    Returns
    -------
    list of pathlib.Path
    """
    path = _resolve_dir(directory)
    files = [p for p in path.rglob("*") if p.is_file() and p.suffix in (".cu", ".cuh")
             and not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(path).as_posix())


def _include_dirs(path: Path) -> list[Path]:
    """The kernel directory and its family folders: sources include each other by file name."""
    return [path] + sorted(d for d in path.iterdir() if d.is_dir() and not d.name.startswith(
        ("_", ".")))


def source_path(filename: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """The path of one kernel source file, wherever its family folder is.

    Raises
    ------
    FileNotFoundError
        If no file of that name is in the kernel directory.
    """
    path = _resolve_dir(directory)
    for d in _include_dirs(path):
        cand = d / filename
        if cand.is_file():
            return cand
    raise FileNotFoundError(f"kernel source {filename!r} not found under {path}")


def _compute_hash(path: Path) -> str:
    h = hashlib.sha256()
    for f in kernel_sources(path):
        name = f.relative_to(path).as_posix().encode("utf-8")
        data = f.read_bytes()
        # Length-prefix both parts so that no two different file sets hash alike.
        h.update(len(name).to_bytes(8, "little"))
        h.update(name)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def source_hash(directory: str | os.PathLike[str] | None = None) -> str:
    """SHA-256 over the names and contents of every ``*.cu`` / ``*.cuh`` file, sorted by name.

    Parameters
    ----------
    directory : path-like, optional
        The directory to hash. When omitted, :func:`kernel_dir` is hashed and the result is
        cached for the process (call :func:`clear_cache` after editing sources in a running
        process). An explicit directory is always hashed afresh.

    Returns
    -------
    str
        64 lowercase hex digits.
    """
    if directory is not None:
        return _compute_hash(_resolve_dir(directory))
    path = kernel_dir()
    key = str(path)
    with _lock:
        cached = _hash_cache.get(key)
    if cached is None:
        cached = _compute_hash(path)
        with _lock:
            _hash_cache[key] = cached
    return cached


# ---------------------------------------------------------------------------------------------
# Compiler options


def _check_cc(compute_capability: Any) -> tuple[int, int]:
    if not isinstance(compute_capability, (tuple, list)) or len(compute_capability) != 2:
        raise TypeError(
            "compute_capability must be a (major, minor) tuple of ints, "
            f"got {compute_capability!r}"
        )
    major, minor = compute_capability
    for v in (major, minor):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(
                "compute_capability must be a (major, minor) tuple of ints, "
                f"got {compute_capability!r}"
            )
    if major < 1 or not 0 <= minor <= 9:
        raise ValueError(
            f"compute_capability={compute_capability!r} is not a valid CUDA compute capability"
        )
    return int(major), int(minor)


def arch_flag(compute_capability: tuple[int, int]) -> str:
    """The NVRTC architecture flag for a compute capability.

    Hopper (9, 0) gets the architecture-specific ``-arch=sm_90a`` (needed for ``wgmma`` and
    the other sm_90a-only instructions); every other capability gets ``-arch=sm_<major><minor>``
    (for example ``-arch=sm_100`` for (10, 0)).

    Parameters
    ----------
    compute_capability : tuple of int
        ``(major, minor)``.

    Returns
    -------
    str
    """
    major, minor = _check_cc(compute_capability)
    if (major, minor) == (9, 0):
        return "-arch=sm_90a"
    return f"-arch=sm_{major}{minor}"


def build_options(
    compute_capability: tuple[int, int],
    directory: str | os.PathLike[str] | None = None,
) -> tuple[str, ...]:
    """NVRTC options for compiling the kernels for one GPU.

    Parameters
    ----------
    compute_capability : tuple of int
        ``(major, minor)`` of the target GPU.
    directory : path-like, optional
        The kernel directory (include path and hash input); :func:`kernel_dir` when omitted.

    Returns
    -------
    tuple of str
        ``("-std=c++17", "-I<dir>", "-arch=...", "-DLPM_SOURCE_HASH=<16 hex digits>")``.

    Raises
    ------
    TypeError, ValueError
        If ``compute_capability`` is not a valid ``(major, minor)`` pair.
    """
    arch = arch_flag(compute_capability)
    path = _resolve_dir(directory)
    digest = source_hash(None if directory is None else path)
    return (
        "-std=c++17",
        *(f"-I{d}" for d in _include_dirs(path)),
        arch,
        f"-DLPM_SOURCE_HASH={digest[:_HASH_DIGITS]}",
    )


# ---------------------------------------------------------------------------------------------
# Loading modules (needs CuPy and a GPU)


def _numbered(source: str) -> str:
    lines = source.splitlines()
    width = len(str(len(lines)))
    return "\n".join(f"{i + 1:>{width}} | {line}" for i, line in enumerate(lines))


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if not _IDENTIFIER.fullmatch(value):
        raise ValueError(f"{what}={value!r} is not a valid identifier")
    return value


def _current_device_id() -> int:
    try:
        import cupy  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(
            "the CUDA kernels need CuPy and a CUDA GPU; install the GPU extra "
            "(pip install 'lowprec-moe[gpu]')"
        ) from exc
    return int(cupy.cuda.runtime.getDevice())


def _compute_capability(device_id: int) -> tuple[int, int]:
    import cupy  # noqa: PLC0415

    cc = str(cupy.cuda.Device(device_id).compute_capability)  # e.g. "90", "100", "120"
    return int(cc[:-1]), int(cc[-1])


def get_module(name: str, source: str | None = None) -> Any:
    """The compiled ``cupy.RawModule`` of ``raw_kernels/<name>.cu`` for the current device.

    Compiled once per (device id, name, source hash) and memoized.

    Parameters
    ----------
    name : str
        File stem of the source, e.g. ``"smoke"`` for ``raw_kernels/common/smoke.cu``.
    source : str, optional
        The module's CUDA text when it is generated rather than a file (the grouped-GEMM
        instantiations, :mod:`lowprec_moe.backends.cupy.gemm.configs`); it includes the
        headers of the kernel directory, and its own digest joins the cache key.

    Returns
    -------
    cupy.RawModule

    Raises
    ------
    TypeError, ValueError
        If ``name`` is not an identifier string.
    FileNotFoundError
        If ``raw_kernels/<name>.cu`` does not exist.
    RuntimeError
        If NVRTC fails; the message holds the compiler log and the numbered source.
    """
    _check_name(name, "name")
    device_id = _current_device_id()
    path = kernel_dir()
    digest = source_hash()
    own = None if source is None else hashlib.sha256(source.encode("utf-8")).hexdigest()
    key = (device_id, name, digest, own)
    with _lock:
        mod = _modules.get(key)
    if mod is not None:
        return mod

    try:
        src_path = source_path(f"{name}.cu", path)
    except FileNotFoundError:
        src_path = path / f"{name}.cu"
    if source is not None:
        pass
    elif not src_path.is_file():
        available = sorted(p.stem for p in path.rglob("*.cu"))
        raise FileNotFoundError(
            f"kernel source name={name!r} not found: no {src_path.name} in the kernel directory "
            f"(available: {available})"
        )
    if source is None:
        source = src_path.read_text(encoding="utf-8")
    cc = _compute_capability(device_id)
    options = build_options(cc, path)

    import cupy  # noqa: PLC0415
    from cupy.cuda.compiler import CompileException  # noqa: PLC0415

    try:
        mod = cupy.RawModule(code=source, options=options, backend="nvrtc")
        # RawModule compiles lazily; force it now so errors surface here, with context.
        mod.compile()
    except CompileException as exc:
        raise RuntimeError(
            f"NVRTC failed to compile {src_path.name} for compute capability "
            f"{cc[0]}.{cc[1]} with options {' '.join(options)}\n"
            f"--- compiler log ---\n{exc}\n"
            f"--- {src_path.name} ---\n{_numbered(source)}"
        ) from exc

    with _lock:
        mod = _modules.setdefault(key, mod)
    return mod


def get_function(module_name: str, kernel_name: str, source: str | None = None) -> Any:
    """An ``extern "C"`` kernel of ``raw_kernels/<module_name>.cu`` for the current device.

    Parameters
    ----------
    module_name : str
        File stem of the source.
    kernel_name : str
        Name of the ``extern "C" __global__`` function.
    source : str, optional
        Generated module text (:func:`get_module`).

    Returns
    -------
    cupy.RawKernel
        Call as ``fn(grid, block, args, shared_mem=0)``.

    Raises
    ------
    ValueError
        If the module has no kernel of that name.
    """
    _check_name(module_name, "module_name")
    _check_name(kernel_name, "kernel_name")
    device_id = _current_device_id()
    own = None if source is None else hash(source)
    key = (device_id, module_name, source_hash(), kernel_name, own)
    with _lock:
        fn = _functions.get(key)
    if fn is not None:
        return fn
    mod = get_module(module_name, source)
    try:
        fn = mod.get_function(kernel_name)
    except Exception as exc:  # cupy raises CUDADriverError (CUDA_ERROR_NOT_FOUND)
        raise ValueError(
            f"kernel_name={kernel_name!r} not found in raw_kernels/{module_name}.cu "
            "(is it declared extern \"C\" __global__?)"
        ) from exc
    with _lock:
        fn = _functions.setdefault(key, fn)
    return fn


def handle_table() -> dict:
    """A dict for a launcher's own memo of kernel handles; :func:`clear_cache` empties it too."""
    table: dict = {}
    with _lock:
        _handle_tables.append(table)
    return table


def clear_cache() -> None:
    """Forget the cached kernel directory, source hashes, modules and functions (and the
    launchers' handle memos from :func:`handle_table`).

    Call after editing kernel sources in a running process.
    """
    with _lock:
        _dir_cache.clear()
        _hash_cache.clear()
        _modules.clear()
        _functions.clear()
        for table in _handle_tables:
            table.clear()
