"""lab.md and its plots from the results of a suite: one table per experiment, paired differences with 95% CIs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from instruments.lab import budget
from instruments.lab.estimators import ESTIMATORS, bv_blend_config, unavailable_reason
from instruments.lab.experiments import ArmResult, ExperimentResult
from instruments.lab.metrics import (
    BUCKET_LABELS,
    COLLAPSE_DROP,
    EXTREME_ADVANTAGE,
    TARGET_GAIN,
    Summary,
    mean_ci,
    median_steps,
    paired_ci,
    summarise,
)
from instruments.lab.suites import ADAM, BASE_ENV, SGD, Suite

DPI = 80


@dataclass
class RunInfo:
    """How the suite was run, for the report's header."""

    command: str
    wall_seconds: float
    jobs: int
    machine: str
    versions: str
    runs: int = 0  # runs in the cache after the suite
    runs_from_earlier: int = 0  # of them, finished by an earlier invocation (its time is not in wall_seconds)


def write_report(suite: Suite, results: Sequence[ExperimentResult], info: RunInfo, out: Path) -> Path:
    """Write ``out/lab.md`` and ``out/*.png``; returns the path of lab.md."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    lines = _header(suite, info)
    for result in results:
        lines += _experiment_section(result, out)
    path = out / "lab.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------------------------------- header
def _header(suite: Suite, info: RunInfo) -> list[str]:
    lines = [
        f"# Estimator lab: the `{suite.name}` suite",
        "",
        f"Command: `{info.command}`. Wall time {info.wall_seconds / 60:.1f} min with {info.jobs} process(es)"
        + (f", the last of several invocations: {info.runs_from_earlier} of its {info.runs} runs were finished by "
           "earlier ones, whose time is not in this figure." if info.runs_from_earlier else "."),
        f"Machine: {info.machine}. {info.versions}.",
        "",
        f"{suite.seeds} seeds (0..{suite.seeds - 1}), {suite.steps} steps a run; every arm of an experiment runs on "
        "the same seeds, so its differences to the reference arm (GRPO at the same setting) are paired. "
        "`±` is the half-width of a 95% t-interval over seeds.",
        "",
        "## Setting",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| env.{name} | {value} |" for name, value in asdict(BASE_ENV).items()],
        f"| Adam (base) | lr {ADAM.lr}, betas ({ADAM.beta1}, {ADAM.beta2}), eps {ADAM.eps}, "
        f"grad-norm clip {ADAM.clip_grad_norm} |",
        f"| SGD | lr {SGD.lr}, no clip |",
        f"| pilot steps (matching) | {suite.pilot_steps} |",
        "",
        "## Metrics",
        "",
        "- **AUC gain**: mean over steps of success(t) - success(0), success being the exact expected success over all "
        "prompts of the task; **final gain**: the same over the last 10% of steps.",
        f"- **steps to +{TARGET_GAIN:.2f}**: median over seeds of the first step with a gain of {TARGET_GAIN:.2f} "
        "(runs that reach it / runs).",
        "- **signal**: mean share of groups whose advantages are not all zero (the effective signal ratio).",
        "- **max |A|**: median over seeds of each run's largest |advantage| (and the largest over seeds); "
        "**p99.9 |A|**: mean over seeds of each run's 99.9th percentile.",
        f"- **ext/col/nan**: runs with max |A| > {EXTREME_ADVANTAGE:.0f} / runs that ended more than "
        f"{COLLAPSE_DROP} below their start / runs with a non-finite advantage.",
        "",
        "## Estimators",
        "",
        "| estimator | verl call | runs here |",
        "|---|---|---|",
    ]
    for spec in ESTIMATORS.values():
        call = f"`adv_estimator={spec.adv_estimator}`" + (f" `{dict(spec.options)}`" if spec.options else "")
        reason = unavailable_reason(spec)
        config = bv_blend_config(spec)
        if config is not None:
            resolved = {k: v for k, v in config.to_dict().items() if k not in ("sync_across_ranks", "epsilon")}
            call += f"<br>resolved: `{resolved}`"
        lines.append(f"| {spec.label} | {call} | {'yes' if reason is None else 'skipped: ' + reason} |")
    return [*lines, ""]


# -------------------------------------------------------------------------------------------- experiments
def _experiment_section(result: ExperimentResult, out: Path) -> list[str]:
    experiment = result.experiment
    lines = [f"## {experiment.title}", "", f"Experiment `{experiment.key}`.", ""]
    for label, reason in result.skipped.items():
        lines.append(f"- skipped **{label}**: {reason}")
    if result.skipped:
        lines.append("")
    summaries = {label: summarise(arm.runs) for label, arm in result.arms.items()}
    lines += _arm_table(result.arms, summaries)
    if result.matched:
        lines += _matched_table(result, summaries)
    lines += _contrast_table(_contrasts(result), summaries)
    lines += _plots(result, summaries, out)
    if experiment.key == budget.KEY:
        lines += budget.section(result)
    if experiment.key == "main":
        lines += _bias_tables(summaries)
        lines += _time_table(result)
    return lines


def _arm_table(arms: dict[str, ArmResult], summaries: dict[str, Summary]) -> list[str]:
    lines = [
        f"| arm | AUC gain | Δ AUC vs ref | final gain | Δ final vs ref | steps to +{TARGET_GAIN:.2f} | signal "
        "| max \\|A\\| | p99.9 \\|A\\| | ext/col/nan |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, arm in arms.items():
        s = summaries[label]
        ref = summaries.get(arm.arm.reference or "")
        delta_auc = _ci(*paired_ci(s.auc, ref.auc)) if ref is not None else "ref"
        delta_final = _ci(*paired_ci(s.final, ref.final)) if ref is not None else "ref"
        lines.append(
            f"| {label} | {_ci(*mean_ci(s.auc))} | {delta_auc} | {_ci(*mean_ci(s.final))} | {delta_final} | "
            f"{median_steps(s.steps_to_target, s.horizon)} | {s.signal.mean():.2f} | "
            f"{np.median(s.max_abs):.3g} [{s.max_abs.max():.3g}] | {s.p999_abs.mean():.3g} | "
            f"{s.extreme}/{s.collapsed}/{s.nonfinite} |"
        )
    return [*lines, ""]


def _matched_table(result: ExperimentResult, summaries: dict[str, Summary]) -> list[str]:
    matched = {label: summarise(arm.runs) for label, arm in result.matched.items()}
    lines = [
        "Step-size matched: each arm's learning rate times its scale, from the pilot. 'update ratio' is the achieved "
        "mean |Δθ| of the arm over its reference's in the matched runs (1 = matched).",
        "",
        "| arm | lr scale | update ratio | Δ AUC vs ref, raw | Δ AUC vs ref, matched | Δ final, matched |",
        "|---|---|---|---|---|---|",
    ]
    for label, arm in result.matched.items():
        reference = arm.arm.reference
        if reference is None or reference not in matched:
            continue
        s, ref = matched[label], matched[reference]
        ratio = s.update_norm.mean() / ref.update_norm.mean()
        raw = _ci(*paired_ci(summaries[label].auc, summaries[reference].auc))
        lines.append(
            f"| {label} | {arm.lr_scale:.3f} | {ratio:.3f} | {raw} | {_ci(*paired_ci(s.auc, ref.auc))} | "
            f"{_ci(*paired_ci(s.final, ref.final))} |"
        )
    return [*lines, ""]


def _contrasts(result: ExperimentResult) -> list[tuple[str, str]]:
    """Paired differences worth reading besides "vs reference": the stability variants against each other in the
    main experiment, every pair of weight modes in the ablation, every codebook against the true clusters."""
    labels = [label for label, arm in result.arms.items() if arm.arm.reference is not None]
    key = result.experiment.key
    if key == "main":
        stability = {k: ESTIMATORS[k].label for k in ESTIMATORS if k.startswith("bv_sem")}
        pairs = [
            ("bv_sem_clip5", "bv_sem"),
            ("bv_sem_literal", "bv_sem"),
            ("bv_sem_floor_only", "bv_sem_literal"),
            ("bv_sem_clip_only", "bv_sem_literal"),
        ]
        return [(stability[a], stability[b]) for a, b in pairs if stability[a] in labels and stability[b] in labels]
    if key == "ablation":
        return [(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :]]
    if key.startswith("codebook"):
        true = [label for label in labels if "codebook true" in label]
        return [(label, t) for t in true for label in labels if label != t and label.endswith(t.rsplit(" [", 1)[-1])]
    return []


def _contrast_table(pairs: list[tuple[str, str]], summaries: dict[str, Summary]) -> list[str]:
    if not pairs:
        return []
    lines = [
        "Paired differences between arms (same seeds):",
        "",
        "| arm | minus | Δ AUC | Δ final |",
        "|---|---|---|---|",
    ]
    for a, b in pairs:
        auc, final = paired_ci(summaries[a].auc, summaries[b].auc), paired_ci(summaries[a].final, summaries[b].final)
        lines.append(f"| {a} | {b} | {_ci(*auc)} | {_ci(*final)} |")
    return [*lines, ""]


def _bias_tables(summaries: dict[str, Summary]) -> list[str]:
    lines = [
        "### Bias against the true advantage, by difficulty",
        "",
        "Bias = mean(A / c) - mean(R - p) over the rows of a difficulty bucket (p = the prompt's success probability "
        "when sampled), with c = sum A (R - p) / sum (R - p)^2 the estimator's least-squares scale (results/lab.md, "
        "'Bias'). Positive: the estimator pushes that outcome up more than the true advantage does.",
        "",
    ]
    first = next(iter(summaries.values())).bias
    for outcome, name in ((1, "correct responses (R = 1)"), (0, "wrong responses (R = 0)")):
        lines += [
            f"**{name}**",
            "",
            "| estimator | c | " + " | ".join(BUCKET_LABELS) + " |",
            "|---|---|" + "---|" * len(BUCKET_LABELS),
            "| true mean of R - p (oracle bucket means) |  | "
            + " | ".join(_num(v) for v in first.true[:, outcome] / np.maximum(first.count[:, outcome], 1))
            + " |",
        ]
        for label, s in summaries.items():
            bias = s.bias.bias()[:, outcome]
            lines.append(f"| {label} | {s.bias.scale():.3g} | " + " | ".join(_num(v) for v in bias) + " |")
        lines.append("")
    share = first.count.sum(axis=1) / max(first.count.sum(), 1)
    lines += [
        "Rows per bucket (reference arm): "
        + ", ".join(f"{b} {s:.0%}" for b, s in zip(BUCKET_LABELS, share, strict=True)),
        "",
    ]
    return lines


def _time_table(result: ExperimentResult) -> list[str]:
    """Where a run's time goes: the estimator call (verl's function, glue included) against everything else."""
    lines = [
        "### Time per step (this experiment's runs)",
        "",
        "| arm | ms per step, estimator call | ms per step, rest of the step (environment, gradient, metrics) |",
        "|---|---|---|",
    ]
    for label, arm in result.arms.items():
        steps = sum(len(r.signal_ratio) for r in arm.runs)
        estimator = sum(r.estimator_seconds for r in arm.runs)
        rest = sum(r.total_seconds for r in arm.runs) - estimator
        lines.append(f"| {label} | {1e3 * estimator / steps:.2f} | {1e3 * rest / steps:.2f} |")
    return [*lines, ""]


# ---------------------------------------------------------------------------------------------------- plots
def _plots(result: ExperimentResult, summaries: dict[str, Summary], out: Path) -> list[str]:
    key = result.experiment.key
    files = [_delta_plot(result, summaries, out / f"{key}_delta.png")]
    if key in ("main", "scenarios") or key.startswith("sgd"):
        files.append(_curves_plot(result, summaries, out / f"{key}_curves.png"))
    if key == "group_size":
        files.append(_group_size_plot(result, summaries, out / "group_size.png"))
    if key == "main":
        files.append(_bias_plot(summaries, out / "bias.png"))
        files.append(_abs_plot(summaries, out / "abs_advantage.png"))
    return [f"![{path.stem}]({path.name})" for path in files if path is not None] + [""]


def _delta_plot(result: ExperimentResult, summaries: dict[str, Summary], path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    rows = [(label, arm) for label, arm in result.arms.items() if arm.arm.reference in summaries]
    if not rows:
        return None
    matched = {label: summarise(arm.runs) for label, arm in result.matched.items()}
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(rows) + 1.2), dpi=DPI)
    y = np.arange(len(rows))
    for offset, source, colour, name in (
        (-0.18, summaries, "tab:blue", "raw"),
        (0.18, matched, "tab:orange", "matched"),
    ):
        points = [
            paired_ci(source[label].auc, source[arm.arm.reference].auc)
            if label in source and arm.arm.reference in source
            else (math.nan, math.nan)
            for label, arm in rows
        ]
        if all(math.isnan(p[0]) for p in points):
            continue
        means, halves = np.array(points).T
        ax.errorbar(means, y + offset, xerr=halves, fmt="o", color=colour, ms=4, capsize=2, label=name)
    ax.axvline(0.0, color="grey", lw=0.8)
    ax.set_yticks(y, [label for label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("Δ AUC gain vs reference (paired, 95% CI)")
    ax.legend(fontsize=7, loc="best")
    ax.set_title(result.experiment.title, fontsize=9)
    return _save(fig, path)


def _curves_plot(result: ExperimentResult, summaries: dict[str, Summary], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=DPI)
    colours = plt.get_cmap("tab20")
    for index, (label, s) in enumerate(summaries.items()):
        ax.plot(s.curve, lw=1.2, color=colours(index % 20), label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("expected success (all prompts)")
    ax.legend(fontsize=6, ncol=2)
    ax.set_title(result.experiment.title, fontsize=9)
    return _save(fig, path)


def _group_size_plot(result: ExperimentResult, summaries: dict[str, Summary], path: Path) -> Path:
    import matplotlib.pyplot as plt

    matched = {label: summarise(arm.runs) for label, arm in result.matched.items()}
    fig, ax = plt.subplots(figsize=(6.5, 4.0), dpi=DPI)
    by_name: dict[str, list[tuple[int, str, str]]] = {}
    for label, arm in result.arms.items():
        if arm.arm.reference is None:
            continue
        name = label.rsplit(" [", 1)[0]
        by_name.setdefault(name, []).append((int(arm.arm.sweep.split("=")[1]), label, arm.arm.reference))
    for index, (name, points) in enumerate(by_name.items()):
        colour = f"C{index}"
        for source, style, suffix in ((summaries, "-", ""), (matched, "--", ", matched")):
            rows = [(g, *paired_ci(source[lab].auc, source[ref].auc)) for g, lab, ref in points if lab in source]
            if rows:
                g, mean, half = np.array(rows).T
                ax.errorbar(g, mean, yerr=half, fmt="o" + style, color=colour, capsize=2, label=name + suffix)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"group size G (prompts x G = {BASE_ENV.rollouts_per_step})")
    ax.set_ylabel("Δ AUC gain vs GRPO at the same G")
    ax.legend(fontsize=7)
    return _save(fig, path)


# The estimators the bias plot shows (the table has them all; the weight-mode ablations would crowd the plot).
BIAS_PLOT = ("grpo", "drgrpo", "rloo", "reinforce_pp", "bv_sem", "bv_sem_literal", "ha_dw", "maxnorm_ac", "oracle")


def _bias_plot(summaries: dict[str, Summary], path: Path) -> Path:
    import matplotlib.pyplot as plt

    shown = {ESTIMATORS[key].label for key in BIAS_PLOT}
    summaries = {label: s for label, s in summaries.items() if label in shown}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=DPI, sharey=False)
    x = np.arange(len(BUCKET_LABELS))
    for outcome, ax, name in ((1, axes[0], "R = 1"), (0, axes[1], "R = 0")):
        for index, (label, s) in enumerate(summaries.items()):
            ax.plot(
                x, s.bias.bias()[:, outcome], "o-", ms=3, lw=1, color=plt.get_cmap("tab20")(index % 20), label=label
            )
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xticks(x, BUCKET_LABELS, fontsize=7)
        ax.set_title(f"bias of A / c against R - p, {name}", fontsize=9)
        ax.set_xlabel("prompt success probability p")
    axes[1].legend(fontsize=5, ncol=2)
    return _save(fig, path)


def _abs_plot(summaries: dict[str, Summary], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.3 * len(summaries) + 1.2), dpi=DPI)
    for index, s in enumerate(summaries.values()):
        ax.plot(s.max_abs, np.full(s.max_abs.size, index), "o", ms=3, alpha=0.6, color="tab:red")
        ax.plot(s.p999_abs, np.full(s.p999_abs.size, index), "|", ms=6, color="tab:blue")
    ax.set_xscale("log")
    ax.set_yticks(np.arange(len(summaries)), list(summaries), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("per run: max |A| (red dots), 99.9th percentile (blue ticks)")
    return _save(fig, path)


def _save(fig: object, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path


# ------------------------------------------------------------------------------------------------- format
def _ci(mean: float, half: float) -> str:
    return f"{mean:+.3f} ± {half:.3f}" if math.isfinite(half) else f"{mean:+.3f}"


def _num(value: float) -> str:
    return "" if not math.isfinite(value) else f"{value:+.3f}"
