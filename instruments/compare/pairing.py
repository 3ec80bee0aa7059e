"""How verl's CPU comparison pairs an arm with the reference, by seed: the one reading that both of its reports make,
the differences table and plot of results/benchmarks.md (compare_report) and the regime summary the rule reads
(no_revisit.summarize), so that the two cannot disagree on a number. Both pair on the seeds every arm has finished
(:func:`common_seeds`): a partial comparison is read on its whole seeds only.

Each run is placed on the rollouts it generated (``run_logs.generated_rollouts``). An arm that drew beyond its batch
(verl's dynamic sampling) is read at the reference's final rollouts on its own curve (``regime.generated_arm_summary``);
every other arm at the last validation both have (``regime.arm_summary``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from instruments import regime
from instruments.run.run_logs import generated_rollouts

RunsBySeed = Mapping[int, dict]  # one arm's result.json per seed


def by_seed(runs: Sequence[dict]) -> dict[int, dict]:
    return {r["spec"]["seed"]: r for r in runs}


def common_seeds(arms: Iterable[RunsBySeed]) -> list[int]:
    """The seeds every arm has finished."""
    seed_sets = [set(runs) for runs in arms]
    return sorted(set.intersection(*seed_sets)) if seed_sets else []


def drew_beyond_batch(runs: Sequence[dict]) -> bool:
    """Whether the arm drew more than its batch (verl's dynamic sampling logged its drops)."""
    return any("filter_groups" in r for r in runs)


def shared_steps(runs: Sequence[dict]) -> list[int]:
    """The validation steps every one of ``runs`` has."""
    return sorted(set.intersection(*({int(step) for step in r["validation"]} for r in runs)))


def _matrix(runs: RunsBySeed, seeds: Sequence[int], steps: Sequence[int]) -> np.ndarray:
    return np.array([[runs[seed]["validation"][str(step)] for step in steps] for seed in seeds], dtype=float)


@dataclass(frozen=True)
class Paired:
    """An arm's and the reference's held-out curves (seeds, validations) and the rollouts each had generated there."""

    seeds: list[int]
    curves: np.ndarray
    reference: np.ndarray
    x_by_seed: np.ndarray  # the arm's, per seed: they differ between seeds only where it drew beyond its batch
    x_reference: np.ndarray  # the reference's, mean over seeds (the same every seed)
    generated: bool  # the arm drew beyond its batch

    def reading(self, prior_rollouts: int | None = None) -> regime.ArmSummary:
        """The arm's final, paired difference and reach; ``prior_rollouts``: a priors arm's offline rollouts, counted
        in its budget (``regime.arm_summary``)."""
        if self.generated:
            return regime.generated_arm_summary(self.curves, self.x_by_seed, self.reference, self.x_reference)
        return regime.arm_summary(self.curves, self.x_by_seed.mean(0), self.reference, self.x_reference,
                                  prior_rollouts)


def pair(arm: RunsBySeed, reference: RunsBySeed, seeds: Sequence[int] | None = None,
         steps: Sequence[int] | None = None) -> Paired | None:
    """``arm`` and ``reference`` on ``seeds`` (default: those both have) at ``steps`` (default: the validations every
    one of their runs on those seeds has); None when they share no seed or no validation."""
    seeds = sorted(set(arm) & set(reference)) if seeds is None else list(seeds)
    if not seeds:
        return None
    if steps is None:
        steps = shared_steps([runs[seed] for runs in (arm, reference) for seed in seeds])
    if not steps:
        return None
    x_by_seed = np.array([generated_rollouts(arm[seed], steps) for seed in seeds])
    x_reference = np.array([generated_rollouts(reference[seed], steps) for seed in seeds]).mean(0)
    return Paired(seeds, _matrix(arm, seeds, steps), _matrix(reference, seeds, steps), x_by_seed,
                  x_reference, drew_beyond_batch([arm[seed] for seed in seeds]))
