"""Named arms (an estimator, its overrides, a group size: instruments/compare/arms.py, ARMS) on verl's stock trainer
on CPU: several seeds, the same rollout budget for every arm, validated on held-out prompts, every arm paired by
seed with a reference arm; writes tables and a plot into results/benchmarks.md (results/benchmarks.md says more).

Runs unattended for hours and resumes: run the same command again after an interruption, and the finished runs
are skipped (an unfinished one resumes from its last checkpoint, saved at every validation step). Ctrl-C or
SIGTERM stops the current verl run and every process it started. Each run's result records the most memory it held;
a run is not started where the machine has less available than the comparison's finished runs held.

    python scripts/compare_cpu.py                                   # GRPO and BV-Blend at n=4 and n=2, 3 seeds
    python scripts/compare_cpu.py --arms grpo:8 spo:1 spo_sampler:1 --train-prompts 320 --seeds 0 1 2 3 4
    python scripts/compare_cpu.py --seeds 0 --arms grpo:4 --steps 5 --out /tmp/cmp --docs /tmp/cmp/bench.md

--stop-at-rollouts N ends each run after the first step at whose end it has generated N rollouts (every one,
dropped ones included: DAPO's dynamic sampling, grpo_dynamic, draws several batches a step where most groups are
all-wrong), validating there as at its last step; --steps stays the most a run trains. The comparison reads that arm
at the reference's final rollouts (steps x --rollouts-per-step), so N = that budget spares the steps it would not
read. Each stopped run's result says so ("stopped": its step, the rollouts generated, N).

The no-revisit regime (issue 29; results/benchmarks.md, the pretrained-LM comparison, has its command): --task wide
--distinct-train (different problems, read once by every arm), its arms (instruments/compare/no_revisit.py), the
offline priors made once when an arm reads them, and --regime-summary results/regime (the rule's pretrained_lm.json).
The model is a pretrained LM (SmolLM2-135M-Instruct by default); the tiny model is a test fixture only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from instruments import regime
from instruments.compare import arms as compare_arms
from instruments.compare import no_revisit
from instruments.compare import report as compare_report
from instruments.compare import runs as compare_runs
from instruments.cpu import memory
from instruments.machine import describe_cpu
from instruments.provenance import committed_file
from instruments.run.prepare import prepare
from instruments.run.settings import SMOLLM2, RunSettings
from instruments.run.task import TASKS

DEFAULT_ARMS = ["grpo:4", "bv_blend:4", "grpo:2", "bv_blend:2"]  # the first comparison's grid (results/benchmarks.md)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("compare_out"), help="runs, results and the shared model")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, metavar="ARM:N",
                   help=f"arms and their group sizes; arms: {', '.join(compare_arms.ARMS)}")
    p.add_argument("--reference", metavar="ARM:N", default=None,
                   help="the arm every other is paired with (default: grpo:8 if run, else the first of --arms)")
    p.add_argument("--rollouts-per-step", type=int, default=32, help="prompts x group size, the same for every arm")
    p.add_argument("--train-prompts", type=int, default=None,
                   help="training rows every run draws from (default: steps x the largest batch, each row once)")
    p.add_argument("--steps", type=int, default=None, help="RL steps per run (default 100)")
    p.add_argument("--test-freq", type=int, default=20, help="validate every this many steps (and before and after)")
    p.add_argument("--val-samples", type=int, default=4, help="responses per held-out prompt (T=1)")
    p.add_argument("--stop-at-rollouts", type=int, default=None, metavar="N",
                   help="end each run after the first step at whose end it has generated N rollouts (kept or dropped), "
                        "validating there as at its last step (default: every run trains --steps)")
    p.add_argument("--lr", type=float, default=None, help=f"the actor's learning rate (default {RunSettings.lr:g})")
    p.add_argument("--settings", type=Path, default=None, metavar="FILE",
                   help="lr and steps from this committed file (results/regime/pretrained_lm_settings.json, written by "
                        "scripts/pretrained_settings.py): refused if uncommitted, changed, or beside --lr/--steps; "
                        "the report names its commit")
    p.add_argument("--task", choices=sorted(TASKS), default="demo",
                   help="the task's families (instruments/run/task.py; wide: enough for a pool never drawn twice)")
    p.add_argument("--distinct-train", action="store_true",
                   help="the training rows are --train-prompts different problems (no prompt twice in the pool)")
    p.add_argument("--docs", type=Path, default=Path("results/benchmarks.md"), help="markdown file the results go in")
    p.add_argument("--section", default=compare_report.SECTION,
                   help="the markers in --docs the results go between (<!-- SECTION:begin/end -->) and the plot's name")
    p.add_argument("--regime-summary", type=Path, default=None, metavar="DIR",
                   help="also write the no-revisit regime's summary (DIR/pretrained_lm.json, instruments/regime.py)")
    p.add_argument("--report", action="store_true",
                   help="run nothing: write the results of the runs finished so far, marked as partial")
    p.add_argument("--runs-only", action="store_true",
                   help="run the pending runs and write no report (for a frozen worktree, which stays clean: the "
                        "same command with --report, from the main checkout, writes it)")
    p.add_argument("--model", default=SMOLLM2,
                   help="smollm2 (SmolLM2-135M-Instruct, offline; the default) or a local HF causal LM folder")
    p.add_argument("--no-memory-check", dest="memory_check", action="store_false",
                   help="start each run even where the machine has less memory available than this comparison's "
                        "finished runs held (by default the run is refused, naming the verl runs holding memory)")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                   help="the model's compute dtype, one for every run (auto: bf16 with AMX, else fp32; "
                   "bf16 needs AVX-512-BF16)")
    a = p.parse_args(argv)
    if a.report and a.runs_only:
        p.error("--report runs nothing and --runs-only reports nothing: give one of them")
    try:
        fixed_settings(a)
    except ValueError as e:
        p.error(str(e))
    if min(a.steps, a.test_freq, a.val_samples, a.rollouts_per_step,
           1 if a.stop_at_rollouts is None else a.stop_at_rollouts) < 1:
        p.error("--steps, --test-freq, --val-samples, --rollouts-per-step and --stop-at-rollouts must be positive")
    try:
        a.arm_sizes = [compare_arms.parse_arm(text) for text in a.arms]
        a.specs = compare_arms.grid(a.arm_sizes, a.rollouts_per_step, a.seeds)
        a.pool = compare_arms.pool_size(a.specs, a.steps, a.train_prompts)
        if a.reference is None:
            a.reference = ("grpo", 8) if ("grpo", 8) in a.arm_sizes else a.arm_sizes[0]
        else:
            a.reference = compare_arms.parse_arm(a.reference)
            if a.reference not in a.arm_sizes:
                raise ValueError(f"--reference {a.reference[0]}:{a.reference[1]} is not one of --arms")
        if a.regime_summary is not None:
            if a.stop_at_rollouts is not None:  # the regime's summary reads every run at its settings' last step
                raise ValueError("--regime-summary reads every run at its last step; a run stopped by "
                                 "--stop-at-rollouts has none there: drop one of them (scripts/fair_verdict_report.py "
                                 "reads stopped runs)")
            no_revisit.check_regime(a.arm_sizes, a.specs, a.steps, a.pool, a.distinct_train)
    except ValueError as e:
        p.error(str(e))
    return a


def fixed_settings(a: argparse.Namespace) -> None:
    """lr and steps: from ``--settings`` (a committed file, whose commit the report names), else the flags or their
    defaults. Both at once are refused: a comparison's settings are fixed before its runs, in one place."""
    a.settings_commit = None
    if a.settings is None:
        a.lr = RunSettings.lr if a.lr is None else a.lr
        a.steps = 100 if a.steps is None else a.steps
        return
    if a.lr is not None or a.steps is not None:
        raise ValueError(f"--settings {a.settings} fixes lr and steps: drop --lr/--steps")
    if not a.settings.is_file():
        raise ValueError(f"--settings {a.settings}: no such file (scripts/pretrained_settings.py writes it)")
    a.settings_commit = committed_file(a.settings)
    fixed = json.loads(a.settings.read_text())
    missing = {"lr", "steps"} - set(fixed)
    if missing:
        raise ValueError(f"--settings {a.settings} lacks {sorted(missing)}: not a settings file of "
                         "scripts/pretrained_settings.py")
    a.lr, a.steps = float(fixed["lr"]), int(fixed["steps"])


def demo_settings(a: argparse.Namespace) -> RunSettings:
    # every run draws from the same pool of training rows (one shared preparation); its size is in the settings key
    return RunSettings(work_dir=a.out / "prepared", steps=a.steps, lr=a.lr, val_samples=a.val_samples,
                        test_freq=a.test_freq, n_train=a.pool, task=a.task, distinct_train=a.distinct_train,
                        model=a.model, dtype=a.dtype, stop_at_rollouts=a.stop_at_rollouts)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    # SIGTERM ends the process through Python's exit path, so that run_trainer's clean-up stops the verl run
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    s = demo_settings(a)
    key = compare_runs.settings_key(s)
    todo = compare_runs.pending(a.out, a.specs, key)  # also refuses an --out made with other settings
    started = time.time()
    if a.report:
        if len(todo) == len(a.specs):
            sys.exit(f"[compare] no run in {a.out} has finished yet: nothing to report")
        write_report(a, argv, s, [spec for spec in a.specs if spec not in todo], None, [t.name for t in todo])
        return
    prepared = prepare(s, reuse=True)
    failed = []
    if any(spec.reads_priors for spec in a.specs):
        try:  # once, in the shared preparation; a failure fails the arms that read them, the others still run
            priors, _ = no_revisit.prepare_priors(s, prepared, batch=max(spec.batch for spec in a.specs))
            prepared = replace(prepared, priors=priors)
        except RuntimeError as e:
            tqdm.write(f"[compare] {e}; the arms that read the priors are not run")
    with tqdm(total=len(a.specs), initial=len(a.specs) - len(todo), desc="runs", unit="run", position=0) as runs:
        for spec in todo:
            if spec.reads_priors and prepared.priors is None:
                failed.append(spec.name)
                continue
            if a.memory_check:
                fits_or_exit(a.out, a.specs, key)
            runs.set_postfix_str(spec.name)
            with tqdm(total=a.steps, desc=f"  {spec.name}", unit="step", position=1, leave=False) as steps:
                try:
                    compare_runs.run_one(s, prepared, a.out, spec, key,
                                         on_step=lambda step: steps.update(step - steps.n))
                except RuntimeError as e:  # a failed verl run: the others still run; a rerun retries this one
                    failed.append(spec.name)
                    tqdm.write(f"[compare] {spec.name} failed: {e}")
                    continue
            runs.update(1)
    if failed:
        sys.exit(f"[compare] {len(failed)} run(s) failed: {', '.join(failed)}. Their logs say why; run the same "
                 "command again to retry them (finished runs are kept). No results were written.")
    if a.runs_only:
        print(f"[compare] {len(a.specs)} runs finished in {a.out}; no report written (--runs-only): the same command "
              "with --report instead writes it", flush=True)
        return
    write_report(a, argv, s, a.specs, time.time() - started if todo else None)


def fits_or_exit(out: Path, specs: list, key: dict[str, str]) -> None:
    """Ends the comparison, keeping its finished runs, where the machine has less memory available than its runs held
    (instruments/cpu/memory.py): a run started beside another verl run would be killed for memory, not finish."""
    needed = compare_runs.memory_needed(out, specs, key)
    if needed is None:
        return
    try:
        memory.refuse_unless_it_fits(needed[0], f"the most of this comparison's finished runs, {needed[1]}")
    except memory.NotEnoughMemory as e:
        sys.exit(f"[compare] {e}. Wait for them to end or stop them, then run the same command again (finished runs "
                 "are kept); --no-memory-check starts the run anyway.")


def write_report(a: argparse.Namespace, argv: list[str], s: RunSettings, finished: list, wall_s: float | None,
                 missing: list[str] = ()) -> None:
    """Tables and plot of the ``finished`` runs into ``--docs`` (and its PNG); ``missing`` marks them partial.
    ``wall_s``: this invocation's time, None where it ran no verl run (a report, or every run already finished)."""
    key = compare_runs.settings_key(s)
    results = [compare_runs.load_result(a.out, spec, key) for spec in finished]
    suffix = "cpu" if a.section == compare_report.SECTION else a.section  # one plot per section
    png = a.docs.with_name(f"{a.docs.stem}_{suffix}.png")
    compare_report.plot_comparison(results, png, a.reference)
    run_args = [arg for arg in argv if arg != "--report"]
    command = "python scripts/compare_cpu.py" + (" " + shlex.join(run_args) if run_args else "")
    settings = {"steps": a.steps, "rollouts/step": a.rollouts_per_step, "train prompts": s.n_train,
                **({} if s.task == "demo" and not s.distinct_train else
                   {"task": s.task, "distinct train prompts": s.distinct_train}), "lr": a.lr,
                "model": s.model, "dtype": s.dtype,
                "held-out prompts": s.val_prompts, "samples/prompt": a.val_samples,
                "test_freq": a.test_freq, "reference": f"{a.reference[0]}:{a.reference[1]}",
                **({} if s.stop_at_rollouts is None else {"stop at rollouts": s.stop_at_rollouts}),
                **({} if a.settings_commit is None else {"settings from": f"{a.settings} at {a.settings_commit}"})}
    here = describe_cpu()  # where this report is written: the runs' machine when they did not record theirs
    generated = compare_report.results_markdown(results, command, here, png.name, wall_s,
                                         {k: str(v) for k, v in settings.items()}, date.today().isoformat(), missing,
                                         a.reference, a.section)
    doc = compare_report.write_benchmarks(a.docs, generated, a.section)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(compare_report.summary_table(results).to_string())
        print(compare_report.paired_differences(results, a.reference).to_string())
        sampler = compare_report.sampler_table(results)
        if not sampler.empty:  # only arms that draw prompts by the history have one
            print(sampler.to_string())
    print(f"[compare] wrote {doc} and {png}")
    if a.regime_summary is not None:
        summary = no_revisit.summarize(results, json.loads((s.work_dir / "prepared.json").read_text()),
                                       no_revisit.read_priors_record(s.work_dir), command,
                                       compare_report.runs_machines(results, here), missing)
        print(f"[compare] wrote {regime.write_summary(summary, a.regime_summary)} (seeds {summary.seeds}; visits per "
              f"prompt: max {summary.revisits['max']:.0f}, mean {summary.revisits['mean']:.2f})")


if __name__ == "__main__":
    main()
