"""Reads what verl wrote for one run and compares runs: held-out pass rates, signal, step time; tables and a plot.

Sources, all written by verl itself:
- the "file" logger's JSONL (one ``{"step", "data"}`` line per step, at VERL_FILE_LOGGER_PATH). The line of step 0
  holds the validation before training; verl's validation loop logs the pass rate of each data_source, i.e. of
  each task family, as ``val-core/<family>/acc/mean@<samples>``;
- the validation dump of ``trainer.validation_data_dir`` (one JSONL per validation, a row per response with its
  prompt, response and score): the prompt-level spread behind the confidence intervals, and the answer format;
- the rollout dump of ``trainer.rollout_data_dir`` (one JSONL per training step), from which the all-right and
  all-wrong shares and the GRPO run's signal ratio (share of groups whose rewards are not all equal) are counted.

Confidence intervals are over held-out prompts: a validation's pass rate is the mean over prompts of each prompt's
mean score, with a 95% interval of 1.96 standard errors of those prompt means; the gain between two validations
is paired by prompt. This is the noise of measuring on a finite set of prompts with a few samples each, not the
run-to-run noise of training, which scripts/compare_cpu.py measures over seeds.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bv_blend.demo.reward import in_answer_format  # noqa: E402

REWARD = "critic/score/mean"
STEP_TIME = "timing_s/step"
ADV_TIME = "timing_s/adv"
BV_SIGNAL = "bv_blend/effective_signal_ratio"
BV_GRPO_SIGNAL = "bv_blend/grpo_signal_ratio"
VAL_CORE = re.compile(r"^val-core/(?P<source>[^/]+)/acc/mean@(?P<samples>\d+)$")
OVERALL = "all"
Z95 = 1.959963984540054


def read_metrics(path: Path) -> pd.DataFrame:
    """verl's file-logger JSONL as one row per logged step (columns: metric names)."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            rows.append({"step": record["step"], **record["data"]})
    if not rows:
        raise ValueError(f"{path} holds no logged step; did the run fail? See the run's log next to it.")
    # one row per step: verl logs the validation before training as a line of its own (step 0)
    return pd.DataFrame(rows).groupby("step").last().sort_index()


def training_steps(metrics: pd.DataFrame) -> pd.DataFrame:
    """The rows of training steps (step 0 is the validation before training)."""
    return metrics[metrics.index >= 1].dropna(subset=[STEP_TIME]) if STEP_TIME in metrics else metrics.iloc[0:0]


# ---------------------------------------------------------------------------------------------------- validation
def validation_curve(metrics: pd.DataFrame, family_sizes: dict[str, int] | None = None) -> pd.DataFrame:
    """Held-out pass rate per validation step: one column per family (verl's ``val-core/<family>/acc/mean@n``)
    and ``all``, the mean over families weighted by their number of prompts (equal weights when not given)."""
    columns = {}
    for name in metrics.columns:
        match = VAL_CORE.match(name)
        if match:
            columns[match["source"]] = metrics[name]
    if not columns:
        raise ValueError("no val-core/<source>/acc/mean@<n> metric in the run's log: was it run with "
                         "trainer.val_before_train=true or trainer.test_freq > 0?")
    order = [f for f in (family_sizes or {}) if f in columns] + sorted(set(columns) - set(family_sizes or {}))
    curve = pd.DataFrame({f: columns[f] for f in order}).dropna(how="all")
    sizes = pd.Series({f: (family_sizes or {}).get(f, 1) for f in curve.columns}, dtype=float)
    curve[OVERALL] = (curve * sizes).sum(axis=1, min_count=1) / sizes.sum()
    return curve


def _question_of(prompt: str, questions: list[str]) -> str | None:
    """The held-out question a decoded prompt contains (the longest one, so that "5." never matches "15.")."""
    found = [q for q in questions if q in prompt]
    return max(found, key=len) if found else None


def read_validation_dump(dump_dir: Path, question_family: dict[str, str]) -> pd.DataFrame:
    """Every validation response: step, family, question, score (0/1) and whether it has the answer marker."""
    questions = sorted(question_family)
    rows = []
    for path in sorted(dump_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            question = _question_of(row["input"], questions)
            if question is None:
                raise ValueError(f"{path}: a validation prompt matches no held-out question: {row['input']!r}")
            rows.append({"step": int(row["step"]), "family": question_family[question], "question": question,
                         "score": float(row["score"]), "in_format": in_answer_format(row["output"])})
    return pd.DataFrame(rows, columns=["step", "family", "question", "score", "in_format"])


def _prompt_means(samples: pd.DataFrame, step: int, column: str = "score") -> pd.Series:
    at = samples[samples["step"] == step]
    if at.empty:
        raise ValueError(f"no validation responses at step {step} (steps: {sorted(samples['step'].unique())})")
    return at.groupby("question")[column].mean()


def pass_rate_ci(samples: pd.DataFrame, step: int) -> tuple[float, float]:
    """Pass rate at a validation step and the half-width of its 95% interval over prompts."""
    means = _prompt_means(samples, step)
    half = Z95 * means.std(ddof=1) / math.sqrt(len(means)) if len(means) > 1 else float("nan")
    return float(means.mean()), float(half)


def paired_gain(samples: pd.DataFrame, first: int, last: int) -> tuple[float, float]:
    """Pass rate at ``last`` minus at ``first``, paired by prompt, and the half-width of its 95% interval."""
    before, after = _prompt_means(samples, first), _prompt_means(samples, last)
    diff = (after - before).dropna()
    half = Z95 * diff.std(ddof=1) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    return float(diff.mean()), float(half)


def format_share(samples: pd.DataFrame, step: int) -> float:
    """Share of validation responses at ``step`` that carry the verifier's answer marker."""
    return float(samples.loc[samples["step"] == step, "in_format"].mean())


# ------------------------------------------------------------------------------------------------ training signal
def _groups_per_step(rollout_dir: Path) -> dict[int, list[list[float]]]:
    """Per step: the scores of each prompt group in verl's rollout dump.

    Rows are grouped by verl's uid (the dump's ``uid`` is ``<uid>_<session>_<output>``), so that a prompt drawn
    twice in one batch still makes two groups; dumps without it are grouped by prompt text.
    """
    steps = {}
    for path in sorted(rollout_dir.glob("*.jsonl")):
        groups: dict[str, list[float]] = {}
        step = None
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                key = row["uid"].rsplit("_", 2)[0] if "uid" in row else row["input"]
                groups.setdefault(key, []).append(float(row["score"]))
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


def signal_of(method: str, metrics: pd.DataFrame, rollout_dir: Path) -> pd.Series:
    """BV-Blend logs its own effective signal ratio; GRPO's is recomputed from the rollout dump."""
    if method == "bv_blend":
        if BV_SIGNAL not in metrics:
            raise ValueError(f"the bv_blend run logged no {BV_SIGNAL}: is the bv_blend verl plugin installed?")
        return training_steps(metrics)[BV_SIGNAL]
    return group_signal_ratio(rollout_dir)


# --------------------------------------------------------------------------------------------------------- a run
@dataclass
class RunRecord:
    """What the tables and plots need from one verl run."""

    method: str
    metrics: pd.DataFrame
    validation: pd.DataFrame  # validation_curve
    samples: pd.DataFrame  # read_validation_dump
    signal: pd.Series
    shares: dict[str, float]

    @property
    def first_val(self) -> int:
        return int(self.validation.index.min())

    @property
    def last_val(self) -> int:
        return int(self.validation.index.max())

    def summary(self) -> dict[str, float]:
        """The table's numbers for this run (pass rates as fractions, shares in %)."""
        train = training_steps(self.metrics)
        before, before_ci = pass_rate_ci(self.samples, self.first_val)
        after, after_ci = pass_rate_ci(self.samples, self.last_val)
        gain, gain_ci = paired_gain(self.samples, self.first_val, self.last_val)
        # step 1 includes vLLM's first-use costs; the mean share is over the steady steps
        steady = train.iloc[1:] if len(train) > 1 else train
        adv_share = (steady[ADV_TIME] / steady[STEP_TIME]).mean() if ADV_TIME in steady else float("nan")
        grpo_signal = train[BV_GRPO_SIGNAL].mean() if BV_GRPO_SIGNAL in train else self.signal.mean()
        return {
            "val before": before, "val before ±": before_ci, "val after": after, "val after ±": after_ci,
            "gain": gain, "gain ±": gain_ci,
            "in format before": format_share(self.samples, self.first_val),
            "in format after": format_share(self.samples, self.last_val),
            "signal ratio": float(self.signal.mean()) if len(self.signal) else float("nan"),
            "GRPO signal ratio": float(grpo_signal),
            **self.shares,
            "step time s": float(steady[STEP_TIME].mean()) if len(steady) else float("nan"),
            "adv share %": 100 * float(adv_share),
            "steps": float(len(train)),
        }


def read_run(method: str, run_dir: Path, question_family: dict[str, str]) -> RunRecord:
    """Reads a run folder written by bv_blend.demo.pipeline.run_method."""
    metrics = read_metrics(run_dir / "metrics.jsonl")
    sizes: dict[str, int] = {}
    for family in question_family.values():  # in the order of the file: the task's family order
        sizes[family] = sizes.get(family, 0) + 1
    return RunRecord(
        method=method,
        metrics=metrics,
        validation=validation_curve(metrics, sizes),
        samples=read_validation_dump(run_dir / "validation", question_family),
        signal=signal_of(method, metrics, run_dir / "rollouts"),
        shares=group_shares(run_dir / "rollouts"),
    )


# ------------------------------------------------------------------------------------------------- tables, plot
def pass_rate_table(runs: dict[str, RunRecord]) -> pd.DataFrame:
    """Rows: families and ``all``; columns: ``<method> before`` / ``<method> after`` (held-out pass rates)."""
    columns = {}
    for method, run in runs.items():
        columns[f"{method} before"] = run.validation.loc[run.first_val]
        columns[f"{method} after"] = run.validation.loc[run.last_val]
    return pd.DataFrame(columns)


def stats_table(runs: dict[str, RunRecord]) -> pd.DataFrame:
    """Rows: methods; columns: the gain with its interval, answer format, signal, group shares, step time."""
    rows = {}
    for method, run in runs.items():
        s = run.summary()
        rows[method] = {
            "val before": f"{s['val before']:.3f} ± {s['val before ±']:.3f}",
            "val after": f"{s['val after']:.3f} ± {s['val after ±']:.3f}",
            "gain (95% CI)": f"{s['gain']:+.3f} ± {s['gain ±']:.3f}",
            "in format": f"{s['in format before']:.2f} -> {s['in format after']:.2f}",
            "signal ratio": f"{s['signal ratio']:.3f}",
            "GRPO signal ratio": f"{s['GRPO signal ratio']:.3f}",
            "all-right %": f"{s['all-right %']:.1f}",
            "all-wrong %": f"{s['all-wrong %']:.1f}",
            "step time s": f"{s['step time s']:.2f}",
            "adv share %": f"{s['adv share %']:.2f}",
        }
    return pd.DataFrame(rows).T


def demo_tables(runs: dict[str, RunRecord]) -> str:
    """The two tables the demo prints and writes to table.txt."""
    rates = pass_rate_table(runs).to_string(float_format=lambda v: f"{v:.3f}")
    first = {r.first_val for r in runs.values()}
    last = {r.last_val for r in runs.values()}
    return (f"held-out pass rate (T=1) per family, before (step {min(first)}) and after (step {max(last)}) training\n"
            f"{rates}\n\n{stats_table(runs).to_string()}")


def plot_runs(runs: dict[str, RunRecord], out_png: Path) -> Path:
    """Held-out pass rate over steps (95% band over prompts) beside the effective signal ratio, one line per
    method; a third panel shows each family's held-out pass rate."""
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (method, run) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        steps = list(run.validation.index)
        cis = [pass_rate_ci(run.samples, step) for step in steps]
        mean = np.array([c[0] for c in cis])
        half = np.array([c[1] for c in cis])
        axes[0].plot(steps, run.validation[OVERALL], marker="o", color=color, label=method)
        axes[0].fill_between(steps, mean - half, mean + half, color=color, alpha=0.15)
        axes[1].plot(run.signal.index, run.signal.values, marker=".", color=color, label=method)
        for j, family in enumerate(c for c in run.validation.columns if c != OVERALL):
            axes[2].plot(steps, run.validation[family], color=colors[j % len(colors)],
                         linestyle="-" if i == 0 else "--", label=f"{family} ({method})")
    titles = ["held-out pass rate, T=1 (band: 95% over prompts)", "effective signal ratio (groups with signal)",
              "held-out pass rate per family"]
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[1].legend()
    axes[2].legend(fontsize=7, ncol=2)
    axes[1].set_ylim(0, 1.05)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png
