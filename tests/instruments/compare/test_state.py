"""scripts/run_state.py: a comparison's state (preparation, finished runs' results and metrics) goes into the
repository and back, nothing else (rollouts, logs, checkpoints, unfinished runs) does, and the .gitignore lets the
pretrained-LM state in."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests._scripts import load_script

ROOT = Path(__file__).resolve().parents[3]


def _comparison(root: Path) -> None:
    for rel, text in {
        "lr_1e-05/prepared/prepared.json": "{}", "lr_1e-05/prepared/task/val.parquet": "v",
        "lr_1e-05/runs/grpo_n8_seed100/result.json": "{}", "lr_1e-05/runs/grpo_n8_seed100/verl.log": "log",
        "lr_1e-05/runs/grpo_n8_seed100/metrics.jsonl": "finished",
        "lr_1e-05/runs/grpo_n8_seed100/metrics.part1.jsonl": "its first attempt, resumed",
        "lr_1e-05/runs/grpo_n8_seed100/groups.jsonl": "the group record",
        "lr_1e-05/runs/grpo_n8_seed100/replaced.json": "[]",
        "lr_1e-05/runs/grpo_n8_seed100/rollouts/1.jsonl": "r",
        "lr_1e-05/runs/grpo_n8_seed101/metrics.jsonl": "unfinished",
        "lr_1e-05/runs/grpo_n8_seed101/checkpoints/global_step_5/x.pt": "ckpt",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_save_keeps_the_preparation_and_finished_runs_only_and_restore_brings_them_back(tmp_path):
    script = load_script("run_state")
    runs, state, again = tmp_path / "runs_out", tmp_path / "state", tmp_path / "restored"
    _comparison(runs)
    assert script.main(["save", str(runs), str(state)]) == 0
    saved = sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file())
    run = "lr_1e-05/runs/grpo_n8_seed100"
    assert saved == ["lr_1e-05/prepared/prepared.json", "lr_1e-05/prepared/task/val.parquet",
                     f"{run}/groups.jsonl", f"{run}/metrics.jsonl", f"{run}/metrics.part1.jsonl",
                     f"{run}/replaced.json", f"{run}/result.json"]
    assert script.main(["restore", str(again), str(state)]) == 0
    assert sorted(str(p.relative_to(again)) for p in again.rglob("*") if p.is_file()) == saved
    assert script.main(["save", str(tmp_path / "missing"), str(state)]) == 2


def test_the_pretrained_lm_state_is_not_ignored_by_git():
    for path in ("results/regime/pretrained_lm_runs/sweep/lr_1e-05/runs/grpo_n8_seed100/result.json",
                 "results/regime/pretrained_lm_runs/comparison/runs/grpo_n8_seed0/result.json",
                 "results/regime/lr_tuning/grpo_n8/lr_1e-05/runs/grpo_n8_seed100/groups.jsonl"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0
        assert not ignored, f"{path} is ignored by .gitignore: the comparison's state could not be committed"
