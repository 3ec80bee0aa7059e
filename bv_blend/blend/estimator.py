"""`BVBlendEstimator`: the BV-Blend advantage, exactly as the spec defines it (docs/estimator.md).

One call, for rows i in groups g of clusters k (section numbers are the spec's):

    (3)   mean_g, std_g^2 over the group's valid rows (unbiased; std_g = 0 for a single row)
    (5.8) v_k   = max(m2_k - m1_k^2, V_prior / max(N_k, delta_N))     (variance_floor="prior"; "none": no floor)
    (5.1) w_k   = exp(-SEM_k / T),  SEM_k = sqrt(v_k / max(N_k, delta_N));  w = 0 for unseen clusters or c = -1
    (5.2) b_g   = w m1_k + (1 - w) mean_g
          s_g^2 = w v_k  + (1 - w) std_g^2
          A_i   = (R_i - b_g) / (s_g + eps)
    (C4)  s_g  <- max(s_g, max_i |R_i - b_g|, tau)  (bounded_scale_tau=tau, companions spec 4; off by default)
    (5.8) |A_i| <= max(5, (n_g - 1) / sqrt(n_g))                         (max_abs_advantage="auto"; or a number)
    (5.5) S1_k, S2_k, n_k over the call's valid rows, all-reduced across ranks
    (5.6, 5.7) cold start, then the EMA update of (N, m1, m2)

The advantages use the history of earlier calls only; the call's rewards are folded in afterwards.
No Python loop runs over rows, groups or clusters. Tensors come in and go out, and the state is saved and synced
as tensors; the arithmetic in between is float64 numpy on the host (docs/estimator.md, "Speed"). The inputs are
checked in bv_blend/inputs.py, and the call's sums and metrics are bv_blend/call_sums.py's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from bv_blend.blend.config import AUTO, BVBlendConfig, config_mismatch, options_as_saved
from bv_blend.blend.moments import ClusterMoments, cluster_statistics, should_sync
from bv_blend.blend.sums import DEGENERATE, CallSums
from bv_blend.companions.compositions import bounded_blend_scale
from bv_blend.core.grouping import GroupIds
from bv_blend.core.host import all_true
from bv_blend.core.inputs import TOO_LARGE, Batch, check_inputs, check_token_level

# 2: the config holds variance_floor. A format-1 state was computed without a variance floor.
STATE_FORMAT_VERSION = 2
READABLE_STATE_FORMATS = (1, 2)
# max_abs_advantage="auto" clips a group of n rows at max(AUTO_CLIP_MIN, (n - 1) / sqrt(n)) (spec 5 step 8).
AUTO_CLIP_MIN = 5.0


class GroupStatistics(NamedTuple):
    """Spec section 3: each group's statistics over its valid rows."""

    sum: np.ndarray  # (G,) S1_g
    sum_sq: np.ndarray  # (G,) S2_g
    rows: np.ndarray  # (G,) n_g
    mean: np.ndarray  # (G,) mean_g
    var: np.ndarray  # (G,) std_g^2, unbiased (n_g - 1), 0 for a single row


def group_statistics(batch: Batch) -> GroupStatistics:
    codes, num_groups = batch.codes, batch.num_groups
    rows = np.bincount(codes, weights=batch.valid, minlength=num_groups)
    total = np.bincount(codes, weights=batch.reward, minlength=num_groups)  # invalid rows hold reward 0
    total_sq = np.bincount(codes, weights=batch.reward * batch.reward, minlength=num_groups)
    mean = total / np.maximum(rows, 1.0)
    var = np.maximum((total_sq - total * mean) / np.maximum(rows - 1.0, 1.0), 0.0)
    return GroupStatistics(total, total_sq, rows, mean, var)


class Blend(NamedTuple):
    """Spec 5.1-5.3: what each group takes from its cluster's history, and the advantage of each row."""

    weight: np.ndarray  # (G,) w, 0 for a group without history
    has_history: np.ndarray  # (G,) bool: the group's cluster was seen before this call
    hist_var: np.ndarray  # (G,) v_k of the group's cluster (floored)
    floor_raised: np.ndarray  # (G,) bool: the variance floor raised that v_k
    scale: np.ndarray  # (G,) s_g, before any bound (it counts the groups with a signal)
    advantage: np.ndarray  # (B,) A_i, 0 on invalid rows


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
            self.metrics = CallSums.zeros(self.num_clusters).metrics(np.count_nonzero(self.moments.seen))
            return torch.zeros(0, dtype=out_dtype, device=out_device)

        groups = group_statistics(batch)
        blend = self._blend(batch, groups)
        sums = self._sums(batch, groups, blend)
        self._commit(sums.all_reduce() if sync else sums)

        advantage = blend.advantage
        advantage = torch.from_numpy(advantage.astype(np.float32) if out_dtype == torch.float32 else advantage)
        return advantage if out_device is None else advantage.to(out_device)

    def compute_token_level(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        group_ids: GroupIds,
        cluster_ids: torch.Tensor | np.ndarray,
        valid: torch.Tensor | np.ndarray | None = None,
        source_rows: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """verl's estimator face: (B, T) rewards and mask in, ``(advantages, returns)`` shaped like the mask.

        The sequence reward is the sum of token rewards, and the advantage is broadcast over the response
        tokens, as in verl's GRPO. Rows with an all-zero mask are padding.

        Args:
            source_rows: optional (B,) row indices: row i takes the advantage of row ``source_rows[i]``, and only
                rows that are their own source count in the statistics (verl's multi-output agent sessions, where
                only each session's final output counts).
        """
        try:
            counted = check_token_level(token_level_rewards, response_mask, valid, source_rows)
        except (ValueError, TypeError):
            self._reject_together()
            raise
        sequence = self.compute(token_level_rewards.sum(dim=-1), group_ids, cluster_ids, valid=counted)
        if source_rows is not None:
            sequence = sequence[torch.as_tensor(source_rows, device=sequence.device)]
        advantages = sequence.unsqueeze(-1) * response_mask
        return advantages, advantages

    # ------------------------------------------------------------------------------------------------- math
    def _blend(self, batch: Batch, groups: GroupStatistics) -> Blend:
        cfg, moments = self.config, self.moments

        # (5.1) The confidence weight of each group's cluster, from the history before this call.
        cluster_variance, floor_raised = self._history_variance()
        cluster = np.maximum(batch.group_cluster, 0)
        has_history = (batch.group_cluster >= 0) & moments.seen[cluster]
        weight = self._cluster_weights(cluster_variance)[cluster] * has_history  # w = 0 without history
        hist_mean, hist_var = moments.mean[cluster], cluster_variance[cluster]

        # (5.2) Blend baseline and variance; standardise.
        local_weight = 1.0 - weight
        baseline = weight * hist_mean + local_weight * groups.mean
        scale = np.sqrt(weight * hist_var + local_weight * groups.var)
        divisor = scale
        if cfg.bounded_scale_tau is not None:  # (companions spec 4) bounded BV-Blend: |A| <= 1
            tau = cfg.bounded_scale_tau
            divisor = bounded_blend_scale(batch.reward, batch.codes, baseline, scale, tau, batch.valid)
        advantage = (batch.reward - baseline[batch.codes]) / (divisor[batch.codes] + cfg.epsilon)

        # (5.3, 5.8) Guard against extreme advantages (not in the paper).
        bound = self._advantage_bound(batch, groups)
        if bound is not None:
            advantage = np.clip(advantage, -bound, bound)
        advantage = np.where(batch.valid, advantage, 0.0)
        return Blend(weight, has_history, hist_var, floor_raised[cluster] & has_history, scale, advantage)

    def _history_variance(self) -> tuple[np.ndarray, np.ndarray]:
        """(4, 5.8) v_k per cluster, and where the variance floor raised it.

        With ``variance_floor="prior"`` a cluster cannot look more certain than N_k samples of the prior variance
        allow: v_k = max(m2_k - m1_k^2, V_prior / max(N_k, delta_N)).
        """
        cfg, moments = self.config, self.moments
        variance = moments.variance()
        if cfg.variance_floor == "none":
            return variance, np.zeros(variance.shape, dtype=bool)
        floor = cfg.v_prior / np.maximum(moments.count, cfg.delta_n)
        return np.maximum(variance, floor), variance < floor

    def _advantage_bound(self, batch: Batch, groups: GroupStatistics) -> np.ndarray | float | None:
        """(5.8) The largest |A| allowed, per row for ``"auto"``: max(5, (n_g - 1) / sqrt(n_g)), the largest |A|
        that GRPO's standardisation can give a group of n_g rows, so a group without history is never clipped."""
        limit = self.config.max_abs_advantage
        if limit != AUTO:
            return limit
        rows = groups.rows
        return np.maximum(AUTO_CLIP_MIN, (rows - 1.0) / np.sqrt(np.maximum(rows, 1.0)))[batch.codes]

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

    # ----------------------------------------------------------------------------------- sums and commit
    def _sums(self, batch: Batch, groups: GroupStatistics, blend: Blend) -> CallSums:
        """(5.5) The call's per-cluster statistics, and the counts behind its metrics (spec 7)."""
        abs_advantage = np.abs(blend.advantage)
        group_sums = (groups.sum, groups.sum_sq, groups.rows)
        return CallSums(
            cluster_stats=cluster_statistics(batch.group_cluster, group_sums, self.num_clusters),
            groups=np.count_nonzero(groups.rows),
            effective_groups=np.count_nonzero(blend.scale > DEGENERATE),
            grpo_signal_groups=np.count_nonzero(groups.var > DEGENERATE**2),
            history_groups=np.count_nonzero(blend.has_history),
            floor_active_groups=np.count_nonzero(blend.floor_raised),
            weight_sum=blend.weight.sum(),
            hist_var_sum=(blend.hist_var * blend.has_history).sum(),
            rows=groups.rows.sum(),
            nonzero_rows=np.count_nonzero(abs_advantage > DEGENERATE),
            abs_advantage_max=abs_advantage.max() if abs_advantage.size else 0.0,
        )

    def _commit(self, sums: CallSums) -> None:
        """(5.6, 5.7) Fold the call into the history and keep its metrics, unless a rank failed or it overflows."""
        if sums.failed:
            raise ValueError(
                "Another rank's input for this call was rejected (its own error says why); no rank changed "
                "its BV-Blend state. Fix that input and call again on every rank."
            )
        if not all_true(np.isfinite(sums.cluster_stats)) or not math.isfinite(sums.abs_advantage_max):
            # Finite rewards so large that the sums or the advantages overflow: refuse before the history is poisoned.
            raise ValueError(TOO_LARGE)
        # Every call with a valid row ages every cluster; an empty call, or one of only padding rows, is a no-op.
        if sums.rows > 0:
            self.moments.fold(sums.cluster_stats)
            self.num_updates += 1
        self.metrics = sums.metrics(np.count_nonzero(self.moments.seen))

    def _reject_together(self) -> None:
        """On a rank whose input was rejected: join the call's collectives with a failure flag, if ranks sync, so
        that the other ranks raise too instead of waiting forever."""
        if should_sync(self.config.sync_across_ranks):
            CallSums.zeros(self.num_clusters, failed=True).all_reduce()

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

        A state saved before the stability options existed (format 1) was computed without a variance floor;
        under the current defaults it is refused with a message that names the options to continue it exactly.

        Args:
            allow_config_change: keep this estimator's config even if the state was saved under another one (the
                history carries over; only the formulas applied to it change).
            allow_num_clusters_change: adopt the state's K (this estimator is resized to it).
        """
        if state.get("format_version") not in READABLE_STATE_FORMATS:
            raise ValueError(
                f"Unsupported BV-Blend state format {state.get('format_version')!r}; "
                f"this version reads formats {READABLE_STATE_FORMATS}."
            )
        saved_k = state.get("num_clusters")
        if saved_k != self.num_clusters and not allow_num_clusters_change:
            raise ValueError(
                f"The saved BV-Blend state has K={saved_k} clusters but this estimator has K={self.num_clusters}: "
                "it was made with another codebook. Use the run's original codebook, or pass "
                "allow_num_clusters_change=True to adopt the saved K."
            )
        BVBlendConfig.from_mapping(options_as_saved(state.get("config")))  # a valid config, or a clear error
        mismatch = config_mismatch(state.get("config"), self.config.to_dict(), lambda name, value: f"{name}={value!r}")
        if mismatch and not allow_config_change:
            raise ValueError(
                f"The saved BV-Blend state was made with {mismatch} in BVBlendConfig, or pass "
                "allow_config_change=True to continue its history under the current options."
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
