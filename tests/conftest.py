"""Shared fixtures: the ``xp`` backend fixture, byte-exact comparison helpers, and a check that
a kernel source holds the expressions a CPU emulation mirrors.

Tests written once run on both backends through ``xp``: the NumPy run always happens, the CuPy
run is marked ``gpu`` and skips cleanly when CuPy or a GPU is missing.

Memory checking: CuPy's memory pool hands out slices of larger blocks, so an out-of-bounds access
would land inside the pool and escape ``compute-sanitizer --tool memcheck``. With the environment
variable ``LPM_TEST_NO_MEMPOOL=1`` every array gets its own ``cudaMalloc`` (slow; for memcheck
runs only).
"""

from __future__ import annotations

import os

import numpy as np
import pytest


def _gpu_ok() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


GPU_AVAILABLE = _gpu_ok()
if GPU_AVAILABLE and os.environ.get("LPM_TEST_NO_MEMPOOL") == "1":
    import cupy

    cupy.cuda.set_allocator(None)
    cupy.cuda.set_pinned_memory_allocator(None)
requires_gpu = pytest.mark.skipif(not GPU_AVAILABLE, reason="needs CuPy and a CUDA GPU")


@pytest.fixture(params=[pytest.param("numpy", id="cpu"),
                        pytest.param("cupy", id="gpu", marks=[pytest.mark.gpu, requires_gpu])])
def xp(request):
    """The array module under test: numpy, or cupy (gpu-marked, skipped without a GPU)."""
    if request.param == "numpy":
        return np
    import cupy

    return cupy


@pytest.fixture(scope="module")
def cp():
    """The cupy module; skips the test when CuPy or a CUDA device is missing."""
    cupy = pytest.importorskip("cupy")
    if not GPU_AVAILABLE:
        pytest.skip("no CUDA device")
    return cupy


def to_host(a):
    """A NumPy copy of a NumPy or CuPy array (tests only)."""
    if a is None or isinstance(a, np.ndarray):
        return a
    return a.get()


def assert_bytes_equal(actual, expected, what: str = "") -> None:
    """Assert two arrays hold the same bytes; report the first mismatching index."""
    a, e = to_host(actual), to_host(expected)
    assert (a is None) == (e is None), f"{what}: one side is None"
    if a is None:
        return
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    av = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    ev = np.ascontiguousarray(e).view(np.uint8).reshape(-1)
    if not np.array_equal(av, ev):
        bad = np.flatnonzero(av != ev)
        i = int(bad[0])
        itemsize = a.dtype.itemsize
        elem = np.unravel_index(i // itemsize, a.shape) if a.size else ()
        raise AssertionError(
            f"{what}: {bad.size} mismatching bytes; first at byte {i} (element {elem}): "
            f"got 0x{int(av[i]):02x}, expected 0x{int(ev[i]):02x}")


QT_FIELDS = ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale",
             "amax_rowwise", "amax_columnwise")


def assert_quantized_equal(a, b, what: str = "") -> None:
    """Byte-compare every stored array of two QuantizedTensor / GroupedTensor objects."""
    for f in QT_FIELDS:
        assert_bytes_equal(getattr(a, f), getattr(b, f), f"{what} {f}")


def assert_colsums_close(sums, x, splits, probs=None, what: str = "") -> None:
    """Per-member column sums of ``x`` (times ``probs``) within float32 summation error of the
    float64 sums of the float32 products (any fp32 order: |error| <= rows * 2^-24 * sum |w|);
    members without rows give exact zeros."""
    sums = to_host(sums)
    assert sums.dtype == np.float32 and sums.shape == (len(splits), x.shape[1]), what
    w = np.asarray(x).astype(np.float32)
    if probs is not None:
        w = w * np.asarray(probs, np.float32)[:, None]  # the fp32 products both backends sum
    offs = np.concatenate([[0], np.cumsum(splits)]).astype(np.int64)
    for g in range(len(splits)):
        part = w[offs[g]:offs[g + 1]].astype(np.float64)
        if part.shape[0] == 0:
            assert not sums[g].any(), f"{what} member {g} has no rows: its sums must be zeros"
            continue
        bound = part.shape[0] * 2.0**-24 * np.abs(part).sum(axis=0)
        err = np.abs(sums[g].astype(np.float64) - part.sum(axis=0))
        assert (err <= bound).all(), f"{what} member {g}: max error {err.max()} (first bad " \
                                     f"column {int(np.argmax(err > bound))})"


# ------------------------------------------------------------------ host data for GPU tests
def host_dtype(name: str):
    """NumPy dtype of a layer-dtype name ("float32", "float16", "bfloat16")."""
    import ml_dtypes

    return {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[name]


def cast_host(x32, name: str) -> np.ndarray:
    """float32 -> float32 / float16 / bfloat16 contiguous host array (overflow to inf is fine)."""
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(np.asarray(x32, np.float32).astype(host_dtype(name)))


def spread_random(shape, seed: int, spread: int) -> np.ndarray:
    """float32 normals times 2^U[-spread, spread], with ~2 % exact zeros."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    x = x.astype(np.float32)
    if x.size:
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, max(1, flat.size // 50))] = 0.0
    return x


def random_splits(rng, m: int, g: int, empty: bool = True) -> np.ndarray:
    """int64 ``[g]`` random rows per expert summing to ``m``; with ``empty`` (and ``g > 2``)
    expert 2 gets none."""
    cuts = np.sort(rng.integers(0, m + 1, g - 1))
    s = np.diff(np.concatenate([[0], cuts, [m]])).astype(np.int64)
    if empty and g > 2:
        s[1] += s[2]
        s[2] = 0
    return s


def capture_graph(step):
    """Capture one call of ``step()`` into a CUDA graph, after two eager calls that compile the
    kernels and fill the caches and a private memory pool (a capture may not allocate).

    Returns ``(out, replay)``: the captured call's outputs, and a function that waits for the
    current stream (new inputs written in place), launches the graph and waits for it; the
    outputs then hold the replayed step's results.
    """
    import cupy as cp

    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.using_allocator(pool.malloc), stream:
        for _ in range(2):
            warm = step()
        del warm
        stream.synchronize()
        stream.begin_capture()
        out = step()
        graph = stream.end_capture()

    def replay():
        cp.cuda.get_current_stream().synchronize()
        graph.launch(stream)
        stream.synchronize()

    replay.pool = pool  # the graph's buffers live in it
    return out, replay


def assert_source_has(name: str, *texts: str) -> None:
    """Assert that raw_kernels/<name> contains every text (the expressions a CPU emulation of
    that kernel mirrors); the message names the first one missing."""
    from lowprec_moe import kernels

    src = kernels.source_path(name).read_text()
    for text in texts:
        assert text in src, f"{name} no longer contains: {text}"


def set_gemm_options(monkeypatch, **options):
    """Set :class:`lowprec_moe.config.GemmOptions` (``kernel=``, ``mxfp8_mma=``) for the rest of
    a test, undone by ``monkeypatch`` at its end (the ``with lowprec_moe.config.gemm(...)``
    block for tests that switch options mid-way)."""
    import contextvars

    from lowprec_moe import config

    opts = config.GemmOptions(**options)
    monkeypatch.setattr(config, "_gemm", contextvars.ContextVar("test_gemm_options", default=opts))
    return opts


def gemm_internals():
    """One namespace over the grouped-GEMM launcher's host modules (plan, smem, TMA rules,
    selection rules, launch), for tests that check their constants and tables."""
    import types

    from lowprec_moe.backends.cupy.gemm import launch, plan, rules, select, smem, tma_rules

    ns = types.SimpleNamespace()
    for mod in (plan, smem, tma_rules, rules, select, launch):
        for k, v in vars(mod).items():
            if not k.startswith("__"):
                setattr(ns, k, v)
    return ns


def set_kernel_dir(monkeypatch, directory):
    """Compile kernels from ``directory`` for the rest of a test
    (:func:`lowprec_moe.config.kernel_directory` without the ``with`` block)."""
    import contextvars
    import os

    from lowprec_moe import config

    monkeypatch.setattr(config, "_kernel_dir", contextvars.ContextVar(
        "test_kernel_dir", default=None if directory is None else os.fspath(directory)))
