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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from bv_blend.config import BVBlendConfig
from bv_blend.grouping import GroupIds, factorize_groups
from bv_blend.moments import ClusterMoments, all_reduce, should_sync, sufficient_statistics

STATE_FORMAT_VERSION = 1
NO_CLUSTER = -1
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
)  # the order of the sums in _blend_and_update


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
        out_device = rewards.device if isinstance(rewards, torch.Tensor) else None
        rewards, codes, clusters, valid, group_cluster = self._check_inputs(rewards, group_ids, cluster_ids, valid)
        out_dtype = torch.promote_types(rewards.dtype, torch.float32)
        if rewards.numel() == 0 and not should_sync(self.config.sync_across_ranks):
            # An empty batch is a no-op: no history ages, and the last call's metrics are replaced.
            self.metrics = self._empty_metrics()
            return torch.zeros(0, dtype=out_dtype, device=out_device)
        advantage = self._blend_and_update(rewards, codes, clusters, valid, group_cluster)
        return advantage.to(device=out_device, dtype=out_dtype)

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
        if token_level_rewards.shape != response_mask.shape or response_mask.dim() != 2:
            raise ValueError(
                f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
                f"{tuple(response_mask.shape)} must both be (batch, response_length)."
            )
        if response_mask.shape[1] == 0:
            raise ValueError("response_mask has no columns: a batch needs at least one response token per row.")
        rewards = token_level_rewards.sum(dim=-1)
        nonempty = nonempty_rows(response_mask)
        if valid is not None:
            valid = torch.as_tensor(valid, device=nonempty.device)
            if valid.dtype != torch.bool:
                raise ValueError(f"valid must be a bool mask, got dtype {valid.dtype}.")
            nonempty = nonempty & valid
        advantages = self.compute(rewards, group_ids, cluster_ids, valid=nonempty).unsqueeze(-1) * response_mask
        return advantages, advantages

    # ------------------------------------------------------------------------------------------------- math
    def _blend_and_update(
        self,
        rewards: torch.Tensor,
        codes: torch.Tensor,
        clusters: torch.Tensor,
        valid: torch.Tensor,
        group_cluster: torch.Tensor,
    ) -> torch.Tensor:
        cfg, moments, num_clusters = self.config, self.moments, self.num_clusters
        # Invalid rows become reward 0 with weight 0, so junk (even NaN) in padding rows never reaches a sum.
        reward = torch.where(valid, rewards.to(torch.float64), 0.0)
        # Per row: its contribution to S1, S2 and n, for the group statistics and the cluster statistics alike.
        per_row = torch.stack((reward, reward * reward, valid.to(torch.float64)), dim=1)

        # (3) Prompt-local statistics over valid rows: mean_g and the unbiased std_g^2 (0 for a single row).
        group_sum, group_sum_sq, group_rows = (
            torch.zeros(group_cluster.numel(), 3, dtype=torch.float64).index_add_(0, codes, per_row).unbind(1)
        )
        group_mean = group_sum / group_rows.clamp_min(1.0)
        group_var = ((group_sum_sq - group_sum * group_mean) / (group_rows - 1.0).clamp_min(1.0)).clamp_min(0.0)

        # (5.1) Confidence weight per cluster from the history before this call, gathered per group.
        cluster_index = group_cluster.clamp_min(0)
        hist_mean, hist_var = moments.mean[cluster_index], moments.variance()[cluster_index]
        group_has_history = (group_cluster >= 0) & moments.seen[cluster_index]
        group_weight = torch.where(group_has_history, self._cluster_weights()[cluster_index], 0.0)

        # (5.2) Blend baseline and variance; standardise.
        baseline = group_weight * hist_mean + (1.0 - group_weight) * group_mean
        scale = (group_weight * hist_var + (1.0 - group_weight) * group_var).sqrt()
        advantage = (reward - baseline[codes]) / (scale[codes] + cfg.epsilon)
        # (5.3) Optional guard against extreme advantages; off by default, not in the paper.
        if cfg.max_abs_advantage is not None:
            advantage = advantage.clamp(-cfg.max_abs_advantage, cfg.max_abs_advantage)
        advantage = torch.where(valid, advantage, 0.0)

        # (5.5) The call's sufficient statistics; rows that must not count go to the dropped slot K.
        slots = torch.where(valid & (clusters >= 0), clusters, num_clusters)
        stats = sufficient_statistics(per_row, slots, num_clusters)

        # Metric sums ride along in the same all-reduce, so the metrics describe the global batch.
        group_present = group_rows > 0
        abs_advantage = advantage.abs()
        group_terms = torch.stack(
            (
                group_present,
                scale > DEGENERATE,
                group_var > DEGENERATE**2,
                group_present & ~group_has_history,
                group_weight,
                group_has_history,
                group_has_history * hist_var,
            ),
            dim=1,
        ).to(torch.float64)
        row_terms = torch.stack((per_row[:, 2].sum(), (abs_advantage > DEGENERATE).sum()))
        sums = torch.cat((group_terms.sum(0), row_terms.to(torch.float64)))
        abs_max = abs_advantage.max() if advantage.numel() else torch.zeros((), dtype=torch.float64)
        if should_sync(cfg.sync_across_ranks):
            packed = all_reduce(torch.cat((stats.flatten(), sums)))
            stats, sums = packed[: stats.numel()].view(3, num_clusters), packed[stats.numel() :]
            abs_max = all_reduce(abs_max.reshape(1), op=torch.distributed.ReduceOp.MAX)[0]

        # One host sync for all the scalars: the metric sums and the largest |A|.
        *summed, abs_max_value = torch.cat((sums, abs_max.reshape(1))).tolist()
        summed = dict(zip(_SUMMED, summed, strict=True))
        if not (torch.isfinite(stats).all() and math.isfinite(abs_max_value)):
            # Finite rewards so large that R^2 or the advantage overflows: refuse before the history is poisoned.
            raise ValueError("Rewards are too large: their squares or the advantages overflow. Rescale the reward.")
        # (5.6, 5.7) Fold into the history: every call with a valid row ages every cluster (an empty call or
        # one of only padding rows is a no-op).
        if summed["rows"] > 0:
            moments.fold(stats)
            self.num_updates += 1
        self.metrics = self._metrics(summed, abs_max_value)
        return advantage

    def _cluster_weights(self) -> torch.Tensor:
        """w_k of the configured weight mode (spec 5.1) for every cluster, before masking unseen ones."""
        cfg, count, hist_var = self.config, self.moments.count, self.moments.variance()
        floored_count = count.clamp_min(cfg.delta_n)
        if cfg.weight_mode == "sem":
            return torch.exp(-(hist_var / floored_count).sqrt() / cfg.temperature)
        if cfg.weight_mode == "neff":
            return torch.exp(-(cfg.v_prior / floored_count).sqrt() / cfg.temperature)
        if cfg.weight_mode == "sigma":
            return torch.exp(-hist_var.sqrt() / cfg.temperature)
        return torch.full_like(count, cfg.fixed_weight)

    # ---------------------------------------------------------------------------------------------- metrics
    def _metrics(self, sums: dict[str, float], abs_max: float) -> dict[str, float]:
        groups, rows, history = max(sums["groups"], 1.0), max(sums["rows"], 1.0), sums["history_groups"]
        return {
            "bv_blend/effective_signal_ratio": sums["effective_groups"] / groups,
            "bv_blend/grpo_signal_ratio": sums["grpo_signal_groups"] / groups,
            "bv_blend/zero_variance_group_ratio": (sums["groups"] - sums["grpo_signal_groups"]) / groups,
            "bv_blend/nonzero_advantage_ratio": sums["nonzero_rows"] / rows,
            "bv_blend/weight_mean": sums["weight_sum"] / groups,
            "bv_blend/cold_start_group_ratio": sums["cold_start_groups"] / groups,
            "bv_blend/clusters_seen": float(self.moments.seen.sum()),
            "bv_blend/hist_var_mean": sums["hist_var_sum"] / history if history > 0 else 0.0,
            "bv_blend/abs_advantage_max": abs_max,
        }

    def _empty_metrics(self) -> dict[str, float]:
        return self._metrics(dict.fromkeys(_SUMMED, 0.0), 0.0)

    # ----------------------------------------------------------------------------------------------- inputs
    def _check_inputs(
        self,
        rewards: torch.Tensor,
        group_ids: GroupIds,
        cluster_ids: torch.Tensor | np.ndarray,
        valid: torch.Tensor | np.ndarray | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Validate everything before any state changes, so a bad call loses nothing.

        Returns rewards, group codes, cluster ids, the validity mask and each group's cluster.
        """
        if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1 or not rewards.dtype.is_floating_point:
            got = f"{rewards.dtype} {tuple(rewards.shape)}" if isinstance(rewards, torch.Tensor) else type(rewards)
            raise ValueError(f"rewards must be a 1-D float tensor (one reward per row), got {got}.")
        rewards = rewards.detach().cpu()
        batch = rewards.shape[0]
        clusters = torch.as_tensor(cluster_ids).cpu()
        if clusters.dim() != 1 or clusters.dtype.is_floating_point or clusters.dtype == torch.bool:
            raise ValueError(
                f"cluster_ids must be a 1-D integer tensor or array, got {clusters.dtype} {tuple(clusters.shape)}."
            )
        clusters = clusters.to(torch.int64)
        codes, num_groups, padding_uid = factorize_groups(group_ids)
        valid = torch.ones(batch, dtype=torch.bool) if valid is None else torch.as_tensor(valid).cpu()
        lengths = {
            "rewards": batch,
            "group_ids": codes.shape[0],
            "cluster_ids": clusters.shape[0],
            "valid": valid.shape[0] if valid.dim() == 1 else -1,
        }
        if len(set(lengths.values())) != 1:
            raise ValueError(f"All inputs need one entry per row; got lengths {lengths}.")
        if valid.dtype != torch.bool:
            raise ValueError(f"valid must be a bool mask, got dtype {valid.dtype}.")
        if padding_uid is not None:
            valid = valid & ~padding_uid

        bad_reward = valid & ~torch.isfinite(rewards)
        if bad_reward.any():
            rows = bad_reward.nonzero().flatten()[:5].tolist()
            raise ValueError(f"Rewards must be finite; rows {rows} hold NaN or inf. Check the reward function.")
        bad_cluster = valid & ((clusters < NO_CLUSTER) | (clusters >= self.num_clusters))
        if bad_cluster.any():
            row = int(bad_cluster.nonzero()[0])
            raise ValueError(
                f"Cluster id {int(clusters[row])} (row {row}) is outside -1..{self.num_clusters - 1}: the data "
                f"was annotated with another codebook than this estimator's K={self.num_clusters}. Re-annotate it "
                "with scripts/build_codebook.py, or set num_clusters to the codebook's K."
            )
        # Each group's cluster is the one its valid rows carry; the lowest and highest must agree.
        # Invalid rows take neutral values (K for the minimum, -1 for the maximum) so they never vote.
        group_low = torch.full((num_groups,), self.num_clusters, dtype=torch.int64)
        group_low.scatter_reduce_(0, codes, torch.where(valid, clusters, self.num_clusters), reduce="amin")
        group_cluster = torch.full((num_groups,), NO_CLUSTER, dtype=torch.int64)
        group_cluster.scatter_reduce_(0, codes, torch.where(valid, clusters, NO_CLUSTER), reduce="amax")
        mixed = (group_cluster >= 0) & (group_low != group_cluster)
        if mixed.any():
            group = int(mixed.nonzero()[0])
            raise ValueError(
                f"A prompt group mixes clusters {int(group_low[group])} and {int(group_cluster[group])}: all rows "
                "of one group (one uid) must carry their prompt's cluster id."
            )
        return rewards, codes, clusters, valid, group_cluster

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


def nonempty_rows(response_mask: torch.Tensor) -> torch.Tensor:
    """Rows with at least one response token, reading only the first column and the rare empty-start rows.

    A real response starts with a model token, so its mask starts with 1; only rows that start with 0
    (verl's padding rows, or odd layouts) need a full scan. This keeps the check O(B) instead of O(B*T).
    """
    nonempty = response_mask[:, 0] != 0
    starts_empty = (~nonempty).nonzero().flatten()
    if starts_empty.numel():
        nonempty[starts_empty] = (response_mask[starts_empty] != 0).any(dim=-1)
    return nonempty


__all__ = ["BVBlendEstimator", "NO_CLUSTER", "STATE_FORMAT_VERSION", "nonempty_rows"]
