"""The comparison configs of the companion methods (configs/paper/<name>.yaml; docs/companions.md, Configs).

Each inherits the paper's main run and changes only the keys listed here: the estimator (and its declared options),
the rollouts per prompt with the batch sizes that keep the main run's 128 trajectories per step, and the policy loss.
``bv_blend.paper.configs.COMPARISONS`` includes these entries.
"""

from __future__ import annotations

ESTIMATOR = frozenset({"algorithm.adv_estimator"})
BUDGET = frozenset(
    {"actor_rollout_ref.rollout.n", "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"}
)
NTF_LOSS = frozenset(
    f"actor_rollout_ref.actor.policy_loss.{key}" for key in ("_target_", "loss_mode", "ntf_keep_ratio")
)
HA_DW_OPTIONS = frozenset(
    f"algorithm.ha_dw.{key}"
    for key in ("lambda_scale", "mode", "window", "eta", "eta_min", "belief_window", "anchor", "reward_range",
                "epsilon", "allow_state_reset")
)  # fmt: skip
MAXNORM_OPTIONS = frozenset(
    f"algorithm.maxnorm.{key}" for key in ("numerator", "delta_res", "tau_res", "reward_range", "skip_zero_gap")
)

# name -> (what it is, the dotted keys it may change relative to the main run)
COMPANION_COMPARISONS: dict[str, tuple[str, frozenset[str]]] = {
    "ha_dw": ("HA-DW, lambda 1.3, window anchor (arXiv 2601.08521)", ESTIMATOR | HA_DW_OPTIONS),
    "maxnorm_rloo": ("MaxNorm-RLOO with the RRP, G = 16 (arXiv 2609.19164)", ESTIMATOR | BUDGET | MAXNORM_OPTIONS),
    "ntf_rfpp": ("REINFORCE++ at one rollout with negative token filtering (arXiv 2606.17250)",
                 ESTIMATOR | BUDGET | NTF_LOSS),
    "bv_blend_ntf": ("BV-Blend at one rollout with negative token filtering", BUDGET | NTF_LOSS),
}  # fmt: skip
