"""One call's rows as the companion estimators need them: checked, grouped, as float64 host arrays.

*Valid rows* are the BV-Blend spec's: a non-empty response mask (or ``valid=True``) and a uid that does not start
with ``pad``. Invalid rows get advantage 0 and touch no statistic, so junk (even NaN) in them is ignored.

Like BV-Blend's core, the arithmetic is float64 numpy on the host, where verl computes advantages anyway: a call is
a few dozen operations on vectors of B rows or G groups, where numpy's per-operation cost is smaller than torch's
(docs/estimator.md, "Why the host arithmetic is numpy").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from bv_blend.core.grouping import GroupIds, factorize_groups
from bv_blend.core.inputs import nonempty_rows

# Rewards this far outside the declared range (relative to its width) are float noise, not a wrong range:
# a float32 reward of 1 summed over token rewards can land a few ulps above 1.
RANGE_TOLERANCE = 1e-6


class Rows(NamedTuple):
    """One call's validated rows and their per-group sums over valid rows."""

    reward: np.ndarray  # (B,) float64, 0 on invalid rows
    valid: np.ndarray  # (B,) bool
    codes: np.ndarray  # (B,) int64 group of each row, 0..G-1
    count: np.ndarray  # (G,) float64 number of valid rows per group
    total: np.ndarray  # (G,) float64 sum of the valid rows' rewards per group

    @property
    def num_groups(self) -> int:
        return self.count.shape[0]


def host_array(values: Any) -> np.ndarray:
    """A CPU numpy view or copy of a tensor, array or sequence (bfloat16 goes through float32)."""
    if not isinstance(values, torch.Tensor):
        return np.asarray(values)
    values = values.detach().cpu()
    return (values.float() if values.dtype == torch.bfloat16 else values).numpy()


def read_rows(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    valid: torch.Tensor | np.ndarray | None,
    reward_range: tuple[float, float],
    section: str,
) -> Rows:
    """Check one call's inputs and group its valid rows; raises before any caller changes state.

    Raises:
        ValueError: inputs of different lengths, a non-bool ``valid``, NaN or infinite rewards on valid rows, or
            rewards outside ``reward_range`` (``section`` names the option to fix).
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1 or not rewards.dtype.is_floating_point:
        got = f"{rewards.dtype} {tuple(rewards.shape)}" if isinstance(rewards, torch.Tensor) else type(rewards)
        raise ValueError(f"rewards must be a 1-D float tensor (one reward per row), got {got}.")
    reward = host_array(rewards).astype(np.float64)  # a copy: invalid rows are overwritten below
    codes, num_groups, padding_uid = factorize_groups(group_ids)
    rows = reward.shape[0]
    mask = np.ones(rows, dtype=bool)
    if valid is not None:
        mask = host_array(valid)
        if mask.dtype != np.bool_ or mask.shape != (rows,):
            raise ValueError(f"valid must be a (B,) bool mask with B={rows}, got {mask.dtype} {mask.shape}.")
    if codes.shape[0] != rows:
        raise ValueError(f"rewards and group_ids need one entry per row; got {rows} rewards and {codes.shape[0]} ids.")
    if padding_uid is not None:
        mask = mask & ~padding_uid
    reward[~mask] = 0.0

    not_finite = np.flatnonzero(~np.isfinite(reward))
    if not_finite.size:
        raise ValueError(
            f"Rewards must be finite; rows {not_finite[:5].tolist()} hold NaN or inf. Check the reward function."
        )
    lo, hi = reward_range
    slack = RANGE_TOLERANCE * (hi - lo)
    outside = np.flatnonzero(mask & ((reward < lo - slack) | (reward > hi + slack)))
    if outside.size:
        raise ValueError(
            f"Rewards must lie in {section}.reward_range=[{lo:g}, {hi:g}]; rows {outside[:5].tolist()} hold "
            f"{reward[outside[:5]].tolist()}. Set {section}.reward_range to the range your reward function "
            "produces, or fix the reward."
        )
    count = np.bincount(codes, weights=mask, minlength=num_groups)
    total = np.bincount(codes, weights=reward, minlength=num_groups)
    return Rows(reward, mask, codes, count, total)


def token_rows(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, valid: torch.Tensor | np.ndarray | None
) -> tuple[torch.Tensor, np.ndarray]:
    """verl's estimator face: the sequence rewards (sums of token rewards, as verl's GRPO) and the valid rows
    (a non-empty response mask, and ``valid`` where given)."""
    if token_level_rewards.shape != response_mask.shape or response_mask.dim() != 2:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be (batch, response_length)."
        )
    nonempty = nonempty_rows(response_mask)  # reads the first column, and whole rows only where that is 0
    if valid is not None:
        valid = host_array(valid)
        if valid.dtype != np.bool_ or valid.shape != nonempty.shape:
            raise ValueError(f"valid must be a (B,) bool mask with B={nonempty.shape[0]}, got {valid.dtype} "
                             f"{valid.shape}.")
        nonempty = nonempty & valid
    return token_level_rewards.sum(dim=-1), nonempty


def group_max(values: np.ndarray, codes: np.ndarray, num_groups: int, empty: float = 0.0) -> np.ndarray:
    """Per-group maximum of ``values`` (rows already neutralised by the caller); ``empty`` for groups without rows.

    ``np.maximum.at`` is an unbuffered scatter: one vectorised pass, no loop over groups.
    """
    out = np.full(num_groups, empty, dtype=np.float64)
    np.maximum.at(out, codes, values)
    return out


def grpo_advantages(rows: Rows, norm_by_std: bool, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """verl's ``grpo`` arithmetic over valid rows: (advantages (B,), unbiased std per group (G,)).

    Groups of two or more rows: (R - mean) / (std + eps), or R - mean in Dr.GRPO mode (``norm_by_std=False``).
    Singletons: verl uses mean 0 and std 1, so (R - 0) / (1 + eps), or R. Invalid rows: 0.
    The variance is two-pass (deviations first) so that rewards a hair apart keep their digits.
    """
    mean = rows.total / np.maximum(rows.count, 1.0)
    deviation = np.where(rows.valid, rows.reward - mean[rows.codes], 0.0)
    variance = np.bincount(rows.codes, weights=deviation * deviation, minlength=rows.num_groups)
    std = np.sqrt(variance / np.maximum(rows.count - 1.0, 1.0))
    singleton = rows.count[rows.codes] < 2
    centred = np.where(singleton, rows.reward, deviation)
    if not norm_by_std:
        return np.where(rows.valid, centred, 0.0), std
    scale = np.where(singleton, 1.0, std[rows.codes]) + epsilon
    return np.where(rows.valid, centred / scale, 0.0), std


def to_tensor(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """Advantages on the device of ``like``: float64 if it is float64, else float32 (a float16 reward's
    advantages must not overflow)."""
    dtype = np.float64 if like.dtype == torch.float64 else np.float32
    return torch.from_numpy(values.astype(dtype)).to(like.device)


__all__ = ["Rows", "group_max", "grpo_advantages", "host_array", "read_rows", "to_tensor", "token_rows"]
