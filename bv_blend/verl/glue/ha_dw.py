"""The function verl calls for ``algorithm.adv_estimator=ha_dw``, its options and its checkpointed state.

HA-DW (arXiv 2601.08521; companions spec section 2) is verl's ``grpo`` arithmetic times a difficulty weight
against a history-aware anchor. The math is :class:`bv_blend.companions.HADWEstimator`; this module reads its
options from ``algorithm.ha_dw`` and verl's ``algorithm.norm_adv_by_std_in_grpo`` (false: Dr.GRPO mode), holds the
process's estimator, and gives the checkpoint hooks its state (``global_step_N/ha_dw_state.pt``, see ``state.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bv_blend.companions import HADWConfig, HADWEstimator
from bv_blend.verl import runtime
from bv_blend.verl.multi_output import outcome_advantages
from bv_blend.verl.options import config_get, section_options

ESTIMATOR_NAME = "ha_dw"
SECTION = f"algorithm.{ESTIMATOR_NAME}"
NORM_KEY = "norm_adv_by_std_in_grpo"
# HADWConfig.norm_adv_by_std comes from verl's own key, so that grpo and ha_dw runs read the same switch.
ESTIMATOR_KEYS = frozenset(f.name for f in dataclasses.fields(HADWConfig)) - {"norm_adv_by_std"}
GLUE_KEYS = frozenset({"allow_state_reset"})


@dataclass(frozen=True)
class HADWOptions:
    """``algorithm.ha_dw`` read and validated.

    Attributes:
        config: the estimator's parameters (``norm_adv_by_std`` from ``algorithm.norm_adv_by_std_in_grpo``).
        allow_state_reset: on resume, start the anchor history afresh instead of failing when the checkpoint has no
            HA-DW state or one made with other options.
    """

    config: HADWConfig
    allow_state_reset: bool = False


def defaults() -> dict[str, Any]:
    """Every ``algorithm.ha_dw`` key with its default (what ``configs/paper/ha_dw.yaml`` declares)."""
    values = {k: v for k, v in HADWConfig().to_dict().items() if k in ESTIMATOR_KEYS}
    return {**values, "allow_state_reset": False}


def read_options(algorithm_config: Any) -> HADWOptions:
    """Validate ``algorithm.ha_dw``; absent keys take their defaults.

    Raises:
        ValueError: an unknown key (named, with the known ones), or an invalid value (named).
    """
    options = section_options(algorithm_config, ESTIMATOR_NAME)
    if "norm_adv_by_std" in options:
        raise ValueError(
            f"{SECTION}.norm_adv_by_std is not an option: HA-DW reads verl's algorithm.{NORM_KEY} (true: GRPO's "
            "standardised advantage, false: Dr.GRPO's R - mean), like the built-in grpo. Set that key instead."
        )
    unknown = sorted(set(options) - ESTIMATOR_KEYS - GLUE_KEYS)
    if unknown:
        raise ValueError(
            f"Unknown option(s) {SECTION}.{{{', '.join(unknown)}}}. Known options: "
            f"{sorted(ESTIMATOR_KEYS | GLUE_KEYS)}. Check the spelling."
        )
    allow_reset = options.pop("allow_state_reset", False)
    if not isinstance(allow_reset, bool):
        raise ValueError(f"{SECTION}.allow_state_reset={allow_reset!r} is invalid: it must be true or false.")
    norm = config_get(algorithm_config, NORM_KEY)
    norm = True if norm is None else norm
    if not isinstance(norm, bool):
        raise ValueError(f"algorithm.{NORM_KEY}={norm!r} is invalid: it must be true or false.")
    return HADWOptions(HADWConfig.from_mapping({**options, "norm_adv_by_std": norm}), allow_reset)


def estimator_for(algorithm_config: Any) -> HADWEstimator:
    """The process's HA-DW estimator for these options, built on first use."""
    options = read_options(algorithm_config)
    return runtime.process_object(ESTIMATOR_NAME, options.config, lambda: HADWEstimator(options.config))


def compute_ha_dw_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HA-DW outcome advantages: ``grpo``'s (or Dr.GRPO's) advantage times Phi = lambda exp(D |diff|).

    Args:
        token_level_rewards: (bs, response_length) rewards; the sequence reward is their sum.
        response_mask: (bs, response_length); all-zero rows (verl's padding) get advantage 0 and no update.
        index: (bs,) prompt uids (the groups); uids starting with "pad" are padding.
        config: verl's ``config.algorithm``; options are read from its ``ha_dw`` sub-node.

    Returns:
        advantages and returns, both (bs, response_length) (equal, as for GRPO).
    """
    if index is None:
        raise ValueError("ha_dw groups rows by prompt uid: verl passes it as `index` when the batch has 'uid'.")
    estimator = estimator_for(config)
    advantages = outcome_advantages(estimator.compute, token_level_rewards, response_mask, index)
    runtime.record_metrics(estimator.metrics)
    return advantages, advantages


# --------------------------------------------------------------------------------------- checkpointed state
def state_payload(algorithm_config: Any) -> dict[str, Any]:
    """What ``global_step_N/ha_dw_state.pt`` holds besides the file's format and versions."""
    return {"estimator": estimator_for(algorithm_config).state_dict()}


def restore_payload(algorithm_config: Any, payload: dict[str, Any], path: str) -> None:
    """Load a saved anchor history; every check runs before anything changes.

    Raises:
        ValueError: the state was written with other ``algorithm.ha_dw`` options (or another Dr.GRPO setting).
    """
    estimator = estimator_for(algorithm_config)
    state = payload.get("estimator")
    saved = state.get("config") if isinstance(state, dict) else None
    if not isinstance(saved, dict):
        raise ValueError(f"{path} holds no HA-DW estimator state: the file is corrupt.")
    current = estimator.config.to_dict()
    changed = {key: (value, current.get(key)) for key, value in saved.items() if current.get(key) != value}
    if changed:
        raise ValueError(
            f"{path} was written with other HA-DW options (saved, current): {changed}. Resume with the original "
            f"{SECTION}.* options (norm_adv_by_std is algorithm.{NORM_KEY})."
        )
    estimator.load_state_dict(state)


def allows_state_reset(algorithm_config: Any) -> bool:
    return read_options(algorithm_config).allow_state_reset


__all__ = [
    "ESTIMATOR_NAME",
    "HADWOptions",
    "allows_state_reset",
    "compute_ha_dw_advantage",
    "defaults",
    "estimator_for",
    "read_options",
    "restore_payload",
    "state_payload",
]
