"""scripts/tune_lr.py: what it runs for the procedure (instruments/tuning.py), read from the state it saves (the
commands and the reading are instruments/campaign.py's, shared with scripts/fair_verdict.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from instruments import campaign, fair_verdict
from tests._scripts import load_script


def _save_result(state: Path, arm: str, lr: float, seed: int, final: float, steps: int) -> None:
    """A finished run's result.json where run_state.py saves it, with the fields tune_lr reads (as compare writes)."""
    name, n = arm.split(":")
    run = state / f"{name}_n{n}" / f"lr_{lr:g}" / "runs" / f"{name}_n{n}_seed{seed}"
    run.mkdir(parents=True)
    result = {"spec": {"arm": name, "n": int(n), "seed": seed}, "settings": {"lr": str(lr)},
              "validation": {"0": 0.1, str(steps // 2): 0.3, str(steps): final}}
    (run / "result.json").write_text(json.dumps(result))


def test_the_first_runs_are_the_start_grid_on_the_first_seed(tmp_path, capsys):
    script = load_script("tune_lr")
    assert script.main(["--arm", "grpo:8", "--state", str(tmp_path), "--next"]) == 0
    assert capsys.readouterr().out.split("\n")[:3] == ["lr 1e-05 seed 100", "lr 2e-05 seed 100", "lr 4e-05 seed 100"]


def test_each_run_is_the_comparisons_settings_at_its_rate(tmp_path):
    command = campaign.tuning_command("bv_blend:2", 4e-5, 101, tmp_path)
    flags = {flag: value for flag, value in zip(command, [*command[1:], ""], strict=True)
             if flag.startswith("--") and not value.startswith("--")}
    steps = json.loads(fair_verdict.SETTINGS.read_text())["steps"]
    assert flags["--lr"] == "4e-05" and flags["--seeds"] == "101" and flags["--arms"] == "bv_blend:2"
    assert flags["--steps"] == str(steps) and flags["--train-prompts"] == str(64 * steps)
    assert flags["--out"] == str(tmp_path / "lr_4e-05") and command[-1] == "--runs-only"


def test_the_choice_is_written_from_the_saved_finals_and_names_the_rules(tmp_path):
    script = load_script("tune_lr")
    steps = campaign.wide_steps()
    peak = {1e-5: 0.60, 2e-5: 0.70, 4e-5: 0.65}
    for lr, final in peak.items():
        for seed in (100, 101):
            _save_result(tmp_path, "grpo:8", lr, seed, final + (0.01 if seed == 101 else 0.0), steps)
    assert script.main(["--arm", "grpo:8", "--state", str(tmp_path), "--choose"]) == 0
    choice = json.loads((tmp_path / "grpo_n8" / "choice.json").read_text())
    assert choice["lr"] == 2e-5 and not choice["at_edge"]
    assert choice["two_seed_scores"]["2e-05"] == pytest.approx(0.705)
    assert choice["rules"].startswith("instruments/tuning.py at ")


def test_choosing_an_unfinished_procedure_is_refused(tmp_path, capsys):
    script = load_script("tune_lr")
    _save_result(tmp_path, "grpo:8", 2e-5, 100, 0.7, campaign.wide_steps())
    assert script.main(["--arm", "grpo:8", "--state", str(tmp_path), "--choose"]) == 1
    assert "still needs lr 1e-05 seed 100" in capsys.readouterr().err


def test_the_state_folders_are_the_fair_verdict_s(tmp_path, capsys):
    """The run in progress saves into results/regime/lr_tuning/grpo_n8/lr_<x>/runs/grpo_n8_seed<s>/: tune_lr and the
    runner read the same folders."""
    script = load_script("tune_lr")
    assert script.STATE == fair_verdict.TUNING == fair_verdict.REGIME / "lr_tuning"
    command = campaign.tuning_command("grpo:8", 1e-5, 100, tmp_path / "grpo_n8")
    assert command[-3:] == ["--out", str(tmp_path / "grpo_n8" / "lr_1e-05"), "--runs-only"]
    with pytest.raises(SystemExit):
        script.main(["--arm", "grpo8", "--next"])
    assert "is not ARM:N" in capsys.readouterr().err
