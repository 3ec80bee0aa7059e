"""Training dynamics of several runs from verl's logs: reward, effective signal ratio, length, entropy, weight.

verl writes a step's metrics to every backend in ``trainer.logger``. Two can be read back offline:
``file`` (JSONL, one ``{"step": s, "data": {metric: value}}`` per step; path ``$VERL_FILE_LOGGER_PATH``)
and ``tensorboard`` (event files under ``$TENSORBOARD_DIR``). ``scripts/train.py`` sets both per run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Panel:
    """One figure: metric keys plotted against step, one line per run and key (keys after the first dashed)."""

    filename: str
    title: str
    ylabel: str
    keys: tuple[str, ...]
    labels: tuple[str, ...]


PANELS: tuple[Panel, ...] = (
    Panel("reward.png", "Training reward", "mean reward", ("critic/score/mean",), ("",)),
    Panel(
        "effective_signal_ratio.png",
        "Effective signal ratio (groups with a non-zero advantage scale)",
        "share of groups",
        ("bv_blend/effective_signal_ratio", "bv_blend/grpo_signal_ratio"),
        ("BV-Blend", "GRPO on the same batch"),
    ),
    Panel("response_length.png", "Response length", "tokens", ("response_length/mean",), ("",)),
    Panel("entropy.png", "Policy entropy", "entropy (nats/token)", ("actor/entropy",), ("",)),
    Panel("weight_mean.png", "Mean blend weight w", "w", ("bv_blend/weight_mean",), ("",)),
)


def read_jsonl_log(path: Path) -> pd.DataFrame:
    """verl's ``file`` logger output as a frame indexed by step (later lines for a step win)."""
    rows: dict[int, dict[str, float]] = {}
    with open(path) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step, data = int(record["step"]), record["data"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number} is not a verl file-logger line ({exc}).") from exc
            numeric = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            rows.setdefault(step, {}).update(numeric)
    return pd.DataFrame.from_dict(rows, orient="index").sort_index().rename_axis("step")


def read_tensorboard_log(path: Path) -> pd.DataFrame:
    """Scalars of a tensorboard log folder (or event file) as a frame indexed by step."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(path), size_guidance={SCALARS: 0})  # 0: keep every point
    accumulator.Reload()
    series = {
        tag: pd.Series({event.step: event.value for event in accumulator.Scalars(tag)})
        for tag in accumulator.Tags()["scalars"]
    }
    if not series:
        raise ValueError(f"{path} holds no tensorboard scalars.")
    return pd.DataFrame(series).sort_index().rename_axis("step")


def read_attempts(run_dir: Path) -> pd.DataFrame:
    """A run folder's ``metrics.jsonl`` and, where the run was resumed, each later attempt's file
    (``launch.metrics_files``: scripts/train.py gives every launch its own, since verl's logger erases the file it
    opens); a step logged by two attempts keeps the later one's values."""
    from bv_blend.paper.launch import metrics_files

    merged = pd.concat([read_jsonl_log(path) for path in metrics_files(run_dir)])
    return merged[~merged.index.duplicated(keep="last")].sort_index()


def load_run(path: Path) -> pd.DataFrame:
    """A run's metrics from a JSONL file, a tensorboard folder, or a run folder holding ``metrics.jsonl`` (with a
    resumed run's ``metrics.<k>.jsonl``) or ``tensorboard/`` (the layout scripts/train.py writes)."""
    path = Path(path).expanduser()
    if path.is_file():
        return read_jsonl_log(path) if path.suffix in (".jsonl", ".json") else read_tensorboard_log(path)
    if (path / "metrics.jsonl").is_file():
        return read_attempts(path)
    if (path / "tensorboard").is_dir():
        return read_tensorboard_log(path / "tensorboard")
    if path.is_dir() and any(path.rglob("events.out.tfevents.*")):
        return read_tensorboard_log(path)
    raise FileNotFoundError(f"{path}: no metrics.jsonl, tensorboard/ folder or tensorboard event file found.")


def plot_dynamics(
    runs: dict[str, pd.DataFrame], out_dir: Path, smooth: int = 1
) -> tuple[list[Path], list[str]]:
    """One PNG per panel with every run's curves; ``smooth`` is a centred rolling mean over that many steps.

    Returns (written PNG paths, notes on what was missing: a metric a run did not log, a panel with no data).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("No runs to plot.")
    if smooth < 1:
        raise ValueError(f"smooth must be >= 1 step, got {smooth}.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, notes = [], []
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for panel in PANELS:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        drawn = 0
        for index, (run, frame) in enumerate(runs.items()):
            for key_index, (key, label) in enumerate(zip(panel.keys, panel.labels, strict=True)):
                if key not in frame.columns or frame[key].dropna().empty:
                    notes.append(f"{panel.filename}: run {run!r} has no {key}")
                    continue
                values = frame[key].dropna()
                values = values.rolling(smooth, center=True, min_periods=1).mean() if smooth > 1 else values
                name = f"{run} ({label})" if label else run
                ax.plot(values.index, values.to_numpy(), color=colours[index % len(colours)],
                        linestyle="-" if key_index == 0 else "--", label=name, linewidth=1.5)
                drawn += 1
        if drawn == 0:
            plt.close(fig)
            notes.append(f"{panel.filename}: no run logged {', '.join(panel.keys)}; figure not written")
            continue
        ax.set(title=panel.title, xlabel="training step", ylabel=panel.ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / panel.filename
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written, notes


def summarise(runs: dict[str, pd.DataFrame], last: int = 50) -> pd.DataFrame:
    """Each panel metric's mean over each run's last ``last`` logged steps (NaN where a run lacks it)."""
    keys = [key for panel in PANELS for key in panel.keys]
    return pd.DataFrame(
        {run: {k: frame[k].dropna().tail(last).mean() if k in frame else math.nan for k in keys}
         for run, frame in runs.items()}
    ).T
