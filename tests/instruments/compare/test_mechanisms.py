"""instruments/compare/mechanisms.py and scripts/mechanisms.py: each arm's verl columns and estimator counters, averaged
over a run's training steps and then its seeds, from runs in verl's metrics format and from the committed runs of
the pretrained-LM comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from instruments.compare import mechanisms
from tests._scripts import load_script

ROOT = Path(__file__).resolve().parents[3]
COMMITTED_RUNS = ROOT / "results/regime/pretrained_lm_runs/comparison/runs"


def _run(runs: Path, name: str, arm: str, pg_losses: list[float] | None, own: dict[str, list[float]],
         resumed_after: int | None = None) -> None:
    """A finished run folder as compare.py leaves it: its result, and verl's file-logger lines (step 0 is the
    validation before training, without a step time); a resumed run's first attempt keeps its steps up to
    ``resumed_after`` in ``metrics.part1.jsonl`` (instruments/run/resume.py)."""
    folder = runs / name
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"spec": {"arm": arm, "n": 8, "batch": 8, "seed": 0}}))
    if pg_losses is None:
        return
    lines = [{"step": 0, "data": {"val-core/echo3/acc/mean@4": 0.1}}]
    for step, loss in enumerate(pg_losses, start=1):
        data = {"timing_s/step": 30.0, "actor/pg_loss": loss, "critic/score/mean": 0.5, "actor/lr": 2e-5}
        data.update({name: values[step - 1] for name, values in own.items()})
        lines.append({"step": step, "data": data})
    if resumed_after is not None:
        first, lines = lines[: resumed_after + 1], lines[resumed_after + 1 :]
        (folder / "metrics.part1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in first))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_means_over_steps_then_seeds_count_runs_without_metrics_and_keep_counters_to_their_arm(tmp_path):
    """Seed 1 of HA-DW was resumed after its step 1: both attempts' steps count."""
    runs = tmp_path / "runs"
    _run(runs, "ha_dw_n8_seed0", "ha_dw", [0.1, 0.3], {"ha_dw/phi_mean": [1.0, 2.0]})
    _run(runs, "ha_dw_n8_seed1", "ha_dw", [0.4, 0.6], {"ha_dw/phi_mean": [0.5, 1.5]}, resumed_after=1)
    _run(runs, "grpo_n8_seed0", "grpo", [0.0, 0.2], {})
    _run(runs, "grpo_n8_seed1", "grpo", None, {})  # its metrics lost with an earlier machine
    (runs / "grpo_n8_seed2").mkdir()  # unfinished: no result, not counted

    table, finished = mechanisms.arm_means(runs)

    ha_dw, grpo = "ha_dw n=8 (8 prompts)", "grpo n=8 (8 prompts)"
    assert list(table.index) == [grpo, ha_dw]  # ARMS' order, not the folders'

    assert finished == {ha_dw: 2, grpo: 2}
    assert table.at[ha_dw, "with metrics"] == 2 and table.at[grpo, "with metrics"] == 1
    assert table.at[ha_dw, "actor/pg_loss"] == pytest.approx((0.2 + 0.5) / 2)
    assert table.at[ha_dw, "ha_dw/phi_mean"] == pytest.approx((1.5 + 1.0) / 2)
    assert table.at[grpo, "actor/pg_loss"] == pytest.approx(0.1)
    assert "actor/lr" not in table.columns  # neither verl's chosen columns nor an estimator's own
    text = mechanisms.markdown(runs)
    assert f"| {grpo} | 2 | 1 | +0.100 |" in text
    counters = text.split("its own counters")[1]
    assert "`ha_dw/phi_mean` 1.250" in counters and grpo not in counters


def test_the_script_writes_between_its_markers_and_names_a_missing_folder(tmp_path, capsys):
    runs = tmp_path / "runs"
    _run(runs, "grpo_n8_seed0", "grpo", [0.0, 0.2], {})
    doc = tmp_path / "bench.md"
    doc.write_text("before\n<!-- mech:begin -->\nold\n<!-- mech:end -->\nafter\n")
    script = load_script("mechanisms")

    assert script.main([str(runs), "--docs", str(doc), "--section", "mech"]) == 0
    text = doc.read_text()
    assert text.startswith("before\n<!-- mech:begin -->\n| arm |") and text.endswith("<!-- mech:end -->\nafter\n")
    assert "old" not in text
    assert script.main([str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert script.main([str(runs), "--docs", str(doc), "--section", "other"]) == 2
    assert doc.read_text() == text  # nothing lost


def test_the_committed_comparison_reads_with_each_estimators_own_counters():
    table, finished = mechanisms.arm_means(COMMITTED_RUNS)
    assert set(table.index) <= set(finished)
    assert (table["with metrics"] <= [finished[label] for label in table.index]).all()
    own_prefix = {"bv_blend": "bv_blend/", "ha_dw": "ha_dw/", "maxnorm_rloo": "maxnorm/",
                  "reinforce_plus_plus_ntf": "actor/ntf/"}  # the arms without one: verl's estimators alone
    for label, row in table.iterrows():
        counters = [c for c in table.columns if mechanisms.is_own_counter(c) and row.notna()[c]]
        prefix = own_prefix.get(label.split(" ")[0])
        assert bool(counters) == (prefix is not None), label
        assert all(c.startswith(prefix) for c in counters), (label, counters)
