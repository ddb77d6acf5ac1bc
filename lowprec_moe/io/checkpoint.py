"""Save and load :class:`QuantizedTensor` / :class:`GroupedTensor` objects as named arrays.

Names (compatible with ModelOpt NVFP4 checkpoints)
-------------------------------------------------
A quantized tensor called ``w`` occupies these arrays (only the copies it has):

=========================  =====================================  ===============================
name                       nvfp4                                  mxfp8
=========================  =====================================  ===============================
``w``                      rowwise data, U8 (packed E2M1)         rowwise data, F8_E4M3 / F8_E5M2
``w_scale``                rowwise scales, F8_E4M3                rowwise scales, U8 (E8M0)
``w_scale_2``              F32 ``amax / NVFP4_AMAX_DIVISOR`` (ModelOpt's         --
                           ``weight_scale_2``)
``w_amax``                 F32 amax, exact                        --
``w_columnwise``           columnwise data                        columnwise data
``w_columnwise_scale``     columnwise scales                      columnwise scales
``w_columnwise_scale_2``   F32 ``amax / NVFP4_AMAX_DIVISOR``                    --
``w_columnwise_amax``      F32 amax, exact                        --
=========================  =====================================  ===============================

Scales are compact (unpadded, not swizzled). ``_scale_2`` is a scalar per tensor (as ModelOpt
writes it), ``[G]`` per member of a grouped tensor, and the amax vector divided by NVFP4_AMAX_DIVISOR when
row-scaled. ``.npz`` files use the same names and store fp8 bytes as uint8.

The ``__metadata__`` map holds ``"format": "pt"`` (safetensors only, which Hugging Face style
loaders expect) and ``"lowprec_moe"``: a JSON object with the library version, the layout version
and, per tensor, its type, format, shape, options and the names of its arrays. Loading is exact:
``load(save(t))`` equals ``t`` byte for byte in every field. A safetensors file without that
metadata is read as a ModelOpt NVFP4 checkpoint: ``w`` (U8), ``w_scale`` (F8_E4M3) and
``w_scale_2`` (F32 scalar) become a rowwise :class:`QuantizedTensor` with ``amax = w_scale_2 *
NVFP4_AMAX_DIVISOR``; every other array is returned as it is.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backend import asnumpy_explicit
from lowprec_moe.tensors.grouped_tensor import GroupedTensor
from lowprec_moe.tensors.quantized_tensor import QuantizedTensor
from lowprec_moe.io._common import CheckpointError, describe
from lowprec_moe.io.arrays import ArrayWriter, check_metadata, file_kind, open_arrays
from lowprec_moe.io.layout import array_names, bad, build, check_entry, flatten, plan
from lowprec_moe.io.safetensors import SafetensorsFile
from lowprec_moe.io.serving import to_layout

__all__ = ["save", "load", "open_checkpoint", "Checkpoint", "CheckpointWriter", "array_names",
           "META_KEY", "LAYOUT_VERSION"]

META_KEY = "lowprec_moe"
LAYOUT_VERSION = 1
_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


class Checkpoint:
    """A validated file of arrays and quantized tensors, read one tensor at a time.

    Attributes
    ----------
    entries : dict of str to dict
        Per logical tensor, in file order: ``{"type": "QuantizedTensor" | "GroupedTensor" |
        "array", ...}`` (the metadata entry; for arrays at least ``dtype`` and ``shape``).
    metadata : dict of str to str
        The file's other ``__metadata__`` entries (the library's own are parsed away).
    arrays
        The underlying reader (see :func:`~lowprec_moe.io.open_arrays`).
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self.arrays = open_arrays(path)
        try:
            self._parse()
        except CheckpointError as exc:
            self.arrays.close()
            raise CheckpointError(f"{self.path}: {exc}") from None
        except BaseException:
            self.arrays.close()
            raise

    def _parse(self) -> None:
        meta = dict(self.arrays.metadata)
        own = meta.pop(META_KEY, None)
        if isinstance(self.arrays, SafetensorsFile):
            meta.pop("format", None)
        self.metadata = meta
        entries: dict[str, dict] = {}
        if own is not None:
            try:
                own = json.loads(own)
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"__metadata__[{META_KEY!r}] is not valid JSON "
                                      f"({exc.msg})") from None
            except RecursionError:
                raise CheckpointError(f"__metadata__[{META_KEY!r}] is nested too deeply"
                                      ) from None
            tensors = own.get("tensors") if isinstance(own, dict) else None
            if not isinstance(tensors, dict):
                raise CheckpointError(f"__metadata__[{META_KEY!r}] has no 'tensors' object")
            if own.get("layout_version") != LAYOUT_VERSION:
                raise CheckpointError(f"layout_version={own.get('layout_version')!r} is not "
                                      f"supported (this library reads {LAYOUT_VERSION})")
            for name, e in tensors.items():
                if isinstance(e, dict) and e.get("type") in ("QuantizedTensor", "GroupedTensor"):
                    check_entry(name, e)
                    missing = [k for k in e["arrays"].values() if k not in self.arrays]
                    if missing:
                        raise bad(name, f"arrays {missing} are missing from the file")
                    plan(name, e, self.arrays.info)
                    entries[name] = e
        else:
            entries = self._modelopt()
        owner: dict[str, str] = {}
        for name, e in entries.items():
            for key in [*e["arrays"].values(), *e.get("aux_arrays", {}).values()]:
                if owner.setdefault(key, name) != name:
                    raise bad(name, f"array {key!r} also belongs to tensor {owner[key]!r}")
        arrays_meta = own.get("tensors", {}) if isinstance(own, dict) else {}
        ordered: dict[str, dict] = {}
        for key in self.arrays.keys():  # file order; a tensor appears with its first array
            name = owner.get(key, key)
            if name in ordered:
                if key not in owner:
                    raise bad(name, "is both a quantized tensor and a plain array")
                continue
            if key in owner:
                ordered[name] = entries[name]
            else:
                dtype, shape = self.arrays.info(key)
                extra = arrays_meta.get(key) if isinstance(arrays_meta.get(key), dict) else {}
                ordered[key] = {**extra, "type": "array",
                                "dtype": _restored_dtype(key, dtype, extra),
                                "shape": list(shape)}
        self.entries = ordered

    def _modelopt(self) -> dict[str, dict]:
        """ModelOpt NVFP4 triples ``w`` / ``w_scale`` / ``w_scale_2`` of a foreign file."""
        found = {}
        for key in self.arrays.keys():
            s, s2 = key + "_scale", key + "_scale_2"
            if s not in self.arrays or s2 not in self.arrays:
                continue
            (dt, sh), (sdt, ssh), (s2dt, s2sh) = (self.arrays.info(k) for k in (key, s, s2))
            k = 2 * sh[1] if len(sh) == 2 else 0
            if (dt == np.uint8 and sdt == _E4M3 and s2dt == np.float32 and len(sh) == 2
                    and k % F.NVFP4_BLOCK == 0 and ssh == (sh[0], k // F.NVFP4_BLOCK)
                    and int(np.prod(s2sh)) == 1):
                found[key] = {"type": "QuantizedTensor", "format": "nvfp4",
                              "shape": [sh[0], k], "fp8_dtype": None, "source": "modelopt",
                              "arrays": {"rowwise_data": key, "rowwise_scale": s,
                                         "rowwise_scale_2": s2}}
        return found

    def names(self) -> list[str]:
        """Logical tensor names, in file order."""
        return list(self.entries)

    def get(self, name: str):
        """Tensor ``name``: a QuantizedTensor, a GroupedTensor or a read-only array."""
        e = self.entries[name]
        try:
            if e["type"] == "array":
                a = self.arrays.get(name)
                want = _np_dtype(e["dtype"])
                return a.view(want) if want is not None and want.name != a.dtype.name else a
            return build(name, e, self.arrays)
        except CheckpointError as exc:
            raise CheckpointError(f"{self.path}: {exc}") from None

    def close(self) -> None:
        self.arrays.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _np_dtype(name) -> np.dtype | None:
    """NumPy dtype from its name (ml_dtypes names included); None if unknown."""
    if not isinstance(name, str):
        return None
    try:
        return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
    except Exception:  # any garbage in a foreign file's metadata
        return None


def _restored_dtype(key: str, dtype: np.dtype, extra: dict) -> str:
    """The dtype an array had when saved: .npz stores fp8 bytes as uint8 and says so.

    Any other disagreement between the array's own header and the metadata is refused rather
    than resolved by reinterpreting bytes (E4M3 bytes must never be decoded as E5M2).
    """
    if "dtype" not in extra:
        return dtype.name
    want = _np_dtype(extra.get("dtype"))
    if want is not None and want.name == dtype.name:
        return dtype.name
    if want is not None and want.name.startswith("float8_") and dtype == np.uint8:
        return want.name
    raise CheckpointError(f"tensor {key!r}: the file stores it as {dtype.name}, the metadata "
                          f"says dtype={extra.get('dtype')!r}")


def open_checkpoint(path) -> Checkpoint:
    """Open and validate a .safetensors / .npz / .npy file (see :class:`Checkpoint`)."""
    return Checkpoint(path)


class CheckpointWriter:
    """Write arrays and quantized tensors one at a time; :meth:`commit` publishes atomically.

    Parameters
    ----------
    path : str or os.PathLike
        ``.safetensors`` or ``.npz`` (``.npy``: one plain array, no metadata).
    hold : bool
        Keep added arrays by reference until :meth:`commit` (see :class:`ArrayWriter`); the
        caller must not modify them in between.
    """

    def __init__(self, path, *, hold: bool = False):
        self._writer = ArrayWriter(path, hold=hold)
        self.kind = self._writer.kind
        self.entries: dict[str, dict] = {}

    def add(self, name: str, obj, *, layout: str = "lowprec", **info) -> None:
        """Add a QuantizedTensor, GroupedTensor or array; ``info`` (JSON values) is kept in
        the tensor's metadata entry (e.g. ``original_shape``). ``layout`` names the arrays of a
        quantized tensor (see :mod:`lowprec_moe.io.serving`)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor name {name!r} must be a non-empty string")
        if name in self.entries:
            raise ValueError(f"tensor name {name!r} is used twice")
        if isinstance(obj, (QuantizedTensor, GroupedTensor)):
            if self.kind == "npy":
                raise ValueError(f"a .npy file cannot hold the quantized tensor {name!r}; "
                                 "write .safetensors or .npz")
            arrays, entry = flatten(name, obj)
            arrays, entry = to_layout(name, arrays, entry, layout)
            found = {key: (a.dtype, a.shape) for key, a in arrays}
            try:  # what load() would check, so that save() never writes an unloadable file
                plan(name, entry, lambda key: found[key])
            except CheckpointError as exc:
                raise ValueError(f"{exc}; it cannot be saved") from None
            for key, a in arrays:
                self._writer.add(key, a)
        else:
            try:
                a = asnumpy_explicit(obj)
            except TypeError:
                raise TypeError(f"tensor {name!r} must be an array, QuantizedTensor or "
                                f"GroupedTensor, got {describe(obj)}") from None
            self._writer.add(name, a)
            entry = {"type": "array", "dtype": a.dtype.name}
        entry.update(info)
        json.dumps(entry)  # fail here, not at commit, on values JSON cannot hold
        self.entries[name] = entry

    @property
    def names(self) -> list[str]:
        """Array names written so far, in order."""
        return self._writer.names

    def commit(self, metadata: Mapping[str, str] | None = None) -> None:
        """Write the library metadata (plus ``metadata``) and publish the file."""
        from lowprec_moe import __version__

        meta = dict(metadata or {})
        check_metadata(meta)
        if META_KEY in meta:
            raise ValueError(f"metadata key {META_KEY!r} is reserved for the library")
        if self.kind == "safetensors":
            meta.setdefault("format", "pt")
        meta[META_KEY] = json.dumps({"version": __version__, "layout_version": LAYOUT_VERSION,
                                     "scale_layout": "compact", "tensors": self.entries})
        self._writer.commit(meta if self.kind != "npy" else None)

    def abort(self) -> None:
        self._writer.abort()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.abort()


def save(path, tensors: Mapping[str, Any], *, metadata: Mapping[str, str] | None = None) -> None:
    """Save named QuantizedTensors, GroupedTensors and arrays to .safetensors or .npz.

    Parameters
    ----------
    path : str or os.PathLike
        Destination; the suffix picks the format. Written atomically (temp file + rename).
    tensors : mapping of str to QuantizedTensor, GroupedTensor or array
        CuPy arrays are copied to the host (an explicit transfer: this is a save).
    metadata : mapping of str to str, optional
        Extra ``__metadata__`` entries.

    Raises
    ------
    ValueError
        Name collisions (``w_scale`` both a tensor and the scale of ``w``), a bad suffix.
    TypeError
        Values of an unsupported type or dtype.
    OSError
        The destination cannot be written.
    """
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of names to tensors, got {describe(tensors)}")
    if file_kind(path) == "npy":
        raise ValueError(f"{os.fspath(path)!r}: save() writes .safetensors or .npz")
    with CheckpointWriter(path, hold=True) as w:
        for name, obj in tensors.items():
            w.add(name, obj)
        w.commit(metadata)


def load(path) -> dict[str, Any]:
    """Load every tensor of a .safetensors / .npz / .npy file.

    Returns
    -------
    dict of str to QuantizedTensor, GroupedTensor or numpy.ndarray
        Arrays are read-only views of the memory-mapped file where the format allows.

    Raises
    ------
    CheckpointError
        (a ``ValueError``) for truncated, inconsistent or refused files.
    OSError
        The file cannot be read.
    """
    with open_checkpoint(path) as ck:
        return {name: ck.get(name) for name in ck.names()}
