"""Checks on what verl logged, shared by the end-to-end tests."""

from __future__ import annotations

import pandas as pd

# verl's rollout-vs-actor check (rollout.calculate_log_probs=true): the largest |p_rollout - p_actor| over the
# batch's response tokens. Both sides compute in fp32 from the same weights: fresh rollouts agreed to 4e-9 (random
# model) and 8e-7 (warmed up); one lr-1e-3 step left a stale copy 0.83 away (tests/e2e/test_cpu_weight_sync.py).
FRESH_BOUND = 1e-3
PROBS_DIFF = "training/rollout_probs_diff_max"


def assert_rollouts_use_fresh_weights(metrics: pd.DataFrame) -> None:
    """Every logged step sampled with the actor's current weights: vLLM's probabilities of the tokens it sampled
    equal the actor's. Raises AssertionError otherwise (a stale or broken weight sync)."""
    assert PROBS_DIFF in metrics, "verl logged no rollout-vs-actor metrics: is rollout.calculate_log_probs on?"
    diff = metrics[PROBS_DIFF]
    assert diff.notna().all(), f"steps without a rollout-vs-actor comparison: {diff[diff.isna()].index.tolist()}"
    worst_step = diff.idxmax()
    assert diff[worst_step] < FRESH_BOUND, (
        f"at step {worst_step}, rollout and actor probabilities differ by up to {diff[worst_step]:.3g} (bound "
        f"{FRESH_BOUND:g}): vLLM generated with weights other than the actor's"
    )
