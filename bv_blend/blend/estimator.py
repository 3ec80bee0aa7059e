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
as tensors; the arithmetic in between is float64 numpy on the host (docs/estimator.md, "Speed"). The rows are
checked by ``bv_blend.core.rows``, the group statistics are ``bv_blend.core.groups``', and the call's sums and
metrics are ``bv_blend.blend.sums``'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from bv_blend.blend.config import AUTO, BVBlendConfig
from bv_blend.blend.moments import NO_CLUSTER, ClusterMoments, cluster_statistics
from bv_blend.blend.sums import DEGENERATE, CallSums
from bv_blend.core.groups import GroupStats, group_max, group_stats
from bv_blend.core.options import check_state_config, check_state_count, check_state_format
from bv_blend.core.rows import TOO_LARGE, GroupIds, Rows, host_array, per_group, read_rows, read_token_rows, to_tensor
from bv_blend.core.sync import should_sync

STATE_FORMAT_VERSION = 2
# max_abs_advantage="auto" clips a group of n rows at max(AUTO_CLIP_MIN, (n - 1) / sqrt(n)) (spec 5 step 8).
AUTO_CLIP_MIN = 5.0


def group_clusters(rows: Rows, cluster_ids: torch.Tensor | np.ndarray, num_clusters: int) -> np.ndarray:
    """(G,) each group's cluster: the one its valid rows carry, -1 for none (or no valid row); they must agree."""
    clusters = host_array(cluster_ids)
    out_of_range = rows.valid & ((clusters < NO_CLUSTER) | (clusters >= num_clusters))
    if out_of_range.any():
        row = int(np.flatnonzero(out_of_range)[0])
        raise ValueError(
            f"Cluster id {int(clusters[row])} (row {row}) is outside -1..{num_clusters - 1}: the data "
            f"was annotated with another codebook than this estimator's K={num_clusters}. Re-annotate it "
            "with scripts/build_codebook.py, or set num_clusters to the codebook's K."
        )
    return per_group(rows, clusters.astype(np.int64, copy=False), NO_CLUSTER, "clusters")


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
        sync = should_sync(self.config.sync_across_ranks)
        try:
            clusters = host_array(cluster_ids)
            if clusters.ndim != 1 or clusters.dtype.kind not in "iu":
                raise ValueError(
                    f"cluster_ids must be a 1-D integer tensor or array, got "
                    f"{getattr(cluster_ids, 'dtype', clusters.dtype)} {clusters.shape}."
                )
            rows = read_rows(rewards, group_ids, valid, cluster_ids=clusters)
            group_cluster = group_clusters(rows, clusters, self.num_clusters)
        except (ValueError, TypeError):
            self._reject_together()
            raise
        if rows.codes.size == 0 and not sync:
            # An empty batch is a no-op: no history ages, and the last call's metrics are replaced.
            self.metrics = CallSums.zeros(self.num_clusters).metrics(np.count_nonzero(self.moments.seen))
            return to_tensor(np.zeros(0), rewards)

        groups = group_stats(rows)
        blend = self._blend(rows, groups, group_cluster)
        sums = self._sums(groups, group_cluster, blend)
        self._commit(sums.all_reduce() if sync else sums)
        return to_tensor(blend.advantage, rewards)

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
            sequence_rewards, counted = read_token_rows(token_level_rewards, response_mask, valid, source_rows)
        except (ValueError, TypeError):
            self._reject_together()
            raise
        sequence = self.compute(sequence_rewards, group_ids, cluster_ids, valid=counted)
        if source_rows is not None:
            sequence = sequence[torch.as_tensor(source_rows, device=sequence.device)]
        advantages = sequence.unsqueeze(-1) * response_mask
        return advantages, advantages

    # ------------------------------------------------------------------------------------------------- math
    def _blend(self, rows: Rows, groups: GroupStats, group_cluster: np.ndarray) -> Blend:
        cfg, moments = self.config, self.moments

        # (5.1) The confidence weight of each group's cluster, from the history before this call.
        cluster_variance, floor_raised = self._history_variance()
        cluster = np.maximum(group_cluster, 0)
        has_history = (group_cluster >= 0) & moments.seen[cluster]
        weight = self._cluster_weights(cluster_variance)[cluster] * has_history  # w = 0 without history
        hist_mean, hist_var = moments.mean[cluster], cluster_variance[cluster]

        # (5.2) Blend baseline and variance; standardise.
        local_weight = 1.0 - weight
        baseline = weight * hist_mean + local_weight * groups.mean
        scale = np.sqrt(weight * hist_var + local_weight * groups.var)
        divisor = scale
        if cfg.bounded_scale_tau is not None:  # (companions spec 4) bounded BV-Blend: |A| <= 1
            divisor = bounded_blend_scale(rows.reward, rows.codes, baseline, scale, cfg.bounded_scale_tau, rows.valid)
        advantage = (rows.reward - baseline[rows.codes]) / (divisor[rows.codes] + cfg.epsilon)

        # (5.3, 5.8) Guard against extreme advantages (not in the paper).
        bound = self._advantage_bound(rows, groups)
        if bound is not None:
            advantage = np.clip(advantage, -bound, bound)
        advantage = np.where(rows.valid, advantage, 0.0)
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

    def _advantage_bound(self, rows: Rows, groups: GroupStats) -> np.ndarray | float | None:
        """(5.8) The largest |A| allowed, per row for ``"auto"``: max(5, (n_g - 1) / sqrt(n_g)), the largest |A|
        that GRPO's standardisation can give a group of n_g rows, so a group without history is never clipped."""
        limit = self.config.max_abs_advantage
        if limit != AUTO:
            return limit
        count = groups.count
        return np.maximum(AUTO_CLIP_MIN, (count - 1.0) / np.sqrt(np.maximum(count, 1.0)))[rows.codes]

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
    def _sums(self, groups: GroupStats, group_cluster: np.ndarray, blend: Blend) -> CallSums:
        """(5.5) The call's per-cluster statistics, and the counts behind its metrics (spec 7)."""
        abs_advantage = np.abs(blend.advantage)
        group_sums = (groups.total, groups.total_sq, groups.count)
        return CallSums(
            cluster_stats=cluster_statistics(group_cluster, group_sums, self.num_clusters),
            groups=np.count_nonzero(groups.count),
            effective_groups=np.count_nonzero(blend.scale > DEGENERATE),
            grpo_signal_groups=np.count_nonzero(groups.var > DEGENERATE**2),
            history_groups=np.count_nonzero(blend.has_history),
            floor_active_groups=np.count_nonzero(blend.floor_raised),
            weight_sum=blend.weight.sum(),
            hist_var_sum=(blend.hist_var * blend.has_history).sum(),
            rows=groups.count.sum(),
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
        if not np.isfinite(sums.cluster_stats).all() or not math.isfinite(sums.abs_advantage_max):
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

        Args:
            allow_config_change: keep this estimator's config even if the state was saved under another one (the
                history carries over; only the formulas applied to it change).
            allow_num_clusters_change: adopt the state's K (this estimator is resized to it).
        """
        saved_config = check_state_format(state, "BV-Blend", STATE_FORMAT_VERSION)
        saved_k = state.get("num_clusters")
        if saved_k != self.num_clusters and not allow_num_clusters_change:
            raise ValueError(
                f"The saved BV-Blend state has K={saved_k} clusters but this estimator has K={self.num_clusters}: "
                "it was made with another codebook. Use the run's original codebook, or pass "
                "allow_num_clusters_change=True to adopt the saved K."
            )
        check_state_config(saved_config, self.config, "BV-Blend", allow_config_change)
        num_updates = check_state_count(state, "BV-Blend")
        target = self.moments
        if saved_k != self.num_clusters:
            target = ClusterMoments(saved_k, self.config.gamma, self.config.n0, self.config.v_prior)
        target.load_state_dict(state)  # validates shapes and values first, then assigns
        self.moments, self.num_updates = target, num_updates


__all__ = ["STATE_FORMAT_VERSION", "BVBlendEstimator", "bounded_blend_scale", "group_clusters"]
