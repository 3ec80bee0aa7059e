"""Reads verl's logs of one run and compares runs: the side-by-side table and the PNG plot.

Sources, both written by verl itself: the "file" logger's JSONL (one ``{"step", "data"}`` line per step, at
VERL_FILE_LOGGER_PATH) and the rollout dump of ``trainer.rollout_data_dir`` (one JSONL per step with each row's
prompt and score), from which the GRPO run's signal ratio is recomputed: the share of groups whose rewards are
not all equal. Rows are grouped by prompt text, which is unique within a step unless one prompt is drawn twice.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

REWARD = "critic/score/mean"
STEP_TIME = "timing_s/step"
ADV_TIME = "timing_s/adv"
BV_SIGNAL = "bv_blend/effective_signal_ratio"
BV_GRPO_SIGNAL = "bv_blend/grpo_signal_ratio"


def read_metrics(path: Path) -> pd.DataFrame:
    """verl's file-logger JSONL as one row per training step (columns: metric names)."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            rows.append({"step": record["step"], **record["data"]})
    if not rows:
        raise ValueError(f"{path} holds no logged step; did the run fail? See the run's log next to it.")
    return pd.DataFrame(rows).set_index("step").sort_index()


def _groups_per_step(rollout_dir: Path) -> dict[int, list[list[float]]]:
    """Per step: the scores of each prompt group in verl's rollout dump."""
    steps = {}
    for path in sorted(rollout_dir.glob("*.jsonl")):
        groups: dict[str, list[float]] = defaultdict(list)
        step = None
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                groups[row["input"]].append(float(row["score"]))
                step = row.get("step", step)
        if groups and step is not None:
            steps[int(step)] = list(groups.values())
    return steps


def group_signal_ratio(rollout_dir: Path) -> pd.Series:
    """Per step: share of prompt groups whose scores are not all equal (GRPO's non-zero-advantage groups)."""
    ratios = {step: sum(max(v) - min(v) > 1e-6 for v in groups) / len(groups)
              for step, groups in _groups_per_step(rollout_dir).items()}
    return pd.Series(ratios, name="signal_ratio", dtype=float).sort_index()


def group_shares(rollout_dir: Path) -> dict[str, float]:
    """Share (%) of all-right and all-wrong groups (0/1 scores) over a run's rollout dump: GRPO's zero-signal groups."""
    groups = [g for step_groups in _groups_per_step(rollout_dir).values() for g in step_groups]
    if not groups:
        return {"all-right %": float("nan"), "all-wrong %": float("nan")}
    return {"all-right %": 100 * sum(min(g) > 0.5 for g in groups) / len(groups),
            "all-wrong %": 100 * sum(max(g) < 0.5 for g in groups) / len(groups)}


def run_summary(metrics: pd.DataFrame, signal: pd.Series) -> dict[str, float]:
    """The table's numbers for one run."""
    adv_share = (metrics[ADV_TIME] / metrics[STEP_TIME]).mean() if ADV_TIME in metrics else float("nan")
    half = max(1, len(metrics) // 2)
    return {
        "reward first half": metrics[REWARD].iloc[:half].mean(),
        "reward last half": metrics[REWARD].iloc[half:].mean() if len(metrics) > 1 else float("nan"),
        "signal ratio": signal.mean() if len(signal) else float("nan"),
        "GRPO signal ratio": (metrics[BV_GRPO_SIGNAL].mean() if BV_GRPO_SIGNAL in metrics else signal.mean()),
        "step time s": metrics[STEP_TIME].iloc[1:].mean() if len(metrics) > 1 else metrics[STEP_TIME].mean(),
        "adv share %": 100 * adv_share,
    }


def signal_of(method: str, metrics: pd.DataFrame, rollout_dir: Path) -> pd.Series:
    """BV-Blend logs its own effective signal ratio; GRPO's is recomputed from the rollout dump."""
    if method == "bv_blend":
        if BV_SIGNAL not in metrics:
            raise ValueError(f"the bv_blend run logged no {BV_SIGNAL}: is the bv_blend verl plugin installed?")
        return metrics[BV_SIGNAL]
    return group_signal_ratio(rollout_dir)


def comparison_table(summaries: dict[str, dict[str, float]]) -> str:
    frame = pd.DataFrame(summaries).T
    return frame.to_string(float_format=lambda v: f"{v:.3f}")


def plot_curves(curves: dict[str, tuple[pd.DataFrame, pd.Series]], out_png: Path) -> Path:
    """Reward, signal ratio and step time per step, one line per method."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for method, (metrics, signal) in curves.items():
        axes[0].plot(metrics.index, metrics[REWARD], marker="o", label=method)
        axes[1].plot(signal.index, signal.values, marker="o", label=method)
        axes[2].plot(metrics.index, metrics[STEP_TIME], marker="o", label=method)
    titles = ["mean reward (0/1 verifier)", "effective signal ratio (groups with signal)", "step time (s)"]
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[1].set_ylim(0, 1.05)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png
