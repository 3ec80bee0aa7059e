"""instruments/rule.py: the one rule (results/regime.md, as revised for issue 37), on hand-made intervals and finals."""

from __future__ import annotations

import numpy as np
import pytest

from instruments import rule
from instruments.rule import AHEAD, BEHIND, LEVEL, headroom, recommend, verdict
from instruments.stats import Interval

AHEAD_IV, LEVEL_IV, BEHIND_IV = Interval(0.03, 0.01, 0.05), Interval(0.0, -0.02, 0.02), Interval(-0.03, -0.05, -0.01)
SIMPLICITY = {"reinforce_pp_n1": 0, "grpo_n2": 0, "spo_n1": 1, "bv_blend_n2": 2}


def test_the_verdict_reads_the_interval_against_zero():
    assert verdict(Interval(0.03, 0.01, 0.05)) == AHEAD
    assert verdict(Interval(-0.03, -0.05, -0.01)) == BEHIND
    assert verdict(Interval(0.01, -0.01, 0.03)) == LEVEL
    assert verdict(Interval(0.0, 0.0, 0.02)) == LEVEL  # a bound on zero does not exclude it


def test_an_arm_must_be_ahead_somewhere_and_behind_nowhere():
    differences = {
        "reinforce_pp_n1": {"pretrained_lm": Interval(0.02, 0.01, 0.03), "logistic_lab": AHEAD_IV, "third": LEVEL_IV},
        "spo_n1": {"pretrained_lm": Interval(0.04, 0.02, 0.06), "logistic_lab": LEVEL_IV, "third": LEVEL_IV},
        "bv_blend_n2": {"pretrained_lm": AHEAD_IV, "logistic_lab": AHEAD_IV, "third": BEHIND_IV},  # behind once: out
        "grpo_n2": {"pretrained_lm": LEVEL_IV, "logistic_lab": LEVEL_IV, "third": LEVEL_IV},  # never ahead: out
        "oracle_baseline": {"pretrained_lm": Interval(0.09, 0.07, 0.11), "logistic_lab": AHEAD_IV},  # a limit: out
    }
    result = recommend(differences, limits=frozenset({"oracle_baseline"}), simplicity=SIMPLICITY)
    assert result.qualified == ("spo_n1", "reinforce_pp_n1")  # the pretrained LM orders them
    assert result.tie_breaker == "pretrained_lm"
    assert result.verdicts["bv_blend_n2"]["third"] == BEHIND
    # no per-seed finals: nothing separates the two, so the simplest of the tied pair is picked and said to be
    assert result.tied == ("spo_n1", "reinforce_pp_n1") and not result.resolved
    assert result.arm == "reinforce_pp_n1"
    assert result.leader_margins == {"reinforce_pp_n1": None}


def _finals(mean: float, spread: float = 0.004, seeds: int = 5) -> list[float]:
    return (mean + spread * np.linspace(-1, 1, seeds)).tolist()


def test_the_leader_is_picked_only_when_resolved_ahead_of_every_other_qualified_arm():
    differences = {"bv_blend_n2": {"pretrained_lm": Interval(0.05, 0.03, 0.07)},
                   "reinforce_pp_n1": {"pretrained_lm": Interval(0.02, 0.01, 0.03)}}
    # leader minus the other: +0.03 on every seed (the same seed noise in both): resolved, the leader is the pick
    finals = {"bv_blend_n2": {"pretrained_lm": _finals(0.65)}, "reinforce_pp_n1": {"pretrained_lm": _finals(0.62)}}
    result = recommend(differences, finals=finals, simplicity=SIMPLICITY)
    assert result.resolved and result.arm == "bv_blend_n2" and result.tied == ("bv_blend_n2",)
    assert result.leader_margins["reinforce_pp_n1"].low > 0
    # the same means with seed-to-seed disagreement: not resolved, so the simplest of the tie (verl's own) is picked
    noisy = {"bv_blend_n2": {"pretrained_lm": [0.70, 0.60, 0.68, 0.61, 0.66]},
             "reinforce_pp_n1": {"pretrained_lm": [0.60, 0.66, 0.60, 0.65, 0.59]}}
    result = recommend(differences, finals=noisy, simplicity=SIMPLICITY)
    assert not result.resolved and result.tied == ("bv_blend_n2", "reinforce_pp_n1")
    assert result.arm == "reinforce_pp_n1"


def test_the_pretrained_lm_breaks_ties_once_measured():
    differences = {"bv_blend_n2": {"logistic_lab": Interval(0.05, 0.03, 0.07),
                                   "pretrained_lm": Interval(0.01, 0.0, 0.02)},
                   "spo_n1": {"logistic_lab": Interval(0.02, 0.01, 0.03), "pretrained_lm": Interval(0.06, 0.04, 0.08)}}
    finals = {"bv_blend_n2": {"pretrained_lm": _finals(0.41), "logistic_lab": _finals(0.65)},
              "spo_n1": {"pretrained_lm": _finals(0.46), "logistic_lab": _finals(0.62)}}
    result = recommend(differences, finals=finals, simplicity=SIMPLICITY)
    assert result.tie_breaker == "pretrained_lm"
    assert result.qualified == ("spo_n1", "bv_blend_n2") and result.resolved and result.arm == "spo_n1"


def test_an_arm_the_tie_breaker_did_not_run_cannot_be_separated_from_the_leader():
    differences = {"spo_n1": {"pretrained_lm": Interval(0.05, 0.03, 0.07)},
                   "reinforce_pp_n1": {"third": Interval(0.02, 0.01, 0.03)}}
    finals = {"spo_n1": {"pretrained_lm": _finals(0.65)}, "reinforce_pp_n1": {"third": _finals(0.62)}}
    result = recommend(differences, finals=finals, simplicity=SIMPLICITY)
    assert result.qualified == ("spo_n1", "reinforce_pp_n1")
    assert not result.resolved and result.arm == "reinforce_pp_n1"


def test_without_a_qualifying_arm_the_reference_stays():
    assert recommend({"grpo_n2": {"pretrained_lm": LEVEL_IV}}).arm is None


def test_headroom_is_the_limits_lead_over_the_baseline():
    assert headroom(Interval(0.09, 0.07, 0.11), Interval(0.03, 0.01, 0.05)) == 0.09 - 0.03


def test_the_package_s_best_arm_is_its_largest_difference() -> None:
    differences = {"grpo2": Interval(0.05, 0.01, 0.09), "bv1": Interval(0.02, -0.01, 0.05),
                   "spo1": Interval(0.03, -0.02, 0.08)}
    assert rule.best_package_arm(differences, frozenset({"bv1", "spo1"})) == "spo1"
    with pytest.raises(ValueError, match="package's arms"):
        rule.best_package_arm(differences, frozenset({"bv8"}))


def test_priors_counted_in_the_budget_move_the_final_value_back() -> None:
    from instruments.regime import final_with_priors

    curves = np.array([[0.1, 0.2, 0.4], [0.0, 0.3, 0.5]])
    x = np.array([0, 50, 100])
    assert final_with_priors(curves, x, 0).tolist() == [0.4, 0.5]
    assert final_with_priors(curves, x, 25).tolist() == pytest.approx([0.3, 0.4])
    assert final_with_priors(curves, x, 400).tolist() == [0.1, 0.0]  # the priors spent the whole budget


def test_a_summary_names_only_regime_arms() -> None:
    from instruments.regime import InstrumentSummary

    with pytest.raises(ValueError, match="not regime arms"):
        InstrumentSummary("pretrained_lm", "", "", [0], {}, {"grpo16": None})  # type: ignore[dict-item]


def test_the_simplest_arms_are_verl_s_own() -> None:
    from instruments import regime

    stock = {key for key, rank in regime.SIMPLICITY.items() if rank == 0}
    assert {"rpp1", "grpo2", "grpo8_dynamic", regime.REFERENCE} <= stock
    assert regime.SIMPLICITY["spo1"] < regime.SIMPLICITY["bv_cluster2"] < regime.SIMPLICITY["bv2_priors"]
