"""The one rule that judges every arm in every instrument, and recommends a setting (results/regime.md).

Revised on 2026-12-03 (issue 37, "The revised rule" in results/regime.md), before any run of the pretrained-LM
comparison; its first version (issue 29) is commit ``59fdb98`` with ``MIN_SEEDS`` from ``ef4381d``. Only the
instruments' own statistics (instruments.stats) feed it:

- **the difference**: the paired difference of the final held-out pass rate, arm minus reference (GRPO n = 8 at the
  same rollouts a step), mean over paired seeds with its 95% Student t-interval (``stats.paired_difference``). The
  first version read a percentile bootstrap, whose coverage at 5 seeds is well under 95%;
- **ahead / behind / level** in an instrument: that interval lies entirely above zero / entirely below zero /
  holds zero;
- **qualified**: an arm that can be run (no limit) and is ahead in at least one instrument and behind in none;
- **the pick**: the qualified arms are ordered by their difference in the tie-breaking instrument (the first of
  ``TIE_BREAKERS`` that was judged: the pretrained LM, the most like a user's run; the token lab, the second, is
  retired and no longer read), then by their mean difference over the instruments. The leader is picked only if it
  is *resolved ahead* of every other qualified arm there: the paired t-interval of leader minus that arm, over the
  seeds both ran, lies above zero. Otherwise the qualified arms it is not resolved ahead of are **tied** with it,
  and the rule recommends the **simplest** of the tied set (verl's stock estimators first: they need nothing from
  this package; then the package's estimators without a codebook, with one, with offline priors) and says so;
- no arm qualifies: the reference stays the recommendation, and the docs say nothing beat it;
- **the rollouts-to-reach ratio** (``stats.reach_interval``) is reported beside every verdict and judges nothing;
- **priors** are paid in rollouts: an arm with offline priors is judged with the priors' rollouts counted in its
  budget, and reported both ways;
- **limits** (the estimated-p baselines) are judged like arms and never recommended: their distance to REINFORCE++
  n = 1 (``headroom``) says what is worth building next;
- **seeds**: an instrument is judged from ``MIN_SEEDS`` paired seeds on; with fewer its differences are reported and
  judge nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from instruments.stats import Interval, paired_difference

AHEAD, BEHIND, LEVEL = "ahead", "behind", "level"
TIE_BREAKERS = ("pretrained_lm",)  # the first judged one separates the qualified arms
MIN_SEEDS = 5  # the fewest paired seeds an instrument is judged on


def verdict(difference: Interval) -> str:
    """Ahead, behind or level, from the 95% interval of the paired final difference to the reference."""
    if difference.low > 0:
        return AHEAD
    if difference.high < 0:
        return BEHIND
    return LEVEL


@dataclass(frozen=True)
class Recommendation:
    arm: str | None  # None: no arm qualified, the reference stays
    qualified: tuple[str, ...]  # every arm the rule let through, in the rule's order (leader first)
    verdicts: dict[str, dict[str, str]]  # arm -> instrument -> verdict
    tied: tuple[str, ...] = ()  # the leader and the qualified arms it is not resolved ahead of
    resolved: bool = False  # the leader is resolved ahead of every other qualified arm, and is the pick
    tie_breaker: str | None = None  # the instrument that ordered and separated the qualified arms
    leader_margins: dict[str, Interval | None] | None = None  # other qualified arm -> leader minus it (None: not run)


def leader_minus(leader: Sequence[float] | None, other: Sequence[float] | None) -> Interval | None:
    """Paired t-interval of leader minus another arm over the seeds both ran (per-seed finals, aligned by the
    instrument's seed order); None where either has no per-seed finals there."""
    if leader is None or other is None:
        return None
    pairs = [(a, b) for a, b in zip(leader, other, strict=False) if not (np.isnan(a) or np.isnan(b))]
    if len(pairs) < 2:
        return None
    return paired_difference(np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))


def recommend(
    differences: Mapping[str, Mapping[str, Interval]],
    limits: frozenset[str] = frozenset(),
    finals: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    simplicity: Mapping[str, int] | None = None,
) -> Recommendation:
    """``differences[arm][instrument]``: each arm's paired final difference to the reference in each judged
    instrument. ``finals[arm][instrument]``: its per-seed finals there, in the instrument's seed order (what
    separates the qualified arms). ``simplicity[arm]``: lower is simpler (0 = verl's stock estimator). ``limits`` are
    judged but never recommended."""
    finals = finals or {}
    simplicity = simplicity or {}
    verdicts = {arm: {name: verdict(d) for name, d in by_instrument.items()} for arm, by_instrument in
                differences.items()}  # fmt: skip
    instruments = {name for by_instrument in differences.values() for name in by_instrument}
    tie_breaker = next((name for name in TIE_BREAKERS if name in instruments), None)

    def qualifies(arm: str) -> bool:
        marks = verdicts[arm].values()
        return arm not in limits and AHEAD in marks and BEHIND not in marks

    def order(arm: str) -> tuple[float, float]:
        by_instrument = differences[arm]
        there = by_instrument.get(tie_breaker) if tie_breaker else None
        return (there.value if there else float("-inf")), sum(d.value for d in by_instrument.values()) / len(
            by_instrument)

    qualified = tuple(sorted((arm for arm in differences if qualifies(arm)), key=order, reverse=True))
    if not qualified:
        return Recommendation(None, (), verdicts, tie_breaker=tie_breaker)
    leader = qualified[0]
    margins = {arm: leader_minus(finals.get(leader, {}).get(tie_breaker), finals.get(arm, {}).get(tie_breaker))
               for arm in qualified[1:]}  # fmt: skip
    tied = (leader, *(arm for arm, margin in margins.items() if margin is None or margin.low <= 0))
    if len(tied) == 1:
        return Recommendation(leader, qualified, verdicts, tied, True, tie_breaker, margins)
    rank = {arm: i for i, arm in enumerate(qualified)}
    simplest = min(tied, key=lambda arm: (simplicity.get(arm, len(simplicity) + 1), rank[arm]))
    return Recommendation(simplest, qualified, verdicts, tied, False, tie_breaker, margins)


def headroom(limit: Interval, baseline: Interval) -> float:
    """How far a limit's difference to the reference is ahead of a runnable baseline's (REINFORCE++ n = 1), in held-
    out pass rate: positive where the limit leaves something to build."""
    return limit.value - baseline.value


def best_package_arm(differences: Mapping[str, Interval], package_arms: frozenset[str]) -> str:
    """The arm of the package (BV-Blend, SPO) with the largest mean paired difference to the reference in one
    instrument: the third arm of the learning-rate check (results/regime.md, addendum)."""
    candidates = [arm for arm in differences if arm in package_arms]
    if not candidates:
        raise ValueError(f"none of {sorted(differences)} is one of the package's arms {sorted(package_arms)}")
    return max(candidates, key=lambda arm: differences[arm].value)
