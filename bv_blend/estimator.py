"""`BVBlendEstimator`: the BV-Blend advantage, exactly as docs/estimator.md (the spec) defines it.

One call, for rows i in groups g of clusters k (section numbers are the spec's):

    (5.1) w_k   = exp(-SEM_k / T),  SEM_k = sqrt(v_k / max(N_k, delta_N));  w = 0 for unseen clusters or c = -1
    (5.2) b_g   = w m1_k + (1 - w) mean_g
          s_g^2 = w v_k  + (1 - w) std_g^2
          A_i   = (R_i - b_g) / (s_g + eps)
    (5.5) S1_k, S2_k, n_k over the call's valid rows, all-reduced across ranks
    (5.6, 5.7) cold start, then the EMA update of (N, m1, m2)

The advantages use the history of earlier calls only; the call's rewards are folded in afterwards.
No Python loop runs over rows, groups or clusters.

Tensors come in and go out, and the state is saved and synced as tensors, but the arithmetic in between is
float64 numpy on the host, where verl computes advantages anyway. A call is a few dozen operations on vectors of
G groups or K clusters; numpy does each in 1-4 us, torch in 2-11 us (scripts/bench_ops.py), and at verl's batch
sizes that overhead, not the data, is the cost (docs/estimator.md, "Why the host arithmetic is numpy"). The inputs are
checked and converted in bv_blend/inputs.py before anything here runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from bv_blend.config import BVBlendConfig
from bv_blend.grouping import GroupIds
from bv_blend.inputs import TOO_LARGE, Batch, bool_mask, check_inputs, nonempty_rows
from bv_blend.moments import ClusterMoments, all_reduce, cluster_statistics, should_sync

STATE_FORMAT_VERSION = 1
# Groups or rows below this are "degenerate" in the metrics of spec section 7.
DEGENERATE = 1e-6
# The metrics that are sums over groups or rows; reduced across ranks in one buffer with the statistics.
_SUMMED = (
    "groups",
    "effective_groups",
    "grpo_signal_groups",
    "cold_start_groups",
    "weight_sum",
    "history_groups",
    "hist_var_sum",
    "rows",
    "nonzero_rows",
)  # the keys of the sums in _blend_and_update


class BVBlendEstimator:
    """Cluster-conditioned EMA baseline blended with the prompt-local one, weighted by its confidence.

    Args:
        num_clusters: K, the number of clusters in the codebook. Cluster ids are 0..K-1, or -1 for none.
        config: the parameters; defaults to ``BVBlendConfig()``.
    """

    def __init__(self, num_clusters: int, config: BVBlendConfig | None = None) -> None:
        self.config = config if config is not None else BVBlendConfig()
        if not isinstance(self.config, BVBlendConfig):
            raise TypeError(f"config must be a BVBlendConfig, got {type(self.config).__name__}.")
        self.moments = ClusterMoments(num_clusters, self.config.gamma, self.config.n0, self.config.v_prior)
        self.num_updates = 0
        self.metrics: dict[str, float] = {}

    @property
    def num_clusters(self) -> int:
        return self.moments.num_clusters

    # ------------------------------------------------------------------------------------------------ faces
    def compute(
        self,
        rewards: torch.Tensor,
        group_ids: GroupIds,
        cluster_ids: torch.Tensor | np.ndarray,
        valid: torch.Tensor | np.ndarray | None = None,
    ) -> torch.Tensor:
        """Sequence-level advantages, one per row, then fold the valid rows into the history.

        Args:
            rewards: (B,) float rewards R_i.
            group_ids: (B,) prompt-group ids: uid strings (a numpy object array, as verl passes them) or ints.
            cluster_ids: (B,) integer cluster of each row's prompt, -1 for none.
            valid: optional (B,) bool; False marks padding rows. Rows whose uid starts with "pad" are
                padding too. Padding rows get advantage 0 and change no statistic.

        Returns:
            (B,) advantages on the device of ``rewards``, in its dtype promoted to at least float32 (so that a
            float16 reward cannot overflow). The state lives on the CPU.

        Raises:
            ValueError: NaN or infinite rewards, cluster ids outside -1..K-1, a group mixing clusters, or
                inputs of different lengths. The state is left exactly as it was.
        """
        # Advantages go back to a device only if the rewards came from one.
        out_device = rewards.device if isinstance(rewards, torch.Tensor) and not rewards.is_cpu else None
        sync = should_sync(self.config.sync_across_ranks)
        try:
            batch = check_inputs(rewards, group_ids, cluster_ids, valid, self.num_clusters)
        except (ValueError, TypeError):
            self._reject_together()
            raise
        # float16 and bfloat16 rewards get float32 advantages, so that a large advantage cannot overflow.
        out_dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
        if batch.codes.size == 0 and not sync:
            # An empty batch is a no-op: no history ages, and the last call's metrics are replaced.
            self.metrics = self._empty_metrics()
            return torch.zeros(0, dtype=out_dtype, device=out_device)
        advantage = self._blend_and_update(batch, sync)
        advantage = torch.from_numpy(advantage.astype(np.float32) if out_dtype == torch.float32 else advantage)
        return advantage if out_device is None else advantage.to(out_device)

    def compute_token_level(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        group_ids: GroupIds,
        cluster_ids: torch.Tensor | np.ndarray,
        valid: torch.Tensor | np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """verl's estimator face: (B, T) rewards and mask in, ``(advantages, returns)`` shaped like the mask.

        The sequence reward is the sum of token rewards, and the advantage is broadcast over the response
        tokens, as in verl's GRPO. Rows with an all-zero mask are padding.
        """
        try:
            if token_level_rewards.shape != response_mask.shape or response_mask.dim() != 2:
                raise ValueError(
                    f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
                    f"{tuple(response_mask.shape)} must both be (batch, response_length)."
                )
            if response_mask.shape[1] == 0:
                raise ValueError("response_mask has no columns: a batch needs at least one response token per row.")
            nonempty = nonempty_rows(response_mask)
            if valid is not None:
                valid = bool_mask(valid)
                if valid.shape != nonempty.shape:
                    raise ValueError(f"valid has shape {valid.shape}; it needs one entry per row, {nonempty.shape}.")
                nonempty = nonempty & valid
        except (ValueError, TypeError):
            self._reject_together()
            raise
        rewards = token_level_rewards.sum(dim=-1)
        advantages = self.compute(rewards, group_ids, cluster_ids, valid=nonempty).unsqueeze(-1) * response_mask
        return advantages, advantages

    # ------------------------------------------------------------------------------------------------- math
    def _blend_and_update(self, batch: Batch, sync: bool) -> np.ndarray:
        cfg, num_clusters = self.config, self.num_clusters
        reward, codes, valid = batch.reward, batch.codes, batch.valid
        group_sum, group_sum_sq, group_rows = batch.group_sums
        group_cluster = batch.group_cluster

        # (3) Prompt-local statistics over valid rows: mean_g and the unbiased std_g^2 (0 for a single row).
        group_mean = group_sum / np.maximum(group_rows, 1.0)
        group_var = np.maximum((group_sum_sq - group_sum * group_mean) / np.maximum(group_rows - 1.0, 1.0), 0.0)

        # (5.1) Confidence weight per cluster from the history before this call, gathered per group.
        moments, cluster_variance = self.moments, self.moments.variance()
        cluster_index = np.maximum(group_cluster, 0)
        hist_mean, hist_var = moments.mean[cluster_index], cluster_variance[cluster_index]
        group_has_history = (group_cluster >= 0) & moments.seen[cluster_index]
        group_weight = self._cluster_weights(cluster_variance)[cluster_index] * group_has_history  # 0 if none

        # (5.2) Blend baseline and variance; standardise.
        local_weight = 1.0 - group_weight
        baseline = group_weight * hist_mean + local_weight * group_mean
        scale = np.sqrt(group_weight * hist_var + local_weight * group_var)
        advantage = (reward - baseline[codes]) / (scale[codes] + cfg.epsilon)
        # (5.3) Optional guard against extreme advantages; off by default, not in the paper.
        if cfg.max_abs_advantage is not None:
            advantage = np.clip(advantage, -cfg.max_abs_advantage, cfg.max_abs_advantage)
        if valid is not None:
            advantage = np.where(valid, advantage, 0.0)

        # (5.5) The call's sufficient statistics per cluster.
        stats = cluster_statistics(group_cluster, batch.group_sums, num_clusters)

        # Metric sums ride along in the same all-reduce, so the metrics describe the global batch.
        abs_advantage = np.abs(advantage)
        groups, history_groups = np.count_nonzero(group_rows), np.count_nonzero(group_has_history)
        summed = {
            "groups": groups,
            "effective_groups": np.count_nonzero(scale > DEGENERATE),
            "grpo_signal_groups": np.count_nonzero(group_var > DEGENERATE**2),
            "cold_start_groups": groups - history_groups,  # a group with history has rows
            "weight_sum": group_weight.sum(),
            "history_groups": history_groups,
            "hist_var_sum": (hist_var * group_has_history).sum(),
            "rows": group_rows.sum(),
            "nonzero_rows": np.count_nonzero(abs_advantage > DEGENERATE),
        }
        abs_max = float(abs_advantage.max()) if advantage.size else 0.0
        if sync:
            stats, sums, abs_max, peer_failed = self._sync(stats, list(summed.values()), abs_max, failed=False)
            if peer_failed:
                raise ValueError(
                    "Another rank's input for this call was rejected (its own error says why); no rank changed "
                    "its BV-Blend state. Fix that input and call again on every rank."
                )
            summed = dict(zip(summed, sums, strict=True))
        if np.count_nonzero(np.isfinite(stats)) != stats.size or not math.isfinite(abs_max):
            # Finite rewards so large that their sums or the advantage overflow: refuse before the history
            # is poisoned.
            raise ValueError(TOO_LARGE)
        # (5.6, 5.7) Fold into the history: every call with a valid row ages every cluster (an empty call or
        # one of only padding rows is a no-op).
        if summed["rows"] > 0:
            self.moments.fold(stats)
            self.num_updates += 1
        self.metrics = self._metrics(summed, abs_max)
        return advantage

    def _reject_together(self) -> None:
        """On a rank whose input was rejected: join the call's collectives with a failure flag, if ranks sync, so
        that the other ranks raise too instead of waiting forever."""
        if should_sync(self.config.sync_across_ranks):
            self._sync(np.zeros((3, self.num_clusters)), [0.0] * len(_SUMMED), 0.0, failed=True)

    @staticmethod
    def _sync(
        stats: np.ndarray, sums: list[float], abs_max: float, failed: bool
    ) -> tuple[np.ndarray, list[float], float, bool]:
        """A call's two collectives: one SUM of (stats, metric sums, failure flag), one MAX of the largest |A|.

        A rank whose input was rejected joins with ``failed=True``, so that every rank learns of it in the
        same call and none waits forever. Returns the global stats, sums, largest |A|, and whether any rank failed.
        """
        packed = torch.from_numpy(np.concatenate((stats.ravel(), np.array([*sums, float(failed)]))))
        packed = all_reduce(packed).numpy()
        global_abs_max = all_reduce(torch.tensor([abs_max], dtype=torch.float64), op=torch.distributed.ReduceOp.MAX)
        return (
            packed[: stats.size].reshape(stats.shape),
            packed[stats.size : -1].tolist(),
            float(global_abs_max[0]),
            bool(packed[-1] > 0),
        )

    def _cluster_weights(self, cluster_variance: np.ndarray) -> np.ndarray:
        """w_k of the configured weight mode (spec 5.1) for every cluster, before masking unseen ones."""
        cfg, count = self.config, self.moments.count
        floored_count = np.maximum(count, cfg.delta_n)
        if cfg.weight_mode == "sem":
            return np.exp(-np.sqrt(cluster_variance / floored_count) / cfg.temperature)
        if cfg.weight_mode == "neff":
            return np.exp(-np.sqrt(cfg.v_prior / floored_count) / cfg.temperature)
        if cfg.weight_mode == "sigma":
            return np.exp(-np.sqrt(cluster_variance) / cfg.temperature)
        return np.full_like(count, cfg.fixed_weight)

    # ---------------------------------------------------------------------------------------------- metrics
    def _metrics(self, sums: dict[str, Any], abs_max: float) -> dict[str, float]:
        sums = {name: float(value) for name, value in sums.items()}  # numpy scalars become plain floats
        groups, rows, history = max(sums["groups"], 1.0), max(sums["rows"], 1.0), sums["history_groups"]
        return {
            "bv_blend/effective_signal_ratio": sums["effective_groups"] / groups,
            "bv_blend/grpo_signal_ratio": sums["grpo_signal_groups"] / groups,
            "bv_blend/zero_variance_group_ratio": (sums["groups"] - sums["grpo_signal_groups"]) / groups,
            "bv_blend/nonzero_advantage_ratio": sums["nonzero_rows"] / rows,
            "bv_blend/weight_mean": sums["weight_sum"] / groups,
            "bv_blend/cold_start_group_ratio": sums["cold_start_groups"] / groups,
            "bv_blend/clusters_seen": float(np.count_nonzero(self.moments.seen)),
            "bv_blend/hist_var_mean": sums["hist_var_sum"] / history if history > 0 else 0.0,
            "bv_blend/abs_advantage_max": abs_max,
        }

    def _empty_metrics(self) -> dict[str, float]:
        return self._metrics(dict.fromkeys(_SUMMED, 0.0), 0.0)

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Plain tensors plus K and the config, safe for ``torch.save`` and ``torch.load(weights_only=True)``."""
        return {
            "format_version": STATE_FORMAT_VERSION,
            "num_clusters": self.num_clusters,
            "config": self.config.to_dict(),
            "num_updates": self.num_updates,
            **self.moments.state_dict(),
        }

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        *,
        allow_config_change: bool = False,
        allow_num_clusters_change: bool = False,
    ) -> None:
        """Restore a state from :meth:`state_dict`; all checks run before anything changes.

        Args:
            allow_config_change: keep this estimator's config even if the state was saved under another one.
            allow_num_clusters_change: adopt the state's K (this estimator is resized to it).
        """
        if state.get("format_version") != STATE_FORMAT_VERSION:
            raise ValueError(
                f"Unsupported BV-Blend state format {state.get('format_version')!r}; "
                f"this version reads format {STATE_FORMAT_VERSION}."
            )
        saved_k = state.get("num_clusters")
        if saved_k != self.num_clusters and not allow_num_clusters_change:
            raise ValueError(
                f"The saved BV-Blend state has K={saved_k} clusters but this estimator has K={self.num_clusters}: "
                "it was made with another codebook. Use the run's original codebook, or pass "
                "allow_num_clusters_change=True to adopt the saved K."
            )
        saved_config = BVBlendConfig.from_mapping(state.get("config"))
        if saved_config != self.config and not allow_config_change:
            changed = {
                k: (v, getattr(self.config, k))
                for k, v in saved_config.to_dict().items()
                if getattr(self.config, k) != v
            }
            raise ValueError(
                f"The saved BV-Blend state was made with another config (saved, current): {changed}. "
                "Restore the original options, or pass allow_config_change=True to keep the current ones."
            )
        num_updates = state.get("num_updates")
        if isinstance(num_updates, bool) or not isinstance(num_updates, int) or num_updates < 0:
            raise ValueError(f"BV-Blend state 'num_updates' must be a non-negative int, got {num_updates!r}.")
        target = self.moments
        if saved_k != self.num_clusters:
            target = ClusterMoments(saved_k, self.config.gamma, self.config.n0, self.config.v_prior)
        target.load_state_dict(state)  # validates shapes and values first, then assigns
        self.moments, self.num_updates = target, num_updates


__all__ = ["BVBlendEstimator", "STATE_FORMAT_VERSION"]
