"""The fair verdict's runs (results/fair_verdict.md, issue 56), all of them, in their committed order: run this one
command on any machine, as often as it takes, and it works through every run the design still needs, one at a time,
saving each finished run's state into the repository (scripts/run_state.py) as soon as it finishes.

    python scripts/fair_verdict.py                  # run every remaining run, in order (resumes; Ctrl-C stops it)
    python scripts/fair_verdict.py --next           # run nothing: print the next runs, what waits and on what
    python scripts/fair_verdict.py --max-runs 2     # at most two runs this time (a session's share)
    python scripts/fair_verdict.py --stop-after-current   # asks the runner at work on --out to stop between runs
    python scripts/fair_verdict.py --stop-at-checkpoint   # ... or sooner: once its run can resume where it stops

The order (instruments/campaign.py, from the plan in instruments/fair_verdict.py): GRPO n = 8's learning-rate tuning;
the cold start's selection at GRPO's rate (20 steps, 40 only if 20 fails: instruments/cold_start.py); REINFORCE++
n = 1's tuning, then BV-Blend n = 2's; the judged runs at each arm's own rate (seeds 0-4; a rate of 2e-5 reuses the
committed comparison's runs); the cold start's six arms, seed-major, if the selection accepted a task; last, the
first cut, BV-Blend n = 8's tuning and judged runs. Each run is one scripts/compare_cpu.py comparison of one arm at
one seed (one SmolLM2 run: 26-37 min and 13-16 GiB on the 2-core AVX-512 EPYC in fp32, so never two at once).

Resuming: the state in results/regime/ decides what is done. On start, the repository's state is restored into
--out (results, metrics, preparations), so a new machine goes on where the last stopped; on the same machine an
interrupted run resumes from its last checkpoint in --out. A finished tuning writes its choice.json, a decided
selection cold_start/selection.json. A failed run stops the runner; the same command resumes it. Each launch is
appended to results/regime/launches.jsonl as it starts, so commit results/regime/ after each run (the runner commits
nothing): an attempt lost with its machine then stays recorded, and the report names it. Do not run it beside
scripts/tune_lr.py on the same arm: both would run the same run.

Each run records its commit and whether the tree was clean as it starts, so run it from a checkout nobody edits
meanwhile (a git worktree with its own .venv: `git worktree add /work/wt_runs main && cd /work/wt_runs && bash
scripts/setup_env.sh`), with --state naming the results/regime/ of the checkout you commit from:

    python scripts/fair_verdict.py --out /work/runs --state /work/main/results/regime

--out is where the runs run, the state's layout below it (<out>/lr_tuning/grpo_n8/lr_1e-05, ...): --out /work/runs
puts the tuning runs where scripts/tune_lr.py runs them (/work/runs/lr_tuning), so an unfinished run of tune_lr's
resumes from its checkpoint.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import subprocess
import sys
from pathlib import Path

from tqdm.auto import tqdm

from instruments import campaign, fair_verdict
from instruments.child_run import StoppedAsAsked, call_child_run
from instruments.run import resume


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("/work/runs/fair_verdict"), help="where the runs run")
    p.add_argument("--state", type=Path, default=fair_verdict.REGIME,
                   help="where their state is kept, in the repository (results/regime)")
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many runs (a session's share)")
    p.add_argument("--next", action="store_true", help="run nothing: print the next runs, in order")
    p.add_argument("--stop-after-current", action="store_true",
                   help="run nothing: ask the runner at work on --out to stop once its current run is finished and "
                        "saved (nothing is lost; the same command as before goes on)")
    p.add_argument("--stop-at-checkpoint", action="store_true",
                   help="run nothing: ask the runner at work on --out to stop its current run as soon as it has "
                        "logged a step it saved (a checkpoint every 10 steps), or between runs; the same command "
                        "resumes the run from there on this machine (the checkpoint stays in --out, not in the state)")
    a = p.parse_args(argv)
    if a.max_runs is not None and a.max_runs < 0:
        p.error("--max-runs must be >= 0")
    return a


def state(action: str, out: Path, regime: Path, folder: Path) -> None:
    subprocess.run(campaign.state_command(action, out / folder, regime / folder), check=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    again = shlex.join(["python", "scripts/fair_verdict.py", *argv])
    try:
        return work(a, again)
    except ValueError as e:  # a state the campaign cannot read on (named, with its fix), or rules not committed
        print(f"[fair verdict] {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # compare_cpu stops its verl run; the finished runs are saved
        print(f"[fair verdict] interrupted; the same command resumes: {again}", file=sys.stderr)
        return 130


def stop_request(out: Path) -> Path:
    """The file that asks the runner at work on ``out`` to stop between runs (Ctrl-C would stop the run itself)."""
    return out / "fair_verdict.stop"


def pause_request(out: Path) -> Path:
    """The file that asks the runner at work on ``out`` to stop its run at its next resumable step."""
    return out / "fair_verdict.pause"


def ask_runner(request: Path, what: str) -> int:
    """Leaves ``request`` for the runner at work on its folder (the runner reads it; one started later clears it)."""
    request.parent.mkdir(parents=True, exist_ok=True)
    request.touch()
    print(f"[fair verdict] asked the runner on {request.parent} {what} ({request}; a runner started later clears it)")
    return 0


def clear_requests(out: Path) -> None:
    for request in (stop_request(out), pause_request(out)):
        request.unlink(missing_ok=True)


def pause_asked_and_resumable(out: Path, run: campaign.Run, launched_from: int | None) -> bool:
    """Whether to stop ``run`` now: asked to (:func:`pause_request`), and it would resume from a step later than the
    one it was launched from, and not its last (a run past its last checkpoint, or ended at its rollout budget, is
    left to finish and be saved)."""
    if not pause_request(out).is_file():
        return False
    run_dir = run.run_dir(out)
    step = resume.resume_step(run_dir)
    return step is not None and (launched_from or 0) < step < run.steps and resume.stopped_at(run_dir) is None


def work(a: argparse.Namespace, again: str) -> int:
    if a.next:
        print("\n".join(campaign.describe(campaign.plan(a.state), a.out, a.state)))
        return 0
    if a.stop_after_current:
        return ask_runner(stop_request(a.out), "to stop once its current run is saved")
    if a.stop_at_checkpoint:
        return ask_runner(pause_request(a.out), "to stop its run once it has logged a step it saved")
    clear_requests(a.out)  # a request left from a runner that had already stopped
    for folder in campaign.STATE_FOLDERS:  # a new machine goes on from the repository's state
        if (a.state / folder).is_dir():
            state("restore", a.out, a.state, folder)
    done, last = 0, None
    with tqdm(desc="fair verdict", unit="run") as bar:
        while True:
            for path in campaign.write_decisions(a.state):
                tqdm.write(f"[fair verdict] wrote {path}")
            plan = campaign.plan(a.state)
            bar.total = done + plan.estimated
            bar.refresh()
            if not plan.runs:
                break
            run = plan.runs[0]
            if run == last:  # it exited 0 and its result is not where the state keeps it: running it again won't help
                print(f"[fair verdict] {run.describe()} finished, but {run.result(a.state)} is not there: see "
                      f"{a.out / run.folder}", file=sys.stderr)
                return 1
            asked = stop_request(a.out).is_file() or pause_request(a.out).is_file()
            if asked or (a.max_runs is not None and done >= a.max_runs):
                clear_requests(a.out)
                print(f"[fair verdict] {done} run(s) done{', stopped as asked' if asked else ''}; next: "
                      f"{run.describe()} (about {plan.estimated} still needed): {again} goes on")
                return 0
            bar.set_postfix_str(run.describe())
            campaign.record_launch(a.state, run)  # before it runs: a launch lost with its machine stays recorded
            run_dir = run.run_dir(a.out)
            pause = functools.partial(pause_asked_and_resumable, a.out, run, resume.resume_step(run_dir))
            try:
                code = call_child_run(run.command(a.out), stop_when=pause)
            except StoppedAsAsked:
                clear_requests(a.out)
                print(f"[fair verdict] {done} run(s) done, stopped as asked: {run.describe()} stopped after step "
                      f"{resume.resume_step(run_dir)}, whose checkpoint is in {run_dir / resume.CHECKPOINTS}; "
                      f"{again} resumes it from there")
                return 0
            if code != 0:
                print(f"[fair verdict] {run.describe()} failed (exit {code}); its log is in "
                      f"{a.out / run.folder / 'runs'}. Run the same command to resume it: {again}", file=sys.stderr)
                return code
            state("save", a.out, a.state, run.folder)
            done, last = done + 1, run
            bar.update(1)
    print("\n".join(campaign.describe(plan, a.out, a.state)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
