"""Command-line interface ``lowprec-moe``: quantize, dequantize and inspect saved arrays.

Commands: ``quantize``, ``dequantize``, ``inspect``, ``info`` and ``demo``. File errors (missing,
truncated or inconsistent inputs, refused pickles, non-finite values, unwritable outputs) print
one ``Error: ...`` line on stderr and exit with status 1; bad usage exits with status 2. No
output file is left behind by a failed command. Set ``LOWPREC_MOE_DEBUG=1`` to see a traceback
for unexpected errors.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Iterable, Iterator, Sequence

import click

_QUANT_OUT = (".safetensors", ".npz")
_ANY_FILE = (".npy", ".npz", ".safetensors")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lowprec-moe")
    except PackageNotFoundError:  # running from a checkout that is not installed
        import lowprec_moe

        return getattr(lowprec_moe, "__version__", "unknown")


# ------------------------------------------------------------------------------ helpers
class _Failure(click.ClickException):
    """An error that is not a usage error: one ``Error:`` line, exit status 1."""

    exit_code = 1


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        msg = f"{exc.filename}: {exc.strerror or exc}"
    else:
        msg = str(exc) or type(exc).__name__
    expected = (ValueError, TypeError, OSError, NotImplementedError, MemoryError)
    if not isinstance(exc, expected):
        msg = f"{type(exc).__name__}: {msg}"
    return " ".join(msg.split())


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn any exception into one line on stderr and exit status 1 (click's own pass)."""
    try:
        yield
    except (click.ClickException, click.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:
        if os.environ.get("LOWPREC_MOE_DEBUG"):
            raise
        if isinstance(exc, MemoryError):
            raise _Failure("out of memory while converting one tensor") from None
        raise _Failure(_one_line(exc)) from None


def _suffix_check(allowed: Sequence[str]):
    """Click callback: the file suffix must be one of ``allowed`` (else a usage error)."""

    def check(ctx, param, value):
        if value is None:
            return value
        suffix = os.path.splitext(value)[1].lower()
        if suffix not in allowed:
            raise click.BadParameter(f"{value!r} has suffix {suffix or '(none)'!r}; use "
                                     f"{' or '.join(allowed)}", ctx=ctx, param=param)
        return value

    return check


def _require_file(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise _Failure(f"{what} {path!r} does not exist")
    if os.path.isdir(path):
        raise _Failure(f"{what} {path!r} is a directory")


def _progress(names: Sequence[str], label: str) -> Iterable[str]:
    """A progress bar on stderr for multi-tensor files (only when stderr is a terminal)."""
    if len(names) < 2 or not sys.stderr.isatty():
        yield from names
        return
    with click.progressbar(names, label=label, file=sys.stderr,
                           item_show_func=lambda n: n or "") as bar:
        yield from bar


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _print_report(report, verb: str) -> None:
    n = len(report.converted) + len(report.copied)
    sizes = (f"{_fmt_bytes(report.bytes_in)} in, " if report.bytes_in else "") + \
        f"{_fmt_bytes(report.bytes_out)} out"
    click.echo(f"{verb} {len(report.converted)} of {n} tensors -> {report.output} ({sizes})")
    for name, why in report.copied:
        click.echo(f"  copied unchanged: {name}: {why}")


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 3) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]

    def line(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    click.echo(line(head))
    click.echo("  ".join("-" * w for w in widths))
    for r in rows:
        click.echo(line(r))


# ------------------------------------------------------------------------------ commands
@click.group()
@click.version_option(version=_version(), prog_name="lowprec-moe")
def main() -> None:
    """lowprec_moe: NVFP4 / MXFP8 quantization and grouped MoE layers (NumPy and CuPy).

    \b
    Example:
      lowprec-moe quantize model.safetensors model-nvfp4.safetensors --format nvfp4
      lowprec-moe inspect model-nvfp4.safetensors --against model.safetensors
    """


@main.command(short_help="Quantize the matrices of a .npy/.npz/.safetensors file.")
@click.argument("src", metavar="IN", callback=_suffix_check(_ANY_FILE))
@click.argument("dst", metavar="OUT", callback=_suffix_check(_QUANT_OUT))
@click.option("--format", "fmt", type=click.Choice(["nvfp4", "mxfp8"]), required=True,
              help="Target format.")
@click.option("--row-scaled", is_flag=True,
              help="nvfp4: one amax per row (per column for the columnwise copy).")
@click.option("--block-2d", is_flag=True,
              help="2-D scale blocks (16x16 nvfp4, 32x32 mxfp8), as used for weights.")
@click.option("--columnwise", is_flag=True, help="Also store a columnwise copy.")
@click.option("--fp8-dtype", type=click.Choice(["e4m3", "e5m2"]), default=None,
              help="mxfp8 element type  [default: e4m3]")
@click.option("--keys", multiple=True, metavar="GLOB",
              help="Quantize only tensors whose name matches (repeatable); others are copied.")
@click.option("--grouped", is_flag=True,
              help="Quantize 3-D tensors [G, N, K] as G experts with one amax each.")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True, help="Quantize on the GPU (CuPy) or the CPU (NumPy).")
@click.option("--allow-nonfinite", is_flag=True,
              help="Quantize tensors holding NaN / inf instead of refusing them.")
def quantize(src, dst, fmt, row_scaled, block_2d, columnwise, fp8_dtype, keys, grouped,
             device, allow_nonfinite) -> None:
    """Quantize the matrices of IN to NVFP4 or MXFP8 and write OUT (.safetensors or .npz).

    IN is a .npy, .npz or .safetensors file (float32, float16 or bfloat16 tensors). Tensors
    that are not selected by --keys or cannot be quantized (rank 1, K not a multiple of the
    block, integer dtypes) are copied unchanged and reported. OUT uses ModelOpt-compatible
    names: NAME (data), NAME_scale, NAME_scale_2 (nvfp4: amax / (FP4_MAX * E4M3_MAX)), plus NAME_amax and
    NAME_columnwise* (see lowprec_moe.io.checkpoint).

    \b
    Example:
      lowprec-moe quantize model.safetensors model-nvfp4.safetensors \\
          --format nvfp4 --block-2d --keys '*.weight'
    """
    from lowprec_moe.io import convert

    try:
        convert.quantize_options(fmt, columnwise=columnwise, row_scaled=row_scaled,
                                 block_2d=block_2d, fp8_dtype=fp8_dtype)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    _require_file(src, "input file")
    with _errors():
        report = convert.quantize_file(
            src, dst, fmt, columnwise=columnwise, row_scaled=row_scaled, block_2d=block_2d,
            fp8_dtype=fp8_dtype, keys=list(keys) or None, grouped=grouped, device=device,
            allow_nonfinite=allow_nonfinite, progress=_progress)
    _print_report(report, f"quantized ({fmt})")


@main.command(short_help="Dequantize a file written by 'quantize'.")
@click.argument("src", metavar="IN", callback=_suffix_check(_QUANT_OUT))
@click.argument("dst", metavar="OUT", callback=_suffix_check(_ANY_FILE))
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              default="float32", show_default=True, help="Output dtype.")
@click.option("--direction", type=click.Choice(["rowwise", "columnwise"]), default="rowwise",
              show_default=True, help="Which stored copy to decode.")
def dequantize(src, dst, dtype, direction) -> None:
    """Dequantize every quantized tensor of IN and write OUT (.safetensors, .npz or .npy).

    Values are exactly those of lowprec_moe.dequantize; tensors get their original shape
    back and other tensors are copied unchanged. IN may also be a ModelOpt NVFP4 checkpoint
    (NAME, NAME_scale, NAME_scale_2). A .npy OUT needs a file with a single tensor.

    \b
    Example:
      lowprec-moe dequantize model-nvfp4.safetensors model-dq.safetensors --dtype bfloat16
    """
    from lowprec_moe.io import convert

    _require_file(src, "input file")
    with _errors():
        report = convert.dequantize_file(src, dst, dtype=dtype, direction=direction,
                                         progress=_progress)
    _print_report(report, f"dequantized ({direction}, {dtype})")


@main.command("inspect", short_help="Show each tensor of a file; compare with the original.")
@click.argument("path", metavar="FILE", callback=_suffix_check(_ANY_FILE))
@click.option("--against", metavar="ORIGINAL", callback=_suffix_check(_ANY_FILE),
              help="Unquantized file to compare with (tensors matched by name).")
def inspect_cmd(path, against) -> None:
    """Print a table of the tensors in FILE: format, shape, bytes, amax and scale range.

    With --against, each tensor is dequantized and compared with the tensor of the same name
    in ORIGINAL: signal-to-noise ratio in dB and the largest error relative to amax.

    \b
    Example:
      lowprec-moe inspect model-nvfp4.safetensors --against model.safetensors
    """
    from lowprec_moe.io import convert

    _require_file(path, "file")
    if against is not None:
        _require_file(against, "original file")
    with _errors():
        rows = convert.inspect_file(path, against, progress=_progress)
    head = ["name", "format", "shape", "bytes", "amax", "scale range"]
    if against is not None:
        head += ["SNR dB", "max|err|/amax"]
    notes = any(r["note"] for r in rows)
    if notes:
        head.append("note")
    cells = []
    for r in rows:
        c = [r["name"], r["format"], "x".join(map(str, r["shape"])) or "scalar",
             _fmt_bytes(r["bytes"]), "-" if r["amax"] is None else f"{r['amax']:.4g}",
             r["scale_range"]]
        if against is not None:
            snr, err = r["snr_db"], r["max_rel_err"]
            c += ["-" if snr is None else ("inf" if math.isinf(snr) else f"{snr:.2f}"),
                  "-" if err is None else f"{err:.3e}"]
        if notes:
            c.append(r["note"] or "")
        cells.append(c)
    click.echo(f"{path}: {len(rows)} tensors")
    _table(head, cells)


@main.command(short_help="Quantize / dequantize random data and print the errors.")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True, help="Backend: the GPU when usable (auto), NumPy, or CuPy.")
@click.option("--m", "m", type=int, default=256, show_default=True, help="Rows of the input.")
@click.option("--k", "k", type=int, default=1024, show_default=True, help="Columns of the input.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random input.")
def demo(device: str, m: int, k: int, seed: int) -> None:
    """Quantize / dequantize round trips and a GroupedLinear step per recipe, with errors.

    \b
    Example:
      lowprec-moe demo --device cpu --m 128 --k 512
    """
    from lowprec_moe.demo import run_demo

    try:
        run_demo(device=device, m=m, k=k, seed=seed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def _kernel_cache_dir(cupy) -> str:
    if cupy is not None:
        try:
            from cupy.cuda import compiler

            return str(compiler.get_cache_dir())
        except Exception:  # an older or unusual CuPy: fall back to its documented default
            pass
    return os.environ.get("CUPY_CACHE_DIR",
                          os.path.join(os.path.expanduser("~"), ".cupy", "kernel_cache"))


@main.command(short_help="Version, backend, GPU and kernel directories.")
def info() -> None:
    """Version, backend, GPU (name, compute capability) and kernel directories.

    \b
    Example:
      lowprec-moe info
    """
    import lowprec_moe
    from lowprec_moe import backend, kernels

    click.echo(f"lowprec_moe {getattr(lowprec_moe, '__version__', 'unknown')}")
    gpu = backend.cupy_available()
    try:
        import cupy

        cupy_version = cupy.__version__
    except Exception:  # not installed, or a broken CUDA set-up
        cupy, cupy_version = None, None
    click.echo(f"cupy: {cupy_version or 'not installed'}")
    click.echo(f"backend: {'cupy (GPU)' if gpu else 'numpy (CPU reference)'}")
    if gpu:
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        cc = str(dev.compute_capability)
        click.echo(f"gpu {dev.id}: {name}, compute capability {cc[:-1]}.{cc[-1]}")
    else:
        click.echo("gpu: none")
    try:
        click.echo(f"kernel dir: {kernels.kernel_dir()}")
        click.echo(f"kernel source hash: {kernels.source_hash()}")
    except FileNotFoundError as exc:
        click.echo(f"kernel dir: not found ({exc})")
    note = "" if cupy is not None else " (used once CuPy is installed)"
    click.echo(f"kernel cache dir: {_kernel_cache_dir(cupy)}{note}")


if __name__ == "__main__":
    main()
