"""Chart of the grouped-GEMM table: ratio to torch bf16 per shape and format, one panel per GEMM.

Usage::

    python benchmarks/plot_tables.py [--json benchmarks/results/gemm_h200.json]
                                     [--out benchmarks/images/gemm_ratios.png]

Reads the machine-readable table (``ratios[shape][mode][format]`` = torch time / our time, as
``bench_gemm.py`` prints it) and draws grouped bars with the 0.6x milestone and parity marked.
Needs matplotlib (imported here only; it is not a dependency of the library).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("fprop", "dgrad", "wgrad")
COLORS = {"bf16": "#7f7f7f", "mxfp8": "#1f77b4", "nvfp4": "#d62728", "nvfp4-rs": "#ff9896"}


def plot(table: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = table["ratios"]
    shapes = list(ratios)
    formats = [f for f in COLORS if any(f in ratios[s][m] for s in shapes for m in MODES)]
    top = max(v for s in shapes for m in MODES for v in ratios[s][m].values())
    fig, axes = plt.subplots(3, 1, figsize=(10, 9.5), sharex=True)
    width = 0.8 / len(formats)
    for ax, mode in zip(axes, MODES):
        for j, fmt in enumerate(formats):
            xs, ys = [], []
            for i, s in enumerate(shapes):
                if fmt in ratios[s][mode]:
                    xs.append(i + (j - (len(formats) - 1) / 2) * width)
                    ys.append(ratios[s][mode][fmt])
            bars = ax.bar(xs, ys, width, color=COLORS[fmt], label=fmt)
            ax.bar_label(bars, fmt="%.2f", fontsize=6.5, padding=1, rotation=90)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(0.6, color="black", lw=0.8, ls="--")
        ax.set_ylim(0, top * 1.15)
        ax.set_ylabel(f"{mode}\ntorch time / ours")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(ncol=len(formats), loc="upper left", fontsize=8)
    axes[-1].set_xticks(range(len(shapes)), shapes)
    fig.suptitle(f"Grouped GEMM vs torch._grouped_mm bf16 ({table['card']}, {table['commit']}); "
                 "dashed: 0.6x milestone, solid: parity", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=HERE / "results" / "gemm_h200.json")
    ap.add_argument("--out", type=Path, default=HERE / "images" / "gemm_ratios.png")
    args = ap.parse_args()
    plot(json.loads(args.json.read_text()), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
