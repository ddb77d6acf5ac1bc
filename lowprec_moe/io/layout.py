"""How a QuantizedTensor / GroupedTensor maps to named arrays, and back.

See :mod:`lowprec_moe.io.checkpoint` for the table of names. :func:`flatten` turns a tensor into
host arrays plus a JSON-able metadata entry; :func:`plan` checks an entry against the arrays'
headers (dtype and shape only, before any data is read) and :func:`build` rebuilds the tensor.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from lowprec_moe import formats as F
from lowprec_moe import quant_formats
from lowprec_moe.backend import asnumpy_explicit
from lowprec_moe.tensors.grouped_tensor import (GroupedTensor, _offsets, columnwise_offsets,
                                               columnwise_sizes)
from lowprec_moe.tensors.quantized_tensor import QuantizedTensor
from lowprec_moe.io._common import CheckpointError, describe

__all__ = ["array_names", "flatten", "check_entry", "plan", "build", "bad"]

_SUFFIX = {"rowwise_data": "", "rowwise_scale": "_scale", "rowwise_scale_2": "_scale_2",
           "amax_rowwise": "_amax", "columnwise_data": "_columnwise",
           "columnwise_scale": "_columnwise_scale", "columnwise_scale_2": "_columnwise_scale_2",
           "amax_columnwise": "_columnwise_amax"}
_AMAX_OF = {"rowwise_scale_2": "amax_rowwise", "columnwise_scale_2": "amax_columnwise"}
_BYTE_FIELDS = ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale")
_OPTIONS = ("row_scaled", "block_2d", "rht", "stochastic_rounding")
_E4M3, _E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
_FP8 = {"e4m3": _E4M3, "e5m2": _E5M2}
#: Serving-layout arrays that carry no field of their own: compressed-tensors' global scale
#: (``NVFP4_AMAX_DIVISOR / amax``, the reciprocal of ModelOpt's ``weight_scale_2``).
_AUX = {"rowwise_global_scale": "amax_rowwise"}


def array_names(name: str, format: str, *, rowwise: bool = True,
                columnwise: bool = False) -> list[str]:
    """The array names a quantized tensor called ``name`` occupies in a file."""
    fields = [f for f in _SUFFIX if (rowwise and "rowwise" in f) or (columnwise and "columnwise"
                                                                      in f)]
    if not quant_formats.get(format).has_amax:
        fields = [f for f in fields if f in _BYTE_FIELDS]
    return [name + _SUFFIX[f] for f in fields]


def _storage_dtype(t, field: str) -> np.dtype | None:
    """The dtype a byte field is labelled with (None: plain uint8)."""
    if t.format == "nvfp4":
        return _E4M3 if field.endswith("scale") else None
    return _FP8[t.fp8_dtype] if field.endswith("data") else None


def flatten(name: str, t) -> tuple[list[tuple[str, np.ndarray]], dict[str, Any]]:
    """Host arrays and the metadata entry of one QuantizedTensor / GroupedTensor."""
    grouped = isinstance(t, GroupedTensor)
    if grouped:
        t = t.with_host_splits()  # a file stores host splits and trimmed buffers
    entry: dict[str, Any] = {"type": type(t).__name__, "format": t.format,
                             "shape": [int(s) for s in t.shape], "fp8_dtype": t.fp8_dtype,
                             **{o: bool(getattr(t, o)) for o in _OPTIONS}, "seed": int(t.seed)}
    if grouped:
        entry["splits"] = [int(s) for s in t.splits]
        if t.columnwise_data is not None:
            _check_grouped_offsets(name, t)
    else:
        entry["member_index"] = int(t.member_index)
    arrays, names = [], {}
    for field in _SUFFIX:
        if field.endswith("scale_2"):
            continue
        a = getattr(t, field)
        if a is None:
            continue
        a = np.ascontiguousarray(asnumpy_explicit(a))
        if field in _BYTE_FIELDS:
            dt = _storage_dtype(t, field)
            a = a.view(dt) if dt is not None else a
        arrays.append((name + _SUFFIX[field], a))
        names[field] = name + _SUFFIX[field]
        if field.startswith("amax"):
            s2 = field.replace("amax_", "") + "_scale_2"
            v = (a.astype(np.float32) / np.float32(F.NVFP4_AMAX_DIVISOR)).astype(np.float32)
            if not grouped and not t.row_scaled:
                v = v.reshape(())
            arrays.append((name + _SUFFIX[s2], v))
            names[s2] = name + _SUFFIX[s2]
    if t.format == "nvfp4":
        div = f"amax / {F.NVFP4_AMAX_DIVISOR:g}"
        entry["scale_2"] = (f"{div} per row (row-scaled; columnwise: per column)"
                            if t.row_scaled else
                            f"{div} per member" if grouped else f"{div} per tensor")
    entry["arrays"] = names
    return arrays, entry


def _check_grouped_offsets(name, t: GroupedTensor) -> None:
    k = t.shape[1]
    want_d, want_s = columnwise_offsets(t.format, t.splits, k)
    if not (np.array_equal(np.asarray(t.columnwise_data_offsets), want_d)
            and np.array_equal(np.asarray(t.columnwise_scale_offsets), want_s)):
        raise ValueError(f"tensor {name!r}: columnwise offsets do not follow the packed layout "
                         f"(data {list(map(int, t.columnwise_data_offsets))}, expected "
                         f"{want_d.tolist()}); it cannot be saved")


# --------------------------------------------------------------------------------- loading
def bad(name: str, what: str) -> CheckpointError:
    return CheckpointError(f"tensor {name!r}: {what}")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_entry(name: str, e: dict) -> None:
    if not isinstance(e, dict):
        raise bad(name, f"metadata entry must be an object, got {describe(e)}")
    if e.get("format") not in F.FORMATS:
        raise bad(name, f"format={e.get('format')!r} must be one of {F.FORMATS}")
    shape = e.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2 and all(_int(s) and s >= 0
                                                                for s in shape)):
        raise bad(name, f"shape={shape!r} must be two non-negative ints")
    block = quant_formats.get(e["format"]).block
    if shape[1] % block:
        raise bad(name, f"K={shape[1]} must be a multiple of {block} for {e['format']}")
    want_fp8 = F.FP8_DTYPES if e["format"] == "mxfp8" else (None,)
    if e.get("fp8_dtype") not in want_fp8:
        raise bad(name, f"fp8_dtype={e.get('fp8_dtype')!r} must be one of {want_fp8}")
    for o in _OPTIONS:
        if not isinstance(e.get(o, False), bool):
            raise bad(name, f"{o}={e.get(o)!r} must be true or false")
    if not (_int(e.get("seed", 0)) and 0 <= e.get("seed", 0) < 2**64):
        raise bad(name, f"seed={e.get('seed')!r} must be an int in [0, 2**64)")
    arrays = e.get("arrays")
    if not isinstance(arrays, dict) or not arrays or not all(
            f in _SUFFIX and isinstance(k, str) for f, k in arrays.items()):
        raise bad(name, f"arrays={arrays!r} must map field names to array names")
    exact = e.get("amax_values", {})
    if not isinstance(exact, dict) or not all(
            f in _AMAX_OF.values() and isinstance(v, list) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                and x >= 0 for x in v) for f, v in exact.items()):
        raise bad(name, f"amax_values={exact!r} must map amax fields to lists of finite "
                         "non-negative numbers")
    if exact and e["format"] != "nvfp4":
        raise bad(name, "amax_values belong to nvfp4 tensors only")
    aux = e.get("aux_arrays", {})
    if not isinstance(aux, dict) or not all(
            k in _AUX and isinstance(v, str) for k, v in aux.items()):
        raise bad(name, f"aux_arrays={aux!r} must map {sorted(_AUX)} to array names")
    if e.get("type") == "GroupedTensor":
        splits = e.get("splits")
        if not (isinstance(splits, list) and splits and all(_int(s) and s >= 0 for s in splits)
                and sum(splits) == shape[0]):
            raise bad(name, f"splits={splits!r} must be non-negative ints summing to "
                             f"M={shape[0]}")
    elif not (_int(e.get("member_index", 0)) and e.get("member_index", 0) >= 0):
        raise bad(name, f"member_index={e.get('member_index')!r} must be a non-negative int")


def _expected_shapes(e: dict) -> dict[str, tuple]:
    fmt, (m, k) = e["format"], e["shape"]
    rs = e.get("row_scaled", False)
    if fmt == "nvfp4":
        out = {"rowwise_data": (m, k // 2), "rowwise_scale": (m, k // F.NVFP4_BLOCK)}
    else:
        out = {"rowwise_data": (m, k), "rowwise_scale": (m, k // F.MXFP8_BLOCK)}
    if e["type"] == "GroupedTensor":
        g = len(e["splits"])
        sizes = [columnwise_sizes(fmt, s, k) for s in e["splits"]]
        out.update(columnwise_data=(sum(s[0] for s in sizes),),
                   columnwise_scale=(sum(s[1] for s in sizes),),
                   amax_rowwise=(m,) if rs else (g,), amax_columnwise=(g, k) if rs else (g,))
    else:
        _, _, dshape, sshape = columnwise_sizes(fmt, m, k)
        out.update(columnwise_data=dshape, columnwise_scale=sshape,
                   amax_rowwise=(m,) if rs else (1,), amax_columnwise=(k,) if rs else (1,))
    return out


def plan(name: str, e: dict, info) -> dict[str, str]:
    """Check a tensor's arrays from their headers alone (``info(key) -> (dtype, shape)``).

    Returns ``{field: array name}`` of the arrays to read (an amax may come from ``_scale_2``).
    """
    check_entry(name, e)
    shapes = _expected_shapes(e)
    t = type("T", (), {"format": e["format"], "fp8_dtype": e.get("fp8_dtype")})
    plan: dict[str, str] = {}
    for field, key in e["arrays"].items():
        dtype, shape = info(key)
        if field in _BYTE_FIELDS:
            allowed = {np.dtype(np.uint8), _storage_dtype(t, field)}
            if dtype not in allowed:
                raise bad(name, f"array {key!r} has dtype {dtype}, expected one of "
                                 f"{sorted(str(d) for d in allowed if d is not None)}")
        elif e["format"] != "nvfp4":
            raise bad(name, f"array {key!r}: {field} is not part of an {e['format']} tensor")
        elif dtype != np.float32:
            raise bad(name, f"array {key!r} has dtype {dtype}, expected float32")
        if field in _AMAX_OF:
            if _AMAX_OF[field] in e["arrays"]:
                continue  # the exact amax is stored too
            field = _AMAX_OF[field]
            shape = (1,) if len(shape) != 1 and math.prod(shape) == 1 else shape
        if tuple(shape) != shapes[field]:
            raise bad(name, f"array {key!r} has shape {tuple(shape)}, expected "
                             f"{shapes[field]} for {e['format']} {tuple(e['shape'])}")
        plan[field] = key
    exact = e.get("amax_values", {})
    for field, values in exact.items():
        if (len(values),) != shapes[field]:
            raise bad(name, f"amax_values[{field!r}] has {len(values)} values, expected "
                             f"{shapes[field][0]}")
        if field not in plan and any(f.startswith(field.split("_")[1]) for f in plan):
            plan[field] = None  # exact values from the metadata, not an array
    for field, key in e.get("aux_arrays", {}).items():
        dtype, shape = info(key)
        if dtype != np.float32 or math.prod(shape) != shapes[_AUX[field]][0]:
            raise bad(name, f"array {key!r} has dtype {dtype} and shape {tuple(shape)}, "
                             f"expected float32 with {shapes[_AUX[field]][0]} values")
    for direction in ("rowwise", "columnwise"):
        need = [f"{direction}_data", f"{direction}_scale"]
        if e["format"] == "nvfp4":
            need.append(f"amax_{direction}")
        have = [f in plan for f in need]
        if any(have) and not all(have):
            raise bad(name, f"incomplete {direction} copy: needs {', '.join(need)}")
    if "rowwise_data" not in plan and "columnwise_data" not in plan:
        raise bad(name, "holds neither a rowwise nor a columnwise copy")
    return plan


def _check_derived(name: str, key: str, stored: np.ndarray, want: np.ndarray) -> None:
    """A stored scale must agree with the exact amax of the metadata (else: contradiction)."""
    got = np.asarray(stored, np.float32).reshape(-1)
    if got.shape != want.reshape(-1).shape or got.tobytes() != want.astype(np.float32).reshape(
            -1).tobytes():
        raise bad(name, f"array {key!r} ({got[:4].tolist()}) contradicts the amax recorded in "
                         "the metadata")


def build(name: str, e: dict, arrays) -> QuantizedTensor | GroupedTensor:
    """Rebuild one tensor from its metadata entry and the file's ``arrays`` reader."""
    fields: dict[str, Any] = {}
    exact = e.get("amax_values", {})
    for field, key in plan(name, e, arrays.info).items():
        if field in exact:
            a = np.array(exact[field], np.float32)
            if key is not None:
                _check_derived(name, key, arrays.get(key), a / np.float32(F.NVFP4_AMAX_DIVISOR))
        else:
            a = arrays.get(key)
        if field in _BYTE_FIELDS:
            a = a.view(np.uint8)
        elif field not in exact and e["arrays"].get(field) != key:
            # amax from scale_2 (a ModelOpt checkpoint without the exact amax)
            a = (a * np.float32(F.NVFP4_AMAX_DIVISOR)).astype(np.float32).reshape(-1)
        fields[field] = a
    for field, key in e.get("aux_arrays", {}).items():
        amax = fields.get(_AUX[field])
        if amax is not None:
            with np.errstate(divide="ignore"):
                want = np.float32(F.NVFP4_AMAX_DIVISOR) / amax.astype(np.float32)
            _check_derived(name, key, arrays.get(key), want)
    common = dict(format=e["format"], shape=tuple(e["shape"]), fp8_dtype=e.get("fp8_dtype"),
                  seed=e.get("seed", 0), **{o: e.get(o, False) for o in _OPTIONS}, **fields)
    if e["type"] == "QuantizedTensor":
        return QuantizedTensor(member_index=e.get("member_index", 0), **common)
    splits = tuple(e["splits"])
    if "columnwise_data" in fields:
        d_off, s_off = columnwise_offsets(e["format"], splits, e["shape"][1])
        common.update(columnwise_data_offsets=d_off, columnwise_scale_offsets=s_off)
    return GroupedTensor(splits=splits, offsets=_offsets(splits), **common)
