"""scripts/regime_report.py: the one rule applied to every instrument's summary (summaries made here, in the
instruments' on-disk format, to test the reading: they are not results)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from instruments.regime import ArmSummary, InstrumentSummary, write_summary
from instruments.stats import Interval

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "regime_report.py"


def _script():
    spec = importlib.util.spec_from_file_location("regime_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _arm(value: float, half: float = 0.02) -> ArmSummary:
    return ArmSummary(Interval(0.3 + value, 0.29 + value, 0.31 + value), Interval(value, value - half, value + half),
                      Interval(1.0, 0.9, 1.1), finals=None)


def _summary(name: str, seeds: int = 10, **arms: float) -> InstrumentSummary:
    return InstrumentSummary(name, "cmd", "cpu", list(range(seeds)), {"max": 1, "mean": 1.0},
                             {"grpo8": _arm(0.0), **{key: _arm(value) for key, value in arms.items()}})


def test_the_rule_recommends_across_instruments_and_names_the_missing_one(tmp_path):
    write_summary(_summary("logistic_lab", rpp1=0.05, grpo2=-0.05, oracle_baseline1=0.3), tmp_path)
    assert _script().main(["--summaries", str(tmp_path)]) == 0
    text = (tmp_path / "recommendation.md").read_text()
    # grpo2 is behind in the logistic lab; the oracle is a limit: REINFORCE++ n=1 is the one that qualifies
    assert "**Recommendation: REINFORCE++ n=1**, the only qualified arm." in text
    assert "pretrained_lm" in text.split("without a finished regime run")[1].splitlines()[0]
    assert "limit: baseline R - p, n=1 (p true in the logistic lab): logistic_lab +0.250" in text


def test_the_retired_instruments_summaries_are_not_read(tmp_path):
    """The token lab's and the tiny model's summaries stay in the run record (results/token_lab/, results/verl_cpu/);
    one left in the summaries' folder is not read, and neither is named as missing."""
    write_summary(_summary("logistic_lab", rpp1=0.05), tmp_path)
    write_summary(_summary("token_lab", rpp1=-0.2), tmp_path)  # would make REINFORCE++ n=1 behind if it were read
    write_summary(_summary("verl_cpu", rpp1=-0.2), tmp_path)
    assert _script().main(["--summaries", str(tmp_path)]) == 0
    text = (tmp_path / "recommendation.md").read_text()
    assert "**Recommendation: REINFORCE++ n=1**" in text
    assert "token_lab" not in text and "verl_cpu" not in text


def test_nothing_ahead_keeps_the_reference(tmp_path):
    write_summary(_summary("logistic_lab", rpp1=0.0, spo1=-0.05), tmp_path)
    assert _script().main(["--summaries", str(tmp_path)]) == 0
    assert "**Recommendation: GRPO n=8 stays.**" in (tmp_path / "recommendation.md").read_text()


def test_no_summary_is_a_clear_error(tmp_path, capsys):
    assert _script().main(["--summaries", str(tmp_path)]) == 2
    assert "no summary in" in capsys.readouterr().err


def test_an_instrument_with_too_few_seeds_is_shown_and_not_judged(tmp_path):
    from instruments.rule import MIN_SEEDS

    write_summary(_summary("logistic_lab", rpp1=0.05, bv_cluster2=0.04), tmp_path)
    # the pretrained LM's would make REINFORCE++ n=1 behind, and with too few seeds it must not
    write_summary(_summary("pretrained_lm", seeds=MIN_SEEDS - 1, rpp1=-0.1, bv_cluster2=0.0), tmp_path)
    assert _script().main(["--summaries", str(tmp_path)]) == 0
    text = (tmp_path / "recommendation.md").read_text()
    # both qualify in the logistic lab and nothing separates them (no per-seed finals): the simplest is verl's own
    assert "**Tied**: REINFORCE++ n=1 (needs: verl), BV-Blend cluster level n=2 (needs: codebook)" in text
    assert "recommends the simplest of the tied set (verl's stock estimators first): **REINFORCE++ n=1**" in text
    assert f"**Reported, not judged** (fewer than {MIN_SEEDS} paired seeds" in text
    assert f"pretrained_lm ({MIN_SEEDS - 1} seeds)" in text and "| pretrained_lm (not judged) |" in text
    assert "-0.100 [-0.120, -0.080] behind" in text  # its numbers are still shown

    write_summary(_summary("pretrained_lm", seeds=MIN_SEEDS, rpp1=-0.1, bv_cluster2=0.0), tmp_path)
    assert _script().main(["--summaries", str(tmp_path)]) == 0
    text = (tmp_path / "recommendation.md").read_text()  # with enough seeds it judges: rpp1 is behind there
    assert "**Recommendation: BV-Blend cluster level n=2**, the only qualified arm." in text
    assert "not judged" not in text


def test_the_committed_recommendation_is_what_the_committed_summaries_give(tmp_path):
    """results/regime/recommendation.md is derived, never edited: rebuilt from results/regime/*.json it is the same
    text."""
    committed = SCRIPT.parents[1] / "results" / "regime"
    assert _script().main(["--summaries", str(committed), "--out", str(tmp_path / "rebuilt.md")]) == 0
    assert (tmp_path / "rebuilt.md").read_text() == (committed / "recommendation.md").read_text()


def test_a_resolved_leader_is_the_pick_and_a_summary_without_finals_is_named(tmp_path):
    def arm(value: float, finals: list[float]) -> ArmSummary:
        return ArmSummary(Interval(0.3 + value, 0.29 + value, 0.31 + value), Interval(value, value - 0.01,
                          value + 0.01), Interval(1.0, 0.9, 1.1), finals=finals)

    seeds = [0.0, 0.01, -0.01, 0.02, -0.02]
    summary = InstrumentSummary("pretrained_lm", "cmd", "cpu", list(range(5)), {"max": 1, "mean": 1.0}, {
        "grpo8": arm(0.0, [0.5 + s for s in seeds]), "rpp1": arm(0.02, [0.52 + s for s in seeds]),
        "bv_cluster2": arm(0.05, [0.55 + s for s in seeds])})
    write_summary(summary, tmp_path)
    assert _script().main(["--summaries", str(tmp_path)]) == 0
    text = (tmp_path / "recommendation.md").read_text()
    assert "**Recommendation: BV-Blend cluster level n=2**, resolved ahead of every other qualified arm." in text
    assert "- minus REINFORCE++ n=1: +0.030 [+0.030, +0.030], resolved ahead" in text
    assert "older than the revised rule" not in text
    write_summary(_summary("logistic_lab", rpp1=0.0), tmp_path)
    assert _script().main(["--summaries", str(tmp_path)]) == 0
    assert "**Summaries older than the revised rule**: logistic_lab." in (tmp_path / "recommendation.md").read_text()


def test_priors_arms_are_read_with_what_they_bought(tmp_path):
    summary = _summary("logistic_lab", rpp1=0.02, spo1_priors=-0.3)
    summary.notes["priors"] = {"minus_twin_training_only": {"spo1_priors": {"twin": "spo1", "value": 0.014,
                                                                            "low": 0.011, "high": 0.018}}}
    write_summary(summary, tmp_path)
    assert _script().main(["--summaries", str(tmp_path)]) == 0
    text = (tmp_path / "recommendation.md").read_text()
    assert "arithmetic, not a measurement" in text and "one-off cost that a user reuses across runs" in text
    assert "- logistic_lab: SPO n=1 + offline priors minus SPO n=1: +0.014 [+0.011, +0.018]" in text
