"""Tables and plot of the demo from a run folder written like verl writes it (tests/demo/_fake_run.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bv_blend.demo import report
from tests.demo._fake_run import QUESTION_FAMILY, VALIDATION, family_means, write_fake_run


@pytest.fixture
def runs(tmp_path):
    return {m: report.read_run(m, write_fake_run(tmp_path / m, m), QUESTION_FAMILY) for m in ("grpo", "bv_blend")}


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
    assert mean == pytest.approx(m0.mean()) and half == pytest.approx(1.959964 * m0.std(ddof=1) / 2, rel=1e-5)
    gain, gain_half = report.paired_gain(samples, 0, 4)
    d = m4 - m0
    assert gain == pytest.approx(d.mean()) and gain_half == pytest.approx(1.959964 * d.std(ddof=1) / 2, rel=1e-5)
    assert report.format_share(samples, 0) == pytest.approx(3 / 8)  # responses scored 1 carry the marker here


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


def test_tables_and_plot(runs, tmp_path):
    text = report.demo_tables(runs)
    rates = report.pass_rate_table(runs)
    assert list(rates.columns) == ["grpo before", "grpo after", "bv_blend before", "bv_blend after"]
    assert rates.loc["all", "grpo after"] == pytest.approx(_prompt_means(4).mean())
    for family in ("echo", "tiny_sum", "small_sum", "all", "gain (95% CI)", "adv share %", "all-wrong %"):
        assert family in text
    png = report.plot_runs(runs, tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_run_without_validation_is_a_clear_error(tmp_path):
    folder = write_fake_run(tmp_path / "r")
    lines = [line for line in (folder / "metrics.jsonl").read_text().splitlines() if '"val-core' not in line]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="val_before_train=true or trainer.test_freq"):
        report.validation_curve(report.read_metrics(folder / "metrics.jsonl"))


def test_a_validation_prompt_outside_the_held_out_set_is_a_clear_error(tmp_path):
    folder = write_fake_run(tmp_path / "r")
    with pytest.raises(ValueError, match="matches no held-out question"):
        report.read_validation_dump(folder / "validation", {"Add 9 and 9.": "small_sum"})
