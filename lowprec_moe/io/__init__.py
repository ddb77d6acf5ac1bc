"""Checkpoint I/O: save and load quantized tensors; read and write .npy / .npz / .safetensors.

>>> import lowprec_moe as lpm
>>> from lowprec_moe import io as lpm_io
>>> q = lpm.quantize(x, "nvfp4", columnwise=True)                    # doctest: +SKIP
>>> lpm_io.save("w.safetensors", {"w": q, "bias": b})                # doctest: +SKIP
>>> lpm_io.load("w.safetensors")["w"]                                # doctest: +SKIP
QuantizedTensor(format='nvfp4', ...)

Files are validated before their data is touched (headers, dtypes, shapes, byte counts; pickled
objects are refused, never unpickled) and read through memory maps; outputs are written to a
temporary file in the destination directory and renamed into place; an output is never an
input. See :mod:`lowprec_moe.io.checkpoint` for the library's array names,
:mod:`lowprec_moe.io.serving` for the ModelOpt and compressed-tensors layouts serving stacks
load, :mod:`lowprec_moe.io.model_dir` for sharded checkpoints and model directories, and
:mod:`lowprec_moe.io.convert` for the file-to-file operations behind the CLI.
"""

from lowprec_moe.io._common import CheckpointError
from lowprec_moe.io.arrays import ArrayWriter, file_kind, open_arrays
from lowprec_moe.io.checkpoint import Checkpoint, CheckpointWriter, array_names, load, open_checkpoint, save
from lowprec_moe.io.convert import ConvertReport, dequantize_file, inspect_file, quantize_file

__all__ = [
    "ArrayWriter",
    "Checkpoint",
    "CheckpointError",
    "CheckpointWriter",
    "ConvertReport",
    "array_names",
    "dequantize_file",
    "file_kind",
    "inspect_file",
    "load",
    "open_arrays",
    "open_checkpoint",
    "quantize_file",
    "save",
]
