"""File-level operations behind the CLI: quantize, dequantize and inspect checkpoints.

Each function streams: it reads one memory-mapped tensor, converts it, writes it to the output
and lets it go, so peak memory is about one tensor (plus its temporaries), not the file. Outputs
are published atomically (nothing is left at the destination on failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import ml_dtypes
import numpy as np

from lowprec_moe import _validate as V
from lowprec_moe import formats as F
from lowprec_moe.tensors.grouped_tensor import GroupedTensor
from lowprec_moe.tensors.quantized_tensor import QuantizedTensor
from lowprec_moe.io.checkpoint import Checkpoint, open_checkpoint

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
    #: ``(stack name, experts, per-expert name pattern)`` of expert stacks written per expert.
    split: list[tuple[str, int, str]] = field(default_factory=list)
    #: Expert stacks kept fused (one grouped tensor, one amax per expert).
    fused: list[str] = field(default_factory=list)
    #: Modules of float matrices left unquantized (the config's ``exclude_modules``).
    excluded_modules: list[str] = field(default_factory=list)
    #: Array layout of the quantized tensors (see :mod:`lowprec_moe.io.serving`).
    layout: str = "lowprec"
    #: Files of a directory output.
    files: list[str] = field(default_factory=list)


def select_device(device: str):
    """``numpy`` or ``cupy`` for ``device`` in {"auto", "cpu", "gpu"} ("auto": GPU if usable).

    Raises
    ------
    ValueError
        Unknown device, or "gpu" without CuPy and a CUDA GPU.
    """
    from lowprec_moe.backend import cupy_available

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


def quantize_file(src, dst, format: str, *, columnwise: bool = False, row_scaled: bool = False,
                  block_2d: bool = False, fp8_dtype: str | None = None,
                  keys: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
                  experts: str = "split", grouped: bool = False, layout: str = "modelopt",
                  device: str = "cpu", allow_nonfinite: bool = False, force: bool = False,
                  jobs: int | None = None, progress=None) -> ConvertReport:
    """Quantize the float matrices of a checkpoint: a file, a sharded index or a directory.

    Parameters
    ----------
    src : path
        A .npy, .npz or .safetensors file (memory-mapped), a ``*.safetensors.index.json`` or
        a model directory (``model.safetensors`` or shards with their index, ``config.json``).
    dst : path
        For a file input: a .safetensors or .npz file. Otherwise a directory with the input's
        shards, index, ``config.json`` (with ``quantization_config``), ``hf_quant_config.json``
        (ModelOpt layout) and the input directory's other files. Written atomically.
    format, columnwise, row_scaled, block_2d, fp8_dtype
        As in :func:`lowprec_moe.quantize` (a rowwise copy is always made).
    keys : sequence of str, optional
        Shell-style patterns; only matching tensors are quantized. A match also overrides
        the default exclusions (embeddings, ``lm_head``, router gates, norms, biases).
    exclude : sequence of str, optional
        Patterns of tensors never quantized.
    experts : {"split", "fused", "flat"}
        3-D float tensors ``[G, N, K]``: one tensor per expert named as per-expert checkpoints
        name them (default), one :class:`GroupedTensor` with one amax per expert, or one
        ``[G*N, K]`` matrix. ``grouped=True`` is the same as ``experts="fused"``.
    layout : {"modelopt", "compressed-tensors", "lowprec"}
        Array names and configs; see :mod:`lowprec_moe.io.serving`.
    device : {"cpu", "gpu", "auto"}
    allow_nonfinite : bool
        Quantize tensors holding NaN / inf (by the hardware rules) instead of refusing them.
    force : bool
        Replace an existing output (never an input).
    jobs : int, optional
        Tensors quantized at once on the CPU (threads; default: the usable cores, at most 8).
        The output does not depend on it.
    progress : object, optional
        ``start(total_bytes, label)``, ``advance(nbytes, name)``, ``finish()``; see
        :mod:`lowprec_moe.io.progress`.

    Returns
    -------
    ConvertReport
        Tensors that were not selected or cannot be quantized are copied unchanged and listed
        in ``copied`` with the reason; ``split`` / ``fused`` say what became of expert stacks.

    Raises
    ------
    ValueError
        Bad options, an output that is an input or exists without ``force``, a refused or
        inconsistent input (:class:`CheckpointError`), non-finite values, no tensor matching
        ``keys``, name collisions. Messages name the file and the tensor.
    OSError
        Unreadable input or unwritable output.
    NotImplementedError
        The GPU kernels are not available for this operation.
    """
    from lowprec_moe.io.pipeline import quantize_model

    return quantize_model(src, dst, format, layout=layout, columnwise=columnwise,
                          row_scaled=row_scaled, block_2d=block_2d, fp8_dtype=fp8_dtype,
                          keys=keys, exclude=exclude, experts="fused" if grouped else experts,
                          device=device, allow_nonfinite=allow_nonfinite, force=force,
                          jobs=jobs, progress=progress)


def _original_shape(e: dict, size: int) -> tuple | None:
    shape = e.get("original_shape")
    if (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)
            and math.prod(shape) == size):
        return tuple(shape)
    return None


def dequantize_file(src, dst, *, dtype: str | None = None, direction: str = "rowwise",
                    force: bool = False, progress=None) -> ConvertReport:
    """Dequantize every quantized tensor of a checkpoint (file, index or directory).

    Values equal :func:`lowprec_moe.dequantize` bit for bit, in each tensor's original dtype
    unless ``dtype`` is given; tensors get their original shape back and expert stacks split
    by :func:`quantize_file` are stacked again. Plain arrays are copied unchanged. A ``.npy``
    output needs a file with exactly one tensor and a dtype NumPy reads (not bfloat16).

    Raises
    ------
    ValueError
        Bad ``dtype`` / ``direction``, an output that is an input or exists without ``force``,
        a file without quantized tensors, a tensor without the requested copy, an inconsistent
        input (:class:`CheckpointError`).
    OSError
        Unreadable input or unwritable output.
    """
    from lowprec_moe.io.pipeline import dequantize_model

    return dequantize_model(src, dst, dtype=dtype, direction=direction, force=force,
                            progress=progress)


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
