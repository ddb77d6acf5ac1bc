"""Pictures: loss curves of a training run per recipe, and per-tensor errors of ``inspect``.

matplotlib is imported only when a function here is called (the ``plot`` extra); figures are
drawn on a ``matplotlib.figure.Figure`` and saved directly, so no pyplot state or interactive
backend is touched.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

__all__ = ["plot_inspect", "plot_loss_curves"]


def _figure(width: float, height: float, ncols: int = 1):
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("plotting needs matplotlib: pip install 'lowprec-moe[plot]'"
                                  ) from exc
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def _ema(values: Sequence[float], alpha: float) -> list[float]:
    out, acc = [], None
    for v in values:
        acc = v if acc is None else alpha * acc + (1 - alpha) * v
        out.append(acc)
    return out


def plot_loss_curves(runs: Mapping[str, Mapping[str, Any]], path, *, title: str = "",
                     baseline: str | None = "bf16", smoothing: float = 0.9) -> None:
    """Train (smoothed) and held-out loss per recipe, and each recipe's gap to a baseline.

    Parameters
    ----------
    runs : mapping recipe name -> dict
        Each with ``train_steps`` / ``train_loss`` (lists of equal length) and optionally
        ``eval_steps`` / ``eval_loss``.
    path : str or os.PathLike
        Output image (the suffix picks the format, e.g. ``.png``).
    title : str
    baseline : str or None
        Recipe whose smoothed train loss the right panel divides by; None (or a baseline not
        in ``runs``) draws the curves only.
    smoothing : float
        Exponential moving average factor of the train curves, in ``[0, 1)``.
    """
    if not runs:
        raise ValueError("runs is empty: nothing to plot")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing={smoothing} must be in [0, 1)")
    with_gap = baseline is not None and baseline in runs and len(runs) > 1
    fig, axes = _figure(11 if with_gap else 6.5, 4.2, 2 if with_gap else 1)
    ax = axes[0]
    smooth = {}
    for i, (name, r) in enumerate(runs.items()):
        color = f"C{i}"
        smooth[name] = _ema(r["train_loss"], smoothing)
        ax.plot(r["train_steps"], smooth[name], color=color, lw=1.6, label=f"{name} train")
        if r.get("eval_steps"):
            ax.plot(r["eval_steps"], r["eval_loss"], color=color, lw=1.0, ls="--", marker="o",
                    ms=3, label=f"{name} held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    ax.set_title("loss per recipe")
    if title:
        fig.suptitle(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if with_gap:
        ax2 = axes[1]
        base = smooth[baseline]
        steps = runs[baseline]["train_steps"]
        for i, (name, s) in enumerate(smooth.items()):
            if name == baseline:
                continue
            n = min(len(s), len(base))
            gap = [100.0 * (s[j] - base[j]) / base[j] for j in range(n)]
            ax2.plot(steps[:n], gap, color=f"C{i}", lw=1.4, label=name)
        ax2.axhline(0.0, color="k", lw=0.8)
        ax2.set_xlabel("step")
        ax2.set_ylabel(f"smoothed train loss vs {baseline} (%)")
        ax2.set_title(f"gap to {baseline}")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8)
    fig.savefig(path, dpi=120)


def plot_inspect(rows: Sequence[Mapping[str, Any]], path, *, title: str = "") -> int:
    """Per-tensor SNR (dB) and largest error relative to amax as horizontal bars.

    Parameters
    ----------
    rows : sequence of dict
        ``inspect`` rows: ``name``, ``format``, ``snr_db`` and ``max_rel_err`` (None where no
        comparison was possible; such rows are left out).
    path : str or os.PathLike
        Output image.
    title : str

    Returns
    -------
    int
        Number of tensors drawn.

    Raises
    ------
    ValueError
        When no row has an SNR (nothing was compared).
    """
    rows = [r for r in rows if r.get("snr_db") is not None]
    if not rows:
        raise ValueError("no tensor was compared with an original (no SNR to plot)")
    names = [f"{r['name']} ({r['format']})" for r in rows]
    finite = [r["snr_db"] for r in rows if not math.isinf(r["snr_db"])]
    cap = (max(finite) + 10.0) if finite else 100.0
    snr = [cap if math.isinf(r["snr_db"]) else r["snr_db"] for r in rows]
    err = [float(r["max_rel_err"] or 0.0) for r in rows]
    nonzero = [e for e in err if e > 0]
    floor = min(nonzero) / 10 if nonzero else 1e-8
    height = 1.2 + 0.28 * len(rows)
    fig, (ax1, ax2) = _figure(11, height, 2)
    ypos = list(range(len(rows)))
    bars = ax1.barh(ypos, snr, color="C0")
    for b, r in zip(bars, rows):
        label = "exact" if math.isinf(r["snr_db"]) else f"{r['snr_db']:.1f}"
        ax1.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {label}", va="center",
                 fontsize=7)
    ax1.set_yticks(ypos, names, fontsize=7)
    ax1.invert_yaxis()
    ax1.set_xlabel("SNR (dB, higher is better)")
    ax1.set_title(title or "quantized vs original")
    ax1.grid(axis="x", alpha=0.3)
    # a zero error has no bar on a log axis: mark it in words instead
    ax2.barh(ypos, [e if e > 0 else floor for e in err], color="C3", left=0)
    for y, e in zip(ypos, err):
        if e == 0:
            ax2.text(floor, y, " 0 (exact)", va="center", fontsize=7)
    ax2.set_xscale("log")
    ax2.set_xlim(left=floor)
    ax2.set_yticks(ypos, [""] * len(rows))
    ax2.invert_yaxis()
    ax2.set_xlabel("max |error| / amax (log)")
    ax2.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=120)
    return len(rows)
