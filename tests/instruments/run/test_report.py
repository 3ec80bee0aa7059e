"""One run read from folders written like verl writes them (tests/instruments/_fake_run.py): its validation curve,
pass rates and paired gains with their intervals, the training signal, and the shared start that a run without its own
step-0 validation is measured from. The demo's report on these is tested in tests/instruments/demo/test_report.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from instruments.run import report, run_logs
from tests.instruments._fake_run import QUESTION_FAMILY, VALIDATION, family_means, write_fake_run

T95_3 = 3.182446305284263  # Student's t, 97.5% quantile, 3 degrees of freedom (4 prompts)


@pytest.fixture
def runs(tmp_path):
    """Runs with their own step-0 validation (as scripts/compare_cpu.py reads them)."""
    return {m: report.read_run(m, write_fake_run(tmp_path / m, m), QUESTION_FAMILY) for m in ("grpo", "bv_blend")}


@pytest.fixture
def shared(tmp_path):
    """The demo's runs: grpo's step-0 validation is the shared start, bv_blend has none of its own."""
    folder = tmp_path / "shared"
    grpo = report.share_start(report.read_run("grpo", write_fake_run(folder / "grpo"), QUESTION_FAMILY))
    bv = report.read_run("bv_blend", write_fake_run(folder / "bv_blend", "bv_blend", own_start=False),
                         QUESTION_FAMILY, start=grpo.start)
    return {"grpo": grpo, "bv_blend": bv}


def _prompt_means(step):
    return np.array([np.mean(v) for v in VALIDATION[step].values()])


def test_validation_curve_reads_verl_val_core_per_family_and_weights_the_overall(runs):
    curve = runs["grpo"].validation
    assert list(curve.index) == [0, 2, 4]
    assert list(curve.columns) == ["echo", "tiny_sum", "small_sum", "all"]  # the task's order, then the overall
    for step in (0, 2, 4):
        means = family_means(step)
        assert curve.loc[step, "echo"] == means["echo"]
        # echo has 2 held-out prompts, the others 1: the overall is the mean over prompts
        expected = (2 * means["echo"] + means["tiny_sum"] + means["small_sum"]) / 4
        assert curve.loc[step, "all"] == pytest.approx(expected)
        assert curve.loc[step, "all"] == pytest.approx(_prompt_means(step).mean())


def test_validation_dump_maps_each_prompt_to_the_longest_question(runs):
    samples = runs["grpo"].samples
    assert len(samples) == 3 * 4 * 2
    at4 = samples[samples.step == 4].groupby("question")["score"].mean()
    assert at4["11 plus 2 equals what?"] == 0.5 and at4["1 plus 2 equals what?"] == 1.0
    assert samples[samples.question == "11 plus 2 equals what?"]["family"].unique().tolist() == ["small_sum"]


def test_pass_rate_interval_is_over_prompt_means_and_the_gain_is_paired(runs):
    samples = runs["grpo"].samples
    m0, m4 = _prompt_means(0), _prompt_means(4)
    mean, half = report.pass_rate_ci(samples, 0)
    assert mean == pytest.approx(m0.mean()) and half == pytest.approx(T95_3 * m0.std(ddof=1) / 2, rel=1e-9)
    gain, gain_half = report.paired_gain(samples, 0, 4)
    d = m4 - m0
    assert gain == pytest.approx(d.mean()) and gain_half == pytest.approx(T95_3 * d.std(ddof=1) / 2, rel=1e-9)
    assert report.format_share(samples, 0) == pytest.approx(3 / 8)  # responses scored 1 carry the marker here


def test_mean_ci_is_a_t_interval():
    mean, half = report.mean_ci(np.array([1.0, 2.0, 3.0]))
    assert mean == 2.0 and half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)  # t(2) = 4.302653, sd 1
    assert report.mean_ci(np.array([0.4]))[0] == 0.4 and math.isnan(report.mean_ci(np.array([0.4]))[1])


def test_gain_from_the_shared_start_by_hand(shared):
    """The interval arithmetic on numbers worked out by hand (2 responses per prompt, 4 prompts: t(3) = 3.182).

    Start (grpo's step 0): prompt means 1/2, 0, 1, 0 -> 0.375, deviations 1/8, -3/8, 5/8, -3/8, sum of squares
    0.6875. grpo after: 1, 1, 1, 1/2 -> 0.875. Per-prompt gains d = 1/2, 1, 0, 1/2: mean 0.5, deviations 0, 1/2,
    -1/2, 0, sum of squares 1/2, variance 1/6 (3 d.o.f.), standard error sqrt(1/6)/2, half-width 0.6496.
    """
    grpo = shared["grpo"].summary()
    assert grpo["val before"] == 0.375 and grpo["val after"] == 0.875
    assert grpo["val before ±"] == pytest.approx(T95_3 * math.sqrt(0.6875 / 3) / 2, rel=1e-12)
    assert grpo["val after ±"] == pytest.approx(T95_3 * 0.25 / 2, rel=1e-12)  # 1, 1, 1, 1/2: sd 0.25
    assert grpo["gain"] == 0.5 and grpo["gain ±"] == pytest.approx(T95_3 * math.sqrt(1 / 6) / 2, rel=1e-12)
    assert grpo["gain ±"] == pytest.approx(0.6496141, rel=1e-6)
    # the paired interval lies between leaving the start's noise out and counting prompt difficulty twice
    start_exact = grpo["val after ±"]
    unpaired = T95_3 * math.sqrt((0.6875 / 3) / 4 + 0.25**2 / 4)
    assert start_exact < grpo["gain ±"] < unpaired
    # bv_blend after: 1/2, 0, 1, 1 -> 0.625; d = 0, 0, 0, 1: mean 0.25, sd 1/2, half-width t(3) x 1/4
    bv = shared["bv_blend"].summary()
    assert bv["val before"] == 0.375 and bv["val before ±"] == grpo["val before ±"]
    assert bv["gain"] == 0.25 and bv["gain ±"] == pytest.approx(T95_3 / 4, rel=1e-12)


def test_the_shared_start_is_each_run_s_step_0(shared):
    start = shared["grpo"].start
    assert (start.step, start.prompts, start.samples_per_prompt, start.source) == (0, 4, 2, "grpo")
    for run in shared.values():
        assert run.start is start and run.first_val == 0 and list(run.validation.index) == [0, 2, 4]
        at0 = run.samples[run.samples.step == 0]
        assert len(at0) == 4 * 2 and at0.groupby("question")["score"].mean().to_dict() == {
            q: np.mean(v) for q, v in VALIDATION[0].items()}
        assert run.validation.loc[0, "all"] == pytest.approx(0.375)
        assert run.summary()["shared start"] == 1.0
    assert start.summary()["in format"] == pytest.approx(3 / 8)
    # sampling alone: p(1-p) k/(k-1) = 1/2, 0, 0, 0 per prompt; Var = (1/2 / 2) / 4^2; 1.96 sd = 0.245
    assert start.summary()["pass rate ± sampling"] == pytest.approx(1.959963985 * 0.125, rel=1e-9)
    assert start.summary()["pass rate ± sampling"] < start.summary()["pass rate ±"]


def test_a_run_that_validated_its_own_start_is_refused_with_a_shared_start(tmp_path, shared):
    with pytest.raises(ValueError, match="validated at step.*0.*val_before_train=false"):
        report.read_run("grpo", write_fake_run(tmp_path / "again"), QUESTION_FAMILY, start=shared["grpo"].start)


def test_the_shared_start_needs_a_validation_before_training(tmp_path, shared):
    with pytest.raises(ValueError, match="first validation: step 2.*trainer.val_before_train=true"):
        report.share_start(report.read_run("grpo", write_fake_run(tmp_path / "g", own_start=False), QUESTION_FAMILY))
    with pytest.raises(ValueError, match="already has a shared start"):
        report.share_start(shared["grpo"])


def test_groups_are_told_apart_by_uid_not_prompt(tmp_path):
    rollouts = write_fake_run(tmp_path / "r") / "rollouts"
    # step 1: "Add 1 and 1." twice (all right, all wrong) and one mixed group; step 2: mixed, all wrong, all right
    assert report.group_shares(rollouts) == {"all-right %": pytest.approx(100 * 2 / 6),
                                             "all-wrong %": pytest.approx(100 * 2 / 6)}
    assert report.group_signal_ratio(rollouts).to_dict() == {1: pytest.approx(1 / 3), 2: pytest.approx(1 / 3)}


def test_summary_uses_logged_signal_for_bv_blend_and_steady_steps_for_time(runs):
    grpo, bv = runs["grpo"].summary(), runs["bv_blend"].summary()
    assert grpo["signal ratio"] == pytest.approx(1 / 3) and grpo["GRPO signal ratio"] == pytest.approx(1 / 3)
    assert bv["signal ratio"] == pytest.approx(np.mean([0.5, 1, 1, 1])) and bv["GRPO signal ratio"] == 0.25
    assert grpo["step time s"] == pytest.approx(5.0)  # steps 2-4: step 1 carries vLLM's first-use costs
    assert grpo["adv share %"] == pytest.approx(100 * np.mean([0.2 / 4, 0.1 / 5, 0.3 / 6]))
    assert grpo["val before"] == pytest.approx(_prompt_means(0).mean())
    assert grpo["val after"] == pytest.approx(_prompt_means(4).mean())
    assert grpo["steps"] == 4 and not math.isnan(grpo["gain ±"])


def test_a_run_without_validation_is_a_clear_error(tmp_path):
    folder = write_fake_run(tmp_path / "r")
    lines = [line for line in (folder / "metrics.jsonl").read_text().splitlines() if '"val-core' not in line]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="val_before_train=true or trainer.test_freq"):
        report.validation_curve(report.read_metrics(folder / "metrics.jsonl"))


def test_outputs_with_unicode_line_separators_are_read_as_one_row_each(tmp_path):
    """verl writes its dumps with ensure_ascii=False: a model's U+2028 (SmolLM2 wrote one) or U+0085 stays raw in
    the file, where str.splitlines() would cut its row in two (bv_blend.core.jsonl)."""
    clean_folder, folder = write_fake_run(tmp_path / "clean"), write_fake_run(tmp_path / "r")
    clean = report.read_run("grpo", clean_folder, QUESTION_FAMILY)
    for dump in ("validation", "rollouts"):
        for path in (folder / dump).glob("*.jsonl"):
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for row in rows:
                row["output"] = "Sammy\u2028saw\x85 " + row["output"] + "\u2029\x1c"
            path.write_text("\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n")
    assert "\u2028" in (folder / "validation" / "0.jsonl").read_text()
    odd = report.read_run("grpo", folder, QUESTION_FAMILY)
    assert len(odd.samples) == len(clean.samples)
    assert odd.samples["score"].tolist() == clean.samples["score"].tolist()
    assert report._groups_per_step(folder / "rollouts") == report._groups_per_step(clean_folder / "rollouts")
    assert run_logs.visits_per_prompt(folder / "rollouts") == run_logs.visits_per_prompt(clean_folder / "rollouts")


def test_a_validation_prompt_outside_the_held_out_set_is_a_clear_error(tmp_path):
    folder = write_fake_run(tmp_path / "r")
    with pytest.raises(ValueError, match="matches no held-out question"):
        report.read_validation_dump(folder / "validation", {"Add 9 and 9.": "small_sum"})
