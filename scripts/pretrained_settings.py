"""Fixes the pretrained-LM comparison's learning rate and step count on GRPO n=8 alone (results/regime.md, "The
pretrained-LM comparison"), by the committed selection rules (instruments/compare/selection.py), before any
other arm runs; writes results/regime/pretrained_lm_settings.json.

    python scripts/pretrained_settings.py --out /work/runs/pretrained_sweep            # run (resumes), then choose
    python scripts/pretrained_settings.py --out /work/runs/pretrained_sweep --choose   # choose from what finished

Each learning rate is one scripts/compare_cpu.py comparison of grpo:8 on the selection seeds, in its own folder under
--out (unattended and resumable like it: finished runs are skipped).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from instruments.child_run import call_child_run
from instruments.strict_json import strict_dumps

SELECTION_LRS = (5e-6, 1e-5, 2e-5)
SELECTION_SEEDS = (100, 101)  # not the comparison's 0-4
MAX_STEPS, EVAL_EVERY = 40, 5
ROLLOUTS_PER_STEP = 64
POOL = ROLLOUTS_PER_STEP * MAX_STEPS  # the comparison's pool: its n = 1 arms draw 64 prompts a step
SETTINGS_FILE = Path(__file__).resolve().parents[1] / "results" / "regime" / "pretrained_lm_settings.json"


def sweep_command(out: Path, lr: float) -> list[str]:
    """The compare_cpu command of one learning rate: the comparison's settings, GRPO n=8 alone."""
    return [sys.executable, str(Path(__file__).with_name("compare_cpu.py")), "--model", "smollm2", "--dtype", "fp32",
            "--task", "wide", "--distinct-train", "--train-prompts", str(POOL), "--arms", "grpo:8",
            "--seeds", *map(str, SELECTION_SEEDS), "--rollouts-per-step", str(ROLLOUTS_PER_STEP),
            "--steps", str(MAX_STEPS), "--test-freq", str(EVAL_EVERY), "--val-samples", "4", "--lr", f"{lr:g}",
            "--out", str(out / f"lr_{lr:g}"), "--docs", str(out / f"lr_{lr:g}" / "report.md")]


def finished_curves(out: Path) -> dict[float, list[dict[str, float]]]:
    """lr -> the validation curve ({step: pass rate}) of each finished selection run."""
    curves: dict[float, list[dict[str, float]]] = {}
    for lr in SELECTION_LRS:
        for path in sorted((out / f"lr_{lr:g}" / "runs").glob("*/result.json")):
            curves.setdefault(lr, []).append(json.loads(path.read_text())["validation"])
    return curves


def choose(curves: dict[float, list[dict[str, float]]]) -> dict:
    """The rules of instruments/compare/selection.py on the sweep's curves; refuses an incomplete sweep."""
    from instruments.compare import selection

    missing = {lr: len(SELECTION_SEEDS) - len(curves.get(lr, [])) for lr in SELECTION_LRS}
    if any(missing.values()):
        raise ValueError(f"the sweep is not finished (runs missing by learning rate: {missing}): run it first")
    finals = {lr: [curve[str(MAX_STEPS)] for curve in runs] for lr, runs in curves.items()}
    lr = selection.choose_lr(finals)
    steps = sorted(int(step) for step in curves[lr][0])
    mean = np.mean([[curve[str(step)] for step in steps] for curve in curves[lr]], axis=0)
    chosen_steps = selection.choose_steps(steps, mean, EVAL_EVERY, MAX_STEPS)
    return {"lr": lr, "steps": chosen_steps, "finals_by_lr": {f"{k:g}": v for k, v in finals.items()},
            "chosen_curve": dict(zip(map(str, steps), mean.tolist(), strict=True)),
            "rules": "instruments/compare/selection.py: choose_lr, choose_steps", "seeds": list(SELECTION_SEEDS)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the sweep's folder (one comparison per learning rate)")
    p.add_argument("--choose", action="store_true", help="run nothing: choose from the finished runs")
    p.add_argument("--settings", type=Path, default=SETTINGS_FILE, help="where the chosen settings go")
    a = p.parse_args(argv)
    if not a.choose:
        for lr in SELECTION_LRS:
            code = call_child_run(sweep_command(a.out, lr))
            if code != 0:
                print(f"[settings] the sweep at lr {lr:g} failed (exit {code}); run the same command to resume")
                return code
    try:
        chosen = choose(finished_curves(a.out))
    except ValueError as e:
        print(f"[settings] {e}", file=sys.stderr)
        return 2
    a.settings.write_text(strict_dumps(chosen) + "\n")
    print(f"[settings] lr {chosen['lr']:g}, {chosen['steps']} steps -> {a.settings}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
