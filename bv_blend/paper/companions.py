"""The comparison configs of the companion methods and of the history family (SPO, BV-Blend's prompt level):
configs/paper/<name>.yaml (docs/companions.md and docs/history.md).

Each inherits the paper's main run and changes only the keys listed here: the estimator (and its declared options),
the rollouts per prompt with the batch sizes that keep the main run's 128 trajectories per step, and the policy loss.
``bv_blend.paper.configs.COMPARISONS`` includes these entries.
"""

from __future__ import annotations

ESTIMATOR = frozenset({"algorithm.adv_estimator"})
BUDGET = frozenset(
    {"actor_rollout_ref.rollout.n", "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"}
)
SAMPLER = frozenset({"data.history_sampler.enable", "data.dataloader_num_workers"})
NTF_LOSS = frozenset(
    f"actor_rollout_ref.actor.policy_loss.{key}" for key in ("_target_", "loss_mode", "ntf_keep_ratio")
)


def section_keys(estimator: str) -> frozenset[str]:
    """Every option of an estimator's section, dotted (``algorithm.ha_dw.lambda_scale``, ...), from its record."""
    from bv_blend.verl.records import BY_NAME

    record = BY_NAME[estimator]
    return frozenset(f"{record.option_section}.{key}" for key in record.options_class().defaults())


# name -> (what it is, the dotted keys it may change relative to the main run)
COMPANION_COMPARISONS: dict[str, tuple[str, frozenset[str]]] = {
    "ha_dw": ("HA-DW, lambda 1.3, window anchor (arXiv 2601.08521)", ESTIMATOR | section_keys("ha_dw")),
    "maxnorm_rloo": ("MaxNorm-RLOO with the RRP, G = 16 (arXiv 2609.19164)",
                     ESTIMATOR | BUDGET | section_keys("maxnorm_ac")),
    "ntf_rfpp": ("REINFORCE++ at one rollout with negative token filtering (arXiv 2606.17250)",
                 ESTIMATOR | BUDGET | NTF_LOSS),
    "bv_blend_ntf": ("BV-Blend at one rollout with negative token filtering", BUDGET | NTF_LOSS),
    "reinforce_pp_n1": ("verl's REINFORCE++ at one rollout, 128 prompts: the batch mean as baseline, no history",
                        ESTIMATOR | BUDGET),
    "spo": ("SPO at one rollout, 128 prompts (arXiv 2509.13232)", ESTIMATOR | BUDGET | section_keys("spo")),
    "bv_blend_n2": ("BV-Blend's cluster level at two rollouts, 64 prompts (the measured arm)", BUDGET),
    "bv_blend_n2_priors": ("bv_blend_n2 at prompt_and_cluster, started from offline priors",
                           BUDGET | {"algorithm.bv_blend.history_level", "algorithm.bv_blend.prior_file"}),
    "bv_blend_n2_sampler": ("bv_blend_n2 at prompt_and_cluster with the history-driven prompt sampler",
                            BUDGET | {"algorithm.bv_blend.history_level"} | SAMPLER),
    "spo_sampler": ("SPO at one rollout with the history-driven prompt sampler",
                    ESTIMATOR | BUDGET | section_keys("spo") | SAMPLER),
}  # fmt: skip
