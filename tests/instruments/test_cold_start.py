"""The cold start's selection rule (instruments/cold_start.py; results/fair_verdict.md, section 3), driven through
every branch on made-up readings: accepted at 20 steps, retried at 40 and accepted, no cold start; and its bounds."""

from __future__ import annotations

import pytest

from instruments import cold_start
from instruments.cold_start import Reading
from instruments.fair_verdict import COLD_STEPS
from instruments.tuning import TUNING_SEEDS

FIRST, RETRY = COLD_STEPS


def runs(readings):
    return cold_start.next_selection_runs(readings, COLD_STEPS, TUNING_SEEDS)


def decide(readings):
    return cold_start.decide(readings, COLD_STEPS, TUNING_SEEDS)


def both(start: float, final: float, other: tuple[float, float] | None = None) -> dict[int, Reading]:
    """The two tuning seeds' readings: the same on both, or ``other`` on the second."""
    second = Reading(*other) if other else Reading(start, final)
    return {TUNING_SEEDS[0]: Reading(start, final), TUNING_SEEDS[1]: second}


def test_the_plan_is_20_steps_then_40_on_the_tuning_seeds():
    assert COLD_STEPS == (20, 40) and TUNING_SEEDS == (100, 101)


def test_the_first_runs_are_both_seeds_at_20_steps():
    assert runs({}) == [(FIRST, 100), (FIRST, 101)]
    assert runs({FIRST: {100: Reading(0.02, 0.2)}}) == [(FIRST, 101)]


def test_accepted_at_20_steps_needs_no_retry():
    readings = {FIRST: both(0.02, 0.30, (0.04, 0.10))}  # means 0.03 and 0.20
    assert runs(readings) == []
    decision = decide(readings)
    assert decision.accepted and decision.steps == FIRST
    assert decision.start == pytest.approx(0.03) and decision.final == pytest.approx(0.20)
    assert [t.steps for t in decision.trials] == [FIRST] and decision.reason.startswith("accepted at 20 steps")


def test_a_failure_at_20_retries_both_seeds_at_40_and_accepts_there():
    readings: dict[int, dict[int, Reading]] = {FIRST: both(0.03, 0.06)}  # 2 x the start: not off the ground yet
    assert runs(readings) == [(RETRY, 100), (RETRY, 101)]
    with pytest.raises(ValueError, match="still needs 40 steps seed 100, 40 steps seed 101"):
        decide(readings)
    readings[RETRY] = {100: Reading(0.03, 0.12)}
    assert runs(readings) == [(RETRY, 101)]
    readings[RETRY] = both(0.03, 0.12, (0.02, 0.08))  # means 0.025 and 0.10: four times
    assert runs(readings) == []
    decision = decide(readings)
    assert decision.accepted and decision.steps == RETRY and decision.final == pytest.approx(0.10)
    assert [(t.steps, t.passed) for t in decision.trials] == [(FIRST, False), (RETRY, True)]


def test_a_failure_at_both_lengths_is_no_cold_start():
    readings = {FIRST: both(0.03, 0.05), RETRY: both(0.03, 0.08)}
    assert runs(readings) == []
    decision = decide(readings)
    assert not decision.accepted and decision.steps is None
    assert decision.start == pytest.approx(0.03) and decision.final == pytest.approx(0.08)  # the 40-step test's
    assert decision.reason.startswith("no cold start for this model") and "40 steps" in decision.reason
    assert [(t.steps, t.passed) for t in decision.trials] == [(FIRST, False), (RETRY, False)]


def test_a_start_above_the_bound_fails_whatever_the_final():
    decision = decide({FIRST: both(0.06, 0.9), RETRY: both(0.051, 0.9)})
    assert not decision.accepted and "above 0.05" in decision.reason


@pytest.mark.parametrize(("start", "final", "passed"), [
    (0.05, 0.15, True),  # both bounds exactly: included (3 x 0.05 is 0.15000000000000002 in floating point)
    (0.05 + 1 / 960, 0.9, False),  # one sample over the start's bound
    (0.05, 0.15 - 1 / 960, False),  # one sample short of three times
    (0.02, 0.06, True),
    (0.0, 1 / 960, True),  # a start of 0: one correct sample at the end gets it off the ground
    (0.0, 0.0, False),  # 0 >= 3 x 0, but it never got off the ground
])
def test_the_bounds(start, final, passed):
    assert cold_start.passes(start, final) is passed


def test_a_mean_start_of_exactly_the_bound_from_two_seeds():
    """Means of two seeds' counts over 480 samples: 0.05 is 24/480 on both, or 20/480 and 28/480."""
    decision = decide({FIRST: both(20 / 480, 72 / 480, (28 / 480, 72 / 480))})
    assert decision.accepted and decision.start == pytest.approx(0.05) and decision.final == pytest.approx(0.15)


def test_a_start_of_zero_with_a_final_of_zero_is_not_accepted_at_either_length():
    decision = decide({FIRST: both(0.0, 0.0), RETRY: both(0.0, 0.0)})
    assert not decision.accepted and "and above it" in decision.reason


def test_the_plan_must_be_given_without_repeats():
    with pytest.raises(ValueError, match="none twice"):
        cold_start.next_selection_runs({}, (20, 20), TUNING_SEEDS)
    with pytest.raises(ValueError, match="must be given"):
        cold_start.next_selection_runs({}, (), TUNING_SEEDS)
