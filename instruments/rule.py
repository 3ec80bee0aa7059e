"""The one rule that judges every arm in every instrument, and recommends a setting (issue 29; docs/regime.md).

Written and committed before any run of the no-revisit regime that it reads. The same rule in the token lab, the
logistic lab and on verl's CPU trainer; only the instruments' own statistics (instruments.stats) feed it:

- **the difference**: the paired difference of the final held-out pass rate, arm minus reference (GRPO n = 8 at the
  same rollouts a step), mean over paired seeds with its 95% bootstrap interval (``stats.paired_difference``);
- **ahead / behind / level** in an instrument: that interval lies entirely above zero / entirely below zero /
  holds zero;
- **recommended**: an arm that can be run (no oracle) and is ahead in at least one instrument and behind in none.
  Among several, the one with the largest difference in the token lab (the one instrument with a language model,
  where a rare success on a hard prompt can teach more than its score gradient); then the largest mean difference
  over the instruments. No arm qualifies: the reference stays the recommendation, and the docs say nothing beat it;
- **the rollouts-to-reach ratio** (``stats.reach_interval``) is reported beside every verdict and judges nothing;
- **priors** are paid in rollouts: an arm with offline priors is judged with the priors' rollouts counted in its
  budget (its curve shifted by them), and reported both ways;
- **limits** (the oracle baseline, the oracle allocation) are judged like arms and never recommended: their distance
  to REINFORCE++ n = 1 (``headroom``) says what is worth building next.
- **seeds**: an instrument is judged from ``MIN_SEEDS`` paired seeds on; with fewer its differences are reported and
  judge nothing (added 2026-12-02, before any verl run of the regime was read: a percentile bootstrap over 2-4 seeds
  is about the range of the seeds' values, so a verdict from it is mostly the sign of a handful of runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from instruments.stats import Interval

AHEAD, BEHIND, LEVEL = "ahead", "behind", "level"
TIE_BREAK_INSTRUMENT = "token_lab"
MIN_SEEDS = 5  # the fewest paired seeds an instrument is judged on (the labs run 10, verl's design 5)


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
    qualified: tuple[str, ...]  # every arm the rule let through, best first
    verdicts: dict[str, dict[str, str]]  # arm -> instrument -> verdict


def recommend(
    differences: Mapping[str, Mapping[str, Interval]], limits: frozenset[str] = frozenset()
) -> Recommendation:
    """``differences[arm][instrument]``: each arm's paired final difference to the reference in each instrument
    that ran it. ``limits`` are judged but never recommended."""
    verdicts = {arm: {name: verdict(d) for name, d in by_instrument.items()} for arm, by_instrument in
                differences.items()}  # fmt: skip

    def qualifies(arm: str) -> bool:
        marks = verdicts[arm].values()
        return arm not in limits and AHEAD in marks and BEHIND not in marks

    def order(arm: str) -> tuple[float, float]:
        by_instrument = differences[arm]
        tie = by_instrument[TIE_BREAK_INSTRUMENT].value if TIE_BREAK_INSTRUMENT in by_instrument else float("-inf")
        return tie, sum(d.value for d in by_instrument.values()) / len(by_instrument)

    qualified = tuple(sorted((arm for arm in differences if qualifies(arm)), key=order, reverse=True))
    return Recommendation(qualified[0] if qualified else None, qualified, verdicts)


def headroom(limit: Interval, baseline: Interval) -> float:
    """How far a limit's difference to the reference is ahead of a runnable baseline's (REINFORCE++ n = 1), in held-
    out pass rate: positive where the limit leaves something to build."""
    return limit.value - baseline.value


def best_package_arm(differences: Mapping[str, Interval], package_arms: frozenset[str]) -> str:
    """The arm of the package (BV-Blend, SPO) with the largest mean paired difference to the reference in one
    instrument: the third arm of the learning-rate check (docs/regime.md, addendum)."""
    candidates = [arm for arm in differences if arm in package_arms]
    if not candidates:
        raise ValueError(f"none of {sorted(differences)} is one of the package's arms {sorted(package_arms)}")
    return max(candidates, key=lambda arm: differences[arm].value)
