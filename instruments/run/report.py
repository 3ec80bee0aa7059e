"""Reads what verl wrote for one run and compares runs: held-out pass rates, signal, step time; tables and a plot.

Sources, all written by verl itself:
- the "file" logger's JSONL (one ``{"step", "data"}`` line per step, at VERL_FILE_LOGGER_PATH). The line of step 0
  holds the validation before training; verl's validation loop logs the pass rate of each data_source, i.e. of
  each task family, as ``val-core/<family>/acc/mean@<samples>``;
- the validation dump of ``trainer.validation_data_dir`` (one JSONL per validation, a row per response with its
  prompt, response and score): the prompt-level spread behind the confidence intervals, and the answer format;
- the rollout dump of ``trainer.rollout_data_dir`` (one JSONL per training step), from which the all-right and
  all-wrong shares and the GRPO run's signal ratio (share of groups whose rewards are not all equal) are counted.

The demo's two runs share one start: the first run's validation before training (step 0, the warmed-up model) is
made the start of both (:func:`share_start`), and the second run skips its own step-0 validation; each method's
gain is measured from that shared start, whose samples stand in for the second run's step 0 in its tables and
curves (``read_run(..., start=...)``).

Confidence intervals are over held-out prompts: a validation's pass rate is the mean over prompts of each prompt's
mean score, with a 95% t-interval (prompts - 1 degrees of freedom) of those prompt means. A gain is paired by
prompt: per prompt, its mean score after training minus its mean score at the start, and the t-interval of the
mean of those differences. Each difference carries the sampling noise of both validations (the start's and the
later one's responses), so their spread over prompts accounts for the uncertainty of both measurements, while the
pairing removes the spread of prompt difficulty, which both measurements share (an unpaired interval,
sqrt(se_start^2 + se_after^2), would count it twice; treating the start as exact would leave its noise out). The
two methods' gains share the start's noise, so they are compared by the difference of their final pass rates,
paired by prompt (:func:`method_difference`), which is exactly the difference of the gains. This is the noise of
measuring on a finite set of prompts with a few samples each, not the run-to-run noise of training, which
scripts/compare_cpu.py measures over seeds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from bv_blend.core.jsonl import jsonl_records
from instruments.run.resume import metrics_files
from instruments.run.reward import in_answer_format
from instruments.stats import t_half_width

REWARD = "critic/score/mean"
STEP_TIME = "timing_s/step"
ADV_TIME = "timing_s/adv"
BV_SIGNAL = "bv_blend/effective_signal_ratio"
BV_GRPO_SIGNAL = "bv_blend/grpo_signal_ratio"
VAL_CORE = re.compile(r"^val-core/(?P<source>[^/]+)/acc/mean@(?P<samples>\d+)$")
OVERALL = "all"


def read_metrics(path: Path) -> pd.DataFrame:
    """verl's file-logger JSONL as one row per logged step (columns: metric names)."""
    rows = []
    for record in jsonl_records(path):
        rows.append({"step": record["step"], **record["data"]})
    if not rows:
        raise ValueError(f"{path} holds no logged step; did the run fail? See the run's log next to it.")
    # one row per step: verl logs the validation before training as a line of its own (step 0)
    return pd.DataFrame(rows).groupby("step").last().sort_index()


def read_run_metrics(run_dir: Path) -> pd.DataFrame:
    """A run folder's metrics over all its attempts (instruments.run.resume: a resumed run's earlier attempts keep
    their steps in ``metrics.part<i>.jsonl``); a step logged twice keeps its last line."""
    files = [path for path in metrics_files(run_dir) if path.is_file()]
    frames = [read_metrics(path) for path in files if path.read_text().strip()]
    if not frames:
        return read_metrics(run_dir / "metrics.jsonl")  # its error names the missing run
    merged = pd.concat(frames)
    return merged[~merged.index.duplicated(keep="last")].sort_index()


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


def read_validation_dump(dump_dir: Path, question_family: dict[str, str],
                         in_format: Callable[[str], bool] = in_answer_format) -> pd.DataFrame:
    """Every validation response: step, family, question, score (0/1) and whether it is in the answer format (the
    tiny model's: the verifier's marker; a pretrained model's: the number alone, as it is told)."""
    questions = sorted(question_family)
    rows = []
    for path in sorted(dump_dir.glob("*.jsonl")):
        for row in jsonl_records(path):
            question = _question_of(row["input"], questions)
            if question is None:
                raise ValueError(f"{path}: a validation prompt matches no held-out question: {row['input']!r}")
            rows.append({"step": int(row["step"]), "family": question_family[question], "question": question,
                         "score": float(row["score"]), "in_format": in_format(row["output"])})
    return pd.DataFrame(rows, columns=["step", "family", "question", "score", "in_format"])


def prompt_means(samples: pd.DataFrame, step: int, column: str = "score") -> pd.Series:
    at = samples[samples["step"] == step]
    if at.empty:
        raise ValueError(f"no validation responses at step {step} (steps: {sorted(samples['step'].unique())})")
    return at.groupby("question")[column].mean()


def mean_ci(values: pd.Series | np.ndarray) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (instruments.stats.t_half_width: nan for a single value)."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(t_half_width(x))


def pass_rate_ci(samples: pd.DataFrame, step: int) -> tuple[float, float]:
    """Pass rate at a validation step and the half-width of its 95% interval over prompts."""
    return mean_ci(prompt_means(samples, step))


def sampling_half_width(samples: pd.DataFrame, step: int) -> float:
    """Half-width of the 95% interval of the pass rate at ``step`` from the sampling of responses alone, for this set
    of prompts: normal, with Var = sum_i p_i (1 - p_i) / k_i / P^2 over the P prompts, each with k_i responses, and
    p_i (1 - p_i) estimated without bias by p^_i (1 - p^_i) k_i / (k_i - 1).

    The interval over prompts (:func:`pass_rate_ci`) adds the choice of prompts to this; more responses per prompt
    shrink only this part, and a gain's pairing by prompt leaves mostly this part of each measurement.
    """
    at = samples[samples["step"] == step].groupby("question")["score"].agg(["mean", "count"])
    if (at["count"] < 2).any():
        return float("nan")
    var = (at["mean"] * (1 - at["mean"]) / (at["count"] - 1)).sum() / len(at) ** 2
    return float(stats.norm.ppf(0.975) * np.sqrt(var))


def paired_ci(before: pd.Series, after: pd.Series) -> tuple[float, float]:
    """Mean of ``after - before`` over the prompts both have (per-prompt mean scores, indexed by question), and the
    half-width of its 95% t-interval: the interval of a paired difference (module docstring)."""
    diff = (after - before).dropna()
    return mean_ci(diff)


def paired_gain(samples: pd.DataFrame, first: int, last: int) -> tuple[float, float]:
    """Pass rate at ``last`` minus at ``first``, paired by prompt, and the half-width of its 95% interval."""
    return paired_ci(prompt_means(samples, first), prompt_means(samples, last))


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
        for row in jsonl_records(path):
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
    """BV-Blend logs its own effective signal ratio; any other estimator's is recomputed from the rollout dump."""
    if method == "bv_blend" or BV_SIGNAL in metrics:
        if BV_SIGNAL not in metrics:
            raise ValueError(f"the bv_blend run logged no {BV_SIGNAL}: is the bv_blend verl plugin installed?")
        return training_steps(metrics)[BV_SIGNAL]
    return group_signal_ratio(rollout_dir)


# --------------------------------------------------------------------------------------------- the shared start
@dataclass
class StartRecord:
    """The shared start: verl's validation of the warmed-up model before either method trains."""

    validation: pd.DataFrame  # validation_curve, one row: step 0
    samples: pd.DataFrame  # read_validation_dump, step 0 only
    source: str  # the run whose step-0 validation it is

    @property
    def step(self) -> int:
        return int(self.validation.index[0])

    @property
    def prompts(self) -> int:
        return int(self.samples["question"].nunique())

    @property
    def samples_per_prompt(self) -> int:
        return int(round(len(self.samples) / self.prompts))

    def summary(self) -> dict[str, float]:
        rate, half = pass_rate_ci(self.samples, self.step)
        return {"pass rate": rate, "pass rate ±": half,
                "pass rate ± sampling": sampling_half_width(self.samples, self.step), "prompts": float(self.prompts),
                "samples per prompt": float(self.samples_per_prompt),
                "in format": format_share(self.samples, self.step),
                **{f"family {f}": float(v) for f, v in self.validation.iloc[0].items() if f != OVERALL}}


# --------------------------------------------------------------------------------------------------------- a run
@dataclass
class RunRecord:
    """What the tables and plots need from one verl run; with a shared start, its step 0 is the start's."""

    method: str
    metrics: pd.DataFrame
    validation: pd.DataFrame  # validation_curve
    samples: pd.DataFrame  # read_validation_dump
    signal: pd.Series
    shares: dict[str, float]
    start: StartRecord | None = field(default=None, repr=False)

    @property
    def first_val(self) -> int:
        return int(self.validation.index.min())

    @property
    def last_val(self) -> int:
        return int(self.validation.index.max())

    def summary(self) -> dict[str, float]:
        """The table's numbers for this run (pass rates as fractions, shares in %); "val before" is the shared
        start's pass rate when the run has one, and the gain is measured from it."""
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
            "shared start": float(self.start is not None),
            "in format before": format_share(self.samples, self.first_val),
            "in format after": format_share(self.samples, self.last_val),
            "signal ratio": float(self.signal.mean()) if len(self.signal) else float("nan"),
            "GRPO signal ratio": float(grpo_signal),
            **self.shares,
            "step time s": float(steady[STEP_TIME].mean()) if len(steady) else float("nan"),
            "adv share %": 100 * float(adv_share),
            "steps": float(len(train)),
        }


def family_sizes(question_family: dict[str, str]) -> dict[str, int]:
    """Held-out prompts per family, in the order of the file: the task's family order."""
    sizes: dict[str, int] = {}
    for family in question_family.values():
        sizes[family] = sizes.get(family, 0) + 1
    return sizes


def share_start(run: RunRecord) -> RunRecord:
    """``run`` with its validation before training (step 0: the warmed-up model, before the run's first update) as
    the start it shares with the other runs (pass ``result.start`` to their read_run)."""
    if run.start is not None:
        raise ValueError(f"the {run.method} run already has a shared start (the {run.start.source} run's)")
    if run.first_val != 0:
        raise ValueError(f"the {run.method} run has no validation of its own before training (first validation: "
                         f"step {run.first_val}); the run that measures the shared start needs "
                         "trainer.val_before_train=true")
    start = StartRecord(validation=run.validation.loc[[0]], samples=run.samples[run.samples["step"] == 0].copy(),
                        source=run.method)
    return replace(run, start=start)


def read_run(method: str, run_dir: Path, question_family: dict[str, str],
             start: StartRecord | None = None, in_format: Callable[[str], bool] = in_answer_format) -> RunRecord:
    """Reads a run folder written by instruments.run.verl_run.run_method.

    With ``start`` (another run's, :func:`share_start`), the run must not have validated its own step 0
    (``trainer.val_before_train=false``): the start's validation becomes the run's first point, so that its gain,
    tables and curves are measured from the shared start.
    """
    metrics = read_run_metrics(run_dir)
    validation = validation_curve(metrics, family_sizes(question_family))
    samples = read_validation_dump(run_dir / "validation", question_family, in_format)
    if start is not None:
        own = sorted(s for s in set(validation.index) | set(samples["step"]) if s <= start.step)
        if own:
            raise ValueError(f"{run_dir} validated at step(s) {own} itself; with a shared start, run it with "
                             "trainer.val_before_train=false, so that its gain is measured from the shared start only")
        validation = pd.concat([start.validation, validation]).sort_index()
        samples = pd.concat([start.samples, samples], ignore_index=True)
    return RunRecord(
        method=method,
        metrics=metrics,
        validation=validation,
        samples=samples,
        signal=signal_of(method, metrics, run_dir / "rollouts"),
        shares=group_shares(run_dir / "rollouts"),
        start=start,
    )
