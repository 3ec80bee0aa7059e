"""One arm's own learning rate, by the committed procedure (instruments/tuning.py; results/fair_verdict.md, section 2):
runs what the procedure needs next on the tuning seeds, saves each finished run's state into the repository, and once
it has chosen, writes the choice.

    python scripts/tune_lr.py --arm grpo:8                      # run until the procedure chooses (resumes)
    python scripts/tune_lr.py --arm grpo:8 --max-runs 2         # at most two runs this time
    python scripts/tune_lr.py --arm grpo:8 --next               # run nothing: print the runs it needs next
    python scripts/tune_lr.py --arm grpo:8 --choose             # run nothing: write the choice (refused if unfinished)

Each learning rate is one scripts/compare_cpu.py comparison of the arm alone at the pretrained-LM comparison's
settings (20 steps, 64 rollouts a step, the wide task without a prompt twice, fp32), in its own folder under --out;
its finished runs' results, metrics and group records are copied to --state (scripts/run_state.py), which is what the
procedure reads: a new machine restores them first and goes on where the last one stopped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tqdm.auto import tqdm

from instruments import tuning
from instruments.provenance import committed_file

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = ROOT / "results" / "regime" / "pretrained_lm_settings.json"  # the comparison's steps, fixed on GRPO n = 8
STATE = ROOT / "results" / "regime" / "lr_tuning"
ROLLOUTS_PER_STEP, TEST_FREQ, VAL_SAMPLES = 64, 10, 4
CHOICE = "choice.json"


def arm_folder(arm: str) -> str:
    name, _, n = arm.partition(":")
    return f"{name}_n{n}"


def lr_folder(lr: float) -> str:
    return f"lr_{lr:g}"


def steps() -> int:
    return int(json.loads(SETTINGS.read_text())["steps"])


def run_command(arm: str, lr: float, seed: int, out: Path) -> list[str]:
    """The comparison of one learning rate, the arm alone: the pretrained-LM comparison's settings but the rate."""
    pool = ROLLOUTS_PER_STEP * steps()  # as the comparison: its n = 1 arms draw 64 prompts a step, none twice
    return [sys.executable, str(ROOT / "scripts" / "compare_cpu.py"), "--model", "smollm2", "--dtype", "fp32",
            "--task", "wide", "--distinct-train", "--train-prompts", str(pool), "--arms", arm, "--seeds", str(seed),
            "--rollouts-per-step", str(ROLLOUTS_PER_STEP), "--steps", str(steps()), "--test-freq", str(TEST_FREQ),
            "--val-samples", str(VAL_SAMPLES), "--lr", f"{lr:g}", "--out", str(out / lr_folder(lr)), "--runs-only"]


def finals(state: Path, arm: str) -> dict[float, dict[int, float]]:
    """lr -> seed -> final held-out pass rate, from the finished runs saved in ``state``."""
    name = arm_folder(arm)
    found: dict[float, dict[int, float]] = {}
    for path in sorted(state.glob(f"lr_*/runs/{name}_seed*/result.json")):
        result = json.loads(path.read_text())
        lr, seed = float(result["settings"]["lr"]), int(result["spec"]["seed"])
        found.setdefault(lr, {})[seed] = float(result["validation"][str(steps())])
    return found


def state_script(action: str, runs: Path, state: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "run_state.py"), action, str(runs), str(state)], check=True)


def choose(arm: str, state: Path) -> Path:
    """Writes the arm's choice beside its runs' state, with the commit of the rules that made it."""
    got = finals(state, arm)
    choice = tuning.choose(got)
    path = state / CHOICE
    path.write_text(json.dumps({
        "arm": arm, "lr": choice.lr, "at_edge": choice.at_edge,
        "two_seed_scores": {f"{lr:g}": score for lr, score in choice.scores.items()},
        "finals": {f"{lr:g}": {str(seed): value for seed, value in by_seed.items()} for lr, by_seed in got.items()},
        "grid": [f"{lr:g}" for lr in choice.grid], "steps": steps(),
        "rules": f"instruments/tuning.py at {committed_file(ROOT / 'instruments' / 'tuning.py')}",
    }, indent=1, allow_nan=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", required=True, metavar="ARM:N", help="an arm of instruments' ARMS and its group size")
    p.add_argument("--out", type=Path, default=Path("/work/runs/lr_tuning"), help="where the runs run")
    p.add_argument("--state", type=Path, default=STATE, help="where their state is kept, in the repository")
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many runs (a session's share)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--next", action="store_true", help="run nothing: print the runs the procedure needs next")
    mode.add_argument("--choose", action="store_true", help="run nothing: write the choice")
    a = p.parse_args(argv)
    if ":" not in a.arm:
        p.error(f"--arm {a.arm!r} is not ARM:N (an arm and its group size, e.g. grpo:8)")
    out, state = a.out / arm_folder(a.arm), a.state / arm_folder(a.arm)
    if a.choose:
        try:
            print(f"[tune] wrote {choose(a.arm, state)}")
        except ValueError as e:
            print(f"[tune] {a.arm}: {e}", file=sys.stderr)
            return 1
        return 0
    if state.is_dir() and not a.next:
        state_script("restore", out, state)  # a new machine goes on from the repository's state
    done = 0
    with tqdm(desc=f"tuning {a.arm}", unit="run") as bar:
        while runs := tuning.next_runs(finals(state, a.arm)):
            if a.next:
                print("\n".join(f"lr {lr:g} seed {seed}" for lr, seed in runs))
                return 0
            if a.max_runs is not None and done >= a.max_runs:
                print(f"[tune] {done} run(s) done; still needed: {', '.join(f'{lr:g}/{s}' for lr, s in runs)}")
                return 0
            lr, seed = runs[0]
            bar.set_postfix_str(f"lr {lr:g} seed {seed}")
            code = subprocess.call(run_command(a.arm, lr, seed, out))
            if code != 0:
                print(f"[tune] lr {lr:g} seed {seed} failed (exit {code}); run the same command to resume it",
                      file=sys.stderr)
                return code
            state_script("save", out, state)
            done += 1
            bar.update(1)
    if a.next:
        print("[tune] nothing: the procedure has chosen (--choose writes it)")
        return 0
    print(f"[tune] wrote {choose(a.arm, state)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
