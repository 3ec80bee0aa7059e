"""The regime suite (``scripts/lab.py --suite regime``): every arm of ``instruments.regime.ARMS`` on 10 paired seeds
in the no-revisit regime (``instruments.lab.regime``), judged by ``instruments.rule`` alone; then the learning-rate
check (x0.5, x2) for GRPO n = 8, REINFORCE++ n = 1 and the package's best arm (``rule.best_package_arm``, picked
after the x1 runs and before any learning-rate run). Writes ``results/regime/logistic_lab.json``
(``instruments.regime.write_summary``); ``instruments.lab.regime_report`` writes results/lab/regime.md from it.

Every finished run is kept in the cache folder under a hash of its spec (``experiments.run_cached``), so the
same command after an interruption runs only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from instruments import regime, rule, stats
from instruments.lab.experiments import run_cached
from instruments.lab.regime import (
    NMI_TARGET,
    PRIOR_SAMPLES,
    PRIORS_TWINS,
    SEEDS,
    RegimeResult,
    RegimeSpec,
    check_arms,
    codebook_nmi,
    run_regime,
)

FACTORS = (0.5, 2.0)  # the learning-rate check, around the frozen lr 0.005
LR_ARMS = (regime.REFERENCE, regime.HEADROOM_BASE)  # and the package's best arm
INSTRUMENT = "logistic_lab"


@dataclass
class SuiteRuns:
    """The suite's runs: seeds 0..seeds-1 of every arm at x1, and of the learning-rate check's arms at each factor."""

    base: RegimeSpec  # the settings every run shares (its arm, seed and lr_scale are replaced)
    seeds: int
    results: dict[RegimeSpec, RegimeResult]
    best: str  # the package's best arm, the third arm of the learning-rate check
    ran: int = 0  # runs this invocation ran (the others came from the cache)

    def spec(self, arm: str, seed: int, factor: float = 1.0) -> RegimeSpec:
        return replace(self.base, arm=arm, seed=seed, lr_scale=factor)

    def curves(self, arm: str, factor: float = 1.0) -> np.ndarray:
        """(seeds, steps + 1) held-out success of every seed."""
        return np.stack([self.results[self.spec(arm, seed, factor)].held_out for seed in range(self.seeds)])

    def runs(self, arm: str, factor: float = 1.0) -> list[RegimeResult]:
        return [self.results[self.spec(arm, seed, factor)] for seed in range(self.seeds)]

    @property
    def x(self) -> np.ndarray:
        """Training rollouts consumed at each evaluation (before each step and after the last)."""
        return np.arange(self.base.steps + 1, dtype=np.float64) * self.base.budget

    @property
    def prior_rollouts(self) -> int:
        """The priors' cost: PRIOR_SAMPLES rollouts of every pool prompt (a user's priors cover the dataset)."""
        return PRIOR_SAMPLES * self.base.env.num_clusters * self.base.pool_per_cluster


def run_specs(specs: Sequence[RegimeSpec], cache: Path | None, jobs: int = 1, desc: str = "runs"
              ) -> tuple[dict[RegimeSpec, RegimeResult], int]:  # fmt: skip
    """Each distinct spec once, with a progress bar; runs already in ``cache`` are read, not run. Returns the results
    and how many were run."""
    return run_cached(specs, run_regime, jobs, desc, cache)


def run_suite(base: RegimeSpec, seeds: int = SEEDS, cache: Path | None = None, jobs: int = 1) -> SuiteRuns:
    """The x1 runs of every arm, then the best package arm, then the learning-rate check's runs."""
    check_arms()
    specs = [replace(base, arm=arm, seed=seed, lr_scale=1.0) for arm in regime.IN_LABS for seed in range(seeds)]
    results, ran = run_specs(specs, cache, jobs, "regime runs (x1)")
    suite = SuiteRuns(base, seeds, results, best="", ran=ran)
    differences = {key: arm_summary(suite, key).difference for key in regime.PACKAGE}  # priors counted
    suite.best = rule.best_package_arm(differences, regime.PACKAGE)
    lr_specs = [suite.spec(arm, seed, factor) for arm in lr_arms(suite.best) for factor in FACTORS
                for seed in range(seeds)]  # fmt: skip
    lr_results, ran = run_specs(lr_specs, cache, jobs, f"learning-rate check ({', '.join(lr_arms(suite.best))})")
    results.update(lr_results)
    suite.ran += ran
    return suite


def lr_arms(best: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*LR_ARMS, best)))


def arm_summary(suite: SuiteRuns, key: str, factor: float = 1.0) -> regime.ArmSummary:
    """The rule's reading of one arm against GRPO n = 8 at the same learning-rate factor: final held-out success,
    its paired difference and the rollouts-to-reach ratio; a priors arm with its priors' rollouts counted (and its
    training-only difference beside it)."""
    paid = suite.prior_rollouts if regime.ARMS[key].priors else None
    return regime.arm_summary(suite.curves(key, factor), suite.x, suite.curves(regime.REFERENCE, factor), suite.x,
                              paid)


def revisits(runs: Sequence[RegimeResult], base: RegimeSpec) -> dict[str, float]:
    """Visits per drawn prompt, measured from the runs' draws: the largest over all runs, the mean over runs, and
    how many held-out prompts any run drew."""
    per_cluster = base.pool_per_cluster + base.held_out_per_cluster
    counts = [np.bincount(run.drawn) for run in runs]
    held = sum(int(np.sum(run.drawn % per_cluster >= base.pool_per_cluster)) for run in runs)
    return {"max": float(max(c.max() for c in counts)), "mean": float(np.mean([c[c > 0].mean() for c in counts])),
            "drawn_prompts_per_run_min": float(min(run.drawn.size for run in runs)),
            "drawn_prompts_per_run_max": float(max(run.drawn.size for run in runs)), "held_out_drawn": float(held)}


def spo_versus_rpp(suite: SuiteRuns) -> dict[str, Any]:
    """Whether SPO n = 1 equals REINFORCE++ n = 1 here, bit for bit, from the runs' own rows."""
    spo, rpp = suite.runs("spo1"), suite.runs("rpp1")
    pairs = list(zip(spo, rpp, strict=True))
    gaps = [np.abs(a.advantages - b.advantages) for a, b in pairs]
    steps = suite.base.steps
    first = [int(np.argmax(gap.reshape(steps, -1).max(axis=1) > 0)) if gap.max() > 0 else None for gap in gaps]
    return {
        "rewards_identical_every_row": all(np.array_equal(a.rewards, b.rewards) for a, b in pairs),
        "advantages_bit_identical": all(gap.max() == 0 for gap in gaps),
        "held_out_curves_bit_identical": all(np.array_equal(a.held_out, b.held_out) for a, b in pairs),
        "max_abs_advantage_gap": float(max(gap.max() for gap in gaps)),
        "rows_with_a_gap_share": float(np.mean([np.mean(gap > 0) for gap in gaps])),
        "first_step_with_a_gap_per_seed": first,
        "max_abs_final_gap": float(max(abs(a.held_out[-1] - b.held_out[-1]) for a, b in pairs)),
    }  # fmt: skip


def knapsack_notes(suite: SuiteRuns) -> dict[str, float]:
    runs = suite.runs("knapsack_grpo2")
    sizes = np.concatenate([run.sizes for run in runs])
    trained = sizes[sizes > 0]
    return {"rollouts_per_step_min": float(min(run.rows.min() for run in runs)),
            "rollouts_per_step_max": float(max(run.rows.max() for run in runs)),
            "prompts_trained_per_step_mean": float((sizes > 0).sum(axis=1).mean()),
            "prompts_per_step": float(sizes.shape[1]), "group_size_min": float(trained.min()),
            "group_size_max": float(trained.max()), "group_size_mean": float(trained.mean())}  # fmt: skip


def priors_contrast(suite: SuiteRuns) -> dict[str, dict[str, Any]]:
    """What the priors bought: each priors arm minus its twin without priors (``PRIORS_TWINS``), final held-out
    success, training rollouts only, paired by seed (the judged figure counts the priors' rollouts; at 8x a run's
    budget it is each seed's start value, the same for both priors arms)."""
    return {key: {"twin": twin, **asdict(stats.paired_difference(suite.curves(key)[:, -1], suite.curves(twin)[:, -1]))}
            for key, twin in PRIORS_TWINS.items()}


def build_summary(suite: SuiteRuns, command: str, machine: str) -> regime.InstrumentSummary:
    """The instrument's summary: every arm read by the rule, the learning-rate check, and what the runs measured."""
    arms = {key: arm_summary(suite, key) for key in regime.IN_LABS}
    all_runs = list(suite.results.values())
    lr_check: dict[str, dict[str, stats.Interval]] = {}
    lr_finals: dict[str, dict[str, dict[str, float]]] = {}
    for key in lr_arms(suite.best):
        for factor in (FACTORS[0], 1.0, FACTORS[1]):
            summary = arm_summary(suite, key, factor)
            lr_check.setdefault(key, {})[f"x{factor:g}"] = summary.difference
            lr_finals.setdefault(key, {})[f"x{factor:g}"] = {**asdict(summary.final), "verdict": summary.verdict}
    nmi = [codebook_nmi(seed, suite.base.noisy_share, suite.base.env.num_clusters, suite.base.pool_per_cluster)
           for seed in range(suite.seeds)]  # fmt: skip
    baseline = arms[regime.HEADROOM_BASE].difference
    notes: dict[str, Any] = {
        "pool": {"prompts": suite.base.env.num_clusters * suite.base.pool_per_cluster,
                 "per_cluster": suite.base.pool_per_cluster, "clusters": suite.base.env.num_clusters,
                 "held_out_per_cluster": suite.base.held_out_per_cluster, "steps": suite.base.steps,
                 "rollouts_per_step": suite.base.budget, "lr": suite.base.optimizer.lr},
        "revisits_by_arm": {key: revisits(suite.runs(key), suite.base) for key in regime.IN_LABS},
        "codebook": {"scheme": "noisy", "share": suite.base.noisy_share, "target_nmi": NMI_TARGET,
                     "nmi_per_seed": nmi, "nmi_mean": float(np.mean(nmi))},
        "priors": {"samples_per_prompt": PRIOR_SAMPLES, "rollouts": suite.prior_rollouts, "drawn": "per seed",
                   "training_rollouts": int(suite.x[-1]),
                   "training_only_reach": {key: asdict(stats.reach_interval(suite.curves(key), suite.curves(
                       regime.REFERENCE), suite.x, suite.x)) for key, arm in regime.IN_LABS.items() if arm.priors},
                   "training_only_final": {key: asdict(stats.mean_interval(suite.curves(key)[:, -1]))
                                           for key, arm in regime.IN_LABS.items() if arm.priors},
                   "minus_twin_training_only": priors_contrast(suite),
                   "counted_final_is_start": suite.prior_rollouts >= int(suite.x[-1])},
        "headroom_over_rpp1": {key: rule.headroom(arms[key].difference, baseline) for key in sorted(regime.LIMITS)},
        "knapsack": knapsack_notes(suite),
        "spo1_vs_rpp1": spo_versus_rpp(suite),
        "best_package_arm": suite.best,
        "lr_finals": lr_finals,
        "start_held_out_success": float(suite.curves(regime.REFERENCE)[:, 0].mean()),
    }  # fmt: skip
    return regime.InstrumentSummary(INSTRUMENT, command, machine, list(range(suite.seeds)),
                                    revisits(all_runs, suite.base), arms, lr_check, notes)  # fmt: skip
