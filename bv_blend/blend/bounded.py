"""Bounded BV-Blend (companions spec 4): the blended scale raised so that every |A| <= 1, the ratios within a group
kept. Where tau does not bind this is A^BV / max(1, max_j |A^BV_j|): BV-Blend's dependence on the confidence w
survives."""

from __future__ import annotations

import numpy as np

from bv_blend.core.groups import group_max


def bounded_blend_scale(
    rewards: np.ndarray,
    codes: np.ndarray,
    baseline: np.ndarray,
    scale: np.ndarray,
    tau: float,
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """Bounded BV-Blend's scale per group (companions spec 4): s_g = max(s_BV_g, max_{i in g} |R_i - b_g|, tau).

    Dividing R_i - b_g by it (plus BV-Blend's eps) gives |A| <= 1, with the ratios within a group kept.

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


__all__ = ["bounded_blend_scale"]
