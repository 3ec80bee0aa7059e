"""Everything one call adds up, reduced across ranks in one buffer, and the metrics it gives (spec 5.5 and 7).

Each field declares how ranks combine it, by sum (the default) or by max (``core.sync.Reduced``). A new metric is one
new field here and one line in :meth:`CallSums.metrics`; packing for the all-reduce follows the fields, so nothing
else has to be kept in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bv_blend.core.sync import Reduced

# A group's scale, or a row's |A|, at or below this is "degenerate" in the metrics of spec section 7.
DEGENERATE = 1e-6


@dataclass
class CallSums(Reduced):
    """One call's sums over its groups and valid rows.

    Attributes:
        cluster_stats: (3, K) sufficient statistics S1, S2, n per cluster (moments.SUM, SUM_SQ, COUNT).
        groups: groups with at least one valid row.
        effective_groups: groups whose blended scale s_g > DEGENERATE.
        grpo_signal_groups: groups whose own std_g > DEGENERATE (what GRPO would have had).
        history_groups: groups whose cluster has history (w may be > 0).
        floor_active_groups: groups with history whose v_k the variance floor raised.
        weight_sum: sum of the groups' weights w.
        hist_var_sum: sum of v_k (floored) over the groups with history.
        prompt_history_groups: groups whose prompt has history (history_spec 3; 0 at the cluster level).
        prompt_weight_sum: sum of the groups' prompt weights w_p.
        rows: valid rows.
        nonzero_rows: rows with |A| > DEGENERATE.
        abs_advantage_max: the largest |A| (reduced by max).
        failed: 1 on a rank whose input was rejected, so that every rank learns of it in the same call.
    """

    cluster_stats: np.ndarray
    groups: float
    effective_groups: float
    grpo_signal_groups: float
    history_groups: float
    floor_active_groups: float
    weight_sum: float
    hist_var_sum: float
    prompt_history_groups: float
    prompt_weight_sum: float
    rows: float
    nonzero_rows: float
    abs_advantage_max: float = field(default=0.0, metadata={"reduce": "max"})
    failed: float = 0.0

    @classmethod
    def zeros(cls, num_clusters: int, failed: bool = False) -> CallSums:
        """The sums of a call without rows (an empty batch, or a rank whose input was rejected)."""
        scalars = dict.fromkeys((name for name in cls.reduced_by("sum") if name != "cluster_stats"), 0.0)
        return cls(cluster_stats=np.zeros((3, num_clusters)), **{**scalars, "failed": float(failed)})

    def metrics(self, clusters_seen: int, prompts_tracked: int | None = None) -> dict[str, float]:
        """The ``bv_blend/*`` metrics of spec section 7 (and history_spec 3 with ``prompts_tracked``), as floats."""
        groups, rows, history = max(float(self.groups), 1.0), max(float(self.rows), 1.0), float(self.history_groups)
        prompt_level = {} if prompts_tracked is None else {
            "bv_blend/prompt_weight_mean": float(self.prompt_weight_sum) / groups,
            "bv_blend/prompt_seen_ratio": float(self.prompt_history_groups) / groups,
            "bv_blend/prompts_tracked": float(prompts_tracked),
        }  # fmt: skip
        return prompt_level | {
            "bv_blend/effective_signal_ratio": float(self.effective_groups) / groups,
            "bv_blend/grpo_signal_ratio": float(self.grpo_signal_groups) / groups,
            "bv_blend/zero_variance_group_ratio": float(self.groups - self.grpo_signal_groups) / groups,
            "bv_blend/nonzero_advantage_ratio": float(self.nonzero_rows) / rows,
            "bv_blend/weight_mean": float(self.weight_sum) / groups,
            "bv_blend/cold_start_group_ratio": float(self.groups - self.history_groups) / groups,
            "bv_blend/clusters_seen": float(clusters_seen),
            "bv_blend/hist_var_mean": float(self.hist_var_sum) / history if history > 0 else 0.0,
            "bv_blend/abs_advantage_max": float(self.abs_advantage_max),
            "bv_blend/variance_floor_active_ratio": float(self.floor_active_groups) / history if history > 0 else 0.0,
        }


__all__ = ["DEGENERATE", "CallSums"]
