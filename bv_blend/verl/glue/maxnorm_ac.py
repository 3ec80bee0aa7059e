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

from bv_blend.companions import MaxNormAC, MaxNormConfig
from bv_blend.verl import runtime
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


compute_maxnorm_ac_advantage = runtime.advantage_function(
    NAME, __name__, "MaxNorm-AC outcome advantages: u / max(max |u|, tau) per group, u the (RLOO or centred) "
    "numerator of the binned rewards; groups with one row or all rows in one reward bin get 0; in [-1, 1].",
)


__all__ = ["MaxNormOptions", "compute_maxnorm_ac_advantage"]
