"""How verl's CPU comparison pairs an arm with the reference, by seed: the one reading that both of its reports make,
the differences table and plot of results/benchmarks.md (compare_report) and the regime summary the rule reads
(no_revisit.summarize), so that the two cannot disagree on a number. Both pair on the seeds every arm has finished
(:func:`common_seeds`): a partial comparison is read on its whole seeds only.

Each run is placed on the rollouts it generated (``run_logs.generated_rollouts``). An arm that drew beyond its batch
(verl's dynamic sampling) is read at the reference's final rollouts on its own curve (``regime.generated_arm_summary``);
every other arm at the last validation both have (``regime.arm_summary``). An arm whose runs stopped once they had
generated a rollout budget (``--stop-at-rollouts``: DAPO in the cold start) is read the same way, on its own
validations, which end at the step each seed stopped at (:func:`pair`).
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


def validation_curve(result: dict) -> tuple[np.ndarray, np.ndarray]:
    """A run's validations, by step ascending: (steps, held-out pass rates); a null (a rate that was not finite,
    written as null in strict JSON) reads as nan."""
    items = sorted((int(step), np.nan if value is None else float(value))
                   for step, value in result["validation"].items())
    return np.array([s for s, _ in items], dtype=int), np.array([v for _, v in items], dtype=float)


def stopped_step(result: dict) -> int | None:
    """The step at which a run stopped once it had generated its rollout budget (its result's ``stopped`` record,
    written by instruments/compare/runs.py); None for a run that trained all its steps."""
    stopped = result.get("stopped")
    return None if stopped is None else int(stopped["step"])


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
    one of their runs on those seeds has); None when they share no seed or no validation. An arm with a run stopped
    at its rollout budget is read at the reference's validations (:func:`_pair_stopped`)."""
    seeds = sorted(set(arm) & set(reference)) if seeds is None else list(seeds)
    if not seeds:
        return None
    if any(stopped_step(arm[seed]) is not None for seed in seeds):
        return _pair_stopped(arm, reference, seeds, steps)
    if steps is None:
        steps = shared_steps([runs[seed] for runs in (arm, reference) for seed in seeds])
    if not steps:
        return None
    x_by_seed = np.array([generated_rollouts(arm[seed], steps) for seed in seeds])
    x_reference = np.array([generated_rollouts(reference[seed], steps) for seed in seeds]).mean(0)
    return Paired(seeds, _matrix(arm, seeds, steps), _matrix(reference, seeds, steps), x_by_seed,
                  x_reference, drew_beyond_batch([arm[seed] for seed in seeds]))


def _pair_stopped(arm: RunsBySeed, reference: RunsBySeed, seeds: Sequence[int],
                  steps: Sequence[int] | None) -> Paired | None:
    """A stopped arm's last validation is at the step it stopped at, which differs between seeds and is not one of
    the reference's validations (every 5 steps). Pairing on the validations both have would drop that point and take
    the reference's last shared step (say 5 of 20) for the final: a reading at a fifth of the budget that looks like
    the rule's. So each seed's curve is placed on the rollouts it generated and read at the reference's validations'
    rollouts, linear between its own validations (as regime.generated_arm_summary reads the budget), and the rule's
    final is at the reference's final rollouts, the budget. Raises where a stopped run's last validation comes before
    the budget: it cannot be read there, and a flat extension would make a number up."""
    if steps is None:
        steps = shared_steps([reference[seed] for seed in seeds])
    if not steps:
        return None
    x_reference = np.mean([generated_rollouts(reference[seed], steps) for seed in seeds], axis=0)
    curves = []
    for seed in seeds:
        own_steps, values = validation_curve(arm[seed])
        x = generated_rollouts(arm[seed], own_steps)
        if x[-1] < x_reference[-1]:
            raise ValueError(f"seed {seed}: the arm's last validation (step {own_steps[-1]}) comes after {x[-1]:g} "
                             f"generated rollouts, fewer than the reference's final {x_reference[-1]:g}: it cannot "
                             "be read at that budget")
        curves.append(np.interp(x_reference, x, values))
    reference_curves = np.array([[np.nan if (v := reference[seed]["validation"][str(k)]) is None else v
                                  for k in steps] for seed in seeds], dtype=float)
    return Paired(list(seeds), np.array(curves), reference_curves, np.tile(x_reference, (len(seeds), 1)),
                  x_reference, generated=True)
