"""Statistics over seeds for every instrument: bands, paired differences, the rollouts to reach the reference, 95%
intervals.

Seeds pair the arms: seed s of every arm sees the same prompt order and the same evaluation draws. **Every interval
that judges (a final value, a paired difference, a band) is the Student t-interval over seeds** (``t_interval``),
one kind in every report (issue 37, results/regime.md "The revised rule"). Until 2026-12-03 they were percentile
bootstraps over seeds; at 5 seeds a percentile bootstrap covers the mean about 0.85 of the time (0.92 at 10) where
it should 0.95 (it is about the range of the seeds' values), while the t-interval's coverage holds at 5 and 10 seeds
for the paired differences these instruments produce (``tests/test_rule_coverage.py`` shows both). The
rollouts-to-reach ratio, a ratio of curve crossings that judges nothing, keeps its paired percentile bootstrap
(``bootstrap_seeds``, 2000 resamples, ``scipy.stats.bootstrap``; rliable's ``get_interval_estimates`` cannot run
here: rliable 1.2 pins arch < 8, arch 7 fails to import under pandas 3, and arch 8 rejects the ``random_state``
rliable passes it).

**Rollouts to reach the reference.** The target is the reference's final held-out pass rate (the seed mean at its
last evaluation). An arm's rollouts to reach it are read off its seed-mean curve over rollouts consumed (step x
rollouts a step): the first point where the curve, linearly interpolated between evaluations, reaches the target.
The ratio is that over the reference's own (the reference reaches its final value at its last evaluation, or
earlier if its curve passed it before). An arm that never reaches the target within the run has a ratio above
its total rollouts / the reference's, reported as "> 1.00x (not reached)" at equal budgets; in a bootstrap
resample that never reaches it, the ratio is infinite, and an interval bound that is infinite reads "not reached".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

RESAMPLES = 2000
CONFIDENCE = 0.95
NOT_REACHED = 1e12  # stands for "never reached" inside the bootstrap (percentiles of inf can be NaN)


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float


def bootstrap_seeds(statistic: Callable[[np.ndarray], float], seeds: int, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% CI of ``statistic(indices)`` over resamples of ``seeds`` seed indices (paired resampling)."""
    if seeds < 2:
        return float("nan"), float("nan")
    with np.errstate(all="ignore"):
        result = stats.bootstrap((np.arange(seeds),), statistic, vectorized=False, n_resamples=RESAMPLES,
                                 confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def t_half_width(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Half-width of the 95% Student t-interval of the mean over ``axis`` (the seeds); nan with fewer than 2."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[axis]
    if n < 2:
        return np.full(np.delete(values.shape, axis), np.nan) if values.ndim > 1 else np.float64(np.nan)
    return stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * values.std(axis=axis, ddof=1) / np.sqrt(n)


def t_interval(values: np.ndarray) -> Interval:
    """Mean over seeds with its 95% Student t-interval: the one interval every verdict reads."""
    values = np.asarray(values, dtype=np.float64)
    mean, half = float(values.mean()), float(t_half_width(values))
    return Interval(mean, mean - half, mean + half)


mean_interval = t_interval  # the seed mean of a final value, as every report writes it


def band(curves: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seed mean of (seeds, points) curves and its 95% t-interval at every point (the mean alone with one seed)."""
    curves = np.asarray(curves, dtype=np.float64)
    mean = curves.mean(0)
    if len(curves) < 2:
        return mean, mean.copy(), mean.copy()
    half = t_half_width(curves, axis=0)
    return mean, mean - half, mean + half


def crossing(x: np.ndarray, curve: np.ndarray, target: float) -> float:
    """First x at which ``curve`` (linear between points) reaches ``target``; inf if it never does."""
    if curve[0] >= target:
        return float(x[0])
    for i in range(1, len(curve)):
        if curve[i] >= target:
            share = (target - curve[i - 1]) / (curve[i] - curve[i - 1])
            return float(x[i - 1] + share * (x[i] - x[i - 1]))
    return float("inf")


def reach_ratio(arm: np.ndarray, reference: np.ndarray, x_arm: np.ndarray, x_reference: np.ndarray) -> float:
    """Rollouts for the seed-mean curve of ``arm`` to reach the reference's final value, over the reference's."""
    mean = reference.mean(0)
    target = mean[-1]  # from the same mean curve: the reference reaches it exactly, not 1 ulp short
    ref_rollouts = crossing(x_reference, mean, target)
    if ref_rollouts == 0:
        return float("nan")  # the reference starts at its final value: no rollouts to compare
    return crossing(x_arm, arm.mean(0), target) / ref_rollouts


def reach_interval(arm: np.ndarray, reference: np.ndarray, x_arm: np.ndarray, x_reference: np.ndarray) -> Interval:
    """:func:`reach_ratio` with its paired bootstrap CI (rows of ``arm`` and ``reference`` are the same seeds)."""

    def statistic(i: np.ndarray) -> float:
        value = reach_ratio(arm[i], reference[i], x_arm, x_reference)
        return NOT_REACHED if value == float("inf") else value

    low, high = bootstrap_seeds(statistic, len(arm))
    return Interval(reach_ratio(arm, reference, x_arm, x_reference), *(float("inf") if b >= NOT_REACHED / 10 else b
                                                                        for b in (low, high)))


def paired_difference(values: np.ndarray, reference: np.ndarray) -> Interval:
    """Mean per-seed difference (rows paired by seed) and its 95% t-interval."""
    return t_interval(np.asarray(values, dtype=np.float64) - np.asarray(reference, dtype=np.float64))


def format_interval(interval: Interval | None, signed: bool = False, digits: int = 3) -> str:
    """``value [low, high]``, the bounds written like the value (signed for a difference); the value alone where
    there is no interval (one seed), and nothing for no interval at all. The one format of every report."""
    if interval is None:
        return ""
    spec = f"{'+' if signed else ''}.{digits}f"
    value = format(interval.value, spec)
    if not (np.isfinite(interval.low) and np.isfinite(interval.high)):
        return value
    return f"{value} [{format(interval.low, spec)}, {format(interval.high, spec)}]"


def format_reach(interval: Interval, point: bool = False, undefined: str = "n/a") -> str:
    """A rollouts-to-reach ratio with its interval (the module's docstring: "> 1.00x (not reached)" for the ratio,
    "not reached" for an infinite bound, ``undefined`` where the ratio is NaN, which a report may explain);
    ``point``: the ratio alone."""
    if np.isnan(interval.value):
        return undefined
    value = "> 1.00x (not reached)" if np.isinf(interval.value) else f"{interval.value:.2f}x"
    bounds = format_reach_bounds(interval)
    return value if point or bounds == "n/a" else f"{value} {bounds}"


def format_reach_bounds(interval: Interval) -> str:
    """The interval of a rollouts-to-reach ratio alone, ``[low, high]``; "n/a" where it has none."""
    if np.isnan(interval.value) or np.isnan(interval.low) or np.isnan(interval.high):
        return "n/a"
    low, high = ("not reached" if np.isinf(bound) else f"{bound:.2f}x" for bound in (interval.low, interval.high))
    return f"[{low}, {high}]"
