"""The function verl calls for ``algorithm.adv_estimator=maxnorm_ac``, and its options.

MaxNorm-AC with the Reward-Resolution Protocol (arXiv 2609.19164; companions spec section 3): group-relative
numerators of binned rewards divided by their largest magnitude, floored at tau, so |A| <= 1. The math is
:class:`bv_blend.companions.MaxNormAC`; this module reads its options from ``algorithm.maxnorm`` and holds the
process's estimator. It has no state, so no checkpoint file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bv_blend.companions import MaxNormAC, MaxNormConfig
from bv_blend.verl import channel, runtime
from bv_blend.verl.options import GlueOptions, config_get, section_options

logger = logging.getLogger(__name__)
NAME = "maxnorm_ac"
SECTION = "algorithm.maxnorm"  # the options live under algorithm.maxnorm (the spec's name)


@dataclass(frozen=True)
class MaxNormOptions(GlueOptions):
    """``algorithm.maxnorm`` read and validated (the estimator is stateless: nothing to save or reset)."""

    NAME = NAME

    config: MaxNormConfig = field(default_factory=MaxNormConfig)

    @classmethod
    def from_algorithm(cls, algorithm: Any) -> MaxNormOptions:
        return cls(MaxNormConfig.from_mapping(section_options(algorithm, "maxnorm")))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return MaxNormConfig().to_dict()

    def build(self) -> MaxNormAC:
        return MaxNormAC(self.config)

    def prepare(self, built: MaxNormAC, config: Any) -> None:
        """At trainer start: warn that verl's KL loss still moves the groups the RRP skips."""
        actor = config_get(config_get(config, "actor_rollout_ref"), "actor")
        if self.config.skip_zero_gap and bool(config_get(actor, "use_kl_loss")):
            logger.warning(
                "maxnorm_ac: zero-gap groups get advantage 0, but actor.use_kl_loss=true still applies the KL update "
                "to them (the RRP skips both). Run with actor.use_kl_loss=false for the paper's skip; "
                "docs/companions.md lists the alternatives."
            )


def compute_maxnorm_ac_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MaxNorm-AC outcome advantages: u / max(max |u|, tau) per group, u the (RLOO or centred) numerator of the
    binned rewards; groups with one row or all rows in one reward bin get 0.

    Args:
        token_level_rewards: (bs, response_length) rewards; the sequence reward is their sum.
        response_mask: (bs, response_length); all-zero rows (verl's padding) get advantage 0.
        index: (bs,) prompt uids (the groups); uids starting with "pad" are padding.
        config: verl's ``config.algorithm``; options are read from its ``maxnorm`` sub-node.

    Returns:
        advantages and returns, both (bs, response_length) (equal, as for RLOO), in [-1, 1].
    """
    if index is None:
        raise ValueError("maxnorm_ac groups rows by prompt uid: verl passes it as `index` when the batch has 'uid'.")
    estimator = runtime.estimator_for(NAME, config)
    step = channel.current_step() or channel.StepChannel()
    advantages, returns = estimator.compute_token_level(
        token_level_rewards, response_mask, index, source_rows=step.sources_for(response_mask.shape[0])
    )
    channel.report_metrics(estimator.metrics)
    return advantages, returns


__all__ = ["MaxNormOptions", "compute_maxnorm_ac_advantage"]
