"""File-level operations behind the CLI: quantize, dequantize and inspect checkpoints.

Each function streams: it reads one memory-mapped tensor, converts it, writes it to the output
and lets it go, so peak memory is about one tensor (plus its temporaries), not the file. Outputs
are published atomically (nothing is left at the destination on failure).
"""

from __future__ import annotations

import fnmatch
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import ml_dtypes
import numpy as np

from .. import _validate as V
from .. import formats as F
from ..grouped_tensor import GroupedTensor
from ..quantized_tensor import QuantizedTensor, quantize
from ._common import CheckpointError
from .arrays import file_kind
from .checkpoint import Checkpoint, CheckpointWriter, array_names, open_checkpoint

__all__ = ["ConvertReport", "quantize_options", "select_device", "quantize_file",
           "dequantize_file", "inspect_file"]

_FLOATS = ("float32", "float16", "bfloat16")
Progress = Callable[[Sequence[str], str], Iterable[str]]


def _no_progress(items: Sequence[str], label: str) -> Iterable[str]:
    return items


@dataclass
class ConvertReport:
    """What a conversion did: tensors converted, tensors copied unchanged (with why), sizes."""

    output: str
    converted: list[str] = field(default_factory=list)
    copied: list[tuple[str, str]] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0


def select_device(device: str):
    """``numpy`` or ``cupy`` for ``device`` in {"auto", "cpu", "gpu"} ("auto": GPU if usable).

    Raises
    ------
    ValueError
        Unknown device, or "gpu" without CuPy and a CUDA GPU.
    """
    from ..backend import cupy_available

    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device={device!r} must be 'auto', 'cpu' or 'gpu'")
    if device == "auto":
        device = "gpu" if cupy_available() else "cpu"
    if device == "cpu":
        return np
    if not cupy_available():
        raise ValueError("device='gpu' needs CuPy and a CUDA GPU (pip install -e '.[gpu]')")
    import cupy

    return cupy


def quantize_options(format: str, *, columnwise: bool = False, row_scaled: bool = False,
                     block_2d: bool = False, fp8_dtype: str | None = None) -> dict[str, Any]:
    """Validate a combination of options; return the keywords for :func:`quantize`.

    ``fp8_dtype=None`` means the format's default ("e4m3"; nvfp4 accepts only that).
    """
    V.check_format(format)
    opts = dict(rowwise=True, columnwise=bool(columnwise), row_scaled=bool(row_scaled),
                block_2d=bool(block_2d), rht=False, stochastic_rounding=False,
                fp8_dtype=fp8_dtype or "e4m3")
    if format == "nvfp4" and fp8_dtype not in (None, "e4m3"):
        raise ValueError(f"fp8_dtype={fp8_dtype!r} applies to mxfp8 only")
    V.check_options(format, dtype=np.float32, **opts)
    del opts["rht"], opts["stochastic_rounding"]
    return opts


def _why_not(dtype: np.dtype, shape: tuple, format: str, opts: dict, grouped: bool) -> str | None:
    """Why a tensor cannot be quantized with these options (None: it can)."""
    b = V.block_size(format)
    if dtype.name not in _FLOATS:
        return f"dtype {dtype.name} (only float32, float16 and bfloat16 are quantized)"
    if len(shape) < 2:
        return f"rank {len(shape)} (only matrices are quantized)"
    if math.prod(shape) == 0:
        return f"empty shape {list(shape)}"
    if shape[-1] % b:
        return f"K={shape[-1]} is not a multiple of {b} for {format}"
    rows = shape[-2] if grouped and len(shape) == 3 else math.prod(shape[:-1])
    if opts["block_2d"] and rows % b:
        return f"M={rows} is not a multiple of {b} for 2-D blocks"
    return None


def _all_finite(x2, xp) -> bool:
    step = max(1, (1 << 24) // max(1, x2.shape[1]))
    return all(bool(xp.isfinite(x2[i:i + step].astype(xp.float32)).all())
               for i in range(0, x2.shape[0], step))


def quantize_file(src, dst, format: str, *, columnwise: bool = False, row_scaled: bool = False,
                  block_2d: bool = False, fp8_dtype: str | None = None,
                  keys: Sequence[str] | None = None, grouped: bool = False,
                  device: str = "cpu", allow_nonfinite: bool = False,
                  progress: Progress = _no_progress) -> ConvertReport:
    """Quantize the float matrices of ``src`` into ``dst`` (.safetensors or .npz).

    Parameters
    ----------
    src : path
        .npy, .npz or .safetensors input (memory-mapped).
    dst : path
        .safetensors or .npz output, written atomically (see :mod:`lowprec_moe.io.checkpoint`
        for the names).
    format, columnwise, row_scaled, block_2d, fp8_dtype
        As in :func:`lowprec_moe.quantize` (a rowwise copy is always made).
    keys : sequence of str, optional
        Shell-style patterns; only matching tensors are quantized. None: all.
    grouped : bool
        Quantize 3-D tensors ``[G, N, K]`` as a :class:`GroupedTensor` of G experts (one amax
        each) instead of one ``[G*N, K]`` matrix.
    device : {"cpu", "gpu", "auto"}
    allow_nonfinite : bool
        Quantize tensors holding NaN / inf (by the hardware rules) instead of refusing them.
    progress : callable, optional
        ``progress(names, label)`` returns an iterable over ``names`` (e.g. a progress bar).

    Returns
    -------
    ConvertReport
        Tensors that were not selected or cannot be quantized (rank < 2, wrong K, integer
        dtypes ...) are copied unchanged and listed in ``copied`` with the reason.

    Raises
    ------
    ValueError
        Bad options, a refused or inconsistent input (:class:`CheckpointError`), non-finite
        values, no tensor matching ``keys``, name collisions.
    OSError
        Unreadable input or unwritable output.
    NotImplementedError
        The GPU kernels are not available for this operation.
    """
    opts = quantize_options(format, columnwise=columnwise, row_scaled=row_scaled,
                            block_2d=block_2d, fp8_dtype=fp8_dtype)
    if file_kind(dst) == "npy":
        raise ValueError(f"output {os.fspath(dst)!r}: quantized tensors need .safetensors or .npz")
    xp = select_device(device)
    with open_checkpoint(src) as ck:
        done = [n for n, e in ck.entries.items() if e["type"] != "array"]
        if done:
            raise CheckpointError(f"{os.fspath(src)!r} already holds quantized tensors "
                                  f"({', '.join(done[:3])}); dequantize it first")
        names = ck.names()
        plan: dict[str, str | None] = {}
        for name in names:
            e = ck.entries[name]
            if keys and not any(fnmatch.fnmatchcase(name, g) for g in keys):
                plan[name] = "not selected by --keys"
            else:
                plan[name] = _why_not(np.dtype(ck.arrays.info(name)[0]), tuple(e["shape"]),
                                      format, opts, grouped)
        if keys and all(r == "not selected by --keys" for r in plan.values()):
            raise ValueError(f"no tensor name matches keys={list(keys)} (names: "
                             f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''})")
        _check_collisions(plan, format, opts["columnwise"])
        report = ConvertReport(output=os.fspath(dst))
        with CheckpointWriter(dst) as w:
            for name in progress(names, "quantizing"):
                a = ck.get(name)
                report.bytes_in += int(a.nbytes)
                if plan[name] is not None:
                    w.add(name, a, note=f"not quantized: {plan[name]}")
                    report.copied.append((name, plan[name]))
                    continue
                w.add(name, _quantize_one(name, a, format, opts, grouped, xp, allow_nonfinite),
                      original_shape=list(a.shape), original_dtype=a.dtype.name)
                report.converted.append(name)
            w.commit(ck.metadata)
    report.bytes_out = os.path.getsize(dst)
    return report


def _check_collisions(plan: dict, format: str, columnwise: bool) -> None:
    owner: dict[str, str] = {}
    for name, reason in plan.items():
        outs = [name] if reason else array_names(name, format, columnwise=columnwise)
        for out in outs:
            if out in owner:
                raise ValueError(f"name clash: output array {out!r} is needed by both tensor "
                                 f"{owner[out]!r} and tensor {name!r} (a quantized tensor NAME "
                                 "also writes NAME_scale, NAME_amax ...); exclude one with --keys")
            owner[out] = name


def _quantize_one(name, a, format, opts, grouped, xp, allow_nonfinite):
    x = a if xp is np else xp.asarray(np.ascontiguousarray(a))
    x2 = x.reshape(-1, x.shape[-1])
    if not allow_nonfinite and not _all_finite(x2, xp):
        raise ValueError(f"tensor {name!r} contains NaN or inf values; refusing to quantize it "
                         "(allow them with --allow-nonfinite)")
    if grouped and x.ndim == 3:
        return GroupedTensor.quantize(x2, [x.shape[1]] * x.shape[0], format, **opts)
    return quantize(x2, format, **opts)


def _original_shape(e: dict, size: int) -> tuple | None:
    shape = e.get("original_shape")
    if (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)
            and math.prod(shape) == size):
        return tuple(shape)
    return None


def dequantize_file(src, dst, *, dtype: str = "float32", direction: str = "rowwise",
                    progress: Progress = _no_progress) -> ConvertReport:
    """Dequantize every quantized tensor of ``src`` into ``dst`` (.safetensors, .npz or .npy).

    Values equal :func:`lowprec_moe.dequantize` bit for bit; tensors quantized from rank > 2
    inputs get their original shape back. Plain arrays are copied unchanged. A ``.npy``
    output needs a file with exactly one tensor.

    Raises
    ------
    ValueError
        Bad ``dtype`` / ``direction``, a file without quantized tensors, a tensor without the
        requested copy, an inconsistent input (:class:`CheckpointError`).
    OSError
        Unreadable input or unwritable output.
    """
    dtype = V.check_dequant_dtype(dtype)
    V.check_direction(direction)
    with open_checkpoint(src) as ck:
        names = ck.names()
        quantized = [n for n in names if ck.entries[n]["type"] != "array"]
        if not quantized:
            raise CheckpointError(f"{os.fspath(src)!r} holds no quantized tensors")
        if file_kind(dst) == "npy" and len(names) != 1:
            raise ValueError(f"output {os.fspath(dst)!r}: a .npy file holds one array, the "
                             f"input has {len(names)} tensors; write .safetensors or .npz")
        report = ConvertReport(output=os.fspath(dst))
        with CheckpointWriter(dst) as w:
            for name in progress(names, "dequantizing"):
                t = ck.get(name)
                if not isinstance(t, (QuantizedTensor, GroupedTensor)):
                    w.add(name, t)
                    report.copied.append((name, "not quantized"))
                    continue
                if getattr(t, f"{direction}_data") is None:
                    raise ValueError(f"tensor {name!r} has no {direction} copy")
                x = t.dequantize(direction, dtype)
                shape = _original_shape(ck.entries[name], x.size)
                w.add(name, x.reshape(shape) if shape else x)
                report.converted.append(name)
            w.commit(ck.metadata)
    report.bytes_out = os.path.getsize(dst)
    return report


# ---------------------------------------------------------------------------------- inspect
def _scale_range(t) -> str:
    scales = [s for s in (t.rowwise_scale, t.columnwise_scale) if s is not None and s.size]
    if not scales:
        return "-"
    if t.format == "nvfp4":
        v = np.concatenate([s.reshape(-1).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
                            for s in scales])
        return f"{np.nanmin(v):.4g}..{np.nanmax(v):.4g}"
    codes = np.concatenate([s.reshape(-1) for s in scales])
    nan = " +NaN" if (codes == F.E8M0_NAN).any() else ""
    codes = codes[codes != F.E8M0_NAN]
    if not codes.size:
        return "NaN"
    return f"2^{int(codes.min()) - F.E8M0_BIAS}..2^{int(codes.max()) - F.E8M0_BIAS}{nan}"


def _describe_format(t) -> str:
    fmt = t.format + (f"-{t.fp8_dtype}" if t.fp8_dtype else "")
    tags = ["row+col" if t.rowwise_data is not None and t.columnwise_data is not None
            else "row" if t.rowwise_data is not None else "col"]
    if isinstance(t, GroupedTensor):
        tags.insert(0, f"{t.num_groups} groups")
    tags += [o.replace("_", "-") for o in ("row_scaled", "block_2d", "rht", "stochastic_rounding")
             if getattr(t, o)]
    return f"{fmt} ({', '.join(tags)})"


def _is_float(dtype: np.dtype) -> bool:
    """IEEE-like floats, including ml_dtypes' bfloat16 and fp8 types (kind 'V' in NumPy)."""
    return dtype.kind == "f" or dtype.name.startswith(("bfloat16", "float8_"))


def _compare(ref: np.ndarray, x_hat: np.ndarray) -> tuple[float, float]:
    """(SNR in dB, max |error| / amax of ref) in float64."""
    r = ref.astype(np.float64).reshape(-1)
    err = x_hat.astype(np.float64).reshape(-1) - r
    noise, signal = float(np.dot(err, err)), float(np.dot(r, r))
    amax = float(np.max(np.abs(r))) if r.size else 0.0
    snr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal else -math.inf)
    return snr, (float(np.max(np.abs(err))) / amax if amax else float(np.max(np.abs(err),
                                                                             initial=0.0)))


def inspect_file(path, against=None, *,
                 progress: Progress = _no_progress) -> list[dict[str, Any]]:
    """Describe every tensor of ``path``; compare it with ``against`` when given.

    Returns
    -------
    list of dict
        Per tensor: ``name``, ``format`` (quantized format and options, or the dtype of a plain
        array), ``shape``, ``bytes`` (in the file), ``amax`` (nvfp4: the stored amax; mxfp8: of
        the dequantized values; arrays: of the values), ``scale_range``, and with ``against``:
        ``snr_db`` and ``max_rel_err`` (``max |x_hat - x| / amax(x)``, from the rowwise copy, or
        the columnwise one if that is all there is) or ``note`` when no comparison is possible.
    """
    ref: Checkpoint | None = open_checkpoint(against) if against is not None else None
    try:
        with open_checkpoint(path) as ck:
            return [_inspect_one(ck, name, ref) for name in progress(ck.names(), "inspecting")]
    finally:
        if ref is not None:
            ref.close()


def _inspect_one(ck: Checkpoint, name: str, ref: Checkpoint | None) -> dict[str, Any]:
    e = ck.entries[name]
    t = ck.get(name)
    keys = [name] if e["type"] == "array" else list(e["arrays"].values())
    row: dict[str, Any] = {"name": name, "bytes": sum(
        math.prod(ck.arrays.info(k)[1]) * ck.arrays.info(k)[0].itemsize for k in keys),
        "snr_db": None, "max_rel_err": None, "note": None}
    if isinstance(t, (QuantizedTensor, GroupedTensor)):
        direction = "rowwise" if t.rowwise_data is not None else "columnwise"
        x_hat = t.dequantize(direction, "float32")
        amaxes = [a for a in (t.amax_rowwise, t.amax_columnwise) if a is not None and a.size]
        amax = (max(float(np.max(a)) for a in amaxes) if amaxes
                else float(np.max(np.abs(x_hat), initial=0.0)))
        shape = _original_shape(e, x_hat.size) or tuple(t.shape)
        row.update(format=_describe_format(t), shape=shape, amax=amax,
                   scale_range=_scale_range(t))
    else:
        x_hat = t
        amax = (float(np.nanmax(np.abs(t.astype(np.float32)), initial=0.0))
                if _is_float(t.dtype) and t.size else None)
        row.update(format=t.dtype.name, shape=tuple(t.shape), amax=amax, scale_range="-")
    if ref is not None:
        if name not in ref.entries or ref.entries[name]["type"] != "array":
            row["note"] = "not in the original"
            return row
        orig = ref.get(name)
        if orig.size != x_hat.size:
            row["note"] = f"original has shape {list(orig.shape)}"
        elif not all(_is_float(d) or d.kind in "iub" for d in (orig.dtype, x_hat.dtype)):
            row["note"] = "not numeric"
        else:
            row["snr_db"], row["max_rel_err"] = _compare(orig, x_hat)
    return row
