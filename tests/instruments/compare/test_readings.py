"""instruments/compare/readings.py: the readings beside the rule's, on cases computed by hand, and on the main job's
committed group record against the shares its own report counted from verl's rollout dump."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from instruments import rule
from instruments.compare import pairing, readings

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "results" / "demo" / "main_job"


def _result(seed: int, validation: dict[int, float], arm: str = "grpo", n: int = 8, cpu: str = "cpu A") -> dict:
    return {"spec": {"arm": arm, "n": n, "batch": 64 // n, "seed": seed, "estimator": "grpo", "overrides": []},
            "settings": {"lr": "2e-05"}, "validation": {str(k): v for k, v in validation.items()}, "cpu": cpu}


def _metrics(seconds_per_step: list[float]) -> pd.DataFrame:
    """verl's metrics as report.read_metrics gives them: step 0 (the validation) without a step time."""
    frame = pd.DataFrame({"timing_s/step": [np.nan, *seconds_per_step]}, index=range(len(seconds_per_step) + 1))
    frame.index.name = "step"
    return frame


# ------------------------------------------------------------------------------------------ one run's readings
def test_the_area_is_trapezoids_over_the_steps_divided_by_the_span():
    even = _result(0, {0: 0.1, 10: 0.3, 20: 0.6})
    assert readings.auc(even) == pytest.approx(((0.1 + 0.3) / 2 * 10 + (0.3 + 0.6) / 2 * 10) / 20)  # 0.325
    # uneven steps, written in an order where sorting the keys as text would misplace "5": the mean of the values
    # (0.333) or equal weights would fail
    uneven = {"spec": {}, "validation": {"20": 0.8, "0": 0.0, "5": 0.2}}
    assert readings.auc(uneven) == pytest.approx(((0.0 + 0.2) / 2 * 5 + (0.2 + 0.8) / 2 * 15) / 20)  # 0.4


def test_the_last_two_are_the_last_two_steps_in_number_order():
    result = {"validation": {"10": 0.5, "20": 0.7, "5": 0.2, "0": 0.1}}  # as text, "5" would sort last
    assert readings.last_two_mean(result) == pytest.approx(0.6)
    assert readings.final(result) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="needs two"):
        readings.last_two_mean({"validation": {"20": 0.7}})


def test_a_null_validation_reads_as_nan_not_zero():
    assert np.isnan(readings.final({"validation": {"0": 0.1, "20": None}}))


# ------------------------------------------------------------------------------------------- paired by seed
def test_the_paired_difference_is_the_t_interval_of_the_per_seed_differences():
    arm = {s: _result(s, {0: 0.1, 20: v}) for s, v in enumerate([0.5, 0.6, 0.7])}
    reference = {s: _result(s, {0: 0.1, 20: v}) for s, v in enumerate([0.4, 0.45, 0.65])}
    reference[7] = _result(7, {0: 0.1, 20: 0.9})  # a seed the arm did not run: left out of the pairing
    got = readings.paired(arm, reference, readings.final)
    diffs = np.array([0.1, 0.15, 0.05])
    half = scipy_stats.t.ppf(0.975, 2) * diffs.std(ddof=1) / np.sqrt(3)  # 4.303 x 0.05 / sqrt(3) = 0.1242
    assert got.seeds == (0, 1, 2)
    assert got.interval.value == pytest.approx(0.1)
    assert (got.interval.low, got.interval.high) == pytest.approx((0.1 - half, 0.1 + half))


def test_a_reading_a_run_cannot_give_is_none_with_its_reason():
    arm = {0: _result(0, {20: 0.5}), 1: _result(1, {20: 0.6})}
    got = readings.paired(arm, arm, readings.auc)
    assert got.interval is None and "an area needs two" in got.note


def test_the_rule_reading_judges_only_from_five_paired_seeds():
    finals = [0.70, 0.72, 0.69, 0.71, 0.73]
    arm = {s: _result(s, {0: 0.1, 10: 0.4, 20: f}, arm="bv_blend", n=2) for s, f in enumerate(finals)}
    reference = {s: _result(s, {0: 0.1, 10: 0.3, 20: f - 0.05 - 0.01 * s}) for s, f in enumerate(finals)}
    five = readings.rule_reading(arm, reference)
    assert five.summary.difference.value == pytest.approx(np.mean([0.05 + 0.01 * s for s in range(5)]))
    assert five.verdict == rule.AHEAD
    four = readings.rule_reading({s: arm[s] for s in range(4)}, reference)
    assert four.seeds == (0, 1, 2, 3) and four.verdict is None and four.summary.verdict == rule.AHEAD


# ------------------------------------------------------------------------------------- DAPO: steps and time
def test_at_equal_steps_reads_the_arm_at_the_references_final_step():
    arm = {0: _result(0, {0: 0.1, 10: 0.5, 20: 0.6, 30: 0.9}), 1: _result(1, {0: 0.1, 10: 0.4, 20: 0.7, 30: 0.8})}
    reference = {0: _result(0, {0: 0.1, 20: 0.55}), 1: _result(1, {0: 0.1, 20: 0.6})}
    got = readings.at_equal_steps(arm, reference)
    assert got.interval.value == pytest.approx(np.mean([0.6 - 0.55, 0.7 - 0.6]))  # step 20, not its own last
    missing = readings.at_equal_steps({0: _result(0, {0: 0.1, 30: 0.9})}, reference)
    assert missing.interval is None and "no validation at the reference's final step" in missing.note


# DAPO stopped at its budget (fair_verdict.md, amendment 1): GRPO n = 8 generates 64 rollouts a step, 1,280 by step
# 20, its validations every 5 steps. DAPO (n = 8, batch 8) also draws ``extra`` groups a step beyond its batch, so it
# generates 64 + 8 x extra a step and stops at the first step whose total reaches 1,280, validated there.
BUDGET = 1280


def _grpo(seed: int, validation: dict[int, float]) -> dict:
    return _result(seed, validation) | {"settings": {"lr": "2e-05", "steps": "20"}}


def _stopped(seed: int, extra: int, validation: dict[int, float]) -> dict:
    step = max(validation)
    per_step = 64 + 8 * extra
    assert per_step * (step - 1) < BUDGET <= per_step * step  # the step the budget stop ends it at
    return _result(seed, validation, arm="grpo_dynamic") | {
        "settings": {"lr": "2e-05", "steps": "20", "stop_at_rollouts": str(BUDGET)},
        "filter_groups": {"evicted_samples": {str(k): float(extra) for k in range(1, step + 1)}},
        "stopped": {"reason": "rollout budget", "step": step, "rollouts": float(per_step * step),
                    "stop_at_rollouts": BUDGET, "steps": 20}}


@pytest.fixture
def stopped_dapo() -> tuple[dict, dict]:
    reference = {0: _grpo(0, {0: 0.0, 5: 0.1, 10: 0.2, 15: 0.3, 20: 0.4}),
                 1: _grpo(1, {0: 0.0, 5: 0.1, 10: 0.15, 15: 0.25, 20: 0.35})}
    # seed 0: 184 a step, 920 by step 5, 1,288 by step 7 (stops there); seed 1: 152 a step, 760 by 5, 1,368 by 9
    arm = {0: _stopped(0, 15, {0: 0.0, 5: 0.1, 7: 0.2}), 1: _stopped(1, 11, {0: 0.0, 5: 0.05, 9: 0.25})}
    return arm, reference


def test_a_stopped_arm_is_read_at_the_references_final_rollouts(stopped_dapo):
    """The rule's final of a run stopped at its budget: its own curve, on its own rollouts, read at GRPO's 1,280;
    pairing on the validations both have (0 and 5) would read it at GRPO's step 5, a quarter of the budget."""
    arm, reference = stopped_dapo
    got = readings.rule_reading(arm, reference)
    at_budget = [0.1 + (BUDGET - 920) / (1288 - 920) * (0.2 - 0.1),
                 0.05 + (BUDGET - 760) / (1368 - 760) * (0.25 - 0.05)]
    assert got.summary.finals == pytest.approx(at_budget)  # 0.1978, 0.2211
    assert got.summary.difference.value == pytest.approx(np.mean([at_budget[0] - 0.4, at_budget[1] - 0.35]))
    assert got.seeds == (0, 1) and got.verdict is None  # two seeds: no verdict
    paired_runs = pairing.pair(arm, reference)
    assert paired_runs.x_reference.tolist() == [0, 320, 640, 960, 1280]  # the reference's validations' rollouts
    # seed 0 at 960 rollouts: between its 920 (0.1) and 1,288 (0.2)
    assert paired_runs.curves[0, 3] == pytest.approx(0.1 + 40 / 368 * 0.1)


def test_a_stopped_run_short_of_the_budget_is_refused_not_extended(stopped_dapo):
    arm, reference = stopped_dapo
    short = json.loads(json.dumps(arm[0]))
    short["filter_groups"]["evicted_samples"] = {str(k): 0.0 for k in range(1, 8)}  # 448 rollouts by its step 7
    with pytest.raises(ValueError, match="cannot be read at that budget"):
        readings.rule_reading({0: short}, reference)


def test_arms_that_went_their_steps_pair_as_before():
    arm = {s: _result(s, {0: 0.1, 10: 0.4, 20: 0.5 + 0.1 * s}, arm="bv_blend", n=2) for s in range(3)}
    reference = {s: _result(s, {0: 0.1, 10: 0.3, 20: 0.45}) for s in range(3)}
    paired_runs = pairing.pair(arm, reference)  # no stop: the validations both have, on their own rollouts
    assert paired_runs.curves.tolist() == [[0.1, 0.4, 0.5 + 0.1 * s] for s in range(3)]
    assert paired_runs.reference.tolist() == [[0.1, 0.3, 0.45]] * 3 and not paired_runs.generated


def test_at_equal_steps_reads_a_stopped_run_at_the_step_it_reached(stopped_dapo):
    """Its final validation minus GRPO's curve at that same step, linear between GRPO's validations: seed 0 at step 7
    (GRPO 0.1 + 2/5 x 0.1 = 0.14), seed 1 at step 9 (0.1 + 4/5 x 0.05 = 0.14); GRPO's final would give -0.2, -0.1."""
    arm, reference = stopped_dapo
    got = readings.at_equal_steps(arm, reference)
    assert got.at_steps == (7, 9) and got.seeds == (0, 1)
    assert got.interval.value == pytest.approx(np.mean([0.2 - 0.14, 0.25 - 0.14]))
    assert "seed 0: step 7, seed 1: step 9" in got.note
    unvalidated = json.loads(json.dumps(arm[1]))
    unvalidated["validation"].pop("9")  # its last validation is not at the step it stopped at
    bad = readings.at_equal_steps({1: unvalidated}, reference)
    assert bad.interval is None and "stopped at step 9, but its last validation is at step 5" in bad.note


def test_the_final_is_the_last_validation_of_a_stopped_run(stopped_dapo):
    arm, _ = stopped_dapo
    assert readings.final(arm[0]) == pytest.approx(0.2) and readings.stopped_step(arm[0]) == 7
    assert readings.stopped_step(_grpo(0, {0: 0.1, 20: 0.5})) is None


def test_the_clock_sums_the_step_times_and_refuses_a_hole():
    clock = readings.training_clock(_metrics([10.0, 12.0, 8.0]))
    assert clock.to_dict() == {0: 0.0, 1: 10.0, 2: 22.0, 3: 30.0}
    holed = _metrics([10.0, 12.0, 8.0]).drop(index=2)
    with pytest.raises(ValueError, match=r"step\(s\) \[2\]"):
        readings.training_clock(holed)


def test_at_equal_wall_time_reads_the_arm_at_the_references_training_time():
    # the reference: 10 s a step, its final (step 4) at 40 s. Seed 0's arm: 16 s a step, so 40 s falls a quarter of
    # the way from its step-2 validation (32 s, 0.4) to its step-4 one (64 s, 0.9): 0.4 + 0.25 x 0.5 = 0.525.
    # Seed 1's arm: 20 s a step, 40 s is its step 2 exactly: 0.45.
    reference = {0: _result(0, {0: 0.1, 2: 0.3, 4: 0.5}), 1: _result(1, {0: 0.1, 2: 0.3, 4: 0.4})}
    arm = {0: _result(0, {0: 0.1, 2: 0.4, 4: 0.9}), 1: _result(1, {0: 0.1, 2: 0.45, 4: 0.9})}
    ref_metrics = {0: _metrics([10.0] * 4), 1: _metrics([10.0] * 4)}
    arm_metrics = {0: _metrics([16.0] * 4), 1: _metrics([20.0] * 4)}
    got = readings.at_equal_wall_time(arm, reference, arm_metrics, ref_metrics)
    diffs = np.array([0.525 - 0.5, 0.45 - 0.4])
    half = scipy_stats.t.ppf(0.975, 1) * diffs.std(ddof=1) / np.sqrt(2)
    assert got.seeds == (0, 1) and got.note == ""
    assert got.interval.value == pytest.approx(diffs.mean())
    assert got.interval.high - got.interval.value == pytest.approx(half)


def test_at_equal_wall_time_leaves_out_seeds_it_cannot_read_and_says_why():
    reference = {s: _result(s, {0: 0.1, 2: 0.3, 4: 0.5}) for s in range(4)}
    arm = {s: _result(s, {0: 0.1, 2: 0.4, 4: 0.9}, cpu="cpu B" if s == 2 else "cpu A") for s in range(4)}
    ref_metrics = {0: _metrics([10.0] * 4), 1: None, 2: _metrics([10.0] * 4), 3: _metrics([10.0] * 4)}
    arm_metrics = {0: _metrics([16.0] * 4), 1: _metrics([16.0] * 4), 2: _metrics([16.0] * 4),
                   3: _metrics([5.0] * 4)}  # seed 3's arm ended after 20 s: not extrapolated to 40
    got = readings.at_equal_wall_time(arm, reference, arm_metrics, ref_metrics)
    assert got.seeds == (0,) and got.interval.value == pytest.approx(0.025)
    assert "seed 1: no metrics kept by the reference" in got.note
    assert "seed 2: the two runs ran on different CPUs" in got.note
    assert "seed 3: the arm's training ended before the reference's 40 s" in got.note
    none = readings.at_equal_wall_time(arm, reference, {}, ref_metrics)
    assert none.interval is None and "no metrics kept by the arm" in none.note


# ------------------------------------------------------------------------------------------- the group record
def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _group(step: int, rewards: list[float], mean: float | None = None, weight: float | None = None) -> dict:
    line = {"step": step, "prompt_key": f"k{step}{len(rewards)}{rewards}", "cluster": 0, "rewards": rewards,
            "advantages": [0.0] * len(rewards)}
    if mean is not None:
        line.update(history_mean=mean, history_weight=weight)
    return line


def test_shares_and_lag_on_a_hand_written_record(tmp_path):
    stale = [_group(2, [1.0, 1.0], 0.9, 0.9), _group(3, [1.0, 1.0], 0.9, 0.9)]  # the interrupted attempt's
    record = _write(tmp_path / "groups.jsonl", [
        _group(1, [0.0, 0.0], 0.0, 0.0), _group(1, [1.0, 0.0], 0.0, 0.0), *stale,
        # the resumed attempt, from step 1's checkpoint: step 2 again, then 3
        _group(2, [0.0, 0.0], 0.5, 0.5), _group(2, [1.0, 1.0], 0.1, 0.3), _group(2, [1.0, 0.0, 1.0, 1.0], 0.2, 0.4),
        _group(3, [0.0, 0.0], 0.3, 0.6),
    ])
    groups = readings.read_groups(record)
    assert groups.groupby("step").size().to_dict() == {1: 2, 2: 3, 3: 1}  # the stale lines are gone
    shares = readings.group_shares(groups)
    assert shares.loc[1, ["all-wrong", "all-right", "mixed"]].tolist() == pytest.approx([0.5, 0.0, 0.5])
    assert shares.loc[2, ["all-wrong", "all-right", "mixed"]].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    history = readings.history_by_step(groups)
    # step 2's pass rate is over its 8 rollouts, 5 right: 0.625 (the mean of the groups' rates would be 0.583)
    assert history.loc[2, "pass rate"] == pytest.approx(5 / 8)
    assert history.loc[2, "lag"] == pytest.approx((0.5 + 0.1 + 0.2) / 3 - 5 / 8)
    assert history.loc[2, "weight"] == pytest.approx(0.4)
    assert history.loc[1, "lag"] == pytest.approx(0.0 - 1 / 4)
    assert history.loc[3, "lag"] == pytest.approx(0.3)


def test_an_arm_without_a_history_has_no_lag(tmp_path):
    record = _write(tmp_path / "groups.jsonl", [_group(1, [0.0, 1.0]), _group(1, [1.0, 1.0])])
    groups = readings.read_groups(record)
    assert not readings.has_history(groups) and readings.history_by_step(groups).empty
    assert readings.group_shares(groups).loc[1, "all-right"] == pytest.approx(0.5)


def test_seed_means_by_step_count_the_seeds_that_had_the_step():
    a = pd.DataFrame({"all-wrong": [0.5, 0.25]}, index=pd.Index([1, 2], name="step"))
    b = pd.DataFrame({"all-wrong": [0.3]}, index=pd.Index([1], name="step"))
    got = readings.seed_mean_by_step([a, b])
    assert got.loc[1, "all-wrong"] == pytest.approx(0.4) and got.loc[2, "all-wrong"] == pytest.approx(0.25)
    assert got["seeds"].to_dict() == {1: 2, 2: 1}


def test_the_main_jobs_record_gives_the_shares_its_report_counted_from_the_rollout_dump():
    """The committed group record of the main job (BV-Blend n = 2, 20 steps of 32 groups) against its summary's
    all-wrong and all-right shares, which instruments/run/report.py counted from verl's rollout dump, not from the
    group record; the lag against a second computation straight from the JSON lines."""
    groups = readings.read_groups(DEMO / "groups.jsonl")
    shares = readings.group_shares(groups)
    assert (shares["groups"] == 32).all() and list(shares.index) == list(range(1, 21))
    assert (shares[["all-wrong", "all-right", "mixed"]].sum(axis=1)).to_numpy() == pytest.approx(1.0)
    summary = json.loads((DEMO / "summary.json").read_text())["run"]["summary"]
    weighted = lambda column: 100 * (shares[column] * shares["groups"]).sum() / shares["groups"].sum()  # noqa: E731
    assert weighted("all-wrong") == pytest.approx(summary["all-wrong %"])
    assert weighted("all-right") == pytest.approx(summary["all-right %"])
    lines = [json.loads(line) for line in (DEMO / "groups.jsonl").read_text().splitlines()]
    history = readings.history_by_step(groups)
    for step in (1, 10, 20):
        mine = [line for line in lines if line["step"] == step]
        rollouts = [r for line in mine for r in line["rewards"]]
        rate = sum(rollouts) / len(rollouts)
        lag = sum(line["history_mean"] - rate for line in mine) / len(mine)
        assert history.loc[step, "lag"] == pytest.approx(lag)
        assert history.loc[step, "weight"] == pytest.approx(sum(line["history_weight"] for line in mine) / len(mine))
