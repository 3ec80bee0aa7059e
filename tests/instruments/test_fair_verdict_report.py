"""instruments/fair_verdict_report.py and scripts/fair_verdict_report.py: the report assembled from whatever state
exists, on a made-up state (tuning half done, seeds missing, a cold start with group records) and on the committed
comparison."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from instruments import campaign, fair_verdict, stats, tuning
from instruments import fair_verdict_report as fvr
from tests._scripts import load_script

STEPS = 20


def _save(folder: Path, arm: str, seed: int, lr: float, validation: dict[int, float], groups: list[dict] | None = None,
          ) -> None:
    """A finished run's state as run_state.py keeps it: ``folder/runs/<arm>_n<n>_seed<s>/result.json``."""
    name, n = arm.split(":")
    run = folder / "runs" / fair_verdict.run_folder(arm, seed)
    run.mkdir(parents=True)
    result = {"spec": {"arm": name, "n": int(n), "batch": 64 // int(n), "seed": seed, "estimator": name,
                       "overrides": []},
              "settings": {"lr": f"{lr:g}", "steps": str(max(validation))},
              "validation": {str(k): v for k, v in validation.items()}, "cpu": "cpu A", "wall_s": 100.0}
    (run / "result.json").write_text(json.dumps(result))
    if groups is not None:
        (run / "groups.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))


def _groups(history: bool) -> list[dict]:
    lines = []
    for step in (1, 2):
        for rewards in ([0.0, 0.0], [1.0, 0.0]):
            line = {"step": step, "prompt_key": "k", "cluster": 0, "rewards": rewards, "advantages": [0.0, 0.0]}
            if history:
                line.update(history_mean=0.1 * step, history_weight=0.5)
            lines.append(line)
    return lines


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A results/regime/ laid out as instruments/fair_verdict.py says, part way through the campaign."""
    regime = tmp_path / "regime"
    committed, tuned = regime / campaign.COMMITTED, regime / campaign.TUNING
    cold_arms = regime / campaign.COLD_ARMS_STATE
    for seed in range(5):  # the committed comparison: BV-Blend n = 2 ahead on every seed, REINFORCE++ on 3 seeds
        _save(committed, "grpo:8", seed, 2e-5, {0: 0.1, 10: 0.3, 20: 0.60 + 0.01 * seed})
        _save(committed, "bv_blend:2", seed, 2e-5, {0: 0.1, 10: 0.4, 20: 0.65 + 0.012 * seed})
        if seed < 3:
            _save(committed, "reinforce_plus_plus:1", seed, 2e-5, {0: 0.1, 10: 0.3, 20: 0.7})
    for lr, final in {1e-5: 0.60, 2e-5: 0.70, 4e-5: 0.65}.items():  # GRPO's tuning done: 2e-5, interior
        for seed in tuning.TUNING_SEEDS:
            _save(tuned / "grpo_n8" / fair_verdict.lr_folder(lr), "grpo:8", seed, lr, {0: 0.1, 10: 0.3, STEPS: final})
    _save(tuned / "reinforce_plus_plus_n1" / "lr_1e-05", "reinforce_plus_plus:1", 100, 1e-5,
          {0: 0.1, 10: 0.3, STEPS: 0.6})
    for seed in tuning.TUNING_SEEDS:  # the cold task: starts at 0.025, ends at 0.15, accepted at 20 steps
        _save(regime / campaign.COLD_SELECTION / "steps_20", "grpo:8", seed, 2e-5,
              {0: 0.02 if seed == 100 else 0.03, 10: 0.1, 20: 0.2 if seed == 100 else 0.1})
    for seed in range(5):
        _save(cold_arms / "grpo_n8" / "lr_2e-05", "grpo:8", seed, 2e-5, {0: 0.02, 10: 0.1, 20: 0.2}, _groups(False))
        _save(cold_arms / "bv_blend_n2" / "lr_2e-05", "bv_blend:2", seed, 2e-5,
              {0: 0.02, 10: 0.15, 20: 0.25 + 0.01 * seed}, _groups(True))
    return regime


def _row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_the_tuning_table_and_what_it_still_needs(state):
    done = fvr.tuning_state("grpo:8", state / campaign.TUNING / "grpo_n8", STEPS)
    assert done.lr == 2e-5 and not done.needs
    text = "\n".join(fvr.tuning_lines(done))
    assert "**Chosen: 2e-05**, interior" in text and "| 2e-05 | 0.700 | 0.700 | 0.700 | 0.700 |" in text
    assert "| 4e-05 | 0.650 | 0.650 | 0.650 | 0.650 |" in text and "has not written `choice.json`" in text
    partial = fvr.tuning_state("reinforce_plus_plus:1", state / campaign.TUNING / "reinforce_plus_plus_n1", STEPS)
    text = "\n".join(fvr.tuning_lines(partial))
    assert "| 1e-05 | 0.600 | - | 0.600 | - |" in text
    assert "still needs lr 2e-05 seed 100, lr 4e-05 seed 100" in text


def test_the_report_judges_with_five_seeds_and_says_pending_below(state, tmp_path):
    text = fvr.report_markdown(tmp_path / "out", state, STEPS)
    bv2 = _row(text, "| bv_blend n=2 (32 prompts) | 0.")
    diffs = np.array([0.05 + 0.002 * s for s in range(5)])
    direct = stats.format_interval(stats.Interval(diffs.mean(), *(diffs.mean() + np.array([-1, 1]) * scipy_stats.t.ppf(
        0.975, 4) * diffs.std(ddof=1) / np.sqrt(5))), signed=True)
    assert f"| {direct} | ahead |" in bv2
    assert "pending (3 of 5 seeds)" in _row(text, "| reinforce_plus_plus n=1 (64 prompts) | 0.")
    # GRPO chose 2e-5: its committed runs count at its own rate; the others have no rate of their own yet
    grpo = _row(text, "| grpo n=8 (8 prompts) |")
    assert "| 2e-05 | 0.620 [" in grpo
    assert "no rate of its own yet: its tuning has not chosen" in bv2
    assert (tmp_path / "out" / "curves_grpo_rate.png").is_file()
    assert "No run of this comparison kept a group record" in text
    assert "Pending: only GRPO n = 8, the reference, has runs here" in text  # at its own rate, alone so far


def test_the_cold_start_is_accepted_and_its_group_record_read(state, tmp_path):
    text = fvr.report_markdown(tmp_path / "out", state, STEPS)
    assert "**Accepted**: accepted at 20 steps" in text
    assert "| 20 | 0.020 -> 0.200 | 0.030 -> 0.100 |" in text
    # every step: one all-wrong group of two; BV-Blend's lag at step 1: 0.1 - 1/4, at step 2: 0.2 - 1/4
    assert _row(text, "| bv_blend n=2 (32 prompts) | 5 | 0.500 -> 0.500 |").endswith(
        "| -0.150 -> -0.050 | 0.500 -> 0.500 |")
    assert _row(text, "| grpo n=8 (8 prompts) | 5 | 0.500 -> 0.500 |").endswith("| no history | no history |")
    assert "| 1 | 0.500 | 0.500 | -0.150 (0.50) |" in text and "| 2 | 0.500 | 0.500 | -0.050 (0.50) |" in text
    assert (tmp_path / "out" / "mechanisms_cold_start.png").is_file()
    assert (tmp_path / "out" / "curves_cold_start.png").is_file()
    assert "pending: no run finished" in _row(text, "| reinforce_plus_plus n=1 (64 prompts) | - |")


def test_nothing_run_is_pending_everywhere(tmp_path):
    text = fvr.report_markdown(tmp_path / "out", tmp_path / "empty", STEPS)
    assert text.count("No finished run yet") == len(fair_verdict.TUNED_ARMS)
    assert "the selection runs GRPO n = 8 at its own learning rate, which its tuning has not chosen yet" in text
    assert "Pending: no cold-start arm has finished a run" in text
    assert "### 3.1. At GRPO's learning rate\n\nPending: no run has finished." in text


def test_the_script_reads_the_committed_comparison(tmp_path):
    """DAPO at equal steps against a direct computation from the committed results: each seed's validation at step
    20 minus GRPO n = 8's, and the t-interval of those five differences."""
    assert load_script("fair_verdict_report").main(["--out", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    runs = fair_verdict.COMMITTED / "runs"
    read = lambda arm, s: json.loads((runs / f"{arm}_seed{s}" / "result.json").read_text())["validation"]["20"]  # noqa: E731
    diffs = np.array([read("grpo_dynamic_n8", s) - read("grpo_n8", s) for s in range(5)])
    half = scipy_stats.t.ppf(0.975, 4) * diffs.std(ddof=1) / np.sqrt(5)
    expected = f"{diffs.mean():+.3f} [{diffs.mean() - half:+.3f}, {diffs.mean() + half:+.3f}]"
    assert f"| equal steps | 5 | {expected} |" in text
    assert "| equal wall time | 2 |" in text and "seed 2: no metrics kept by the reference" in text
    assert (tmp_path / "curves_grpo_rate.png").is_file()
