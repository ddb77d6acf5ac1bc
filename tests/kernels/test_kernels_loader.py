"""lowprec_moe.kernels: locating, hashing and compiling raw_kernels/.

CPU tests: option building, hashing, directory discovery and importing without CuPy. The GPU
tests (compiling the real sources) are in ``test_kernels_gpu.py``.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import set_kernel_dir

from lowprec_moe import kernels

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "raw_kernels"


@pytest.fixture(autouse=True)
def _fresh_caches(monkeypatch):
    kernels.clear_cache()
    yield
    kernels.clear_cache()


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def src_dir(tmp_path):
    d = tmp_path / "kern"
    d.mkdir()
    _write(d / "lpm_formats.cuh", "constexpr int LPM_X = 1;\n")
    _write(d / "a.cu", '#include "lpm_formats.cuh"\nextern "C" __global__ void k() {}\n')
    return d


# ------------------------------------------------------------------------------------------
# Discovery


def test_kernel_dir_finds_source_tree():
    d = kernels.kernel_dir()
    assert d.is_absolute()
    assert kernels.source_path("lpm_formats.cuh").is_file()
    assert kernels.source_path("smoke.cu").is_file()


def test_kernel_dir_override(monkeypatch, src_dir):
    set_kernel_dir(monkeypatch, str(src_dir))
    assert kernels.kernel_dir() == src_dir.resolve()
    set_kernel_dir(monkeypatch, str(src_dir / "missing"))
    with pytest.raises(FileNotFoundError, match="missing"):
        kernels.kernel_dir()


def _load_copy(pkg_root: Path):
    """Import a copy of kernels.py placed at pkg_root/lowprec_moe/kernels.py."""
    (pkg_root / "lowprec_moe").mkdir(parents=True, exist_ok=True)
    target = pkg_root / "lowprec_moe" / "kernels.py"
    shutil.copy(Path(kernels.__file__), target)
    spec = importlib.util.spec_from_file_location("_lpm_kernels_copy", target)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernel_dir_installed_layout(tmp_path):
    # installed wheel: lowprec_moe/raw_kernels/ inside the package wins
    root = tmp_path / "site"
    mod = _load_copy(root)
    inside = root / "lowprec_moe" / "raw_kernels"
    inside.mkdir()
    _write(inside / "lpm_formats.cuh", "// x\n")
    outside = root / "raw_kernels"
    outside.mkdir()
    _write(outside / "lpm_formats.cuh", "// y\n")
    assert mod.kernel_dir() == inside.resolve()


def test_kernel_dir_source_layout(tmp_path):
    root = tmp_path / "checkout"
    mod = _load_copy(root)
    outside = root / "raw_kernels"
    outside.mkdir()
    _write(outside / "lpm_formats.cuh", "// y\n")
    assert mod.kernel_dir() == outside.resolve()


def test_kernel_dir_not_found(tmp_path):
    mod = _load_copy(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="raw_kernels"):
        mod.kernel_dir()


# ------------------------------------------------------------------------------------------
# Hashing


def test_source_hash_format_and_determinism(src_dir):
    h = kernels.source_hash(src_dir)
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert kernels.source_hash(src_dir) == h
    assert kernels.source_hash(str(src_dir)) == h


def test_source_hash_changes_when_header_changes(src_dir):
    before = kernels.source_hash(src_dir)
    _write(src_dir / "lpm_formats.cuh", "constexpr int LPM_X = 2;\n")
    assert kernels.source_hash(src_dir) != before


def test_source_hash_changes_when_kernel_changes_or_is_added(src_dir):
    h0 = kernels.source_hash(src_dir)
    _write(src_dir / "a.cu", "// changed\n")
    h1 = kernels.source_hash(src_dir)
    _write(src_dir / "b.cu", "// new\n")
    h2 = kernels.source_hash(src_dir)
    assert len({h0, h1, h2}) == 3


def test_source_hash_sees_names(src_dir):
    h0 = kernels.source_hash(src_dir)
    (src_dir / "a.cu").rename(src_dir / "c.cu")
    assert kernels.source_hash(src_dir) != h0


def test_source_hash_ignores_other_files(src_dir):
    h0 = kernels.source_hash(src_dir)
    _write(src_dir / "notes.txt", "hello\n")
    _write(src_dir / "gen.py", "x = 1\n")
    (src_dir / "_scratch").mkdir()
    _write(src_dir / "_scratch" / "x.cuh", "// folders starting with _ or . are not sources\n")
    assert kernels.source_hash(src_dir) == h0


def test_source_hash_sees_family_folders(src_dir):
    """Sources in family folders (gemm/, nvfp4/, ...) are part of the set and the include path."""
    h0 = kernels.source_hash(src_dir)
    (src_dir / "fam").mkdir()
    _write(src_dir / "fam" / "x.cuh", "// a family header\n")
    assert kernels.source_hash(src_dir) != h0
    assert kernels.source_path("x.cuh", src_dir) == (src_dir / "fam" / "x.cuh").resolve()
    assert f"-I{(src_dir / 'fam').resolve()}" in kernels.build_options((9, 0), src_dir)


def test_source_hash_independent_of_creation_order(tmp_path):
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    d1.mkdir()
    d2.mkdir()
    for d, order in ((d1, ("x.cu", "y.cuh")), (d2, ("y.cuh", "x.cu"))):
        for name in order:
            _write(d / name, f"// {name}\n")
    assert kernels.source_hash(d1) == kernels.source_hash(d2)


def test_source_hash_default_dir_is_cached_until_cleared(monkeypatch, src_dir):
    set_kernel_dir(monkeypatch, str(src_dir))
    h0 = kernels.source_hash()
    assert h0 == kernels.source_hash(src_dir)
    _write(src_dir / "lpm_formats.cuh", "constexpr int LPM_X = 3;\n")
    assert kernels.source_hash() == h0  # cached for the process
    kernels.clear_cache()
    assert kernels.source_hash() == kernels.source_hash(src_dir) != h0


def test_kernel_sources_lists_cu_and_cuh_sorted(src_dir):
    _write(src_dir / "0.cu", "\n")
    names = [p.name for p in kernels.kernel_sources(src_dir)]
    assert names == ["0.cu", "a.cu", "lpm_formats.cuh"]


def test_real_sources_hash():
    names = {p.name for p in kernels.kernel_sources()}
    assert {"lpm_formats.cuh", "smoke.cu"} <= names
    assert kernels.source_hash() == kernels.source_hash(RAW)


# ------------------------------------------------------------------------------------------
# Options


@pytest.mark.parametrize(
    "cc, flag",
    [
        ((9, 0), "-arch=sm_90a"),
        ((8, 0), "-arch=sm_80"),
        ((8, 9), "-arch=sm_89"),
        ((10, 0), "-arch=sm_100"),
        ((12, 0), "-arch=sm_120"),
        ([9, 0], "-arch=sm_90a"),
    ],
)
def test_arch_flag(cc, flag):
    assert kernels.arch_flag(cc) == flag


def test_build_options(src_dir):
    opts = kernels.build_options((9, 0), src_dir)
    assert isinstance(opts, tuple) and all(isinstance(o, str) for o in opts)
    digest = kernels.source_hash(src_dir)
    assert opts == (
        "-std=c++17",
        f"-I{src_dir.resolve()}",
        "-arch=sm_90a",
        f"-DLPM_SOURCE_HASH={digest[:16]}",
    )


def test_build_options_default_dir():
    opts = kernels.build_options((10, 0))
    assert f"-I{kernels.kernel_dir()}" in opts
    assert "-arch=sm_100" in opts
    assert f"-DLPM_SOURCE_HASH={kernels.source_hash()[:16]}" in opts


def test_build_options_change_with_header(src_dir):
    before = kernels.build_options((9, 0), src_dir)
    _write(src_dir / "lpm_formats.cuh", "constexpr int LPM_X = 7;\n")
    after = kernels.build_options((9, 0), src_dir)
    assert before[-1] != after[-1]
    assert before[:-1] == after[:-1]


@pytest.mark.parametrize("bad", [(9,), "90", 90, (9.0, 0), (True, 0), (9, 0, 0), None])
def test_build_options_bad_type(bad):
    with pytest.raises(TypeError, match="compute_capability"):
        kernels.build_options(bad)


@pytest.mark.parametrize("bad", [(0, 0), (-1, 0), (9, 10), (9, -1)])
def test_build_options_bad_value(bad):
    with pytest.raises(ValueError, match="compute_capability"):
        kernels.build_options(bad)


def test_build_options_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError):
        kernels.build_options((9, 0), tmp_path / "nope")


# ------------------------------------------------------------------------------------------
# Names are validated before CuPy is touched


@pytest.mark.parametrize("bad", ["", "../smoke", "smoke.cu", "a b", "1abc", "x/y"])
def test_get_module_bad_name(bad):
    with pytest.raises(ValueError, match="not a valid identifier"):
        kernels.get_module(bad)


def test_get_module_name_type():
    with pytest.raises(TypeError, match="name must be a str"):
        kernels.get_module(3)
    with pytest.raises(TypeError, match="kernel_name must be a str"):
        kernels.get_function("smoke", None)


# ------------------------------------------------------------------------------------------
# Import without CuPy


_NO_CUPY = r"""
import sys, importlib.abc

class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cupy" or name.startswith("cupy.") or name.startswith("cupy_backends"):
            raise ImportError("cupy is blocked for this test")
        return None

sys.meta_path.insert(0, _Block())
import lowprec_moe.kernels as k
import lowprec_moe.backend as b
assert "cupy" not in sys.modules
assert b.cupy_available() is False
opts = k.build_options((9, 0))
assert "-arch=sm_90a" in opts, opts
assert len(k.source_hash()) == 64
assert k.kernel_dir().name in ("raw_kernels",)
try:
    k.get_module("smoke")
except ImportError:
    pass
else:
    raise SystemExit("get_module without cupy should raise ImportError")
print("ok")
"""


def test_import_without_cupy():
    out = subprocess.run(
        [sys.executable, "-c", _NO_CUPY],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_importing_kernels_does_not_import_cupy():
    code = (
        "import sys; import lowprec_moe.kernels, lowprec_moe.backend; "
        "print('cupy' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=str(REPO), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
