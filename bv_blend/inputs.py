"""One call's inputs, as verl passes them, checked and turned into host arrays.

Everything here runs before the estimator changes any state, so a bad call loses nothing. The hot path counts
with ``np.count_nonzero`` rather than ``.any()``/``.all()``/``.min()``, and reads ``tensor.is_cpu`` rather than
``tensor.device``: in a trainer this code is cold, and those take slower paths on first use (``python
scripts/bench_ops.py`` measures both; docs/estimator.md, "Why the host arithmetic is numpy").
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

from bv_blend.grouping import GroupIds, factorize_groups

NO_CLUSTER = -1
# A reward above this in magnitude would overflow R^2 in float64.
LARGEST_SQUARABLE = math.sqrt(np.finfo(np.float64).max)
TOO_LARGE = "Rewards are too large: their squares or the advantages overflow. Rescale the reward."


class Batch(NamedTuple):
    """One call's validated inputs as host arrays, and its per-group sums over valid rows."""

    reward: np.ndarray  # (B,) float64, 0 on invalid rows
    codes: np.ndarray  # (B,) int64 group code of each row
    valid: np.ndarray | None  # (B,) bool, or None when every row is valid
    group_sums: tuple[np.ndarray, np.ndarray, np.ndarray]  # per group: S1, S2, valid row count
    group_cluster: np.ndarray  # (G,) int64 cluster of each group, -1 for none


def host_array(values: torch.Tensor | np.ndarray | Any) -> np.ndarray:
    """A CPU numpy array of ``values``, without a copy when they already are one (or a CPU tensor).

    Each step runs only when needed: on verl's CPU tensors this is one call, not four.
    """
    if not isinstance(values, torch.Tensor):
        return np.asarray(values)
    if values.requires_grad:
        values = values.detach()
    if not values.is_cpu:  # (`is_cpu` is cheap; `.device` builds a Python object every time)
        values = values.cpu()
    if values.dtype == torch.bfloat16:  # numpy has no bfloat16
        values = values.float()
    return values.numpy()


def bool_mask(valid: torch.Tensor | np.ndarray | Any) -> np.ndarray:
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
    if valid is not None:
        valid = bool_mask(valid)
    rows = reward.shape[0]
    if codes.shape[0] != rows or clusters.shape[0] != rows or (valid is not None and valid.shape != (rows,)):
        lengths = {
            "rewards": rows,
            "group_ids": codes.shape[0],
            "cluster_ids": clusters.shape[0],
            "valid": rows if valid is None else valid.shape[0] if valid.ndim == 1 else -1,
        }
        raise ValueError(f"All inputs need one entry per row; got lengths {lengths}.")
    if padding_uid is not None:
        valid = ~padding_uid if valid is None else valid & ~padding_uid
    # From here on, valid is None when every row is valid, which skips every masking step.
    if valid is not None and np.count_nonzero(valid) == rows:
        valid = None

    # Invalid rows become reward 0 with weight 0, so junk (even NaN) in padding rows never reaches a sum.
    if valid is not None:
        reward = np.where(valid, reward, 0.0)
        group_rows = np.bincount(codes, weights=valid, minlength=num_groups)
    else:
        group_rows = np.bincount(codes, minlength=num_groups)  # int counts; the math promotes them
    # NaN, inf, or a reward whose square would overflow: refuse it before squaring (`not <=` holds for NaN).
    if reward.size and not np.abs(reward).max() <= LARGEST_SQUARABLE:
        non_finite = np.flatnonzero(~np.isfinite(reward))[:5].tolist()
        if non_finite:
            raise ValueError(
                f"Rewards must be finite; rows {non_finite} hold NaN or inf. Check the reward function."
            )
        raise ValueError(TOO_LARGE)
    group_sum = np.bincount(codes, weights=reward, minlength=num_groups)
    group_sum_sq = np.bincount(codes, weights=reward * reward, minlength=num_groups)
    if np.count_nonzero(np.isfinite(group_sum_sq)) != num_groups:  # squares that fit, whose sum does not
        raise ValueError(TOO_LARGE)

    counted = clusters if valid is None else clusters[valid]
    if np.count_nonzero(counted < NO_CLUSTER) or np.count_nonzero(counted >= num_clusters):
        out_of_range = (clusters < NO_CLUSTER) | (clusters >= num_clusters)
        row = int(np.flatnonzero(out_of_range if valid is None else out_of_range & valid)[0])
        raise ValueError(
            f"Cluster id {int(clusters[row])} (row {row}) is outside -1..{num_clusters - 1}: the data "
            f"was annotated with another codebook than this estimator's K={num_clusters}. Re-annotate it "
            "with scripts/build_codebook.py, or set num_clusters to the codebook's K."
        )
    # Each group's cluster is the one its valid rows carry (-1 for a group without any): write every valid
    # row's cluster into its group's slot, then check that each row agrees with what its group holds.
    if valid is None:
        group_cluster = np.empty(num_groups, dtype=np.int64)  # every group has a row to write its slot
        group_cluster[codes] = clusters
        disagrees = group_cluster[codes] != clusters
    else:
        group_cluster = np.full(num_groups, NO_CLUSTER, dtype=np.int64)
        group_cluster[codes[valid]] = counted
        disagrees = (group_cluster[codes] != clusters) & valid
    if np.count_nonzero(disagrees):
        group = codes[np.flatnonzero(disagrees)[0]]
        members = clusters[(codes == group) if valid is None else (codes == group) & valid]
        raise ValueError(
            f"A prompt group mixes clusters {int(members.min())} and {int(members.max())}: all rows "
            "of one group (one uid) must carry their prompt's cluster id."
        )
    return Batch(reward, codes, valid, (group_sum, group_sum_sq, group_rows), group_cluster)


def nonempty_rows(response_mask: torch.Tensor) -> np.ndarray:
    """Rows with at least one response token, as a (B,) bool array, reading only the first column and the rare
    rows that start empty.

    A real response starts with a model token, so its mask starts with 1; only rows that start with 0
    (verl's padding rows, or odd layouts) need a full scan. This keeps the check O(B) instead of O(B*T).
    """
    # On the CPU (verl's case) the host array is a free view; from elsewhere only the first column is copied.
    whole = response_mask.is_cpu and response_mask.dtype != torch.bfloat16
    nonempty = host_array(response_mask if whole else response_mask[:, :1])[:, 0] != 0
    if np.count_nonzero(nonempty) != nonempty.size:
        starts_empty = np.flatnonzero(~nonempty)
        rows = torch.from_numpy(starts_empty).to(response_mask.device)
        nonempty[starts_empty] = host_array((response_mask[rows] != 0).any(dim=-1))
    return nonempty


__all__ = ["NO_CLUSTER", "Batch", "bool_mask", "check_inputs", "host_array", "nonempty_rows"]
