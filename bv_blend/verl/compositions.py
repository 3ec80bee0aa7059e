"""What a run's verl config stacks, checked once at trainer start (companions spec section 4).

:func:`check_run` is called by the trainer hooks before any worker or vLLM server starts. It validates the options of
the selected estimator (and builds it), then reads from the config which of the family's parts the run would stack
and refuses the unsound stacks with the reason (:func:`bv_blend.companions.check_composition`):

- ``algorithm.filter_groups.enable`` with ``bv_blend``: the zero-gap skip deletes the groups BV-Blend exists for;
- ``algorithm.ha_dw.*`` set with ``maxnorm_ac`` or ``bv_blend``: HA-DW's weight stacked on them;
- ``algorithm.maxnorm.*`` set with ``bv_blend`` or an estimator without an RRP stage;
- ``algorithm.use_kl_in_reward`` with ``maxnorm_ac``;
- ``algorithm.bv_blend.bounded_scale_tau`` with any estimator but ``bv_blend``.

Options of one of our estimators that the selected estimator would silently ignore are an error too. NTF composes
with every estimator; only the legacy trainer's rollout-correction bypass mode, which swaps the loss for its own, is
refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from bv_blend.companions import Composition, check_composition
from bv_blend.verl import runtime
from bv_blend.verl.glue import ha_dw
from bv_blend.verl.glue import maxnorm_ac as maxnorm
from bv_blend.verl.options import ESTIMATOR_NAME as BV_BLEND
from bv_blend.verl.options import NTF_LOSS, config_get, section_options, selected_estimator, uses_ntf

logger = logging.getLogger(__name__)

# Each of our estimators: how its options are validated and its process-wide estimator built.
BUILDERS: dict[str, Callable[[Any], Any]] = {
    BV_BLEND: runtime.estimator_for,
    ha_dw.ESTIMATOR_NAME: ha_dw.estimator_for,
    maxnorm.ESTIMATOR_NAME: maxnorm.estimator_for,
}
# The option sections of the companion estimators: (section name, its estimator, its defaults).
SECTIONS = (
    (ha_dw.ESTIMATOR_NAME, ha_dw.ESTIMATOR_NAME, ha_dw.defaults),
    (maxnorm.OPTIONS_NAME, maxnorm.ESTIMATOR_NAME, maxnorm.defaults),
)
_MISSING = object()


def check_run(config: Any, legacy: bool = False) -> None:
    """Validate the selected estimator's options and refuse unsound stacks, before any worker starts.

    Args:
        config: the full trainer config.
        legacy: the legacy ``RayPPOTrainer`` (its bypass mode replaces the policy loss).

    Raises:
        RuntimeError: our hooks could not be installed on this verl.
        ValueError: bad options, or an unsound composition (every reason at once, each with its fix).
    """
    estimator = selected_estimator(config)
    ntf = uses_ntf(config)
    if estimator is not None or ntf:
        runtime.raise_hook_errors()
    if estimator is not None:
        BUILDERS[estimator](config.algorithm)  # bad options fail here, not at step 1
    algorithm = config_get(config, "algorithm")
    requested = {name: requested_options(algorithm, name, defaults) for name, _, defaults in SECTIONS}
    _check_stack(algorithm, requested)
    _check_unused(algorithm, requested)
    if ntf:
        _check_ntf(config, legacy)
    _warn_kl_of_skipped_groups(config, estimator)


def requested_options(algorithm: Any, name: str, defaults: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The keys of ``algorithm.<name>`` set to something other than their default (unknown keys included)."""
    options = section_options(algorithm, name)
    default = defaults()
    return {key: value for key, value in options.items() if default.get(key, _MISSING) != value}


def composition_of(algorithm: Any, requested: dict[str, dict[str, Any]]) -> tuple[Composition, list[str]]:
    """The family's parts that the config stacks on its estimator, and which keys request each."""
    estimator = str(config_get(algorithm, "adv_estimator"))
    why: list[str] = []
    filter_groups = bool(config_get(config_get(algorithm, "filter_groups"), "enable"))
    zero_gap_filter = estimator == BV_BLEND and filter_groups
    if zero_gap_filter:
        why.append(
            "algorithm.filter_groups.enable=true evicts every zero-variance group, which is the zero-gap skip "
            "(set it false)"
        )
    difficulty = estimator != ha_dw.ESTIMATOR_NAME and bool(requested[ha_dw.ESTIMATOR_NAME])
    if difficulty:
        keys = ", ".join(requested[ha_dw.ESTIMATOR_NAME])
        why.append(f"algorithm.ha_dw.{{{keys}}} asks for HA-DW's weight (run adv_estimator=ha_dw instead)")
    rrp = estimator != maxnorm.ESTIMATOR_NAME and bool(requested[maxnorm.OPTIONS_NAME])
    rrp_skip = rrp and bool(section_options(algorithm, maxnorm.OPTIONS_NAME).get("skip_zero_gap", True))
    if rrp:
        keys = ", ".join(requested[maxnorm.OPTIONS_NAME])
        why.append(f"algorithm.maxnorm.{{{keys}}} asks for the RRP (run adv_estimator=maxnorm_ac instead)")
    bounded = section_options(algorithm, BV_BLEND).get("bounded_scale_tau") is not None
    if bounded and estimator != BV_BLEND:
        why.append("algorithm.bv_blend.bounded_scale_tau is set, but it bounds only bv_blend's scale (set it null)")
    kl_in_reward = bool(config_get(algorithm, "use_kl_in_reward"))
    if kl_in_reward and estimator == maxnorm.ESTIMATOR_NAME:
        why.append("algorithm.use_kl_in_reward=true puts -beta KL into the rewards (set it false)")
    composition = Composition(
        estimator=estimator,
        reward_binning=rrp,
        skip_zero_gap=zero_gap_filter or rrp_skip,
        difficulty_weighting=difficulty,
        bounded_scale=bounded,
        use_kl_in_reward=kl_in_reward,
    )
    return composition, why


def _check_stack(algorithm: Any, requested: dict[str, dict[str, Any]]) -> None:
    composition, why = composition_of(algorithm, requested)
    try:
        check_composition(composition)
    except ValueError as exc:
        raise ValueError(f"This run's config stacks unsound parts ({'; '.join(why)}). {exc}") from None


def _check_unused(algorithm: Any, requested: dict[str, dict[str, Any]]) -> None:
    """Options of a companion estimator that the selected estimator would silently ignore."""
    estimator = str(config_get(algorithm, "adv_estimator"))
    unused = [
        f"algorithm.{name}.{{{', '.join(requested[name])}}} acts only with algorithm.adv_estimator={owner}"
        for name, owner, _ in SECTIONS
        if requested[name] and estimator != owner
    ]
    if unused:
        raise ValueError(
            f"algorithm.adv_estimator={estimator} would ignore options this config sets: {'; '.join(unused)}. "
            "Select that estimator, or remove the options (their defaults apply only to their own estimator)."
        )


def _check_ntf(config: Any, legacy: bool) -> None:
    correction = config_get(config_get(config, "algorithm"), "rollout_correction")
    if legacy and bool(config_get(correction, "bypass_mode")):
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={NTF_LOSS} cannot run with "
            "algorithm.rollout_correction.bypass_mode=true in the legacy trainer (trainer.use_v1=false): verl's "
            "bypass mode replaces the policy loss with its own (loss_mode=bypass_mode), so no token would be "
            "filtered. Use the V1 trainer (trainer.use_v1=true), or turn bypass_mode off."
        )


def _warn_kl_of_skipped_groups(config: Any, estimator: str | None) -> None:
    if estimator != maxnorm.ESTIMATOR_NAME:
        return
    actor = config_get(config_get(config, "actor_rollout_ref"), "actor")
    skip = section_options(config_get(config, "algorithm"), maxnorm.OPTIONS_NAME).get("skip_zero_gap", True)
    if skip and bool(config_get(actor, "use_kl_loss")):
        logger.warning(
            "maxnorm_ac: zero-gap groups get advantage 0, but actor.use_kl_loss=true still applies the KL update "
            "to them (the RRP skips both). Run with actor.use_kl_loss=false for the paper's skip; "
            "docs/companions.md lists the alternatives."
        )


__all__ = ["BUILDERS", "check_run", "composition_of", "requested_options"]
