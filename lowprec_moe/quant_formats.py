"""The quantized formats as objects: what each format is (block, element and scale types, which
options it takes) and how it is quantized and dequantized on each backend.

Everything that differs between NVFP4 and MXFP8 at the tensor level lives in one
:class:`QuantFormat` subclass each, so a new format (MXFP4, say) is one more subclass and one
entry in :data:`FORMATS`. The constants themselves stay in :mod:`lowprec_moe.formats`
(mirrored in ``raw_kernels/common/lpm_formats.cuh``); the backends are named by explicit imports, the
NumPy reference on the host and the CuPy launchers on the GPU.
"""

from __future__ import annotations

from lowprec_moe import formats as F


class QuantFormat:
    """One block-scaled format.

    Attributes
    ----------
    name : str
        ``"nvfp4"`` or ``"mxfp8"``.
    block : int
        Elements per block scale along the contraction (16 or 32); ``K`` must be a multiple.
    element, scale : str
        Element and scale encodings (``e2m1`` / ``e4m3`` / ``e5m2``, ``e4m3`` / ``e8m0``).
    """

    name: str
    block: int
    element: str
    scale: str
    #: Whether tensors carry an fp32 amax per copy (the second-level scale).
    has_amax: bool
    #: Bits per stored element.
    element_bits: int
    #: Whether the columnwise copy is stored transposed, ``[K, Mp * bits / 8]`` with the rows
    #: (the GEMM contraction of wgrad) contiguous, rather than in x's own layout ``[Mp, K]``.
    columnwise_transposed: bool

    def rowwise_shapes(self, m: int, k: int) -> tuple[tuple, tuple]:
        """Data and scale shapes of the rowwise copy of an ``[m, k]`` tensor."""
        return (m, k * self.element_bits // 8), (m, k // self.block)

    def columnwise_shapes(self, m: int, k: int) -> tuple[tuple, tuple]:
        """Data and scale shapes of the columnwise copy of an ``[m, k]`` tensor (the rows
        padded to the block)."""
        raise NotImplementedError

    def check_options(self, *, row_scaled, rht, stochastic_rounding, block_2d, fp8_dtype,
                      dtype_name: str) -> None:
        """Raise ``ValueError`` naming an option this format does not take."""
        raise NotImplementedError

    def quantize(self, x2, on_gpu: bool, *, rowwise, columnwise, row_scaled, block_2d, rht,
                 stochastic_rounding, seed, fp8_dtype, member=0) -> dict:
        """The ``QuantizedTensor`` fields of a validated ``[M, K]`` array."""
        raise NotImplementedError

    def dequantize(self, q, columnwise: bool, on_gpu: bool):
        """One copy of ``q`` as float32 ``[M, K]``."""
        raise NotImplementedError

    def check_copy(self, q, columnwise: bool) -> None:
        """``ValueError`` naming the field when one copy of a (possibly hand-built) tensor does
        not have the dtypes and shapes this format stores."""
        m, k = q.shape
        direction = "columnwise" if columnwise else "rowwise"
        want = (self.columnwise_shapes if columnwise else self.rowwise_shapes)(m, k)
        for field, arr, shape in zip(("data", "scale"), (
                getattr(q, f"{direction}_data"), getattr(q, f"{direction}_scale")), want):
            name = f"{direction}_{field}"
            if arr is None:
                raise ValueError(f"{name} is missing")
            if str(arr.dtype) != "uint8":
                raise ValueError(f"{name}.dtype={arr.dtype} must be uint8")
            if tuple(arr.shape) != tuple(shape):
                raise ValueError(f"{name}.shape={tuple(arr.shape)} must be {tuple(shape)} for a "
                                 f"{self.name} tensor of shape {(m, k)}")
        if self.has_amax:
            amax = getattr(q, f"amax_{direction}")
            n = (k if columnwise else m) if q.row_scaled else 1
            if amax is None or int(amax.size) != n:
                got = None if amax is None else int(amax.size)
                raise ValueError(f"amax_{direction} must hold {n} value(s), got {got}")

    def grouped_quantize(self, x2, splits, *, rowwise, columnwise, row_scaled, block_2d, rht,
                         stochastic_rounding, seed, fp8_dtype, first_member=0,
                         column_sums=False, probs=None) -> dict:
        """The ``GroupedTensor`` fields of a validated CuPy ``[M_total, K]`` array (one launch
        per kernel stage covers every member; member g rounds as member ``first_member + g``).
        ``column_sums``: also ``column_sums`` float32 ``[G, K]``, each member's column sums of
        ``x`` (times the float32 ``probs`` ``[M_total]`` when given) from the same pass."""
        raise NotImplementedError

    def grouped_dequantize(self, gt, direction: str):
        """One copy of every member of a CuPy ``GroupedTensor`` as float32 ``[M_total, K]``."""
        raise NotImplementedError

    def operand_values(self, data, scale, columnwise: bool, fp8_dtype):
        """NumPy: the float32 GEMM operand values of one copy, contraction along the last axis
        for the rowwise copy and for transposed columnwise copies."""
        raise NotImplementedError

    def element_type(self, fp8_dtype) -> str | None:
        """The ``fp8_dtype`` field a tensor of this format records."""
        return None

    def __repr__(self) -> str:
        return f"<format {self.name}>"


class NVFP4Format(QuantFormat):
    """E2M1 elements, an E4M3 scale per 16, an fp32 global scale from the amax (per tensor, or
    per row / column when row-scaled); optional 2-D blocks, RHT and stochastic rounding."""

    name, block, element, scale, has_amax = "nvfp4", F.NVFP4_BLOCK, "e2m1", "e4m3", True
    element_bits = 4
    columnwise_transposed = True

    def columnwise_shapes(self, m, k):
        mp = -(-m // self.block) * self.block  # stored transposed: [K, Mp/2] and [K, Mp/16]
        return (k, mp // 2), (k, mp // self.block)

    def check_options(self, *, row_scaled, rht, stochastic_rounding, block_2d, fp8_dtype,
                      dtype_name):
        if fp8_dtype != "e4m3":
            raise ValueError(f"fp8_dtype={fp8_dtype!r} applies to mxfp8 only; nvfp4 scales "
                             "are e4m3")
        if row_scaled:
            for opt, val in (("block_2d", block_2d), ("rht", rht),
                             ("stochastic_rounding", stochastic_rounding)):
                if val:
                    raise ValueError(f"row_scaled=True cannot be combined with {opt}=True")
        if rht and dtype_name != "bfloat16":
            raise ValueError(f"rht=True requires bfloat16 input, got dtype={dtype_name}")

    @staticmethod
    def _backend(on_gpu):
        if on_gpu:
            from lowprec_moe.backends.cupy import nvfp4 as backend
        else:
            from lowprec_moe.backends.numpy import nvfp4 as backend
        return backend

    def quantize(self, x2, on_gpu, *, rowwise, columnwise, row_scaled, block_2d, rht,
                 stochastic_rounding, seed, fp8_dtype, member=0):
        return self._backend(on_gpu).quantize_nvfp4(
            x2, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled,
            block_2d=block_2d, rht=rht, stochastic_rounding=stochastic_rounding, seed=seed,
            member=member)

    def dequantize(self, q, columnwise, on_gpu):
        data = q.columnwise_data if columnwise else q.rowwise_data
        scale = q.columnwise_scale if columnwise else q.rowwise_scale
        amax = q.amax_columnwise if columnwise else q.amax_rowwise
        return self._backend(on_gpu).dequantize_nvfp4(
            data, scale, amax, columnwise=columnwise, m=q.shape[0], rht=q.rht and columnwise)

    def grouped_quantize(self, x2, splits, *, rowwise, columnwise, row_scaled, block_2d, rht,
                         stochastic_rounding, seed, fp8_dtype, first_member=0,
                         column_sums=False, probs=None):
        return self._backend(True).grouped_quantize_nvfp4(
            x2, splits, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled,
            block_2d=block_2d, rht=rht, stochastic_rounding=stochastic_rounding, seed=seed,
            first_member=first_member, column_sums=column_sums, probs=probs)

    def grouped_dequantize(self, gt, direction):
        return self._backend(True).grouped_dequantize_nvfp4(gt, direction)

    def operand_values(self, data, scale, columnwise, fp8_dtype):
        from lowprec_moe.backends.numpy.gemm import nvfp4_operand_values

        return nvfp4_operand_values(data, scale)


class MXFP8Format(QuantFormat):
    """E4M3 or E5M2 elements, a power-of-two E8M0 scale per 32; optional 32 x 32 blocks."""

    name, block, element, scale, has_amax = "mxfp8", F.MXFP8_BLOCK, "e4m3|e5m2", "e8m0", False
    element_bits = 8
    columnwise_transposed = False

    def columnwise_shapes(self, m, k):
        mp = -(-m // self.block) * self.block  # x's layout: [Mp, K] and [Mp/32, K]
        return (mp, k), (mp // self.block, k)

    def check_options(self, *, row_scaled, rht, stochastic_rounding, block_2d, fp8_dtype,
                      dtype_name):
        for opt, val in (("row_scaled", row_scaled), ("rht", rht),
                         ("stochastic_rounding", stochastic_rounding)):
            if val:
                raise ValueError(f"{opt}=True is an nvfp4 option; it is not supported for mxfp8")
        if fp8_dtype not in F.FP8_DTYPES:
            raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {F.FP8_DTYPES}")

    @staticmethod
    def _backend(on_gpu):
        if on_gpu:
            from lowprec_moe.backends.cupy import mxfp8 as backend
        else:
            from lowprec_moe.backends.numpy import mxfp8 as backend
        return backend

    def quantize(self, x2, on_gpu, *, rowwise, columnwise, row_scaled, block_2d, rht,
                 stochastic_rounding, seed, fp8_dtype, member=0):
        return self._backend(on_gpu).quantize_mxfp8(
            x2, rowwise=rowwise, columnwise=columnwise, block_2d=block_2d, fp8_dtype=fp8_dtype)

    def dequantize(self, q, columnwise, on_gpu):
        data = q.columnwise_data if columnwise else q.rowwise_data
        scale = q.columnwise_scale if columnwise else q.rowwise_scale
        return self._backend(on_gpu).dequantize_mxfp8(
            data, scale, columnwise=columnwise, m=q.shape[0], fp8_dtype=q.fp8_dtype)

    def grouped_quantize(self, x2, splits, *, rowwise, columnwise, row_scaled, block_2d, rht,
                         stochastic_rounding, seed, fp8_dtype, first_member=0,
                         column_sums=False, probs=None):
        return self._backend(True).grouped_quantize_mxfp8(
            x2, splits, rowwise=rowwise, columnwise=columnwise, block_2d=block_2d,
            fp8_dtype=fp8_dtype, column_sums=column_sums, probs=probs)

    def grouped_dequantize(self, gt, direction):
        return self._backend(True).grouped_dequantize_mxfp8(gt, direction)

    def operand_values(self, data, scale, columnwise, fp8_dtype):
        from lowprec_moe.backends.numpy.gemm import mxfp8_operand_values

        return mxfp8_operand_values(data, scale, columnwise=columnwise, fp8_dtype=fp8_dtype)

    def element_type(self, fp8_dtype):
        return fp8_dtype


NVFP4 = NVFP4Format()
MXFP8 = MXFP8Format()
#: Every format, by name.
FORMATS: dict[str, QuantFormat] = {f.name: f for f in (NVFP4, MXFP8)}
assert tuple(FORMATS) == F.FORMATS


def get(name) -> QuantFormat:
    """The format called ``name``; ``ValueError`` naming the value otherwise."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"format={name!r} must be one of {F.FORMATS}") from None
