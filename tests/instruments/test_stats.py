"""instruments/stats.py (rollouts to reach the reference, the intervals, the one way reports write them) and the
settings' selection rules (instruments/compare/selection.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from instruments import stats
from instruments.compare import selection

X = np.array([0, 10, 20, 30, 40]) * 64


def test_crossing_interpolates_between_evaluations():
    assert stats.crossing(X, np.array([0.1, 0.2, 0.4, 0.5, 0.5]), 0.3) == pytest.approx(15 * 64)
    assert stats.crossing(X, np.array([0.3, 0.2, 0.4, 0.5, 0.5]), 0.3) == 0
    assert stats.crossing(X, np.array([0.1, 0.2, 0.2, 0.2, 0.25]), 0.3) == math.inf


def test_an_arm_twice_as_fast_needs_half_the_rollouts():
    reference = np.tile([0.1, 0.2, 0.3, 0.4, 0.5], (4, 1))
    faster = np.tile([0.1, 0.3, 0.5, 0.5, 0.5], (4, 1))
    assert stats.reach_ratio(faster, reference, X, X) == pytest.approx(0.5)
    assert stats.reach_ratio(reference, reference, X, X) == pytest.approx(1.0)


def test_an_arm_that_never_reaches_it_reads_not_reached():
    reference = np.tile([0.1, 0.2, 0.3, 0.4, 0.5], (4, 1))
    slower = np.tile([0.1, 0.15, 0.2, 0.25, 0.3], (4, 1))
    interval = stats.reach_interval(slower, reference, X, X)
    assert math.isinf(interval.value) and math.isinf(interval.high)
    assert stats.format_reach(interval).startswith("> 1.00x (not reached)")
    assert stats.format_reach(interval).endswith("not reached]")


def test_every_report_writes_intervals_and_ratios_one_way():
    difference = stats.Interval(0.02, -0.005, 0.036)
    assert stats.format_interval(difference, signed=True) == "+0.020 [-0.005, +0.036]"
    assert stats.format_interval(difference, digits=4) == "0.0200 [-0.0050, 0.0360]"
    assert stats.format_interval(stats.Interval(0.5, math.nan, math.nan)) == "0.500"  # one seed: no interval
    assert stats.format_interval(None) == ""
    assert stats.format_reach(stats.Interval(0.8, 0.6, math.inf)) == "0.80x [0.60x, not reached]"
    assert stats.format_reach(stats.Interval(0.8, 0.6, 1.1), point=True) == "0.80x"
    assert stats.format_reach(stats.Interval(math.nan, math.nan, math.nan)) == "n/a"
    assert stats.format_reach(stats.Interval(math.nan, math.nan, math.nan), undefined="n/a (why)") == "n/a (why)"
    assert stats.format_reach_bounds(stats.Interval(0.8, math.nan, math.nan)) == "n/a"


def test_the_reach_interval_covers_the_truth_on_noisy_seeds():
    rng = np.random.default_rng(0)
    reference = np.linspace(0.1, 0.5, 5) + rng.normal(0, 0.02, (10, 5))
    faster = np.array([0.1, 0.35, 0.6, 0.6, 0.6]) + rng.normal(0, 0.02, (10, 5))
    interval = stats.reach_interval(faster, reference, X, X)
    assert interval.low <= 0.4 <= interval.high < 1.0  # 0.5 is reached at step 16 of the reference's 40


def test_paired_difference():
    reference = np.array([0.3, 0.4, 0.5, 0.35, 0.45])
    better = reference + 0.05
    difference = stats.paired_difference(better, reference)
    assert difference.value == pytest.approx(0.05) and difference.low == pytest.approx(0.05)


def test_band_is_the_seed_mean_with_an_interval_around_it():
    curves = np.random.default_rng(1).normal(0.4, 0.05, (10, 3))
    mean, low, high = stats.band(curves)
    assert np.allclose(mean, curves.mean(0)) and (low <= mean).all() and (mean <= high).all()


def test_the_learning_rate_rule():
    assert selection.choose_lr({1e-4: [0.40, 0.42], 2e-4: [0.45, 0.47], 4e-4: [0.30, 0.50]}) == 2e-4
    assert selection.choose_lr({1e-4: [0.4004], 2e-4: [0.4001]}) == 1e-4  # tie to 3 decimals: the smaller rate


def test_the_step_rule():
    steps = list(range(0, 201, 10))
    rising = [0.2 + 0.001 * s for s in steps]
    assert selection.choose_steps(steps, rising, 10, 200) == 200
    saturating = [0.2 + 0.2 * min(s, 60) / 60 for s in steps]  # flat from step 60
    assert selection.choose_steps(steps, saturating, 10, 200) == 40  # at 80 the last quarter is flat
    flat = [0.2] * len(steps)
    assert selection.choose_steps(steps, flat, 10, 200) == 200
