"""The demo, the main job: one run of the package's best arm in the committed pretrained-LM comparison, BV-Blend's
cluster level at n = 2, on verl's stock trainer on CPU at that comparison's settings, read for what one run can tell.

task + held-out split -> model (SmolLM2-135M-Instruct by default, or a local folder) -> codebook of the training
prompts -> one verl run of ``bv_blend`` (32 prompts x 2 rollouts, the comparison's 64 rollouts a step, no training
prompt twice), validated by verl's own loop on 120 held-out prompts x 4 samples at T=1 before its first update and
after its last -> report.py: the pass rate before and after with this run's 95% intervals over held-out prompts, per
family, whether it learned, and beside it the comparison's five-seed result of the same arm and of GRPO n = 8.

The settings are the comparison's: lr and steps from results/regime/pretrained_lm_settings.json (the file that fixed
them before its runs), the rest from the committed result of this arm's runs there
(results/regime/pretrained_lm_runs/comparison/runs/), which the tests hold the demo's defaults to. The one default
that differs, validating at the start and the end only (``test_freq`` = steps, where the comparison also validated
halfway), saves a validation and changes no training step. The report names every setting that differs from the
comparison's, so that a run at other flags is never read as the comparison's arm.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

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

COMPARISON = "pretrained_lm"  # the instrument whose committed comparison the demo's arm comes from
COMPARISON_SUMMARY = regime.SUMMARY_DIR / f"{COMPARISON}.json"  # its five-seed result, per arm
COMPARISON_SETTINGS = regime.SUMMARY_DIR / f"{COMPARISON}_settings.json"  # its lr and steps, fixed before its runs
COMPARISON_RUNS = regime.SUMMARY_DIR / f"{COMPARISON}_runs" / "comparison" / "runs"  # each run's committed result
DEMO_ARM = "bv_cluster2"  # the regime's key of BV-Blend's cluster level at n = 2
ROLLOUTS_PER_STEP = 64  # the comparison's budget a step, the same for every arm (prompts a step x rollouts a prompt)
# The comparison's settings beside lr, steps and the sizes: its command in results/regime/pretrained_lm.json. The rest
# (num_clusters, response_length, dtype auto: fp32 without AMX) are RunSettings' defaults, which it ran on too.
COMPARISON_FIXED: dict[str, Any] = {"model": SMOLLM2, "task": "wide", "distinct_train": True, "val_prompts": 120,
                                    "val_samples": 4}
RUN_FOLDER = "bv_blend_n2"  # the run's folder under <work dir>/runs, named as the comparison names this arm's runs


def demo_arm() -> tuple[str, int, tuple[str, ...]]:
    """The arm the demo trains, as the comparison ran it: its verl estimator, rollouts a prompt and overrides."""
    arm_name, n = REGIME_ARMS[DEMO_ARM]
    return ARMS[arm_name].estimator, n, ARMS[arm_name].overrides


def comparison_lr_steps(path: Path = COMPARISON_SETTINGS) -> tuple[float, int]:
    """The comparison's learning rate and steps from its committed settings file; raises with the fix where the file
    is missing or is not one."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; the demo takes the comparison's lr and steps from it "
                                "(scripts/pretrained_settings.py writes it; the repository commits it)")
    try:
        fixed = json.loads(path.read_text())
        return float(fixed["lr"]), int(fixed["steps"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path} is not a settings file of scripts/pretrained_settings.py (a JSON object with "
                         f"'lr' and 'steps'): {e!r}") from None


def demo_settings(work_dir: Path, settings_file: Path = COMPARISON_SETTINGS, **given: Any) -> RunSettings:
    """The demo's settings: the comparison's for this arm, with ``given`` (the command line's flags) on top.

    The training pool is the comparison's: steps x 64 distinct prompts, what its one-rollout arms drew, so that at the
    comparison's steps and seed 0 (the seed of its one preparation) the demo prepares exactly its task, split and
    codebook (the same preparation key), and verl draws the training prompts of the comparison's seed-0 run of this
    arm, in the same order."""
    lr, steps = comparison_lr_steps(settings_file)
    _, n, _ = demo_arm()
    values = {**COMPARISON_FIXED, "lr": lr, "steps": steps, "batch": ROLLOUTS_PER_STEP // n, "n": n, **given}
    if values.get("test_freq") is None:  # validate before the first update and after the last only
        values["test_freq"] = values["steps"]
    values["n_train"] = values["steps"] * ROLLOUTS_PER_STEP
    return RunSettings(work_dir=work_dir, **values)


def comparison_run_settings(runs: Path = COMPARISON_RUNS) -> dict[str, str]:
    """The settings the comparison recorded with its runs of this arm (its first seed's result: every seed's run
    shares them, ``seed`` being the seed of the one preparation all its runs read)."""
    results = sorted(runs.glob(f"{RUN_FOLDER}_seed*/result.json"))
    if not results:
        raise FileNotFoundError(f"{runs} holds no {RUN_FOLDER}_seed*/result.json: the committed comparison's runs of "
                                "the demo's arm are missing from this checkout")
    return dict(json.loads(results[0].read_text())["settings"])


def differences_from_comparison(s: RunSettings, runs: Path = COMPARISON_RUNS) -> list[str]:
    """Each setting of the demo's run that differs from the comparison's runs of this arm, as ``name: comparison ->
    this run``: test_freq at the defaults, and each flag the user changed (a seed other than 0 prepares another
    held-out split and pool)."""
    compared = comparison_run_settings(runs)
    ours = {**{k: str(v) for k, v in asdict(s).items()}, "dtype": s.compute_dtype()}
    return [f"{name}: {compared[name]} -> {ours[name]}" for name in sorted(compared)
            if name in ours and compared[name] != ours[name]]


def check_demo(s: RunSettings, report_only: bool = False) -> None:
    """What the demo refuses before it writes anything, each with its fix: a work folder that is a file, or that
    holds a finished demo of other settings (a new run would replace its run); ``report_only`` without a demo there;
    the comparison's committed files missing (the report sets the run beside them); a model folder verl cannot
    train; bf16 where the CPU lacks it; more distinct training prompts than the task has."""
    if s.work_dir.exists() and not s.work_dir.is_dir():
        raise ValueError(f"--work-dir {s.work_dir} is a file: pass a folder (it is created if missing)")
    demo_report.read_comparison(COMPARISON_SUMMARY, DEMO_ARM)
    comparison_run_settings()
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
                             "replace its run. Pass another --work-dir, or remove that folder first")
    s.compute_dtype()
    if s.model != SMOLLM2:
        pretrained.check_model_folder(Path(s.model).expanduser().resolve())
    if s.distinct_train:
        held_out = {p.question for p in held_out_problems(s.val_prompts, s.seed, task=s.task)}
        try:
            distinct_problems(s.n_train, s.seed, exclude=held_out, task=s.task)
        except ValueError as e:
            raise ValueError(f"the demo's pool needs {s.n_train} distinct training prompts (steps x "
                             f"{ROLLOUTS_PER_STEP}), more than the {s.task!r} task holds outside the held-out split "
                             f"({e}): lower --steps") from None


def run_demo(s: RunSettings, report_only: bool = False) -> str:
    """All stages; returns the report (also written to work_dir/report.txt, beside held_out.png and summary.json).
    ``report_only``: run nothing, rewrite the report, plot and summary from the run already in ``s.work_dir`` (the
    same settings)."""
    t0 = time.time()
    check_demo(s, report_only)
    cpu = describe_cpu()  # first, so that any report of this run says which kind of CPU it came from
    print(f"[demo] {cpu}")
    comparison = demo_report.read_comparison(COMPARISON_SUMMARY, DEMO_ARM)
    prepared = prepare(s, reuse=True) if report_only else prepare(s)
    estimator, n, overrides = demo_arm()
    run_dir = s.work_dir / "runs" / RUN_FOLDER
    if report_only:
        if not (run_dir / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"{run_dir} holds no run: run the demo first, without --report-only")
    else:
        print(f"[demo] training {comparison.arm_label} on verl's stock trainer (CPU): {s.batch} prompts x {n} "
              f"rollouts a step, {s.steps} steps at lr {s.lr:g}, validating on {s.val_prompts} held-out prompts x "
              f"{s.val_samples} samples before the first update and every {s.test_freq} steps and after the last")
        with tqdm(total=s.steps, desc=RUN_FOLDER, unit="step") as bar:
            run_method(s, estimator, prepared, run_dir, own_start=True, extra=overrides,
                       on_step=lambda step: bar.update(step - bar.n))
    run = run_report.read_run(estimator, run_dir, prepared.question_family, in_format=s.in_format)
    about = demo_report.RunAbout(label=comparison.arm_label, estimator=estimator, batch=s.batch, n=n, steps=s.steps,
                                 lr=s.lr, dtype=s.compute_dtype(), seed=s.seed,
                                 differences=tuple(differences_from_comparison(s)))
    text = demo_report.demo_report(run, about, comparison)
    nmi = prepared.codebook_nmi
    if nmi is not None:
        text += (f"\n\ncodebook (MiniLM + K-means on the training prompts' text, K = {s.num_clusters}): NMI {nmi:.3f} "
                 "against the task families")
    png = demo_report.plot_run(run, comparison, s.work_dir / "held_out.png")
    summary_path = s.work_dir / "summary.json"
    if report_only:  # the run's machine and wall time, not this rereading's
        earlier = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        cpu, wall = earlier.get("cpu", cpu), earlier.get("wall_s")
    else:
        wall = time.time() - t0
    (s.work_dir / "report.txt").write_text(f"{cpu}\n{text}\n")
    summary_path.write_text(json.dumps(finite_or_null(
        {"cpu": cpu, "settings": {k: str(v) for k, v in asdict(s).items()}, "dtype": s.compute_dtype(),
         "codebook_nmi": nmi, **demo_report.demo_summary(run, about, comparison), "wall_s": wall}), indent=2,
        allow_nan=False))
    took = "" if wall is None else f"\n[demo] total {wall:.0f} s"
    print(f"[demo] plot: {png}\n[demo] report: {s.work_dir / 'report.txt'}{took}")
    return text


def finite_or_null(value: Any) -> Any:
    """``value`` with every number that is not finite (a family of one prompt has no interval) as None, so that
    summary.json is strict JSON, which any reader parses."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value
