"""The rule's interval holds its coverage at the seed counts the instruments use (issue 37, results/regime.md).

Simulated paired differences of final held-out pass rates, with a known mean: each seed's difference is the
difference of two pass rates over a held-out set (binomial noise, as the instruments measure them) plus a seed
effect shared by nothing (the run's own randomness). The t-interval's coverage stays near 95% at 5 and 10 seeds;
the percentile bootstrap the first rule used falls well short at 5, which is why the rule was revised.
"""

from __future__ import annotations

import numpy as np
import pytest

from instruments import stats

TRIALS = 2000
TRUE_DIFFERENCE = 0.02


def _paired_differences(rng: np.random.Generator, seeds: int, skewed: bool) -> np.ndarray:
    responses = 480  # 120 held-out prompts x 4 samples, verl's CPU comparison
    p_arm, p_ref = 0.62, 0.60
    run_effect = rng.exponential(0.015, seeds) - 0.015 if skewed else rng.normal(0.0, 0.015, seeds)
    arm = rng.binomial(responses, p_arm, seeds) / responses + run_effect
    ref = rng.binomial(responses, p_ref, seeds) / responses
    return arm - ref


def _coverage(interval, seeds: int, skewed: bool) -> float:
    rng = np.random.default_rng(seeds * 7 + skewed)
    hits = 0
    for _ in range(TRIALS):
        found = interval(_paired_differences(rng, seeds, skewed))
        hits += found.low <= TRUE_DIFFERENCE <= found.high
    return hits / TRIALS


@pytest.mark.parametrize("seeds", [5, 10])
@pytest.mark.parametrize("skewed", [False, True])
def test_the_t_interval_covers_the_true_difference_about_95_percent(seeds: int, skewed: bool) -> None:
    coverage = _coverage(stats.t_interval, seeds, skewed)
    # 2000 trials: a standard error of 0.005 around 0.95; a skewed run effect costs the t a little at 5 seeds
    assert 0.925 <= coverage <= 0.97, coverage


def test_the_first_rule_s_percentile_bootstrap_falls_short_at_5_seeds() -> None:
    def bootstrap(values: np.ndarray) -> stats.Interval:
        low, high = stats.bootstrap_seeds(lambda i: float(values[i].mean()), len(values))
        return stats.Interval(float(values.mean()), low, high)

    global TRIALS
    trials, TRIALS = TRIALS, 300  # the bootstrap is slow; 300 trials resolve 0.95 from under 0.90
    try:
        coverage = _coverage(bootstrap, 5, skewed=False)
    finally:
        TRIALS = trials
    assert coverage < 0.90, coverage
