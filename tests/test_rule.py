"""instruments/rule.py: the one rule of issue 29 (docs/regime.md), on hand-made intervals."""

from __future__ import annotations

import pytest

from instruments import rule
from instruments.rule import AHEAD, BEHIND, LEVEL, headroom, recommend, verdict
from instruments.stats import Interval


def test_the_verdict_reads_the_interval_against_zero():
    assert verdict(Interval(0.03, 0.01, 0.05)) == AHEAD
    assert verdict(Interval(-0.03, -0.05, -0.01)) == BEHIND
    assert verdict(Interval(0.01, -0.01, 0.03)) == LEVEL
    assert verdict(Interval(0.0, 0.0, 0.02)) == LEVEL  # a bound on zero does not exclude it


def test_an_arm_must_be_ahead_somewhere_and_behind_nowhere_and_the_token_lab_breaks_ties():
    ahead, level, behind = Interval(0.03, 0.01, 0.05), Interval(0.0, -0.02, 0.02), Interval(-0.03, -0.05, -0.01)
    differences = {
        "reinforce_pp_n1": {"token_lab": Interval(0.02, 0.01, 0.03), "logistic_lab": ahead, "verl_cpu": level},
        "spo_n1": {"token_lab": Interval(0.04, 0.02, 0.06), "logistic_lab": level, "verl_cpu": level},
        "bv_blend_n2": {"token_lab": ahead, "logistic_lab": ahead, "verl_cpu": behind},  # behind once: out
        "grpo_n2": {"token_lab": level, "logistic_lab": level, "verl_cpu": level},  # never ahead: out
        "oracle_baseline": {"token_lab": Interval(0.09, 0.07, 0.11), "logistic_lab": ahead},  # a limit: out
    }
    result = recommend(differences, limits=frozenset({"oracle_baseline"}))
    assert result.qualified == ("spo_n1", "reinforce_pp_n1")
    assert result.arm == "spo_n1"
    assert result.verdicts["bv_blend_n2"]["verl_cpu"] == BEHIND


def test_without_a_qualifying_arm_the_reference_stays():
    level = Interval(0.0, -0.02, 0.02)
    assert recommend({"grpo_n2": {"token_lab": level}}).arm is None


def test_headroom_is_the_limits_lead_over_the_baseline():
    assert headroom(Interval(0.09, 0.07, 0.11), Interval(0.03, 0.01, 0.05)) == 0.09 - 0.03


def test_the_package_s_best_arm_is_its_largest_difference() -> None:
    differences = {"grpo2": Interval(0.05, 0.01, 0.09), "bv1": Interval(0.02, -0.01, 0.05),
                   "spo1": Interval(0.03, -0.02, 0.08)}
    assert rule.best_package_arm(differences, frozenset({"bv1", "spo1"})) == "spo1"
    with pytest.raises(ValueError, match="package's arms"):
        rule.best_package_arm(differences, frozenset({"bv8"}))


def test_priors_counted_in_the_budget_move_the_final_value_back() -> None:
    import numpy as np

    from instruments.regime import final_with_priors

    curves = np.array([[0.1, 0.2, 0.4], [0.0, 0.3, 0.5]])
    x = np.array([0, 50, 100])
    assert final_with_priors(curves, x, 0).tolist() == [0.4, 0.5]
    assert final_with_priors(curves, x, 25).tolist() == pytest.approx([0.3, 0.4])
    assert final_with_priors(curves, x, 400).tolist() == [0.1, 0.0]  # the priors spent the whole budget


def test_a_summary_names_only_regime_arms() -> None:
    from instruments.regime import InstrumentSummary

    with pytest.raises(ValueError, match="not regime arms"):
        InstrumentSummary("token_lab", "", "", [0], {}, {"grpo16": None})  # type: ignore[dict-item]
