"""``algorithm.adv_estimator=spo``: the function verl calls, its options, and the process's estimator.

SPO (arXiv 2509.13232; history_spec 2): a per-prompt Beta tracker of the success rate as the baseline, normalised over
the batch, at one rollout per prompt in its paper. The math is :class:`bv_blend.SPOEstimator`; this module reads
``algorithm.spo``, loads the offline values, and gives the checkpoint hooks the tracker (``global_step_N/spo_state.pt``,
with the hash of the offline values, which a resume must match).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from bv_blend.core.options import check_optional_text
from bv_blend.history.priors import load_priors, priors_hash, unmatched
from bv_blend.spo import SPOConfig, SPOEstimator
from bv_blend.verl import channel, runtime
from bv_blend.verl.options import HistoryOptions
from bv_blend.verl.prompt_keys import prompt_keys_for_rows

logger = logging.getLogger(__name__)

NAME = "spo"
SECTION = f"algorithm.{NAME}"


@dataclass(frozen=True)
class SPOOptions(HistoryOptions):
    """``algorithm.spo`` read and validated.

    Attributes:
        config: the estimator's parameters.
        prompt_key_field: key each prompt by ``extra_info[field]`` (``index``...) instead of a hash of its text.
        allow_state_reset: on resume, start the tracker afresh instead of failing on a missing or mismatched state.
        offline_values: a prior file (``bv-blend priors``): each prompt's scores under the initial policy.
    """

    NAME = NAME
    CONFIG = SPOConfig

    config: SPOConfig = field(default_factory=SPOConfig)
    offline_values: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_optional_text(SECTION, "offline_values", self.offline_values)

    def build(self) -> SPOEstimator:
        priors = load_priors(self.offline_values, f"{SECTION}.offline_values") if self.offline_values else None
        return SPOEstimator(self.config, priors)

    def advantages(
        self, built: SPOEstimator, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
        step: channel.StepChannel,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Each row's prompt key, from the channel by uid."""
        keys = prompt_keys_for_rows(index, response_mask, step.prompt_keys, NAME)
        return built.compute_token_level(
            token_level_rewards, response_mask, index, keys, source_rows=step.sources_for(len(keys))
        )

    def prepare(self, built: SPOEstimator, config: Any) -> None:
        """At trainer start: :meth:`start` with the training files' prompts."""
        if built.offline_values:
            from bv_blend.verl.training_data import training_prompts

            self.start(built, training_prompts(config, self.prompt_key_field))

    def start(self, built: SPOEstimator, prompts: Mapping[str, int | None]) -> None:
        """Report the offline values' prompts that no training prompt has (not an error); they act from the build."""
        if built.offline_values:
            missing = unmatched(built.offline_values, prompts)
            if missing:
                logger.warning("%s: %d of its %d prompts are in no training file (their priors are unused).",
                               self.offline_values, missing, len(built.offline_values))  # fmt: skip

    def save(self, built: SPOEstimator) -> dict[str, Any]:
        return {"offline_values_hash": _hash(built), "estimator": built.state_dict()}

    def restore(self, built: SPOEstimator, payload: Mapping[str, Any], path: str) -> None:
        if payload.get("offline_values_hash") != _hash(built):
            raise ValueError(
                f"{path} was written with offline values of hash {payload.get('offline_values_hash')}, but this run's "
                f"{SECTION}.offline_values ({self.offline_values}) has {_hash(built)}: the prompts not yet "
                "visited would start from other priors. Resume with the original offline values file."
            )
        super().restore(built, payload, path)


def _hash(built: SPOEstimator) -> str | None:
    return priors_hash(built.offline_values) if built.offline_values else None


compute_spo_advantage = runtime.advantage_function(
    NAME, __name__, "SPO outcome advantages: r - p^ of the prompt's Beta tracker, normalised over the batch's "
    "valid rows.",
)


__all__ = ["SPOOptions", "compute_spo_advantage"]
