"""`BVBlendEstimator`: the BV-Blend advantage, exactly as the spec defines it (docs/estimator.md).

One call, for rows i in groups g of clusters k and prompts p (section numbers are the spec's; H3 is history_spec 3):

    (3)   mean_g, std_g^2 over the group's valid rows (unbiased; std_g = 0 for a single row)
    (5.8) v_k   = max(m2_k - m1_k^2, V_prior / max(N_k, delta_N))     (variance_floor="prior"; "none": no floor)
    (5.1) w_k   = exp(-SEM_k / T),  SEM_k = sqrt(v_k / max(N_k, delta_N));  w = 0 for unseen clusters or c = -1
    (5.2) b_g   = w m1_k + (1 - w) mean_g
          s_g^2 = w v_k  + (1 - w) std_g^2
    (H3)  with a prompt level, the prompt's own moments are blended over that, with w_p from (N_p, m1_p, m2_p) as w_k:
          b_g <- w_p m1_p + (1 - w_p) b_g,   s_g^2 <- w_p v_p + (1 - w_p) s_g^2   (history_level="prompt": no cluster)
          A_i   = (R_i - b_g) / (s_g + eps)
    (C4)  s_g  <- max(s_g, max_i |R_i - b_g|, tau)  (bounded_scale_tau=tau, companions spec 4; off by default)
    (5.8) |A_i| <= max(5, (n_g - 1) / sqrt(n_g))                         (max_abs_advantage="auto"; or a number)
    (5.5) S1_k, S2_k, n_k over the call's valid rows, all-reduced across ranks
    (5.6, 5.7) cold start, then the EMA update of (N, m1, m2) per cluster (every call) and per prompt (per visit)

The advantages use the history of earlier calls only; the call's rewards are folded in afterwards.
No Python loop runs over rows, groups or clusters. Tensors come in and go out, and the state is saved and synced
as tensors; the arithmetic in between is float64 numpy on the host (docs/estimator.md, "Speed"). The rows are
checked by ``bv_blend.core.rows``, the group statistics are ``bv_blend.core.groups``', and the call's sums and
metrics are ``bv_blend.blend.sums``'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from bv_blend.blend.bounded import bounded_blend_scale
from bv_blend.blend.config import AUTO, BVBlendConfig
from bv_blend.blend.moments import NO_CLUSTER, ClusterMoments, PromptMoments, cluster_statistics
from bv_blend.blend.sums import DEGENERATE, CallSums
from bv_blend.core.groups import GroupStats, group_stats
from bv_blend.core.options import check_state_config, check_state_count, check_state_format
from bv_blend.core.rows import TOO_LARGE, GroupIds, Rows, host_array, per_group, read_rows, to_tensor, token_level
from bv_blend.core.sync import all_gather, should_sync
from bv_blend.history.keys import group_prompt_keys
from bv_blend.history.table import group_visits

# 3: the state holds the prompt table (history_spec 3). 2: the config holds variance_floor.
STATE_FORMAT_VERSION = 3
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
            "with `bv-blend codebook`, or set num_clusters to the codebook's K."
        )
    return per_group(rows, clusters.astype(np.int64, copy=False), NO_CLUSTER, "clusters")


class History(NamedTuple):
    """What each group takes from one history level (spec 5.1 for clusters, history_spec 3 for prompts)."""

    weight: np.ndarray  # (G,) w, 0 for a group without history at this level
    has_history: np.ndarray  # (G,) bool
    mean: np.ndarray  # (G,) m1
    var: np.ndarray  # (G,) v (floored)
    floor_raised: np.ndarray  # (G,) bool: the variance floor raised v


class Blend(NamedTuple):
    """Spec 5.1-5.3: what each group takes from its histories, and the advantage of each row."""

    cluster: History
    prompt: History | None
    scale: np.ndarray  # (G,) s_g, before any bound (it counts the groups with a signal)
    advantage: np.ndarray  # (B,) A_i, 0 on invalid rows


class GroupTrace(NamedTuple):
    """What each group of the last call took from its histories (for the group record, ``bv_blend.verl.group_record``):
    read after the call, it is the state before that call's update, as the advantages used it."""

    group_ids: list[str]  # (G,) each group's id (verl's uid), in order of first appearance
    cluster: np.ndarray  # (G,) cluster id, -1 for none
    history_mean: np.ndarray  # (G,) the cluster history's m1 (0 without history)
    history_weight: np.ndarray  # (G,) its confidence weight w
    prompt_mean: np.ndarray | None  # (G,) the prompt's own history, at the prompt levels
    prompt_weight: np.ndarray | None

    def by_group(self) -> dict[str, dict[str, float]]:
        """group id -> the figures of its group (the cluster level's only where the call read clusters)."""
        columns = {"history_mean": self.history_mean, "history_weight": self.history_weight}
        if self.prompt_mean is not None:
            columns |= {"prompt_history_mean": self.prompt_mean, "prompt_history_weight": self.prompt_weight}
        return {uid: {name: float(values[g]) for name, values in columns.items()}
                for g, uid in enumerate(self.group_ids)}


class BVBlendEstimator:
    """Cluster- (and prompt-) conditioned EMA baselines blended with the prompt-local one, weighted by confidence.

    Args:
        num_clusters: K, the number of clusters in the codebook. Cluster ids are 0..K-1, or -1 for none. ``None`` only
            with ``history_level="prompt"``, which needs no codebook.
        config: the parameters; defaults to ``BVBlendConfig()``.
    """

    def __init__(self, num_clusters: int | None, config: BVBlendConfig | None = None) -> None:
        self.config = config if config is not None else BVBlendConfig()
        if not isinstance(self.config, BVBlendConfig):
            raise TypeError(f"config must be a BVBlendConfig, got {type(self.config).__name__}.")
        if num_clusters is None and self.config.uses_clusters:
            raise ValueError(f"history_level={self.config.history_level} needs num_clusters (the codebook's K).")
        cfg = self.config
        self.moments = ClusterMoments(num_clusters or 1, cfg.gamma, cfg.n0, cfg.v_prior)
        self.prompts = PromptMoments(cfg.prompt_decay, cfg.n0, cfg.v_prior)
        self.num_updates = 0
        self.metrics: dict[str, float] = {}
        self.last_groups: GroupTrace | None = None

    @property
    def num_clusters(self) -> int:
        return self.moments.num_clusters

    # ------------------------------------------------------------------------------------------------ faces
    def compute(
        self,
        rewards: torch.Tensor,
        group_ids: GroupIds,
        cluster_ids: torch.Tensor | np.ndarray | None = None,
        valid: torch.Tensor | np.ndarray | None = None,
        prompt_keys: Sequence[str] | np.ndarray | None = None,
    ) -> torch.Tensor:
        """Sequence-level advantages, one per row, then fold the valid rows into the history.

        Args:
            rewards: (B,) float rewards R_i.
            group_ids: (B,) prompt-group ids: uid strings (a numpy object array, as verl passes them) or ints.
            cluster_ids: (B,) integer cluster of each row's prompt, -1 for none; not read at ``history_level=prompt``.
            valid: optional (B,) bool; False marks padding rows. Rows whose uid starts with "pad" are
                padding too. Padding rows get advantage 0 and change no statistic.
            prompt_keys: (B,) each row's prompt key (history_spec 1); required at the prompt levels.

        Returns:
            (B,) advantages on the device of ``rewards``, in its dtype promoted to at least float32 (so that a
            float16 reward cannot overflow). The state lives on the CPU.

        Raises:
            ValueError: NaN or infinite rewards, cluster ids outside -1..K-1, a group mixing clusters or prompt keys,
                a missing input of the history level, or inputs of different lengths. The state is left exactly as it
                was.
        """
        cfg = self.config
        sync = should_sync(cfg.sync_across_ranks)
        try:
            clusters, keys = self._level_inputs(cluster_ids, prompt_keys)
            rows = read_rows(rewards, group_ids, valid, cluster_ids=clusters, prompt_keys=keys)
            group_cluster = (group_clusters(rows, clusters, self.num_clusters) if clusters is not None
                             else np.full(rows.num_groups, NO_CLUSTER))  # fmt: skip
            group_key = group_prompt_keys(rows, keys, "BV-Blend") if keys is not None else None
        except (ValueError, TypeError):
            self._reject_together()
            raise
        if rows.codes.size == 0 and not sync:
            # An empty batch is a no-op: no history ages, and the last call's metrics are replaced.
            self.metrics = CallSums.zeros(self.num_clusters).metrics(*self._sizes())
            return to_tensor(np.zeros(0), rewards)

        groups = group_stats(rows)
        blend = self._blend(rows, groups, group_cluster, group_key)
        self.last_groups = _trace(rows, group_ids, group_cluster, blend)
        sums = self._sums(groups, group_cluster, blend)
        if sync:
            sums = sums.all_reduce()
            if sums.failed:  # before the prompt levels' gather, which the rank that failed does not join
                raise ValueError(
                    "Another rank's input for this call was rejected (its own error says why); no rank changed "
                    "its BV-Blend state. Fix that input and call again on every rank."
                )
        visits = self._prompt_visits(groups, group_key, sync) if group_key is not None else None
        self._commit(sums, visits)
        return to_tensor(blend.advantage, rewards)

    def compute_token_level(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        group_ids: GroupIds,
        cluster_ids: torch.Tensor | np.ndarray | None = None,
        valid: torch.Tensor | np.ndarray | None = None,
        source_rows: np.ndarray | None = None,
        prompt_keys: Sequence[str] | np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """verl's estimator face: (B, T) rewards and mask in, ``(advantages, returns)`` shaped like the mask.

        The sequence reward is the sum of token rewards, and the advantage is broadcast over the response
        tokens, as in verl's GRPO. Rows with an all-zero mask are padding.

        Args:
            source_rows: optional (B,) row indices: row i takes the advantage of row ``source_rows[i]``, and only
                rows that are their own source count in the statistics (verl's multi-output agent sessions, where
                only each session's final output counts).
        """

        def sequence(rewards: torch.Tensor, counted: np.ndarray) -> torch.Tensor:
            return self.compute(rewards, group_ids, cluster_ids, valid=counted, prompt_keys=prompt_keys)

        return token_level(sequence, token_level_rewards, response_mask, valid, source_rows, self._reject_together)

    def success_estimates(
        self, keys: Sequence[str] | np.ndarray, cluster_ids: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(p^, known) per prompt key, for the prompt sampler (history_spec 5): the prompt's mean m1_p (at the prompt
        levels), else its cluster's m1_k (at the cluster levels, where ``cluster_ids`` are given); 0.5 and
        ``known=False`` for a prompt that neither history has seen."""
        p_hat = np.full(len(keys), np.nan)
        if self.config.uses_prompts:
            _, mean, _, seen = self.prompts.lookup(keys)
            p_hat = np.where(seen, mean, p_hat)
        if self.config.uses_clusters and cluster_ids is not None:
            clusters = np.asarray(cluster_ids, dtype=np.int64)
            in_range = (clusters >= 0) & (clusters < self.num_clusters)
            safe = np.where(in_range, clusters, 0)
            seen = in_range & self.moments.seen[safe]
            p_hat = np.where(np.isnan(p_hat) & seen, self.moments.mean[safe], p_hat)
        known = ~np.isnan(p_hat)
        return np.where(known, p_hat, 0.5), known

    def warm_start(
        self, prompt_scores: Mapping[str, Sequence[float]], prompt_clusters: Mapping[str, int] | None = None
    ) -> None:
        """Start the history from offline prior scores (history_spec 4), before the first call.

        At the prompt levels each prompt in ``prompt_scores`` starts with N_p = min(N, n0_prior) and the mean and mean
        square of its scores; at the cluster levels each cluster starts from the pooled scores of its prompts
        (``prompt_clusters``: prompt key -> cluster id) with N_k = n0_prior.
        """
        if self.num_updates:
            raise ValueError("warm_start sets the history before training: this estimator has folded calls already.")
        cfg = self.config
        if cfg.uses_prompts:
            keys = list(prompt_scores)
            self.prompts.warm_start(keys, [np.asarray(prompt_scores[k], dtype=np.float64) for k in keys], cfg.n0_prior)
        if cfg.uses_clusters and prompt_clusters:
            pooled = np.zeros((3, self.num_clusters))
            for key, scores in prompt_scores.items():
                cluster = prompt_clusters.get(key)
                if cluster is None or not 0 <= cluster < self.num_clusters:
                    continue  # a prompt no training row has, or without a cluster: counted by the caller
                values = np.asarray(scores, dtype=np.float64)
                pooled[:, cluster] += (values.sum(), (values * values).sum(), values.size)
            self.moments.warm_start(pooled, cfg.n0_prior)

    # ------------------------------------------------------------------------------------------------- math
    def _blend(self, rows: Rows, groups: GroupStats, group_cluster: np.ndarray, group_key: np.ndarray | None) -> Blend:
        cfg, moments = self.config, self.moments

        # (5.1) The confidence weight of each group's cluster, from the history before this call.
        cluster = np.maximum(group_cluster, 0)
        has_cluster = (group_cluster >= 0) & moments.seen[cluster]
        variance, raised = self._floored(moments.variance(), moments.count)
        weight = self._weights(variance, moments.count)[cluster] * has_cluster  # w = 0 without history
        hist_mean, hist_var = moments.mean[cluster], variance[cluster]
        by_cluster = History(weight, has_cluster, hist_mean, hist_var, raised[cluster] & has_cluster)

        # (5.2) Blend baseline and variance.
        baseline = weight * by_cluster.mean + (1.0 - weight) * groups.mean
        scale_sq = weight * by_cluster.var + (1.0 - weight) * groups.var

        # (H3) The prompt's own history, blended over that (from the state before this call, per visit).
        by_prompt = None
        if group_key is not None:
            count, mean, second, seen = self.prompts.lookup(group_key)
            prompt_var, prompt_raised = self._floored(np.maximum(second - mean * mean, 0.0), count)
            prompt_weight = self._weights(prompt_var, count) * seen
            by_prompt = History(prompt_weight, seen, mean, prompt_var, prompt_raised & seen)
            baseline = prompt_weight * mean + (1.0 - prompt_weight) * baseline
            scale_sq = prompt_weight * prompt_var + (1.0 - prompt_weight) * scale_sq

        # Standardise; (C4) bounded BV-Blend: |A| <= 1.
        scale = np.sqrt(scale_sq)
        divisor = scale
        if cfg.bounded_scale_tau is not None:
            divisor = bounded_blend_scale(rows.reward, rows.codes, baseline, scale, cfg.bounded_scale_tau, rows.valid)
        advantage = (rows.reward - baseline[rows.codes]) / (divisor[rows.codes] + cfg.epsilon)

        # (5.3, 5.8) Guard against extreme advantages (not in the paper).
        bound = self._advantage_bound(rows, groups)
        if bound is not None:
            advantage = np.clip(advantage, -bound, bound)
        advantage = np.where(rows.valid, advantage, 0.0)
        return Blend(by_cluster, by_prompt, scale, advantage)

    def _floored(self, variance: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(4, 5.8) v per cluster or prompt, and where the variance floor raised it.

        With ``variance_floor="prior"`` a history cannot look more certain than N samples of the prior variance
        allow: v = max(m2 - m1^2, V_prior / max(N, delta_N)).
        """
        cfg = self.config
        if cfg.variance_floor == "none":
            return variance, np.zeros(variance.shape, dtype=bool)
        floor = cfg.v_prior / np.maximum(count, cfg.delta_n)
        return np.maximum(variance, floor), variance < floor

    def _weights(self, variance: np.ndarray, count: np.ndarray) -> np.ndarray:
        """w of the configured weight mode (spec 5.1), before masking histories that were never seen."""
        cfg = self.config
        floored_count = np.maximum(count, cfg.delta_n)
        if cfg.weight_mode == "sem":
            return np.exp(-np.sqrt(variance / floored_count) / cfg.temperature)
        if cfg.weight_mode == "neff":
            return np.exp(-np.sqrt(cfg.v_prior / floored_count) / cfg.temperature)
        if cfg.weight_mode == "sigma":
            return np.exp(-np.sqrt(variance) / cfg.temperature)
        return np.full_like(count, cfg.fixed_weight)

    def _advantage_bound(self, rows: Rows, groups: GroupStats) -> np.ndarray | float | None:
        """(5.8) The largest |A| allowed, per row for ``"auto"``: max(5, (n_g - 1) / sqrt(n_g)), the largest |A|
        that GRPO's standardisation can give a group of n_g rows, so a group without history is never clipped."""
        limit = self.config.max_abs_advantage
        if limit != AUTO:
            return limit
        count = groups.count
        return np.maximum(AUTO_CLIP_MIN, (count - 1.0) / np.sqrt(np.maximum(count, 1.0)))[rows.codes]

    # ----------------------------------------------------------------------------------- sums and commit
    def _level_inputs(self, cluster_ids: Any, prompt_keys: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The per-row inputs the history level reads, checked: cluster ids (not at ``prompt``) and prompt keys."""
        cfg, clusters, keys = self.config, None, None
        if cfg.uses_clusters:
            if cluster_ids is None:
                raise ValueError(f"history_level={cfg.history_level} needs cluster_ids (each row's prompt's cluster).")
            clusters = host_array(cluster_ids)
            if clusters.ndim != 1 or clusters.dtype.kind not in "iu":
                raise ValueError(
                    f"cluster_ids must be a 1-D integer tensor or array, got "
                    f"{getattr(cluster_ids, 'dtype', clusters.dtype)} {clusters.shape}."
                )
        if cfg.uses_prompts:
            if prompt_keys is None:
                raise ValueError(
                    f"history_level={cfg.history_level} needs prompt_keys (each row's prompt key, history_spec 1; "
                    "in verl the trainer hooks pass them). Pass them, or use history_level=cluster."
                )
            keys = np.asarray(prompt_keys, dtype=object)
        return clusters, keys

    def _sums(self, groups: GroupStats, group_cluster: np.ndarray, blend: Blend) -> CallSums:
        """(5.5) The call's per-cluster statistics, and the counts behind its metrics (spec 7)."""
        abs_advantage, by_cluster, by_prompt = np.abs(blend.advantage), blend.cluster, blend.prompt
        group_sums = (groups.total, groups.total_sq, groups.count)
        present = groups.count > 0
        return CallSums(
            cluster_stats=cluster_statistics(group_cluster, group_sums, self.num_clusters),
            groups=np.count_nonzero(present),
            effective_groups=np.count_nonzero(blend.scale > DEGENERATE),
            grpo_signal_groups=np.count_nonzero(groups.var > DEGENERATE**2),
            history_groups=np.count_nonzero(by_cluster.has_history),
            floor_active_groups=np.count_nonzero(by_cluster.floor_raised),
            weight_sum=by_cluster.weight.sum(),
            hist_var_sum=(by_cluster.var * by_cluster.has_history).sum(),
            prompt_history_groups=0 if by_prompt is None else np.count_nonzero(by_prompt.has_history & present),
            prompt_weight_sum=0.0 if by_prompt is None else (by_prompt.weight * present).sum(),
            rows=groups.count.sum(),
            nonzero_rows=np.count_nonzero(abs_advantage > DEGENERATE),
            abs_advantage_max=abs_advantage.max() if abs_advantage.size else 0.0,
        )

    def _prompt_visits(self, groups: GroupStats, group_key: np.ndarray, sync: bool) -> tuple[list[str], np.ndarray]:
        """(H3) The call's visits, one per prompt key: the keys and their (3, n) sums S1, S2, n (all ranks')."""
        present = groups.count > 0
        sums = (groups.total[present], groups.total_sq[present], groups.count[present])
        keys, stats, _ = group_visits(group_key[present], sums)
        if sync:  # every rank ends the call with the same prompt table
            gathered = all_gather((keys, stats.tolist()))
            all_keys = np.array([key for part, _ in gathered for key in part], dtype=object)
            all_stats = np.concatenate([np.asarray(values).reshape(3, -1) for _, values in gathered], axis=1)
            keys, stats, _ = group_visits(all_keys, tuple(all_stats))
        return keys, stats

    def _commit(self, sums: CallSums, visits: tuple[list[str], np.ndarray] | None) -> None:
        """(5.6, 5.7) Fold the call into the history and keep its metrics, unless it overflows."""
        if not np.isfinite(sums.cluster_stats).all() or not math.isfinite(sums.abs_advantage_max):
            # Finite rewards so large that the sums or the advantages overflow: refuse before the history is poisoned.
            raise ValueError(TOO_LARGE)
        # Every call with a valid row ages every cluster; an empty call, or one of only padding rows, is a no-op.
        if sums.rows > 0:
            self.moments.fold(sums.cluster_stats)
            if visits is not None and visits[0]:
                self.prompts.fold(*visits)
            self.num_updates += 1
        self.metrics = sums.metrics(*self._sizes())

    def _sizes(self) -> tuple[int, int | None]:
        """Clusters seen, and prompts tracked (``None`` at the cluster level: no prompt metrics)."""
        return np.count_nonzero(self.moments.seen), len(self.prompts) if self.config.uses_prompts else None

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
            "prompts": self.prompts.state_dict(),
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
        prompts = state.get("prompts")
        if not isinstance(prompts, Mapping):
            raise ValueError("BV-Blend state has no 'prompts' table; it was not written by BVBlendEstimator.")
        prompt_keys, prompt_values = self.prompts.validated(prompts)
        target = self.moments
        if saved_k != self.num_clusters:
            target = ClusterMoments(saved_k, self.config.gamma, self.config.n0, self.config.v_prior)
        target.load_state_dict(state)  # validates shapes and values first, then assigns
        self.prompts.table.load(prompt_keys, prompt_values)
        self.moments, self.num_updates = target, num_updates


def _trace(rows: Rows, group_ids: GroupIds, group_cluster: np.ndarray, blend: Blend) -> GroupTrace:
    """The call's groups with what each took from its histories, ids in the order of the rows' group codes."""
    _, first_row = np.unique(rows.codes, return_index=True)  # codes are 0..G-1 in order of first appearance
    ids = [str(uid) for uid in np.asarray(group_ids, dtype=object)[first_row]]
    cluster, prompt = blend.cluster, blend.prompt  # a level without history has weight 0; its mean reads 0
    return GroupTrace(ids, group_cluster, cluster.mean * cluster.has_history, cluster.weight,
                      None if prompt is None else prompt.mean * prompt.has_history,
                      None if prompt is None else prompt.weight)


__all__ = ["STATE_FORMAT_VERSION", "BVBlendEstimator", "GroupTrace", "bounded_blend_scale", "group_clusters"]
