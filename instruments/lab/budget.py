"""The equal-budget experiment (issue 22, point 4): at a fixed number of rollouts a step, which setting reaches
GRPO(G = 8)'s final success with the fewest rollouts, and how much of the limits the shipped methods reach.

Every arm spends the same rollouts a step (``ROLLOUT_BUDGET``), as P prompts x G rollouts, and is paired by seed with
the reference, GRPO at G = 8 (the paper's shape). Two limits bound what a method of its kind can do:
- the oracle baseline R - p (the true advantage, which no estimator can know) bounds every baseline;
- the oracle sampler (weights sqrt(p (1 - p)) + 0.05 from the true p) bounds every sampler.

"Share of the limit": an arm's gain over its own setting without the improvement, divided by the limit's gain over
the same setting (baselines: over GRPO at the same G; samplers: over the same estimator with uniform prompts), in AUC.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from instruments import stats
from instruments.lab.env import EnvConfig
from instruments.lab.estimators import ESTIMATORS
from instruments.lab.experiments import Arm, Experiment, ExperimentResult
from instruments.lab.metrics import summarise
from instruments.lab.run import RunSpec
from instruments.stats import format_interval, format_reach

KEY = "budget"
REFERENCE_SIZE = 8
# (estimator key, sampler) of the arms, run at every group size of the experiment.
METHODS = (
    ("grpo", ""),
    ("bv_sem", ""),
    ("bv_prompt_cluster", ""),
    ("spo", ""),
    ("reinforce_pp", ""),
    ("spo", "history"),
    ("bv_sem", "history"),
    ("bv_prompt_cluster", "history"),
    ("oracle", ""),
    ("grpo", "oracle"),
    ("spo", "oracle"),
    ("bv_prompt_cluster", "oracle"),
)
SAMPLER_LABELS = {"": "", "history": " + sampler", "oracle": " + oracle sampler"}


@dataclass(frozen=True)
class BudgetArm:
    estimator: str
    sampler: str
    size: int

    @property
    def label(self) -> str:
        return f"{ESTIMATORS[self.estimator].label}{SAMPLER_LABELS[self.sampler]} [G={self.size}]"


def budget_experiment(
    steps: int, sizes: Sequence[int], env_of: Callable[[int], EnvConfig], methods: Sequence[tuple[str, str]] = METHODS
) -> Experiment:
    """Every (method, sampler) at every group size, all paired with GRPO at G = 8."""
    reference = BudgetArm("grpo", "", REFERENCE_SIZE)
    arms = [reference] + [BudgetArm(e, s, g) for g in sizes for e, s in methods if BudgetArm(e, s, g) != reference]
    built = tuple(
        Arm(
            label=arm.label,
            spec=RunSpec(ESTIMATORS[arm.estimator], env=env_of(arm.size), steps=steps, sampler=arm.sampler),
            reference=None if arm == reference else reference.label,
            sweep=f"G={arm.size}",
            match=False,
        )
        for arm in arms
    )
    title = f"Equal budget: which setting reaches GRPO (G={REFERENCE_SIZE})'s final success with fewest rollouts"
    return Experiment(KEY, title, built)


def _parse(label: str) -> BudgetArm:
    name, size = label.rsplit(" [G=", 1)
    for (estimator, sampler) in [(e, s) for e in ESTIMATORS for s in SAMPLER_LABELS]:
        if f"{ESTIMATORS[estimator].label}{SAMPLER_LABELS[sampler]}" == name:
            return BudgetArm(estimator, sampler, int(size.rstrip("]")))
    raise ValueError(f"not a budget arm: {label}")


def section(result: ExperimentResult) -> list[str]:
    """The budget tables: per arm the rollouts-to-reach ratio with its CI and the share of all-equal groups; the
    ratio across group sizes; the share of each limit reached."""
    reference_label = next(label for label, arm in result.arms.items() if arm.arm.reference is None)
    reference = result.arms[reference_label]
    ref_curves = np.stack([run.success for run in reference.runs])
    x = np.arange(ref_curves.shape[1], dtype=np.float64)  # steps: every arm spends the same rollouts a step
    summaries = {label: summarise(arm.runs) for label, arm in result.arms.items()}
    ratios: dict[str, stats.Interval] = {}
    lines = [
        f"Rollouts to reach the reference's final success (GRPO G={REFERENCE_SIZE}: the seed-mean success at its last "
        "step), as a ratio to the reference's own, with a 95% paired bootstrap CI over seeds; below 1 is fewer "
        "rollouts. 'not reached' when the seed-mean curve never gets there within the run.",
        "",
        "| arm | rollouts to reach (x ref) | final success | Δ final vs ref | all-equal groups | max \\|A\\| |",
        "|---|---|---|---|---|---|",
    ]
    for label, arm in result.arms.items():
        curves = np.stack([run.success for run in arm.runs])
        ratios[label] = stats.reach_interval(curves, ref_curves, x, x)
        final = stats.mean_interval(curves[:, -1])
        delta = stats.paired_difference(curves[:, -1], ref_curves[:, -1])
        equal = np.mean([run.all_equal_ratio.mean() for run in arm.runs])
        lines.append(f"| {label} | {format_reach(ratios[label])} | {format_interval(final)} | "
                     f"{'ref' if label == reference_label else format_interval(delta, signed=True)} | {equal:.2f} | "
                     f"{np.median(summaries[label].max_abs):.3g} |")  # fmt: skip
    lines += ["", *_revisits(result), "", *_across_sizes(ratios), "", *_limits(summaries), ""]
    return lines


def _revisits(result: ExperimentResult) -> list[str]:
    """How often a prompt comes back at each G (uniform prompts): P of the N prompts a step, so T P / N visits."""
    envs = {arm.arm.spec.env.group_size: arm.arm.spec for arm in result.arms.values()}
    lines = ["How often a prompt comes back with uniform prompts (a prompt history needs revisits):", "",
             "| G | prompts a step | visits per prompt over the run | steps between visits |", "|---|---|---|---|"]
    for size, spec in sorted(envs.items()):
        env = spec.env
        lines.append(f"| {size} | {env.prompts_per_step} | {spec.steps * env.prompts_per_step / env.num_prompts:.1f} | "
                     f"{env.num_prompts / env.prompts_per_step:.0f} |")  # fmt: skip
    return lines


def _across_sizes(ratios: dict[str, stats.Interval]) -> list[str]:
    arms = {label: _parse(label) for label in ratios}
    sizes = sorted({arm.size for arm in arms.values()})
    methods = list(dict.fromkeys((arm.estimator, arm.sampler) for arm in arms.values()))
    header = "| method | " + " | ".join(f"G={g}" for g in sizes) + " |"
    lines = ["Rollouts to reach GRPO(G=8)'s final success, x the reference's, across group sizes at the same budget "
             "(point estimates; CIs in the table above):", "", header, "|---" * (len(sizes) + 1) + "|"]  # fmt: skip
    for estimator, sampler in methods:
        cells = []
        for g in sizes:
            label = BudgetArm(estimator, sampler, g).label
            cells.append(format_reach(ratios[label], point=True) if label in ratios else "")
        lines.append(f"| {ESTIMATORS[estimator].label}{SAMPLER_LABELS[sampler]} | " + " | ".join(cells) + " |")
    return lines


def _limits(summaries: dict[str, object]) -> list[str]:
    """Share of each limit reached, in mean AUC gain: (method - its base) / (limit - the same base), per G.

    A share is only a number where the limit is ahead of its base: where the paired 95% interval of limit - base
    includes zero (at large G the group mean is already about as good as the oracle), the ratio divides noise by noise,
    so the row gives that margin instead.
    """
    arms = {label: _parse(label) for label in summaries}
    auc = {arm: np.asarray(summaries[label].auc, dtype=np.float64) for label, arm in arms.items()}
    lines = ["Share of the limits reached (AUC gain: 0 = no better than the base, 1 = the limit; the limit's margin "
             "over its base is the paired mean AUC difference with its 95% interval):", "",
             "| G | method | base | limit | limit's margin | share |", "|---|---|---|---|---|---|"]  # fmt: skip
    for arm, values in auc.items():
        if arm.estimator in ("bv_sem", "bv_prompt_cluster", "spo") and arm.sampler == "":
            base, limit = replace(arm, estimator="grpo"), replace(arm, estimator="oracle")
        elif arm.sampler == "history":
            base, limit = replace(arm, sampler=""), replace(arm, sampler="oracle")
        else:
            continue
        if base not in auc or limit not in auc:
            continue
        margin = stats.paired_difference(auc[limit], auc[base])
        resolved = margin.low > 0
        share = (values.mean() - auc[base].mean()) / margin.value if resolved else float("nan")
        cell = f"{share:+.2f}" if resolved else "none (the limit is not ahead of the base)"
        lines.append(f"| {arm.size} | {_name(arm)} | {_name(base)} | {_name(limit)} | "
                     f"{format_interval(margin, signed=True)} | {cell} |")
    return lines


def _name(arm: BudgetArm) -> str:
    return f"{ESTIMATORS[arm.estimator].label}{SAMPLER_LABELS[arm.sampler]}"


__all__ = ["KEY", "METHODS", "budget_experiment", "section"]
