"""The suite's report: markdown with plots; results/token_lab/lab_token.md for the full suite.

It is written from the result files alone (``--report-only`` rewrites it without running anything), so a partial
suite gives a partial report, marked as such, and a suite whose comparison has not run yet gives its settings,
its arms and the frozen settings.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from instruments import stats
from instruments.demo.task import FAMILIES
from instruments.lab.token import plots
from instruments.lab.token.arms import ARMS, REFERENCE, TokenArm
from instruments.lab.token.guide import guide
from instruments.lab.token.runner import SuiteResults, final_values
from instruments.lab.token.selection import __doc__ as RULES
from instruments.lab.token.suites import FROZEN, LR_SWEEP_FACTORS, load_frozen
from instruments.stats import format_interval, format_reach

REACH_UNDEFINED = "n/a (the reference starts at its final value)"  # stats.reach_ratio's one NaN here


@dataclass
class RunInfo:
    """How the suite was last run, for the header (saved as DIR/info.json)."""

    command: str
    wall_seconds: float
    jobs: int
    machine: str
    versions: str
    date: str


def write_report(results: SuiteResults, info: RunInfo | None, path: Path, frozen: dict | None = None) -> Path:
    """Write the markdown report at ``path`` and its plots in ``path``'s folder (``<stem>_*.png``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = _header(results, info) + _settings(results) + _arms(results)
    if results.suite.name == "select":
        lines += _frozen_section(frozen, "Settings frozen by this selection") + _selection(results, path)
    else:
        lines += _frozen_section(frozen if frozen is not None else _frozen_or_none(),
                                 "Settings frozen before the first comparison")
        lines += _comparison(results, path) + _lr_check(results) + guide(results.suite, frozen or _frozen_or_none())
        lines += _definitions()
    if results.failures:
        lines += ["## Failed runs", "", *[f"- `{name}`: `{e.strip().splitlines()[-1]}`"
                                          for name, e in results.failures.items()], ""]
    path.write_text("\n".join(lines) + "\n")
    return path


def _frozen_or_none() -> dict | None:
    return load_frozen() if FROZEN.is_file() else None


def _header(results: SuiteResults, info: RunInfo | None) -> list[str]:
    suite = results.suite
    runnable = [k for k in suite.arms if k not in results.unavailable]
    wanted = len(runnable) * len(suite.seeds) * len(suite.lrs)
    finished = sum(len(results.runs(k, lr)) for k in runnable for lr in suite.lrs)
    lines = [f"# Token-level lab: the `{suite.name}` suite", ""]
    if info is not None:
        lines += [f"Last command: `{info.command}` ({info.date}), {info.wall_seconds / 60:.1f} min wall with "
                  f"{info.jobs} worker process(es). Machine: {info.machine}. {info.versions}.", ""]
    if finished == 0:
        status = "**not run yet**: this page shows the settings, the arms and the frozen settings"
    else:
        status = "complete" if finished == wanted else f"**partial: {finished} of {wanted} runs finished**"
    lines += [f"Runs: {finished} of {wanted} ({status}). The {len(results.unavailable)} unavailable arm(s) are "
              "not counted; each run is saved when it finishes, and rerunning the same command resumes.", "",
              "What this is: the demo's tiny Qwen2 (instruments/demo: model, tokenizer, warm-up, arithmetic task, "
              "held-out split, verl's GSM8K verifier) trained with RL, one arm per estimator, every advantage "
              "computed by verl's registered estimator through `bv_blend.verl.offline.compute_advantages` "
              "(instruments/lab/token; scripts/lab_token.py). The question: at the same rollouts a step, does an arm "
              "reach GRPO(n = 8)'s held-out pass rate with fewer rollouts, and with how many fewer?", ""]
    return lines


def _settings(results: SuiteResults) -> list[str]:
    s, suite = results.suite.settings, results.suite
    runs = [r for per_lr in results.records.values() for rs in per_lr.values() for r in rs]
    lines = ["## Settings", "", "| setting | value |", "|---|---|",
             f"| model | the demo's tiny Qwen2 (instruments/demo/model.py), seed {s.model_seed} |",
             f"| warm-up | {s.warmup_steps} supervised steps, {s.format_share:.0%} of the targets in the verifier's "
             "format |",
             f"| held-out | {s.val_prompts} prompts (instruments/demo/task.held_out_problems, seed {s.model_seed}) |",
             f"| evaluation | held-out pass rate at T=1, {s.eval_samples} responses a prompt, at steps "
             f"{_steps_text(s.eval_steps())} |",
             f"| rollouts a step | {s.budget} (prompts a step = {s.budget} / n) |",
             f"| steps | {s.steps} |",
             f"| training pool | {s.pool_size} problems, evenly over the {len(FAMILIES)} families, disjoint from the "
             "held-out split; shuffled epochs per seed (sampler arms: drawn by the sampler) |",
             "| sampling | HF generate, T=1, no top-k/top-p, at most 16 new tokens, up to the EOS |",
             "| loss | verl's token-mean policy gradient (on policy: PPO ratio 1), AdamW (0.9, 0.999), weight decay "
             "0.01, gradient clip 1.0 |",
             f"| learning rate | {', '.join(f'{lr:g}' for lr in suite.lrs)} |",
             f"| seeds | {', '.join(map(str, suite.seeds))} (a seed fixes the prompt order, the sampling and the "
             "evaluation draws; the warmed-up model is shared) |",
             "| clusters | the 5 task families (bv_blend.verl.offline's cluster_ids) |", ""]
    if runs:
        per_eval = np.sum([r.eval_seconds for r in runs]) / np.sum([len(r.eval_steps) for r in runs])
        total = np.mean([r.train_seconds + r.eval_seconds for r in runs])
        cpu = np.mean([r.info.get("cpu_seconds", np.nan) for r in runs])
        share = np.sum([r.eval_seconds for r in runs]) / np.sum([r.train_seconds + r.eval_seconds for r in runs])
        lines += [f"Cost, measured over the {len(runs)} finished runs: {total:.0f} s wall ({cpu:.0f} s CPU) a run "
                  "on average, of which "
                  f"evaluation {share:.0%} ({per_eval:.1f} s per evaluation of {s.val_prompts} x {s.eval_samples} "
                  f"responses, {len(s.eval_steps())} evaluations a run); the advantage computation "
                  f"{np.sum([r.advantage_seconds for r in runs]) / np.sum([r.train_seconds for r in runs]):.1%} "
                  "of the training time.", ""]
    return lines


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 6 else f"0, {steps[1]}, {steps[2]}, ..., {steps[-1]}"


def _arms(results: SuiteResults) -> list[str]:
    s = results.suite.settings
    lines = ["## Arms", "", "Revisits: how often a pool prompt is trained on over a run "
             "(steps x prompts a step / pool size; sampler arms: measured, mean and max).", "",
             "| key | arm | verl estimator | options | n | prompts a step | sampler | revisits | status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in results.suite.arms:
        arm = results.arms[key]
        k = arm.prompts_per_step(s.budget)
        revisits = f"{s.steps * k / s.pool_size:.1f}"
        if arm.sampler and results.runs(key):
            visits = np.array([r.visits for r in results.runs(key)])
            revisits = f"{visits.mean():.1f} (max {visits.max()})"
        lines.append(f"| {key} | {arm.label} | `{arm.adv_estimator}` | {_options(arm)} | {arm.n} | {k} | "
                     f"{'yes' if arm.sampler else 'no'} | {revisits} | {_status(results, key)} |")
    return [*lines, ""]


def _options(arm: TokenArm) -> str:
    if arm.best_of:
        return f"those of the best of {', '.join(arm.best_of)}"
    return f"`{json.dumps(dict(arm.options))}`" if arm.options else "defaults"


def _status(results: SuiteResults, key: str) -> str:
    if key in results.unavailable:
        return f"unavailable: {results.unavailable[key]}"
    if key in results.pending:
        return f"waiting: {results.pending[key]}"
    note = f" (took the options of {ARMS[key].best_of})" if ARMS[key].best_of else ""
    return f"{len(results.runs(key))} of {len(results.suite.seeds)} runs{note}"


def _frozen_section(frozen: dict | None, title: str) -> list[str]:
    lines = [f"## {title}", ""]
    if frozen is None:
        return [*lines, f"None yet: {FROZEN.name} is missing (run `scripts/lab_token.py --suite select`).", ""]
    lines += [f"**Learning rate {frozen['lr']:g}, {frozen['steps']} steps**, chosen on GRPO n=8 alone, on seeds "
              f"{frozen['selection']['seeds']}, before any other arm ran (instruments/lab/token/{FROZEN.name}, which "
              "the full suite reads). The rules, as committed before the selection ran "
              "(instruments/lab/token/selection.py):", "", *[f"> {line}" if line else ">" for line in
                                                          RULES.strip().splitlines()], "",
              f"The sweep: {frozen['selection']['steps']} steps, held-out pass rate at T=1 "
              f"({frozen['selection']['eval_samples']} responses a prompt).", "",
              "| lr | final pass rate per seed | mean final | mean gain over step 0 |", "|---|---|---|---|"]
    for row in frozen["selection"]["table"]:
        chosen = " **(chosen)**" if row["lr"] == frozen["lr"] else ""
        lines.append(f"| {row['lr']:g}{chosen} | {', '.join(f'{v:.3f}' for v in row['final'])} | "
                     f"{row['mean_final']:.3f} | {row['mean_final'] - row['mean_start']:+.3f} |")
    improving = frozen["selection"]["still_improving"]
    lines += ["", "Still improving at T (the step rule, at the chosen rate): "
              + ", ".join(f"T={t}: {'yes' if v else 'no'}" for t, v in improving.items())
              + f" -> {frozen['steps']} steps.", ""]
    if frozen.get("note"):
        lines += [frozen["note"], ""]
    return lines


def _selection(results: SuiteResults, path: Path) -> list[str]:
    series = {f"lr {lr:g}": (np.array(results.runs(REFERENCE, lr)[0].eval_steps),
                             np.array([r.pass_rate for r in results.runs(REFERENCE, lr)]))
              for lr in results.suite.lrs if results.runs(REFERENCE, lr)}
    if not series:
        return []
    plot = plots.curves(series, results.suite.settings.budget, path.with_name(f"{path.stem}_curves.png"),
                        "GRPO n=8, the learning-rate sweep (95% bands over 3 seeds)")
    return ["## The sweep's curves", "", f"![curves]({os.path.basename(plot)})", ""]


def _comparison(results: SuiteResults, path: Path) -> list[str]:
    lines = ["## Results", ""]
    reference = results.runs(REFERENCE)
    if not reference:
        return [*lines, "No runs of the reference yet.", ""]
    budget, seeds = results.suite.settings.budget, [r.seed for r in reference]
    ref_curves, target = np.array([r.pass_rate for r in reference]), float(np.mean(final_values(reference)))
    steps = np.array(reference[0].eval_steps)
    lines += [f"Reference: {ARMS[REFERENCE].label}, final held-out pass rate {target:.3f} (seed mean at step "
              f"{steps[-1]}) from {ref_curves[:, 0].mean():.3f} at step 0. Intervals: 95%, t-intervals over paired "
              "seeds (rollouts to reach: paired bootstrap). *Rollouts to reach* is the ratio of the rollouts an "
              "arm's seed-mean curve needs to reach the reference's final value over the reference's own (below 1: "
              "fewer rollouts; see Definitions).", "",
              "| arm | seeds | final pass rate | minus reference | P(arm > ref) | rollouts to reach, x ref | "
              "all-equal groups | rows with A != 0 | max abs(A) |", "|---|---|---|---|---|---|---|---|---|"]
    curves, differences = {}, {}
    for key in results.suite.arms:
        runs = [r for r in results.runs(key) if r.seed in seeds]
        if not runs:
            continue
        paired = [seeds.index(r.seed) for r in runs]
        values, ref_values = np.array([r.pass_rate for r in runs]), ref_curves[paired]
        final = stats.mean_interval(values[:, -1])
        row = f"| {results.arms[key].label} | {len(runs)} | {format_interval(final)} |"
        if key == REFERENCE:
            row += " - | - | 1 (by definition) |"
        else:
            reach = stats.reach_interval(values, ref_values, steps * budget, steps * budget)
            row += (f" {format_interval(stats.paired_difference(values[:, -1], ref_values[:, -1]), signed=True)} |"
                    f" {format_interval(stats.probability_of_improvement(values[:, -1], ref_values[:, -1]))} |"
                    f" {format_reach(reach, undefined=REACH_UNDEFINED)} |")
            differences[results.arms[key].label] = (steps, values - ref_values)
        all_equal, signal = np.mean([r.all_equal for r in runs]), np.mean([r.signal for r in runs])
        row += f" {all_equal:.2f} | {signal:.2f} | {max(max(r.max_abs) for r in runs):.2f} |"
        lines.append(row)
        curves[results.arms[key].label] = (steps, values)
    stem = path.with_name(path.stem)
    curve_plot = plots.curves(curves, budget, Path(f"{stem}_curves.png"),
                              f"Held-out pass rate, {budget} rollouts a step (95% bands over seeds)", target)
    lines += ["", "All-equal groups: share of a step's groups whose n scores are equal (every group when n=1); "
              "rows with A != 0: share of rows whose advantage is not zero (the signal an update gets); both "
              "averaged over steps and seeds. max abs(A): over every token of every run.", "",
              f"![held-out pass rate]({os.path.basename(curve_plot)})", ""]
    if differences:
        diff_plot = plots.differences(differences, Path(f"{stem}_differences.png"),
                                      f"Paired difference to {ARMS[REFERENCE].label} (95% bands over seeds)")
        lines += [f"![paired differences]({os.path.basename(diff_plot)})", ""]
    return lines


def _lr_check(results: SuiteResults) -> list[str]:
    keys = results.lr_sweep_arms or tuple(k for k in results.records
                                          if any(lr != results.suite.lr for lr in results.records[k]))
    if not keys:
        return []
    factors = (LR_SWEEP_FACTORS[0], 1.0, *LR_SWEEP_FACTORS[1:])
    lines = ["## Learning-rate check (x0.5, x1, x2)", "",
             "Seed-mean final held-out pass rate (95% CI) of the reference and of the arm that came out best "
             "(selection.py's rule) at half and twice the frozen rate.", "",
             "| arm | " + " | ".join(f"lr x{f:g} ({results.suite.lr * f:g})" for f in factors) + " |",
             "|---|" + "---|" * len(factors)]
    for key in keys:
        cells = []
        for factor in factors:
            runs = results.runs(key, results.suite.lr * factor)
            cells.append(format_interval(stats.mean_interval(np.array(final_values(runs)))) if runs else "not run")
        lines.append(f"| {results.arms[key].label} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _definitions() -> list[str]:
    return ["## Definitions and statistics", "", *stats.__doc__.strip().splitlines(), ""]


def save_info(info: RunInfo, out: Path) -> None:
    from instruments.lab.token.store import write_json

    write_json(out / "info.json", asdict(info))


def load_info(out: Path) -> RunInfo | None:
    path = out / "info.json"
    return RunInfo(**json.loads(path.read_text())) if path.is_file() else None
