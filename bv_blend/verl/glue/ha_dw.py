"""The function verl calls for ``algorithm.adv_estimator=ha_dw``, its options and its checkpointed state.

HA-DW (arXiv 2601.08521; companions spec section 2) is verl's ``grpo`` arithmetic times a difficulty weight
against a history-aware anchor. The math is :class:`bv_blend.companions.HADWEstimator`; this module reads its
options from ``algorithm.ha_dw`` and verl's ``algorithm.norm_adv_by_std_in_grpo`` (false: Dr.GRPO mode), holds the
process's estimator, and gives the checkpoint hooks its state (``global_step_N/ha_dw_state.pt``, see ``state.py``):
the default save and restore of ``GlueOptions``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bv_blend.companions import HADWConfig, HADWEstimator
from bv_blend.verl import runtime
from bv_blend.verl.options import GlueOptions, config_get, section_options, unknown_keys
from bv_blend.verl.overrides import override_value

NAME = "ha_dw"
SECTION = f"algorithm.{NAME}"
NORM_KEY = "norm_adv_by_std_in_grpo"
# HADWConfig.norm_adv_by_std comes from verl's own key, so that grpo and ha_dw runs read the same switch.
ESTIMATOR_KEYS = frozenset(f.name for f in dataclasses.fields(HADWConfig)) - {"norm_adv_by_std"}


@dataclass(frozen=True)
class HADWOptions(GlueOptions):
    """``algorithm.ha_dw`` read and validated.

    Attributes:
        config: the estimator's parameters (``norm_adv_by_std`` from ``algorithm.norm_adv_by_std_in_grpo``).
        allow_state_reset: on resume, start the anchor history afresh instead of failing when the checkpoint has no
            HA-DW state or one made with other options.
    """

    NAME = NAME

    config: HADWConfig = field(default_factory=HADWConfig)
    allow_state_reset: bool = False

    @classmethod
    def from_algorithm(cls, algorithm: Any) -> HADWOptions:
        options = section_options(algorithm, NAME)
        if "norm_adv_by_std" in options:
            raise ValueError(
                f"{SECTION}.norm_adv_by_std is not an option: HA-DW reads verl's algorithm.{NORM_KEY} (true: GRPO's "
                "standardised advantage, false: Dr.GRPO's R - mean), like the built-in grpo. Set that key instead."
            )
        unknown_keys(options, ESTIMATOR_KEYS | {"allow_state_reset"}, SECTION)
        allow_reset = options.pop("allow_state_reset", False)
        if not isinstance(allow_reset, bool):
            raise ValueError(f"{SECTION}.allow_state_reset={allow_reset!r} is invalid: it must be true or false.")
        norm = config_get(algorithm, NORM_KEY)
        norm = True if norm is None else norm
        if not isinstance(norm, bool):
            raise ValueError(f"algorithm.{NORM_KEY}={norm!r} is invalid: it must be true or false.")
        return cls(HADWConfig.from_mapping({**options, "norm_adv_by_std": norm}), allow_reset)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        values = {k: v for k, v in HADWConfig().to_dict().items() if k in ESTIMATOR_KEYS}
        return {**values, "allow_state_reset": False}

    def spell(self, name: str, value: Any) -> str:
        if name == "norm_adv_by_std":  # verl's own key, shared with grpo
            return f"algorithm.{NORM_KEY}={override_value(value)}"
        return super().spell(name, value)

    def build(self) -> HADWEstimator:
        return HADWEstimator(self.config)


compute_ha_dw_advantage = runtime.advantage_function(
    NAME, __name__, "HA-DW outcome advantages: ``grpo``'s (or Dr.GRPO's) advantage times Phi = lambda exp(D |diff|)."
)


__all__ = ["HADWOptions", "compute_ha_dw_advantage"]
