"""Command-line interface: ``lowprec-moe demo`` and ``lowprec-moe info``."""

from __future__ import annotations

import click


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lowprec-moe")
    except PackageNotFoundError:  # running from a checkout that is not installed
        import lowprec_moe

        return getattr(lowprec_moe, "__version__", "unknown")


@click.group()
@click.version_option(version=_version(), prog_name="lowprec-moe")
def main() -> None:
    """lowprec_moe: NVFP4 / MXFP8 quantization and grouped MoE layers (NumPy and CuPy)."""


@main.command()
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True, help="Backend: the GPU when usable (auto), NumPy, or CuPy.")
@click.option("--m", "m", type=int, default=256, show_default=True, help="Rows of the input.")
@click.option("--k", "k", type=int, default=1024, show_default=True, help="Columns of the input.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random input.")
def demo(device: str, m: int, k: int, seed: int) -> None:
    """Quantize / dequantize random data with every recipe and print the errors."""
    from lowprec_moe.demo import run_demo

    try:
        run_demo(device=device, m=m, k=k, seed=seed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


@main.command()
def info() -> None:
    """Version, backend, GPU and kernel sources."""
    import lowprec_moe
    from lowprec_moe import backend, kernels

    click.echo(f"lowprec_moe {getattr(lowprec_moe, '__version__', 'unknown')}")
    gpu = backend.cupy_available()
    try:
        import cupy

        cupy_version = cupy.__version__
    except Exception:  # not installed, or a broken CUDA set-up
        cupy_version = None
    click.echo(f"cupy: {cupy_version or 'not installed'}")
    click.echo(f"backend: {'cupy (GPU)' if gpu else 'numpy (CPU reference)'}")
    if gpu:
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        cc = str(dev.compute_capability)
        click.echo(f"gpu {dev.id}: {name}, compute capability {cc[:-1]}.{cc[-1]}")
    try:
        click.echo(f"kernel dir: {kernels.kernel_dir()}")
        click.echo(f"kernel source hash: {kernels.source_hash()}")
    except FileNotFoundError as exc:
        click.echo(f"kernel dir: not found ({exc})")


if __name__ == "__main__":
    main()
