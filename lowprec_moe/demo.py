"""``lowprec-moe demo``: quantize / dequantize round trips and GroupedLinear steps, as tables.

Round trips: each row quantizes one random bfloat16 matrix with one recipe, dequantizes the copy
it produced and reports the storage size, the signal-to-noise ratio, the largest error relative to
the tensor's amax and the round-trip time.

GroupedLinear: each row runs one forward + backward of a small MoE layer (random bfloat16 tokens,
weights, bias and output gradient; skewed routing with an empty expert) with one recipe, and
reports the relative error (Frobenius) of y, dx and dW against float64 products of the
unquantized inputs, and the time of the step (all quantization included).
"""

from __future__ import annotations

import math
import sys
import time
from typing import IO, Any

import numpy as np

#: (format, label, quantize keywords, direction to dequantize)
CASES: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    ("nvfp4", "rowwise", {}, "rowwise"),
    ("nvfp4", "columnwise", {"rowwise": False, "columnwise": True}, "columnwise"),
    ("nvfp4", "2-D 16x16 blocks", {"block_2d": True}, "rowwise"),
    ("nvfp4", "row-scaled", {"row_scaled": True}, "rowwise"),
    ("nvfp4", "columnwise + RHT", {"rowwise": False, "columnwise": True, "rht": True},
     "columnwise"),
    ("nvfp4", "stochastic rounding", {"stochastic_rounding": True, "seed": 1}, "rowwise"),
    ("mxfp8", "e4m3 rowwise", {}, "rowwise"),
    ("mxfp8", "e4m3 columnwise", {"rowwise": False, "columnwise": True}, "columnwise"),
    ("mxfp8", "e5m2 rowwise", {"fp8_dtype": "e5m2"}, "rowwise"),
    ("mxfp8", "2-D 32x32 blocks", {"block_2d": True}, "rowwise"),
)

_DEVICES = ("auto", "cpu", "gpu")


def _select_device(device: str):
    from lowprec_moe.backend import cupy_available

    if device not in _DEVICES:
        raise ValueError(f"device={device!r} must be one of {_DEVICES}")
    if device == "auto":
        device = "gpu" if cupy_available() else "cpu"
    if device == "gpu":
        if not cupy_available():
            raise ValueError("device='gpu' needs CuPy and a CUDA GPU (pip install -e '.[gpu]')")
        import cupy

        return "gpu", cupy
    return "cpu", np


def _sync(xp) -> None:
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def _fmt_bytes(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / 1024:.1f} KiB"


def _random_input(m: int, k: int, seed: int) -> np.ndarray:
    """bfloat16 ``[m, k]``: normal values with row magnitudes spread over four decades."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    row_scale = 10.0 ** rng.uniform(-2.0, 2.0, size=(m, 1))
    x = rng.standard_normal((m, k)) * row_scale
    return x.astype(np.float32).astype(ml_dtypes.bfloat16)


def run_demo(device: str = "auto", *, m: int = 256, k: int = 1024, seed: int = 0,
             repeats: int = 3, file: IO[str] | None = None,
             linear: bool = True) -> list[dict[str, Any]]:
    """Print a table of quantize + dequantize round trips and return its rows.

    With ``linear`` (the default) a second table follows: one GroupedLinear forward + backward
    per recipe (:func:`run_linear_demo`, same device, seed and repeats).

    Parameters
    ----------
    device : {"auto", "cpu", "gpu"}
        ``"auto"`` uses the GPU (CuPy) when one is usable, else the NumPy reference.
    m, k : int
        Shape of the random input; ``m`` and ``k`` must be multiples of 32.
    seed : int
        Seed of the random input.
    repeats : int
        Timed round trips per row (after one warm-up); the median is reported.
    file : text stream, optional
        Where the table goes (standard output by default).

    Returns
    -------
    list of dict
        One dict per row with keys ``format``, ``options``, ``shape``, ``bytes``,
        ``input_bytes``, ``snr_db``, ``max_rel_err``, ``time_ms`` and ``error`` (None, or why
        the row could not run on this device).

    Raises
    ------
    ValueError
        For an unknown ``device``, a GPU request without a GPU, or a bad shape / count.
    """
    import lowprec_moe as lpm

    from lowprec_moe.backend import asnumpy_explicit

    for name, v in (("m", m), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % 32:
            raise ValueError(f"{name}={v!r} must be a positive multiple of 32")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be a positive int")
    out = file if file is not None else sys.stdout
    dev, xp = _select_device(device)

    x_host = _random_input(m, k, seed)
    ref = x_host.astype(np.float64)
    amax = float(np.max(np.abs(ref)))
    signal = float(np.sum(ref * ref))
    x = xp.asarray(x_host) if xp is not np else x_host
    input_bytes = int(x_host.nbytes)

    rows: list[dict[str, Any]] = []
    for fmt, label, kwargs, direction in CASES:
        row: dict[str, Any] = {
            "format": fmt, "options": label, "shape": (m, k), "bytes": None,
            "input_bytes": input_bytes, "snr_db": None, "max_rel_err": None,
            "time_ms": None, "error": None,
        }
        try:
            q = lpm.quantize(x, fmt, **kwargs)  # warm-up (and kernel compilation on the GPU)
            x_hat = lpm.dequantize(q, direction, dtype="float32")
            _sync(xp)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                q = lpm.quantize(x, fmt, **kwargs)
                x_hat = lpm.dequantize(q, direction, dtype="float32")
                _sync(xp)
                times.append(time.perf_counter() - t0)
        except NotImplementedError as exc:
            row["error"] = str(exc).split(";")[0]
            rows.append(row)
            continue
        err = asnumpy_explicit(x_hat).astype(np.float64) - ref
        noise = float(np.sum(err * err))
        row["bytes"] = int(q.nbytes)
        row["snr_db"] = math.inf if noise == 0 else 10.0 * math.log10(signal / noise)
        row["max_rel_err"] = float(np.max(np.abs(err))) / amax if amax else 0.0
        row["time_ms"] = 1e3 * float(np.median(times))
        rows.append(row)

    _print_table(rows, dev, m, k, input_bytes, out)
    if linear:
        print(file=out)
        run_linear_demo(device, seed=seed, repeats=repeats, file=out)
    return rows


def _print_table(rows, dev, m, k, input_bytes, out) -> None:
    head = ("format", "options", "shape", "bytes", "SNR dB", "max|err|/amax", "time ms")
    lines = []
    for r in rows:
        shape = f"{r['shape'][0]}x{r['shape'][1]}"
        if r["error"] is not None:
            lines.append((r["format"], r["options"], shape, "-", "-", "-", "n/a"))
            continue
        ratio = r["bytes"] / r["input_bytes"]
        lines.append((
            r["format"], r["options"], shape, f"{_fmt_bytes(r['bytes'])} ({ratio:.2f}x)",
            f"{r['snr_db']:.2f}", f"{r['max_rel_err']:.3e}", f"{r['time_ms']:.2f}",
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    left = {0, 1, 2}

    def fmt(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    print(f"lowprec_moe round trips on {dev}: random bfloat16 [{m}, {k}] "
          f"({_fmt_bytes(input_bytes)}), rows scaled over 4 decades", file=out)
    print(fmt(head), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for line in lines:
        print(fmt(line), file=out)
    for r in rows:
        if r["error"] is not None:
            print(f"n/a: {r['format']} {r['options']}: {r['error']}", file=out)


# ============================================================================================
# GroupedLinear section


def _linear_recipes():
    from lowprec_moe.layers.recipe import Recipe

    return (
        ("bf16", Recipe.bf16()),
        ("mxfp8 e4m3", Recipe.mxfp8()),
        ("mxfp8 hybrid (dy e5m2)", Recipe.mxfp8(fp8_format="hybrid")),
        ("nvfp4 (RHT + SR)", Recipe.nvfp4()),
        ("nvfp4 row-scaled", Recipe.nvfp4(row_scaled_activation=True)),
    )


#: default (experts, tokens, in features, out features) per device
LINEAR_SHAPES = {"cpu": (8, 512, 256, 128), "gpu": (8, 4096, 1024, 512)}


def demo_splits(tokens: int, experts: int) -> list[int]:
    """Skewed routing: shares proportional to experts-1, ..., 1, 0 (the last expert is empty)."""
    if experts == 1:
        return [tokens]
    w = np.arange(experts - 1, -1, -1, dtype=np.float64)
    s = np.floor(tokens * w / w.sum()).astype(np.int64)
    s[0] += tokens - int(s.sum())
    return [int(v) for v in s]


def _rel_err(got, ref: np.ndarray) -> float:
    from lowprec_moe.backend import asnumpy_explicit

    g = asnumpy_explicit(got).astype(np.float64)
    den = float(np.linalg.norm(ref))
    return float(np.linalg.norm(g - ref)) / den if den else float(np.linalg.norm(g))


def run_linear_demo(device: str = "auto", *, experts: int | None = None,
                    tokens: int | None = None, k: int | None = None, n: int | None = None,
                    seed: int = 0, repeats: int = 3,
                    file: IO[str] | None = None) -> list[dict[str, Any]]:
    """Print a table of GroupedLinear forward + backward steps, one per recipe; return its rows.

    Parameters
    ----------
    device : {"auto", "cpu", "gpu"}
    experts, tokens, k, n : int, optional
        Layer shape (``k`` in, ``n`` out features, multiples of 32); defaults from
        :data:`LINEAR_SHAPES` for the device.
    seed : int
        Seed of the random inputs.
    repeats : int
        Timed steps per recipe (after one warm-up); the median is reported.
    file : text stream, optional

    Returns
    -------
    list of dict
        Keys ``recipe``, ``shape`` ``(experts, tokens, k, n)``, ``err_y``, ``err_dx``,
        ``err_dw``, ``time_ms`` and ``error`` (None, or why the row could not run).
    """
    import ml_dtypes

    from lowprec_moe.layers.linear import grouped_linear_backward, grouped_linear_forward

    out = file if file is not None else sys.stdout
    dev, xp = _select_device(device)
    defaults = LINEAR_SHAPES[dev]
    experts, tokens, k, n = (d if v is None else v
                             for v, d in zip((experts, tokens, k, n), defaults))
    for name, v in (("experts", experts), ("tokens", tokens), ("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}={v!r} must be a positive int")
    for name, v in (("k", k), ("n", n)):
        if v % 32:
            raise ValueError(f"{name}={v} must be a multiple of 32")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be a positive int")
    splits = demo_splits(tokens, experts)

    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng(seed)
    host = {
        "x": rng.standard_normal((tokens, k)) * 10.0 ** rng.uniform(-1, 1, (tokens, 1)),
        "w": rng.standard_normal((experts, n, k)) / np.sqrt(k),
        "b": 0.1 * rng.standard_normal((experts, n)),
        "dy": rng.standard_normal((tokens, n)) / np.sqrt(tokens),
    }
    host = {key: v.astype(np.float32).astype(bf16) for key, v in host.items()}
    f64 = {key: v.astype(np.float64) for key, v in host.items()}
    offs = np.concatenate([[0], np.cumsum(splits)])
    ref_y, ref_dx = np.empty((tokens, n)), np.empty((tokens, k))
    ref_dw = np.zeros((experts, n, k))
    for g in range(experts):
        s = slice(offs[g], offs[g + 1])
        ref_y[s] = f64["x"][s] @ f64["w"][g].T + f64["b"][g]
        ref_dx[s] = f64["dy"][s] @ f64["w"][g]
        ref_dw[g] = f64["dy"][s].T @ f64["x"][s]
    dvc = {key: (xp.asarray(v) if xp is not np else v) for key, v in host.items()}

    def step(recipe, seed_):
        y, ctx = grouped_linear_forward(dvc["x"], splits, dvc["w"], dvc["b"], recipe=recipe,
                                        seed=seed_)
        return y, grouped_linear_backward(dvc["dy"], ctx)

    rows: list[dict[str, Any]] = []
    for label, recipe in _linear_recipes():
        row: dict[str, Any] = {"recipe": label, "shape": (experts, tokens, k, n), "err_y": None,
                               "err_dx": None, "err_dw": None, "time_ms": None, "error": None}
        try:
            y, grads = step(recipe, 0)  # warm-up (and kernel compilation on the GPU)
            _sync(xp)
            times = []
            for r in range(repeats):
                t0 = time.perf_counter()
                step(recipe, r + 1)
                _sync(xp)
                times.append(time.perf_counter() - t0)
        except NotImplementedError as exc:
            row["error"] = str(exc).split(";")[0]
            rows.append(row)
            continue
        row["err_y"] = _rel_err(y, ref_y)
        row["err_dx"] = _rel_err(grads.dx, ref_dx)
        row["err_dw"] = _rel_err(grads.dweight, ref_dw)
        row["time_ms"] = 1e3 * float(np.median(times))
        rows.append(row)

    head = ("recipe", "rel err y", "rel err dx", "rel err dW", "fwd+bwd ms")
    lines = []
    for r in rows:
        if r["error"] is not None:
            lines.append((r["recipe"], "-", "-", "-", "n/a"))
        else:
            lines.append((r["recipe"], f"{r['err_y']:.3e}", f"{r['err_dx']:.3e}",
                          f"{r['err_dw']:.3e}", f"{r['time_ms']:.2f}"))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    print(f"GroupedLinear forward + backward on {dev}: {experts} experts, {tokens} tokens "
          f"routed as {splits}, {k} -> {n}, bfloat16; errors vs float64 of the unquantized "
          f"inputs", file=out)
    print(fmt(head), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for line in lines:
        print(fmt(line), file=out)
    for r in rows:
        if r["error"] is not None:
            print(f"n/a: {r['recipe']}: {r['error']}", file=out)
    return rows
