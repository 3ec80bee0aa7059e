"""MaxNorm-AC with the Reward-Resolution Protocol (arXiv 2609.19164), companions spec section 3.

One call, for each group g of valid rows (the spec's "Per call" steps):

    (1) r~_i = lo + delta floor((clip(r_i, lo, hi) - lo) / delta + 1/2 + 1e-9)      binning, half up
    (2) a group with fewer than 2 rows, or all of them in one bin, gets A = 0 (zero-gap: counted as skipped)
    (3) u_i  = r~_i - mean_{j != i} r~_j      (``rloo``)   or   r~_i - mean r~   (``centered``)
    (4) s_g  = max(max_i |u_i|, tau),   A_i = u_i / s_g,   so |A| <= 1

No state. Advantages are computed on the host outside autograd, so the paper's stop-gradient sg(c) is automatic.
The ``rloo`` numerator is computed as n/(n-1) times the centred one (algebraically the same), so the two numerators
give identical advantages unless the floor tau binds. No Python loop runs over rows or groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bv_blend.core.groups import GroupStats, group_max, group_stats
from bv_blend.core.options import (
    OptionsMixin,
    check_bool,
    check_choice,
    check_number,
    require,
    reward_range,
)
from bv_blend.core.rows import GroupedTokenFace, GroupIds, Rows, read_rows, to_tensor

NUMERATORS = ("rloo", "centered")
SECTION = "algorithm.maxnorm"
# Added inside the floor so that a reward exactly half a bin up, which float division can leave a hair below
# the half, still rounds up (0.515 / 0.01 = 51.4999...). torch.round and np.round round half to even: not used.
HALF_UP_GUARD = 1e-9
# A binned reward further than this from the raw one counts as changed by the binning (not float noise).
CHANGED = 1e-9
GRPO_EPSILON = 1e-6  # verl's, for the grpo_inv_std_p95 comparison metric


@dataclass(frozen=True)
class MaxNormConfig(OptionsMixin):
    """Parameters of MaxNorm-AC with the RRP; defaults are the companions spec's.

    Attributes:
        numerator: ``rloo`` (MaxNorm-RLOO, the paper's main instance) or ``centered`` (r~ - mean r~).
        delta_res: the reward resolution delta: rewards closer than it express no preference. 0 turns binning off.
        tau_res: the resolution floor tau of the scale; ``None`` means "equal to delta_res" (the default).
        reward_range: [lo, hi] of the sequence reward; binning clips into it, and a reward outside is an error.
        skip_zero_gap: count groups that lie in one bin as skipped (their reward advantage is 0 either way; the
            verl glue uses the flag to skip their KL update too).
    """

    SECTION = SECTION

    numerator: str = "rloo"
    delta_res: float = 0.01
    tau_res: float | None = None
    reward_range: tuple[float, float] = (0.0, 1.0)
    skip_zero_gap: bool = True

    def __post_init__(self) -> None:
        check_choice(SECTION, "numerator", self.numerator, NUMERATORS)
        check_number(SECTION, "delta_res", self.delta_res)
        object.__setattr__(self, "reward_range", reward_range(SECTION, self.reward_range))
        lo, hi = self.reward_range
        require(
            0 <= self.delta_res <= hi - lo,
            SECTION,
            "delta_res",
            self.delta_res,
            f"must be in [0, hi - lo = {hi - lo:g}] (0 turns binning off)",
        )
        if self.tau_res is not None:
            check_number(SECTION, "tau_res", self.tau_res)
            require(self.tau_res >= 0, SECTION, "tau_res", self.tau_res, "must be >= 0 (null: equal to delta_res)")
        check_bool(SECTION, "skip_zero_gap", self.skip_zero_gap)

    @property
    def floor(self) -> float:
        """tau, the scale's floor: ``tau_res``, or ``delta_res`` when it is not set."""
        return float(self.delta_res if self.tau_res is None else self.tau_res)


def bin_rewards(rewards: np.ndarray, delta: float, reward_range: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """The RRP's bounded binning: (binned rewards, bin index of each) on the grid lo + delta k, rounding half up.

    Binned values stay in [lo, hi]: a top grid point above hi (when hi - lo is not a whole number of bins) is
    pulled back to hi. With ``delta == 0`` binning is off: the rewards come back unchanged and are their own keys.
    """
    if delta == 0:
        return rewards.copy(), rewards.copy()
    lo, hi = reward_range
    index = np.floor((np.clip(rewards, lo, hi) - lo) / delta + 0.5 + HALF_UP_GUARD)
    return np.minimum(lo + delta * index, hi), index


class MaxNormAC(GroupedTokenFace):
    """Group-relative advantages divided by their own largest magnitude (floored at tau): |A| <= 1.

    Args:
        config: the parameters; defaults to ``MaxNormConfig()``.

    Stateless; after each call :attr:`metrics` holds the call's ``maxnorm/*`` metrics.
    """

    def __init__(self, config: MaxNormConfig | None = None) -> None:
        self.config = config if config is not None else MaxNormConfig()
        if not isinstance(self.config, MaxNormConfig):
            raise TypeError(f"config must be a MaxNormConfig, got {type(self.config).__name__}.")
        self.metrics: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------------ faces
    def compute(
        self, rewards: torch.Tensor, group_ids: GroupIds, valid: torch.Tensor | np.ndarray | None = None
    ) -> torch.Tensor:
        """Sequence-level advantages, one per row.

        Args:
            rewards: (B,) float rewards.
            group_ids: (B,) prompt-group ids: uid strings (a numpy object array, as verl passes them) or ints.
            valid: optional (B,) bool; False marks padding rows, as does a uid starting with "pad".

        Returns:
            (B,) advantages in [-1, 1] on the device of ``rewards`` (float64 for float64 rewards, else float32).

        Raises:
            ValueError: NaN or infinite rewards, rewards outside ``reward_range``, or inputs of different lengths.
        """
        rows = read_rows(rewards, group_ids, valid, self.config.reward_range, SECTION)
        return to_tensor(self._advantages(rows, group_stats(rows)), rewards)

    # ------------------------------------------------------------------------------------------------- math
    def _advantages(self, rows: Rows, groups: GroupStats) -> np.ndarray:
        cfg, codes, valid, count, num_groups = self.config, rows.codes, rows.valid, groups.count, rows.num_groups

        # (1) Bounded binning of the valid rows (invalid rows hold 0 and are masked below).
        binned, key = bin_rewards(rows.reward, cfg.delta_res, cfg.reward_range)

        # (2) Zero gap: every valid row of the group in one bin. Such a group's numerator is 0 in exact arithmetic;
        # it is zeroed explicitly so that float noise cannot be scaled up to +-1 when tau = 0.
        highest = group_max(np.where(valid, key, -np.inf), codes, num_groups, empty=-np.inf)
        lowest = -group_max(np.where(valid, -key, -np.inf), codes, num_groups, empty=-np.inf)
        zero_gap = (count >= 1) & (highest == lowest)
        silent = (count < 2) | zero_gap  # groups that get A = 0
        skipped = (count >= 1) & ((count < 2) | (zero_gap & cfg.skip_zero_gap))

        # (3) Numerator over valid rows: centred, or the leave-one-out one, n/(n-1) times it.
        binned_mean = np.bincount(codes, weights=np.where(valid, binned, 0.0), minlength=num_groups)
        binned_mean /= np.maximum(count, 1.0)
        numerator = binned - binned_mean[codes]
        if cfg.numerator == "rloo":
            numerator *= (count / np.maximum(count - 1.0, 1.0))[codes]
        numerator = np.where(valid & ~silent[codes], numerator, 0.0)

        # (4) Scale: the group's largest |u|, floored at tau.
        largest = group_max(np.abs(numerator), codes, num_groups)
        scale = np.maximum(largest, cfg.floor)
        row_scale = scale[codes]
        advantage = np.divide(numerator, row_scale, out=np.zeros_like(numerator), where=row_scale > 0)

        self.metrics = self._metrics(rows, groups, binned, advantage, scale, silent, skipped, largest < cfg.floor)
        return advantage

    # ---------------------------------------------------------------------------------------------- metrics
    def _metrics(
        self,
        rows: Rows,
        stats: GroupStats,
        binned: np.ndarray,
        advantage: np.ndarray,
        scale: np.ndarray,
        silent: np.ndarray,
        skipped: np.ndarray,
        floor_binds: np.ndarray,
    ) -> dict[str, float]:
        groups = stats.count >= 1
        num_groups = max(int(np.count_nonzero(groups)), 1)
        scaled = groups & ~silent  # the groups that get a scale
        num_scaled = max(int(np.count_nonzero(scaled)), 1)
        inverse_scale = 1.0 / scale[scaled] if np.count_nonzero(scaled) else np.zeros(1)
        # What GRPO would divide by on the same raw rewards, over the groups where GRPO has a signal.
        grpo_std = np.sqrt(stats.var)
        grpo_signal = (stats.count >= 2) & (grpo_std > 0)
        grpo_inverse = 1.0 / (grpo_std[grpo_signal] + GRPO_EPSILON) if np.count_nonzero(grpo_signal) else np.zeros(1)
        changed = rows.valid & (np.abs(binned - rows.reward) > CHANGED)
        metrics = {
            "maxnorm/skipped_group_ratio": np.count_nonzero(skipped) / num_groups,
            "maxnorm/floor_active_ratio": np.count_nonzero(scaled & floor_binds) / num_scaled,
            "maxnorm/inv_scale_mean": float(inverse_scale.mean()),
            "maxnorm/inv_scale_p95": float(np.percentile(inverse_scale, 95)),
            "maxnorm/inv_scale_max": float(inverse_scale.max()),
            "maxnorm/grpo_inv_std_p95": float(np.percentile(grpo_inverse, 95)),
            "maxnorm/abs_advantage_max": float(np.abs(advantage).max()) if advantage.size else 0.0,
            "maxnorm/binning_changed_ratio": np.count_nonzero(changed) / max(int(np.count_nonzero(rows.valid)), 1),
        }
        return {name: float(value) for name, value in metrics.items()}  # numpy scalars become plain floats


__all__ = ["NUMERATORS", "MaxNormAC", "MaxNormConfig", "bin_rewards"]
