"""The report's plots (matplotlib, Agg): held-out pass rate over rollouts consumed and over steps, per arm, with
95% bands over seeds; and each arm's paired difference to the reference."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from instruments import stats

DPI = 90


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curves(series: Mapping[str, tuple[np.ndarray, np.ndarray]], budget: int, path: Path, title: str,
           target: float | None = None) -> Path:
    """``series``: label -> (eval steps, (seeds, points) pass rates). Left: over rollouts; right: over steps."""
    plt = _pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for label, (steps, values) in series.items():
        mean, low, high = stats.band(values)
        for axis, x in ((axes[0], steps * budget / 1000), (axes[1], steps)):
            (line,) = axis.plot(x, mean, label=f"{label} ({len(values)} seeds)")
            axis.fill_between(x, low, high, color=line.get_color(), alpha=0.15)
    for axis in axes:
        if target is not None:
            axis.axhline(target, color="black", lw=0.8, ls="--")
        axis.grid(alpha=0.3)
    axes[0].set_xlabel("rollouts consumed (thousands)")
    axes[1].set_xlabel("step")
    axes[0].set_ylabel("held-out pass rate (T=1)")
    axes[1].legend(fontsize=8, loc="lower right")
    figure.suptitle(title + ("; dashed: the reference's final value" if target is not None else ""), fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path


def differences(series: Mapping[str, tuple[np.ndarray, np.ndarray]], path: Path, title: str) -> Path:
    """``series``: label -> (eval steps, (seeds, points) paired differences to the reference)."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7.5, 4.5))
    for label, (steps, values) in series.items():
        mean, low, high = stats.band(values)
        (line,) = axis.plot(steps, mean, label=label)
        axis.fill_between(steps, low, high, color=line.get_color(), alpha=0.15)
    axis.axhline(0.0, color="black", lw=0.8)
    axis.set_xlabel("step")
    axis.set_ylabel("held-out pass rate, arm - reference (paired by seed)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path
