"""What the lab measures on a run, and how runs over seeds are summarised (means, paired differences, 95% CIs).

Per run (``success`` is the expected success over all the task's prompts, exact, not sampled):
- AUC gain: mean over the run's steps of success(t) - success(0), the area under the learning curve;
- final gain: mean success over the last 10% of steps, minus success(0);
- steps to target: first step with success(t) - success(0) >= TARGET_GAIN (None if never);
- effective signal: mean share of groups that get a non-zero advantage;
- max |A| and the 99.9th percentile of |A| over all rows of the run;
- extreme: max |A| > EXTREME_ADVANTAGE (one row can take over an update); collapsed: final gain < -COLLAPSE_DROP.

Bias against the true advantage (results/lab.md, "Bias"): A*_i = R_i - p_j, the advantage of the policy-gradient
theorem (p_j is known in the simulation). An estimator's overall scale is a step size, not a bias, so each
estimator's advantages are first divided by one scale c = sum A A* / sum A*^2 (least squares over all its rows
of all seeds); the bias in a difficulty bucket and outcome is then mean(A / c) - mean(A*).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

TARGET_GAIN = 0.10
EXTREME_ADVANTAGE = 100.0
COLLAPSE_DROP = 0.02
FINAL_SHARE = 0.1
# Difficulty buckets by the prompt's success probability p when it was sampled.
BUCKET_EDGES = (0.05, 0.2, 0.5, 0.8, 0.95)
BUCKET_LABELS = ("p<0.05", "0.05-0.2", "0.2-0.5", "0.5-0.8", "0.8-0.95", "p>=0.95")


@dataclass
class BiasSums:
    """Sums over rows, by (difficulty bucket, outcome R): count, sum A, sum A*; and sum A A*, sum A*^2 overall."""

    count: np.ndarray
    advantage: np.ndarray
    true: np.ndarray
    cross: float
    true_sq: float

    @classmethod
    def empty(cls) -> BiasSums:
        shape = (len(BUCKET_LABELS), 2)
        return cls(np.zeros(shape), np.zeros(shape), np.zeros(shape), 0.0, 0.0)

    def add(self, success_prob: np.ndarray, rewards: np.ndarray, advantages: np.ndarray) -> None:
        """Fold in one step: (P,) success probabilities, (P, G) 0/1 rewards and advantages."""
        true = rewards - success_prob[:, None]
        bucket = np.broadcast_to(np.digitize(success_prob, BUCKET_EDGES)[:, None], rewards.shape)
        cell = (bucket * 2 + rewards.astype(np.int64)).ravel()
        size = self.count.size
        self.count += np.bincount(cell, minlength=size).reshape(self.count.shape)
        self.advantage += np.bincount(cell, weights=advantages.ravel(), minlength=size).reshape(self.count.shape)
        self.true += np.bincount(cell, weights=true.ravel(), minlength=size).reshape(self.count.shape)
        self.cross += float((advantages * true).sum())
        self.true_sq += float((true * true).sum())

    @classmethod
    def total(cls, parts: Sequence[BiasSums]) -> BiasSums:
        out = cls.empty()
        for part in parts:
            out.count += part.count
            out.advantage += part.advantage
            out.true += part.true
            out.cross += part.cross
            out.true_sq += part.true_sq
        return out

    def scale(self) -> float:
        """c: the least-squares scale of the advantages on the true advantage."""
        return self.cross / self.true_sq if self.true_sq > 0 else float("nan")

    def bias(self) -> np.ndarray:
        """(buckets, 2) mean(A / c) - mean(A*), NaN for empty cells; column 0 is R = 0, column 1 R = 1."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self.advantage / self.scale() - self.true) / self.count


# ----------------------------------------------------------------------------------------------- per run
def auc_gain(success: np.ndarray) -> float:
    return float(np.mean(success[1:] - success[0]))


def final_gain(success: np.ndarray) -> float:
    tail = max(1, int(round(FINAL_SHARE * (len(success) - 1))))
    return float(np.mean(success[-tail:]) - success[0])


def steps_to_target(success: np.ndarray, target: float = TARGET_GAIN) -> int | None:
    reached = np.flatnonzero(success - success[0] >= target)
    return int(reached[0]) if reached.size else None


# ---------------------------------------------------------------------------------------------- over seeds
def mean_ci(values: np.ndarray) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (NaN half-width for fewer than 2 values)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return float(values.mean()) if values.size else float("nan"), float("nan")
    half = stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
    return float(values.mean()), float(half)


def paired_ci(values: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """Mean of the per-seed differences values - reference, with its 95% CI half-width."""
    return mean_ci(np.asarray(values) - np.asarray(reference))


def median_steps(values: Sequence[int | None], horizon: int) -> str:
    """Median steps to target over seeds, runs that never reach it counted as beyond the horizon."""
    finite = np.array([horizon + 1 if v is None else v for v in values], dtype=np.float64)
    median = float(np.median(finite))
    reached = sum(v is not None for v in values)
    return f"{'>' + str(horizon) if median > horizon else f'{median:.0f}'} ({reached}/{len(values)})"


@dataclass
class Summary:
    """An arm's metrics, one entry per seed (seed order), and its mean learning curve."""

    auc: np.ndarray
    final: np.ndarray
    steps_to_target: list[int | None]
    signal: np.ndarray
    max_abs: np.ndarray
    p999_abs: np.ndarray
    update_norm: np.ndarray
    extreme: int
    collapsed: int
    nonfinite: int
    curve: np.ndarray
    bias: BiasSums

    @property
    def horizon(self) -> int:
        return len(self.curve) - 1


def summarise(runs: Sequence) -> Summary:
    """Summary of an arm's runs (``RunResult``s, one per seed)."""
    final = np.array([final_gain(r.success) for r in runs])
    max_abs = np.array([r.abs_advantage_max.max() for r in runs])
    return Summary(
        auc=np.array([auc_gain(r.success) for r in runs]),
        final=final,
        steps_to_target=[steps_to_target(r.success) for r in runs],
        signal=np.array([r.signal_ratio.mean() for r in runs]),
        max_abs=max_abs,
        p999_abs=np.array([r.abs_advantage_p999 for r in runs]),
        update_norm=np.array([r.update_norm.mean() for r in runs]),
        extreme=int(np.sum(max_abs > EXTREME_ADVANTAGE)),
        collapsed=int(np.sum(final < -COLLAPSE_DROP)),
        nonfinite=sum(r.nonfinite_step is not None for r in runs),
        curve=np.mean([r.success for r in runs], axis=0),
        bias=BiasSums.total([r.bias for r in runs]),
    )
