"""One call's inputs, as verl passes them, checked and turned into host arrays.

Everything here runs before the estimator changes any state, so a bad call loses nothing. Nothing here
computes a statistic: the estimator does, from the :class:`Batch` returned.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from bv_blend.core.grouping import GroupIds, factorize_groups
from bv_blend.core.host import all_true, any_true, host_array

NO_CLUSTER = -1
TOO_LARGE = "Rewards are too large: their squares or the advantages overflow. Rescale the reward."
_FLOAT64_MAX = float(np.finfo(np.float64).max)


class Batch(NamedTuple):
    """One call's validated inputs as host arrays."""

    reward: np.ndarray  # (B,) float64, 0 on invalid rows (so junk there never reaches a sum)
    valid: np.ndarray  # (B,) bool: False for padding rows
    codes: np.ndarray  # (B,) int64 group code of each row, 0..G-1
    num_groups: int  # G
    group_cluster: np.ndarray  # (G,) int64 cluster of each group, -1 for none (or no valid row)


def bool_mask(valid: torch.Tensor | np.ndarray) -> np.ndarray:
    """``valid`` as a host bool array; an error naming the caller's dtype if it is not bool."""
    mask = host_array(valid)
    if mask.dtype != np.bool_:
        raise ValueError(f"valid must be a bool mask, got dtype {getattr(valid, 'dtype', mask.dtype)}.")
    return mask


def check_inputs(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    cluster_ids: torch.Tensor | np.ndarray,
    valid: torch.Tensor | np.ndarray | None,
    num_clusters: int,
) -> Batch:
    """Validate one call's inputs and turn them into host arrays; raises before anything else can change."""
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1 or not rewards.dtype.is_floating_point:
        got = f"{rewards.dtype} {tuple(rewards.shape)}" if isinstance(rewards, torch.Tensor) else type(rewards)
        raise ValueError(f"rewards must be a 1-D float tensor (one reward per row), got {got}.")
    reward = host_array(rewards).astype(np.float64, copy=False)
    clusters = host_array(cluster_ids)
    if clusters.ndim != 1 or clusters.dtype.kind not in "iu":
        raise ValueError(
            f"cluster_ids must be a 1-D integer tensor or array, got {getattr(cluster_ids, 'dtype', clusters.dtype)} "
            f"{clusters.shape}."
        )
    codes, num_groups, padding_uid = factorize_groups(group_ids)
    rows = reward.shape[0]
    valid = np.ones(rows, dtype=bool) if valid is None else bool_mask(valid)
    if codes.shape[0] != rows or clusters.shape[0] != rows or valid.shape != (rows,):
        lengths = {
            "rewards": rows,
            "group_ids": codes.shape[0],
            "cluster_ids": clusters.shape[0],
            "valid": valid.shape[0] if valid.ndim == 1 else -1,
        }
        raise ValueError(f"All inputs need one entry per row; got lengths {lengths}.")
    if padding_uid is not None:
        valid = valid & ~padding_uid

    reward = np.where(valid, reward, 0.0)
    _check_reward_size(reward)
    return Batch(reward, valid, codes, num_groups, _group_clusters(codes, num_groups, clusters, valid, num_clusters))


def _check_reward_size(reward: np.ndarray) -> None:
    """NaN, inf, or rewards whose squares summed over the call would overflow float64 (`not <=` holds for NaN)."""
    bound = math.sqrt(_FLOAT64_MAX / max(reward.size, 1))
    if reward.size and not np.abs(reward).max() <= bound:
        non_finite = np.flatnonzero(~np.isfinite(reward))[:5].tolist()
        if non_finite:
            raise ValueError(f"Rewards must be finite; rows {non_finite} hold NaN or inf. Check the reward function.")
        raise ValueError(TOO_LARGE)


def _group_clusters(
    codes: np.ndarray, num_groups: int, clusters: np.ndarray, valid: np.ndarray, num_clusters: int
) -> np.ndarray:
    """Each group's cluster: the one its valid rows carry (-1 for a group without any); they must agree."""
    counted = clusters[valid]
    if any_true(counted < NO_CLUSTER) or any_true(counted >= num_clusters):
        out_of_range = (clusters < NO_CLUSTER) | (clusters >= num_clusters)
        row = int(np.flatnonzero(out_of_range & valid)[0])
        raise ValueError(
            f"Cluster id {int(clusters[row])} (row {row}) is outside -1..{num_clusters - 1}: the data "
            f"was annotated with another codebook than this estimator's K={num_clusters}. Re-annotate it "
            "with scripts/build_codebook.py, or set num_clusters to the codebook's K."
        )
    # Write every valid row's cluster into its group's slot, then check that each row agrees with its group.
    group_cluster = np.full(num_groups, NO_CLUSTER, dtype=np.int64)
    group_cluster[codes[valid]] = counted
    disagrees = (group_cluster[codes] != clusters) & valid
    if any_true(disagrees):
        group = codes[np.flatnonzero(disagrees)[0]]
        members = clusters[(codes == group) & valid]
        raise ValueError(
            f"A prompt group mixes clusters {int(members.min())} and {int(members.max())}: all rows "
            "of one group (one uid) must carry their prompt's cluster id."
        )
    return group_cluster


def check_token_level(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    valid: torch.Tensor | np.ndarray | None,
    source_rows: np.ndarray | None,
) -> np.ndarray:
    """Check the token-level face's tensors; return the rows that count: a non-empty response mask, ``valid``,
    and their own source row."""
    if token_level_rewards.shape != response_mask.shape or response_mask.dim() != 2:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be (batch, response_length)."
        )
    if response_mask.shape[1] == 0:
        raise ValueError("response_mask has no columns: a batch needs at least one response token per row.")
    counted = nonempty_rows(response_mask)
    if valid is not None:
        valid = bool_mask(valid)
        if valid.shape != counted.shape:
            raise ValueError(f"valid has shape {valid.shape}; it needs one entry per row, {counted.shape}.")
        counted = counted & valid
    if source_rows is not None:
        rows = counted.shape[0]
        if source_rows.shape != (rows,) or source_rows.dtype.kind not in "iu" or not all_true(
            (source_rows >= 0) & (source_rows < rows)
        ):
            raise ValueError(f"source_rows must be {rows} row indices in 0..{rows - 1}, one per row.")
        counted = counted & (source_rows == np.arange(rows))
    return counted


def nonempty_rows(response_mask: torch.Tensor) -> np.ndarray:
    """Rows with at least one response token, as a (B,) bool array, reading only the first column and the rare
    rows that start empty.

    A real response starts with a model token, so its mask starts with 1; only rows that start with 0
    (verl's padding rows, or odd layouts) need a full scan. This keeps the check O(B) instead of O(B*T).
    """
    # On the CPU (verl's case) the host array is a free view; from elsewhere only the first column is copied.
    whole = response_mask.is_cpu and response_mask.dtype != torch.bfloat16
    nonempty = host_array(response_mask if whole else response_mask[:, :1])[:, 0] != 0
    if not all_true(nonempty):
        starts_empty = np.flatnonzero(~nonempty)
        rows = torch.from_numpy(starts_empty).to(response_mask.device)
        nonempty[starts_empty] = host_array((response_mask[rows] != 0).any(dim=-1))
    return nonempty


__all__ = ["NO_CLUSTER", "TOO_LARGE", "Batch", "bool_mask", "check_inputs", "check_token_level", "nonempty_rows"]
