"""Checks on what verl logged, shared by the end-to-end tests."""

from __future__ import annotations

import pandas as pd

# verl's rollout-vs-actor check (rollout.calculate_log_probs=true): the largest |p_rollout - p_actor| over the
# batch's response tokens. Both sides compute in fp32 from the same weights: fresh rollouts agreed to 4e-9 (random
# model) and 8e-7 (warmed up); one lr-1e-3 step left a stale copy 0.83 away (tests/e2e/test_cpu_weight_sync.py).
FRESH_BOUND = 1e-3
PROBS_DIFF = "training/rollout_probs_diff_max"


def assert_rollouts_use_fresh_weights(metrics: pd.DataFrame) -> None:
    """Every step after the first update sampled with the weights of that update: its rollout log-probs agree with
    the actor's. Raises AssertionError otherwise (a stale or broken weight sync)."""
    assert PROBS_DIFF in metrics, "verl logged no rollout-vs-actor metrics: is rollout.calculate_log_probs on?"
    updated = metrics["actor/grad_norm"] > 0
    assert updated.iloc[0], "the first step made no update (all advantages 0): the check could not tell"
    after_update = metrics[PROBS_DIFF].iloc[1:]
    assert len(after_update) > 0, "a single step cannot show a sync: run at least two"
    worst = after_update.max()
    assert worst < FRESH_BOUND, (
        f"rollout and actor probabilities differ by up to {worst:.3g} (bound {FRESH_BOUND:g}) after an update: "
        "vLLM generated with weights other than the actor's"
    )
