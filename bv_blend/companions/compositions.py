"""How the companion methods combine with BV-Blend (companions spec section 4): the one new formula, and the
refusals.

- Bounded BV-Blend (sound, recommended): s_g = max(s_BV, max_i |R_i - b_g|, tau). Where tau does not bind this is
  A^BV / max(1, max_j |A^BV_j|): BV-Blend's dependence on the confidence w and the ratios within a group survive,
  and |A| <= 1.
- Refused, with the reason: the RRP zero-gap skip with BV-Blend; HA-DW's weight stacked on MaxNorm-AC or on
  BV-Blend; MaxNorm-AC with the KL penalty in the reward.
- Sound without a rule: NTF with any estimator (BV-Blend at ``rollout.n=1`` is the pairing the spec recommends), and
  RRP binning before BV-Blend (with the binned rewards folded into its history).

docs/companions.md has the whole table of section 4 with our verdicts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bv_blend.core.rows import group_max

BV_BLEND, HA_DW, MAXNORM_AC = "bv_blend", "ha_dw", "maxnorm_ac"


def bounded_blend_scale(
    rewards: np.ndarray,
    codes: np.ndarray,
    baseline: np.ndarray,
    scale: np.ndarray,
    tau: float,
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """Bounded BV-Blend's scale per group: s_g = max(s_BV_g, max_{i in g} |R_i - b_g|, tau).

    Dividing R_i - b_g by it (plus BV-Blend's eps) gives |A| <= 1.

    Args:
        rewards: (B,) rewards R_i (float64).
        codes: (B,) int group code of each row, 0..G-1.
        baseline: (G,) BV-Blend's blended baseline b_g.
        scale: (G,) BV-Blend's blended scale s_g = sqrt(w v_k + (1 - w) std_g^2).
        tau: the floor, >= 0 (MaxNorm's resolution floor; 0 for none).
        valid: optional (B,) bool; invalid rows (padding) do not count towards the maximum.

    Returns:
        (G,) float64 bounded scales.
    """
    if not (np.isfinite(tau) and tau >= 0):
        raise ValueError(f"tau={tau!r} is invalid: the scale's floor must be a finite number >= 0.")
    baseline, scale = np.asarray(baseline, dtype=np.float64), np.asarray(scale, dtype=np.float64)
    if baseline.shape != scale.shape or baseline.ndim != 1:
        raise ValueError(f"baseline {baseline.shape} and scale {scale.shape} must both be (G,), one per group.")
    deviation = np.abs(np.asarray(rewards, dtype=np.float64) - baseline[codes])
    if valid is not None:
        deviation = np.where(valid, deviation, 0.0)
    return np.maximum(np.maximum(scale, group_max(deviation, codes, scale.shape[0])), tau)


@dataclass(frozen=True)
class Composition:
    """What a run stacks, as the verl options would request it.

    Attributes:
        estimator: the registered advantage estimator (``bv_blend``, ``ha_dw``, ``maxnorm_ac``, verl's own ...).
        reward_binning: RRP binning of the rewards before the estimator.
        skip_zero_gap: RRP zero-gap skip of the estimator's groups.
        difficulty_weighting: HA-DW's Phi applied to the estimator's advantages.
        bounded_scale: MaxNorm's bound on BV-Blend's scale.
        use_kl_in_reward: verl's ``algorithm.use_kl_in_reward``.
    """

    estimator: str
    reward_binning: bool = False
    skip_zero_gap: bool = False
    difficulty_weighting: bool = False
    bounded_scale: bool = False
    use_kl_in_reward: bool = False


@dataclass(frozen=True)
class Refusal:
    applies: Callable[[Composition], bool]
    why: str


REFUSALS = (
    Refusal(
        lambda c: c.estimator == BV_BLEND and c.skip_zero_gap,
        "The RRP zero-gap skip cannot run with BV-Blend: it deletes exactly the groups BV-Blend exists for, the "
        "zero-variance groups (an all-wrong group of an easy cluster) that BV-Blend gives a history-based signal. "
        "Keep the RRP binning (reward_binning) and turn skip_zero_gap off.",
    ),
    Refusal(
        lambda c: c.estimator == MAXNORM_AC and c.difficulty_weighting,
        "HA-DW's weight cannot be stacked on MaxNorm-AC: Phi = lambda exp(D |diff|) reaches lambda e, so it breaks "
        "the bound |A| <= 1 that is MaxNorm's point. Run ha_dw or maxnorm_ac, not both.",
    ),
    Refusal(
        lambda c: c.estimator == BV_BLEND and c.difficulty_weighting,
        "HA-DW's weight is not stacked on BV-Blend: on zero-variance groups (outside HA-DW's theory) Phi shrinks "
        "both of BV-Blend's signals by exp(-|p - a|), and on mixed groups it moves the baseline away from the "
        "anchor while BV-Blend moves it toward the cluster mean, so the two partly cancel. The spec rates the "
        "stack an ablation at best; compare ha_dw and bv_blend as separate runs.",
    ),
    Refusal(
        lambda c: c.estimator == MAXNORM_AC and c.use_kl_in_reward,
        "maxnorm_ac cannot run with algorithm.use_kl_in_reward=true: the reward would then include -beta KL, leave "
        "the reward grid that the RRP bins on, and be divided by the scale s_g, which the source never applies to "
        "the KL term. Use actor_rollout_ref.actor.use_kl_loss instead (or no KL).",
    ),
    Refusal(
        lambda c: c.bounded_scale and c.estimator != BV_BLEND,
        "bounded_scale is an option of bv_blend (s = max(s_BV, max |R - b|, tau)); maxnorm_ac is bounded already, "
        "and other estimators have no blended scale to bound.",
    ),
    Refusal(
        lambda c: (c.reward_binning or c.skip_zero_gap) and c.estimator not in (BV_BLEND, MAXNORM_AC),
        "The Reward-Resolution Protocol is built into maxnorm_ac (binning before bv_blend is sound, without the "
        "zero-gap skip); this estimator has no RRP stage. Select maxnorm_ac, or remove the RRP options.",
    ),
)


def check_composition(composition: Composition) -> None:
    """Raise ``ValueError`` naming every unsound part of ``composition``, with the reason and the fix."""
    reasons = [refusal.why for refusal in REFUSALS if refusal.applies(composition)]
    if reasons:
        raise ValueError(f"Unsound combination for {composition.estimator}:\n- " + "\n- ".join(reasons))


__all__ = ["BV_BLEND", "HA_DW", "MAXNORM_AC", "REFUSALS", "Composition", "bounded_blend_scale", "check_composition"]
