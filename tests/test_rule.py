"""instruments/rule.py: the one rule of issue 29 (docs/regime.md), on hand-made intervals."""

from __future__ import annotations

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
