"""``GroupedTensor``: one quantized tensor per expert, packed (NUMERICS §5).

Layout
------
A logical ``[M_total, K]`` tensor split by rows into ``G`` members by ``splits``
(``offsets = [0, cumsum(splits)]``, int64). Each member is quantized independently (its own
amax), so a grouped quantization is bit-identical to quantizing every member alone.

* ``rowwise_data`` / ``rowwise_scale``: all members concatenated along rows, exactly the shapes of
  a single tensor ``[M_total, ...]``.
* ``columnwise_data`` / ``columnwise_scale``: flat uint8 buffers, members concatenated in order;
  member g occupies bytes ``columnwise_data_offsets[g]:columnwise_data_offsets[g+1]`` and is the
  columnwise storage of a ``[splits[g], K]`` tensor (rows padded to the block with zeros).
* nvfp4 amax: per tensor, ``amax_rowwise`` / ``amax_columnwise`` are float32 ``[G]``; row-scaled,
  ``amax_rowwise`` is ``[M_total]`` and ``amax_columnwise`` is ``[G, K]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lowprec_moe import _validate as V
from lowprec_moe import formats as F
from lowprec_moe import quant_formats
from lowprec_moe.backend import get_xp, is_cupy_array
from lowprec_moe.tensors.quantized_tensor import QuantizedTensor, _quantize_2d, dequantize


def columnwise_sizes(fmt: str, m: int, k: int) -> tuple[int, int, tuple, tuple]:
    """Bytes and shapes of the columnwise data and scale of one ``[m, k]`` member."""
    dshape, sshape = quant_formats.get(fmt).columnwise_shapes(m, k)
    return dshape[0] * dshape[1], sshape[0] * sshape[1], dshape, sshape


def columnwise_offsets(fmt: str, splits, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Host int64 ``[G+1]`` byte offsets of every member's columnwise data and scales in the
    flat buffers of a grouped tensor with host ``splits`` (the packed layout)."""
    sizes = [columnwise_sizes(fmt, s, k) for s in splits]
    return _offsets([z[0] for z in sizes]), _offsets([z[1] for z in sizes])


@dataclass(frozen=True)
class GroupedTensor:
    """Quantized experts packed in one set of buffers (see the module docstring for layouts).

    Attributes
    ----------
    format, fp8_dtype, row_scaled, block_2d, rht, stochastic_rounding, seed
        As in :class:`~lowprec_moe.QuantizedTensor`.
    shape : (M_total, K)
    splits : tuple of int, or cupy.ndarray
        Rows per member (zeros allowed); a device int64 array when quantized with device
        splits (see :meth:`quantize`).
    offsets : numpy.ndarray or cupy.ndarray
        int64 ``[G+1]`` row offsets (on the device with device splits).
    rowwise_data, rowwise_scale : uint8 arrays ``[M_total, ...]`` or None
    columnwise_data, columnwise_scale : flat uint8 arrays or None
    columnwise_data_offsets, columnwise_scale_offsets : numpy.ndarray or cupy.ndarray
        int64 ``[G+1]`` byte offsets of each member in the flat columnwise buffers (on the
        device with device splits; the buffers then hold the most any split of ``M_total``
        rows needs; the bytes past the last member belong to no member).
    amax_rowwise, amax_columnwise : float32 arrays or None
    """

    format: str
    shape: tuple
    splits: tuple
    offsets: np.ndarray
    fp8_dtype: str | None = None
    rowwise_data: Any = None
    rowwise_scale: Any = None
    columnwise_data: Any = None
    columnwise_scale: Any = None
    columnwise_data_offsets: Any = None
    columnwise_scale_offsets: Any = None
    amax_rowwise: Any = None
    amax_columnwise: Any = None
    row_scaled: bool = False
    block_2d: bool = False
    rht: bool = False
    stochastic_rounding: bool = False
    seed: int = 0
    #: Member index of the first member in the stochastic-rounding stream (member g uses
    #: ``first_member + g``).
    first_member: int = field(default=0, repr=False)

    # ---------------------------------------------------------------------------------- build
    @staticmethod
    def quantize(x, splits, format: str, *, rowwise: bool = True, columnwise: bool = False,
                 row_scaled: bool = False, block_2d: bool = False, rht: bool = False,
                 stochastic_rounding: bool = False, seed: int = 0, fp8_dtype: str = "e4m3",
                 check_finite: bool = False, first_member: int = 0) -> "GroupedTensor":
        """Quantize ``x`` ``[M_total, K]`` member by member (options as in ``quantize``).

        ``splits`` are host ints (any sizes, zeros allowed) summing to ``M_total``, or, for a
        CuPy ``x``, a device integer array (the router's counts): nothing is then read back,
        so the call neither waits for the GPU nor breaks a CUDA-graph capture. Device splits
        are not checked (negative counts act as 0, counts past ``M_total`` are cut there); the
        columnwise buffers are sized for any split of ``M_total`` rows, the offsets are device
        arrays, and :meth:`with_host_splits` gives the tensor that host splits would have given
        (bit for bit). With ``block_2d`` every split must be a multiple of the block (host
        splits only). Member ``g`` uses member index ``first_member + g`` in the
        stochastic-rounding stream (``first_member``: the global index of the first expert when
        the experts are spread over processes, so that each rounds as one process holding them
        all would; 0 otherwise).
        """
        return _quantize_grouped(
            x, splits, format, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled,
            block_2d=block_2d, rht=rht, stochastic_rounding=stochastic_rounding, seed=seed,
            fp8_dtype=fp8_dtype, check_finite=check_finite, first_member=first_member)[0]

    @staticmethod
    def quantize_with_column_sums(x, splits, format: str, *, probs=None,
                                  **options) -> tuple["GroupedTensor", Any]:
        """:meth:`quantize`, and every member's column sums of ``x`` from the same pass.

        With ``x`` an output gradient ``dy`` the sums are the bias gradient, which the backward
        of a layer with biases needs next to the quantized ``dy``: on the GPU the quantize
        kernel adds them up while it holds the data, so ``dy`` is read once.

        Parameters
        ----------
        x, splits, format, **options
            As :meth:`quantize`.
        probs : array ``[M_total]`` or None
            Per-row factor (float, same backend as ``x``): the sums are then of
            ``x[row] * probs[row]``.

        Returns
        -------
        (GroupedTensor, sums)
            ``sums``: float32 ``[G, K]`` on ``x``'s backend, ``sums[g] = sum over member g's
            rows of x (* probs)``; the products are float32 roundings. The NumPy backend sums
            in float64 and rounds once (``backends.numpy.reduce.grouped_colsum``); the GPU sums
            in float32 in a fixed order (deterministic; equal to the former to float32
            summation error). Members without rows get zeros.
        """
        return _quantize_grouped(x, splits, format, column_sums=True, probs=probs, **options)

    @staticmethod
    def from_mxfp8_rowwise(data, scale, splits, *, fp8_dtype: str = "e4m3") -> "GroupedTensor":
        """Wrap pre-quantized rowwise MXFP8 buffers (the expert-parallel "wire format").

        Parameters
        ----------
        data : uint8 array ``[M_total, K]``
            fp8 bytes (E4M3 by default).
        scale : uint8 array ``[M_total, K/32]``
            Compact E8M0 scales.
        splits : sequence of int
            Rows per expert.
        fp8_dtype : {"e4m3", "e5m2"}

        The buffers are not copied.
        """
        for name, a in (("data", data), ("scale", scale)):
            if not (isinstance(a, np.ndarray) or is_cupy_array(a)):
                raise TypeError(f"{name} must be a numpy or cupy array, got {type(a).__name__}")
            if a.dtype != np.uint8:
                raise TypeError(f"{name}.dtype={a.dtype} must be uint8")
            if a.ndim != 2:
                raise ValueError(f"{name} must be 2-D, got shape {tuple(a.shape)}")
        get_xp(data, scale)
        V.check_fp8_dtype(fp8_dtype)
        m_total, k = data.shape
        V.check_k(k, "mxfp8")
        if tuple(scale.shape) != (m_total, k // F.MXFP8_BLOCK):
            raise ValueError(f"scale.shape={tuple(scale.shape)} must be "
                             f"{(m_total, k // F.MXFP8_BLOCK)} for data.shape={(m_total, k)}")
        splits = V.check_splits(splits, m_total)
        xp = get_xp(data)
        return GroupedTensor(format="mxfp8", shape=(m_total, k), splits=splits,
                             offsets=_offsets(splits), fp8_dtype=fp8_dtype,
                             rowwise_data=xp.ascontiguousarray(data),
                             rowwise_scale=xp.ascontiguousarray(scale))

    def with_columnwise(self, fp8_dtype: str | None = None) -> "GroupedTensor":
        """Add a columnwise copy built from MXFP8 rowwise data.

        Each member is dequantized (float32 ``q * 2**(e-127)``, rounded once to bfloat16) and
        quantized columnwise to MXFP8 (``fp8_dtype``, default: this tensor's). The result shares
        the rowwise buffers and equals ``GroupedTensor.quantize(bf16, splits, "mxfp8",
        columnwise=True)`` on the dequantized input. Returns ``self`` if a columnwise copy exists.
        """
        if self.columnwise_data is not None:
            return self
        self._require_host_splits("with_columnwise()")
        if self.format != "mxfp8":
            raise ValueError(f"with_columnwise() builds the columnwise copy from mxfp8 rowwise data;"
                             f" this tensor is {self.format} without a columnwise copy")
        fp8_dtype = V.check_fp8_dtype(fp8_dtype or self.fp8_dtype)
        if is_cupy_array(self.rowwise_data):
            from lowprec_moe.backends.cupy import grouped

            parts = grouped.grouped_mxfp8_columnwise_from_rowwise(self, fp8_dtype)
        else:
            bf16 = self.dequantize("rowwise", dtype="bfloat16")
            parts = _grouped_quantize_reference(
                bf16, self.splits, "mxfp8", rowwise=False, columnwise=True, row_scaled=False,
                block_2d=False, rht=False, stochastic_rounding=False, seed=0, fp8_dtype=fp8_dtype)
            parts = {k: v for k, v in parts.items() if k.startswith("columnwise")}
        return replace(self, **parts)

    def with_host_splits(self) -> "GroupedTensor":
        """This tensor with its splits on the host (``self`` if they are already).

        Reads device splits back (one device-to-host copy: a synchronisation, on purpose),
        checks them (non-negative, summing to ``M_total``) and trims the columnwise buffers to
        the members' sizes: the result equals, bit for bit, ``GroupedTensor.quantize`` of the
        same input with the same splits given on the host. The buffers are shared, not copied.
        """
        if not self.splits_on_device:
            return self
        splits = V.check_splits(self.splits.get().tolist(), self.shape[0])
        fields: dict = dict(splits=splits, offsets=_offsets(splits))
        if self.columnwise_data is not None:
            d_off, s_off = columnwise_offsets(self.format, splits, self.shape[1])
            fields.update(columnwise_data=self.columnwise_data[:int(d_off[-1])],
                          columnwise_scale=self.columnwise_scale[:int(s_off[-1])],
                          columnwise_data_offsets=d_off, columnwise_scale_offsets=s_off)
        return replace(self, **fields)

    def _require_host_splits(self, what: str) -> None:
        if self.splits_on_device:
            raise NotImplementedError(f"{what} needs the splits on the host and this tensor "
                                      "has device splits; call with_host_splits() first (it "
                                      "reads them back: one synchronisation)")

    # ---------------------------------------------------------------------------------- views
    @property
    def num_groups(self) -> int:
        return len(self.splits)

    @property
    def splits_on_device(self) -> bool:
        """Whether ``splits`` is a device array (see :meth:`quantize`)."""
        return is_cupy_array(self.splits)

    @property
    def is_cuda(self) -> bool:
        arr = self.rowwise_data if self.rowwise_data is not None else self.columnwise_data
        return is_cupy_array(arr)

    def member(self, g: int) -> QuantizedTensor:
        """Zero-copy :class:`QuantizedTensor` view of member ``g`` (``0 <= g < num_groups``)."""
        self._require_host_splits("member()")
        if not 0 <= g < self.num_groups:
            raise IndexError(f"member g={g} out of range for num_groups={self.num_groups}")
        k = self.shape[1]
        lo, hi = int(self.offsets[g]), int(self.offsets[g + 1])
        fields = dict(rowwise_data=None, rowwise_scale=None, columnwise_data=None,
                      columnwise_scale=None, amax_rowwise=None, amax_columnwise=None)
        if self.rowwise_data is not None:
            fields.update(rowwise_data=self.rowwise_data[lo:hi],
                          rowwise_scale=self.rowwise_scale[lo:hi])
        if self.columnwise_data is not None:
            _, _, dshape, sshape = columnwise_sizes(self.format, hi - lo, k)
            d0, d1 = int(self.columnwise_data_offsets[g]), int(self.columnwise_data_offsets[g + 1])
            s0, s1 = int(self.columnwise_scale_offsets[g]), int(self.columnwise_scale_offsets[g + 1])
            fields.update(columnwise_data=self.columnwise_data[d0:d1].reshape(dshape),
                          columnwise_scale=self.columnwise_scale[s0:s1].reshape(sshape))
        if quant_formats.get(self.format).has_amax:
            if self.amax_rowwise is not None:
                fields["amax_rowwise"] = (self.amax_rowwise[lo:hi] if self.row_scaled
                                          else self.amax_rowwise[g:g + 1])
            if self.amax_columnwise is not None:
                fields["amax_columnwise"] = (self.amax_columnwise[g] if self.row_scaled
                                             else self.amax_columnwise[g:g + 1])
        return QuantizedTensor(format=self.format, shape=(hi - lo, k), fp8_dtype=self.fp8_dtype,
                               row_scaled=self.row_scaled, block_2d=self.block_2d, rht=self.rht,
                               stochastic_rounding=self.stochastic_rounding, seed=self.seed,
                               member_index=self.first_member + g, **fields)

    def dequantize(self, direction: str = "rowwise", dtype="float32"):
        """Dequantize every member and return ``[M_total, K]`` of ``dtype``."""
        V.check_direction(direction)
        dtype = V.check_dequant_dtype(dtype)
        self._require_host_splits("dequantize()")
        if is_cupy_array(self.rowwise_data if self.rowwise_data is not None
                         else self.columnwise_data):
            from lowprec_moe.backends.cupy import grouped

            return grouped.grouped_dequantize(
                self, direction, dtype)
        if direction == "rowwise" and self.rowwise_data is not None and not self.row_scaled \
                and self.format == "mxfp8":
            return dequantize(QuantizedTensor(format="mxfp8", shape=self.shape,
                                              fp8_dtype=self.fp8_dtype,
                                              rowwise_data=self.rowwise_data,
                                              rowwise_scale=self.rowwise_scale), "rowwise", dtype)
        parts = [self.member(g).dequantize(direction, dtype) for g in range(self.num_groups)]
        return np.concatenate(parts, axis=0) if parts else parts

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.rowwise_data, self.rowwise_scale,
                                            self.columnwise_data, self.columnwise_scale,
                                            self.amax_rowwise, self.amax_columnwise)
                   if a is not None)


def _offsets(splits) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(splits, dtype=np.int64)]).astype(np.int64)


def _grouped_quantize_reference(x2, splits, fmt, *, rowwise, columnwise, row_scaled, block_2d,
                                rht, stochastic_rounding, seed, fp8_dtype,
                                first_member: int = 0) -> dict:
    """NumPy: quantize each member alone and pack the results (see module docstring)."""
    m_total, k = x2.shape
    offs = _offsets(splits)
    members = [_quantize_2d(x2[offs[g]:offs[g + 1]], fmt, rowwise=rowwise, columnwise=columnwise,
                            row_scaled=row_scaled, block_2d=block_2d, rht=rht,
                            stochastic_rounding=stochastic_rounding, seed=seed,
                            fp8_dtype=fp8_dtype, member=first_member + g)
               for g in range(len(splits))]
    out: dict = {}
    if rowwise:
        out["rowwise_data"] = np.concatenate([q.rowwise_data for q in members], axis=0)
        out["rowwise_scale"] = np.concatenate([q.rowwise_scale for q in members], axis=0)
    if columnwise:
        out["columnwise_data"] = np.concatenate([q.columnwise_data.reshape(-1) for q in members])
        out["columnwise_scale"] = np.concatenate([q.columnwise_scale.reshape(-1) for q in members])
        out["columnwise_data_offsets"] = _offsets([q.columnwise_data.size for q in members])
        out["columnwise_scale_offsets"] = _offsets([q.columnwise_scale.size for q in members])
    if quant_formats.get(fmt).has_amax:
        if rowwise:
            out["amax_rowwise"] = np.concatenate([q.amax_rowwise for q in members]).astype(np.float32)
        if columnwise:
            cols = [q.amax_columnwise for q in members]
            out["amax_columnwise"] = (np.stack(cols) if row_scaled
                                      else np.concatenate(cols)).astype(np.float32)
    return out


def _quantize_grouped(x, splits, format: str, *, rowwise: bool = True, columnwise: bool = False,
                      row_scaled: bool = False, block_2d: bool = False, rht: bool = False,
                      stochastic_rounding: bool = False, seed: int = 0, fp8_dtype: str = "e4m3",
                      check_finite: bool = False, first_member: int = 0,
                      column_sums: bool = False, probs=None):
    """:meth:`GroupedTensor.quantize` (validation included) and, with ``column_sums``, the
    members' column sums: ``(tensor, sums or None)``."""
    V.check_array("x", x)
    V.check_format(format)
    x2 = V.as_2d(x)
    m_total, k = x2.shape
    V.check_k(k, format)
    on_device = is_cupy_array(splits)
    if on_device:
        splits = V.check_device_splits(splits, x2, copy=True)
        if block_2d:
            raise NotImplementedError("block_2d=True with device splits is not implemented "
                                      "(every split must be a multiple of the block, which "
                                      "needs their values on the host)")
    else:
        splits = V.check_splits(splits, m_total)
    V.check_options(format, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled,
                    block_2d=block_2d, rht=rht, stochastic_rounding=stochastic_rounding,
                    fp8_dtype=fp8_dtype, dtype=x.dtype)
    b = V.block_size(format)
    if block_2d and any(s % b for s in splits):
        raise ValueError(f"splits={list(splits)} must all be multiples of {b} for {format} "
                         "with block_2d=True")
    seed = V.check_seed(seed)
    first_member = V.check_first_member(first_member, len(splits))
    if check_finite:
        V.check_finite("x", x2)
    if probs is not None:
        if not column_sums:
            raise ValueError("probs only applies with column sums")
        V.check_array("probs", probs, min_rank=1)
        if tuple(probs.shape) != (m_total,):
            raise ValueError(f"probs.shape={tuple(probs.shape)} must be (M_total,)=({m_total},)")
        get_xp(x2, probs)
    if is_cupy_array(x2):
        from lowprec_moe.backends.cupy import grouped

        parts = grouped.grouped_quantize(
            x2, splits, format, rowwise=rowwise, columnwise=columnwise,
            row_scaled=row_scaled, block_2d=block_2d, rht=rht,
            stochastic_rounding=stochastic_rounding, seed=seed, fp8_dtype=fp8_dtype,
            first_member=first_member, column_sums=column_sums, probs=probs)
        sums = parts.pop("column_sums", None)
    else:
        parts = _grouped_quantize_reference(
            x2, splits, format, rowwise=rowwise, columnwise=columnwise,
            row_scaled=row_scaled, block_2d=block_2d, rht=rht,
            stochastic_rounding=stochastic_rounding, seed=seed, fp8_dtype=fp8_dtype,
            first_member=first_member)
        sums = None
        if column_sums:
            from lowprec_moe.backends.numpy.reduce import grouped_colsum

            sums = grouped_colsum(x2, splits, probs)
    offsets = parts.pop("offsets") if on_device else _offsets(splits)
    gt = GroupedTensor(format=format, shape=(m_total, k), splits=splits, offsets=offsets,
                       fp8_dtype=fp8_dtype if format == "mxfp8" else None,
                       row_scaled=row_scaled, block_2d=block_2d, rht=bool(rht and columnwise),
                       stochastic_rounding=stochastic_rounding, seed=seed,
                       first_member=first_member, **parts)
    return gt, sums

