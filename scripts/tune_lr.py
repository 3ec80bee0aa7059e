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
procedure reads: a new machine restores them first and goes on where the last one stopped. The commands and the
reading are instruments/campaign.py's, which scripts/fair_verdict.py runs the whole fair verdict with (this arm's
tuning among its runs, in the same state folders).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from tqdm.auto import tqdm

from instruments import campaign, fair_verdict, tuning
from instruments.child_run import call_child_run
from instruments.fair_verdict import arm_folder

STATE = fair_verdict.TUNING  # results/regime/lr_tuning: <arm>_n<n>/lr_<x>/runs/..., and choice.json


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
    try:
        out, state = a.out / arm_folder(a.arm), a.state / arm_folder(a.arm)
    except ValueError as e:
        p.error(f"--arm: {e}")
    if a.choose:
        try:
            print(f"[tune] wrote {campaign.write_choice(a.arm, state)}")
        except ValueError as e:
            print(f"[tune] {a.arm}: {e}", file=sys.stderr)
            return 1
        return 0
    if state.is_dir() and not a.next:
        subprocess.run(campaign.state_command("restore", out, state), check=True)  # a new machine goes on
    done = 0
    with tqdm(desc=f"tuning {a.arm}", unit="run") as bar:
        while runs := tuning.next_runs(campaign.tuning_finals(state, a.arm)):
            if a.next:
                print("\n".join(f"lr {lr:g} seed {seed}" for lr, seed in runs))
                return 0
            if a.max_runs is not None and done >= a.max_runs:
                print(f"[tune] {done} run(s) done; still needed: {', '.join(f'{lr:g}/{s}' for lr, s in runs)}")
                return 0
            lr, seed = runs[0]
            bar.set_postfix_str(f"lr {lr:g} seed {seed}")
            code = call_child_run(campaign.tuning_command(a.arm, lr, seed, out))
            if code != 0:
                print(f"[tune] lr {lr:g} seed {seed} failed (exit {code}); run the same command to resume it",
                      file=sys.stderr)
                return code
            subprocess.run(campaign.state_command("save", out, state), check=True)
            done += 1
            bar.update(1)
    if a.next:
        print("[tune] nothing: the procedure has chosen (--choose writes it)")
        return 0
    print(f"[tune] wrote {campaign.write_choice(a.arm, state)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
