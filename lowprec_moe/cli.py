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


def _model_path(allowed: Sequence[str]):
    """Click callback: a file with a suffix in ``allowed``, a ``*.index.json`` or a directory."""
    check = _suffix_check(allowed)

    def callback(ctx, param, value):
        if value is None or os.path.isdir(value) or value.endswith(".index.json"):
            return value
        if not os.path.splitext(value)[1] and not os.path.exists(value):
            return value  # a directory to be created (an output)
        return check(ctx, param, value)

    return callback


def _require_file(path: str, what: str, directory_ok: bool = False) -> None:
    if not os.path.exists(path):
        raise _Failure(f"{what} {path!r} does not exist")
    if os.path.isdir(path) and not directory_ok:
        raise _Failure(f"{what} {path!r} is a directory")


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM / SIGHUP / SIGINT: temporary files go, one line says so, status 128 + signal."""
    from lowprec_moe.io._safety import Interrupted, cleanup_on_signals

    try:
        with cleanup_on_signals():
            yield
    except Interrupted as exc:
        click.echo(f"Error: {exc}; no output was written", err=True)
        sys.exit(128 + exc.signum)
    except KeyboardInterrupt:
        click.echo("Error: interrupted; no output was written", err=True)
        sys.exit(130)


def _byte_progress(quiet: bool):
    from lowprec_moe.io.progress import ByteProgress, NoProgress

    return NoProgress() if quiet else ByteProgress(sys.stderr)


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
    if getattr(report, "files", None):
        click.echo(f"  files: {', '.join(report.files)}")
    for name, count, pattern in getattr(report, "split", []):
        click.echo(f"  expert stack {name}: {count} experts written as {pattern}")
    for name in getattr(report, "fused", []):
        click.echo(f"  expert stack {name}: kept fused (one amax per expert)")
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


@main.command(short_help="Quantize a model: a file, a sharded index or a directory.")
@click.argument("src", metavar="IN", callback=_model_path(_ANY_FILE))
@click.argument("dst", metavar="OUT", callback=_model_path(_QUANT_OUT))
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
              help="Quantize only tensors whose name matches (repeatable); others are copied. "
                   "Also quantizes tensors excluded by default when they match.")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Never quantize tensors whose name matches (repeatable).")
@click.option("--layout", type=click.Choice(["modelopt", "compressed-tensors", "lowprec"]),
              default="modelopt", show_default=True,
              help="Array names and configs: ModelOpt, compressed-tensors (nvfp4-pack-"
                   "quantized), or lowprec (exact amax, columnwise copies, row scaling).")
@click.option("--experts", type=click.Choice(["split", "fused", "flat"]), default="split",
              show_default=True,
              help="3-D tensors [G, N, K]: one tensor per expert, one grouped tensor with one "
                   "amax per expert, or one [G*N, K] matrix.")
@click.option("--grouped", is_flag=True, hidden=True, help="Same as --experts fused.")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True, help="Quantize on the GPU (CuPy) or the CPU (NumPy).")
@click.option("--allow-nonfinite", is_flag=True,
              help="Quantize tensors holding NaN / inf instead of refusing them.")
@click.option("--force", is_flag=True, help="Replace an existing OUT (never an input).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Tensors quantized at once on the CPU  [default: the cores, at most 8]")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
def quantize(src, dst, fmt, row_scaled, block_2d, columnwise, fp8_dtype, keys, exclude, layout,
             experts, grouped, device, allow_nonfinite, force, jobs, quiet) -> None:
    """Quantize the matrices of IN to NVFP4 or MXFP8 and write OUT.

    IN is a .npy, .npz or .safetensors file, a *.safetensors.index.json or a model directory
    (float32, float16 or bfloat16 tensors). A file gives a file OUT (.safetensors or .npz);
    an index or a directory gives a directory OUT with the same shards, the index,
    config.json with quantization_config, hf_quant_config.json (ModelOpt) and the other files.
    Embeddings, lm_head, router gates, norms and biases stay unquantized unless --keys names
    them; expert stacks [G, N, K] become one tensor per expert (--experts). Tensors that are
    not quantized are copied unchanged and reported. OUT never replaces IN, and replaces an
    existing file only with --force.

    \b
    Example:
      lowprec-moe quantize ./Qwen3-30B-A3B ./Qwen3-30B-A3B-nvfp4 --format nvfp4
      lowprec-moe quantize model.safetensors model-nvfp4.safetensors \\
          --format nvfp4 --layout compressed-tensors --exclude '*.shared_expert.*'
    """
    from lowprec_moe.io import convert, serving

    try:
        opts = convert.quantize_options(fmt, columnwise=columnwise, row_scaled=row_scaled,
                                        block_2d=block_2d, fp8_dtype=fp8_dtype)
        serving.check_layout(layout, fmt, opts, "fused" if grouped else experts)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    _require_file(src, "input", directory_ok=True)
    with _interruptible(), _errors():
        report = convert.quantize_file(
            src, dst, fmt, columnwise=columnwise, row_scaled=row_scaled, block_2d=block_2d,
            fp8_dtype=fp8_dtype, keys=list(keys) or None, exclude=list(exclude) or None,
            experts="fused" if grouped else experts, layout=layout, device=device,
            allow_nonfinite=allow_nonfinite, force=force, jobs=jobs,
            progress=_byte_progress(quiet))
    _print_report(report, f"quantized ({fmt}, {layout} layout)")


@main.command(short_help="Dequantize a file or model written by 'quantize'.")
@click.argument("src", metavar="IN", callback=_model_path(_QUANT_OUT))
@click.argument("dst", metavar="OUT", callback=_model_path(_ANY_FILE))
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              default=None, help="Output dtype  [default: each tensor's original dtype]")
@click.option("--direction", type=click.Choice(["rowwise", "columnwise"]), default="rowwise",
              show_default=True, help="Which stored copy to decode.")
@click.option("--force", is_flag=True, help="Replace an existing OUT (never an input).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
def dequantize(src, dst, dtype, direction, force, quiet) -> None:
    """Dequantize every quantized tensor of IN and write OUT (.safetensors, .npz or .npy).

    Values are exactly those of lowprec_moe.dequantize, in each tensor's original dtype
    unless --dtype is given; tensors get their original shape back (expert stacks are stacked
    again) and other tensors are copied unchanged. IN may be a file, an index or a directory
    (giving a directory), or a ModelOpt NVFP4 checkpoint (NAME, NAME_scale, NAME_scale_2). A
    .npy OUT needs a file with a single tensor and a dtype NumPy reads (not bfloat16).

    \b
    Example:
      lowprec-moe dequantize model-nvfp4.safetensors model-dq.safetensors --dtype bfloat16
    """
    from lowprec_moe.io import convert

    _require_file(src, "input", directory_ok=True)
    with _interruptible(), _errors():
        report = convert.dequantize_file(src, dst, dtype=dtype, direction=direction,
                                         force=force, progress=_byte_progress(quiet))
    _print_report(report, f"dequantized ({direction}, {dtype or 'original dtypes'})")


@main.command("inspect", short_help="Show each tensor of a file; compare with the original.")
@click.argument("path", metavar="FILE", callback=_suffix_check(_ANY_FILE))
@click.option("--against", metavar="ORIGINAL", callback=_suffix_check(_ANY_FILE),
              help="Unquantized file to compare with (tensors matched by name).")
@click.option("--plot", "plot_path", metavar="FILE.png",
              help="Also draw per-tensor SNR and error bars into this image (needs --against "
                   "and matplotlib).")
def inspect_cmd(path, against, plot_path) -> None:
    """Print a table of the tensors in FILE: format, shape, bytes, amax and scale range.

    With --against, each tensor is dequantized and compared with the tensor of the same name
    in ORIGINAL: signal-to-noise ratio in dB and the largest error relative to amax; --plot
    draws both as bars per tensor.

    \b
    Example:
      lowprec-moe inspect model-nvfp4.safetensors --against model.safetensors --plot err.png
    """
    from lowprec_moe.io import convert

    if plot_path is not None and against is None:
        raise click.UsageError("--plot needs --against ORIGINAL (it draws the comparison)")
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
    if plot_path is not None:
        from lowprec_moe.plot import plot_inspect

        with _errors():
            drawn = plot_inspect(rows, plot_path, title=f"{os.path.basename(path)} vs "
                                                        f"{os.path.basename(against)}")
        click.echo(f"wrote {plot_path} ({drawn} tensors)")


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
