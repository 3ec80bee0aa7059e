"""What a run's verl config stacks, checked once at trainer start (companions spec section 4).

:func:`check_run` is called by the trainer hooks before any worker or vLLM server starts. It validates the options of
the selected estimator (and builds and prepares it), then reads from the config which of the family's parts the run
would stack and refuses the unsound stacks (:func:`check_composition`). Everything estimator-specific comes from the
records (``bv_blend/verl/records.py``): which parts each estimator hosts and refuses, with the reason and the fix, and
which parts each estimator's options request when they are set on another estimator's run.

Options of one of our estimators that the selected estimator would silently ignore are an error too. NTF composes
with every estimator; only the legacy trainer's rollout-correction bypass mode, which swaps the loss for its own, is
refused.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields
from typing import Any

from bv_blend.verl import runtime
from bv_blend.verl.context_budget import config_value
from bv_blend.verl.options import NTF_LOSS, config_get, section_options, selected_record, uses_ntf
from bv_blend.verl.records import (
    BOUNDED_SCALE,
    DIFFICULTY_WEIGHTING,
    KL_IN_REWARD,
    NEEDS_A_HOST,
    RECORDS,
    REWARD_BINNING,
    SKIP_ZERO_GAP,
    EstimatorRecord,
    Request,
    record_for,
)

_MISSING = object()


@dataclass(frozen=True)
class Composition:
    """What a run stacks, as the verl options would request it.

    Attributes:
        estimator: the registered advantage estimator (one of the records', or verl's own).
        reward_binning: RRP binning of the rewards before the estimator.
        skip_zero_gap: RRP zero-gap skip of the estimator's groups.
        difficulty_weighting: HA-DW's Phi applied to the estimator's advantages.
        bounded_scale: MaxNorm's bound on BV-Blend's scale.
        use_kl_in_reward: verl's ``algorithm.use_kl_in_reward``.
    """

    estimator: str
    reward_binning: bool = False
    skip_zero_gap: bool = False
    difficulty_weighting: bool = False
    bounded_scale: bool = False
    use_kl_in_reward: bool = False

    def parts(self) -> list[str]:
        return [f.name for f in fields(self) if f.name != "estimator" and getattr(self, f.name)]


def refusals(composition: Composition) -> list[str]:
    """Why each unsound part of ``composition`` is refused: its estimator's record refuses it, or it needs an
    estimator that hosts it (``records.NEEDS_A_HOST``)."""
    record = record_for(composition.estimator)
    refuses = record.refuses if record is not None else {}
    hosts = record.hosts if record is not None else frozenset()
    reasons = []
    for part in composition.parts():
        if part in refuses:
            reasons.append(refuses[part])
        elif part in NEEDS_A_HOST and part not in hosts:
            reasons.append(NEEDS_A_HOST[part])
    return list(dict.fromkeys(reasons))  # one part's reason can stand for another's (the RRP's two parts)


def check_composition(composition: Composition) -> None:
    """Raise ``ValueError`` naming every unsound part of ``composition``, with the reason and the fix."""
    reasons = refusals(composition)
    if reasons:
        raise ValueError(f"Unsound combination for {composition.estimator}:\n- " + "\n- ".join(reasons))


def check_run(config: Any, legacy: bool = False) -> None:
    """Validate the selected estimator's options and refuse unsound stacks, before any worker starts.

    Args:
        config: the full trainer config.
        legacy: the legacy ``RayPPOTrainer`` (its bypass mode replaces the policy loss).

    Raises:
        RuntimeError: our hooks could not be installed on this verl.
        ValueError: bad options, or an unsound composition (every reason at once, each with its fix).
    """
    record = selected_record(config)
    ntf = uses_ntf(config)
    if record is not None or ntf:
        runtime.raise_hook_errors()
    # The run's estimator, its options parsed once for the run: bad options fail here, not at step 1.
    process = runtime.start_run(config, None if record is None else record.name)
    if process is not None:
        process.options.prepare(process.estimator, config)
    from bv_blend.verl import sampler

    sampler.check_run(config)
    algorithm = config_get(config, "algorithm")
    requested = {r.name: requested_options(algorithm, r.section, r.options_class().defaults()) for r in RECORDS}
    _check_stack(algorithm, requested)
    _check_unused(algorithm, requested)
    if ntf:
        _check_ntf(config, legacy)
    _check_reward_installed(config)


def requested_options(algorithm: Any, section: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``algorithm.<section>`` set to something other than their default (unknown keys included)."""
    return {
        key: value
        for key, value in section_options(algorithm, section).items()
        if defaults.get(key, _MISSING) != value
    }


def composition_of(algorithm: Any, requested: dict[str, dict[str, Any]]) -> tuple[Composition, list[str]]:
    """The family's parts that the config stacks on its estimator, and which keys request each.

    Every part but verl's own two (DAPO's filter, the KL in the reward) is requested by another estimator's options,
    as its record declares (``EstimatorRecord.requests``).
    """
    estimator = str(config_get(algorithm, "adv_estimator"))
    record = record_for(estimator)
    refuses = record.refuses if record is not None else {}
    why: list[str] = []
    parts = dict.fromkeys((REWARD_BINNING, SKIP_ZERO_GAP, DIFFICULTY_WEIGHTING, BOUNDED_SCALE, KL_IN_REWARD), False)
    # DAPO's filter drops the zero-variance groups: for an estimator that refuses the zero-gap skip, it is that skip.
    if bool(config_get(config_get(algorithm, "filter_groups"), "enable")) and SKIP_ZERO_GAP in refuses:
        parts[SKIP_ZERO_GAP] = True
        why.append(
            "algorithm.filter_groups.enable=true evicts every zero-variance group, which is the zero-gap skip "
            "(set it false)"
        )
    for other in RECORDS:
        if other.name == estimator:
            continue
        for request in other.requests:
            options = _requesting(algorithm, other, request, requested[other.name])
            if options:
                parts[request.part] = True
                if request.why:
                    why.append(request.why.format(options=options))
    parts[KL_IN_REWARD] = bool(config_get(algorithm, "use_kl_in_reward"))
    if parts[KL_IN_REWARD] and KL_IN_REWARD in refuses:
        why.append("algorithm.use_kl_in_reward=true puts -beta KL into the rewards (set it false)")
    return Composition(estimator=estimator, **parts), why


def _requesting(algorithm: Any, record: EstimatorRecord, request: Request, requested: dict[str, Any]) -> str:
    """The options of ``record``'s section that make ``request`` (``"algorithm.x.{a, b}"``), or ``""``."""
    if request.key is None:
        return f"{record.option_section}.{{{', '.join(requested)}}}" if requested else ""
    if request.with_section and not requested:
        return ""
    default = record.options_class().defaults().get(request.key)
    value = section_options(algorithm, record.section).get(request.key, default)
    return f"{record.option_section}.{request.key}" if value is not None and value is not False else ""


def _check_stack(algorithm: Any, requested: dict[str, dict[str, Any]]) -> None:
    composition, why = composition_of(algorithm, requested)
    try:
        check_composition(composition)
    except ValueError as exc:
        raise ValueError(f"This run's config stacks unsound parts ({'; '.join(why)}). {exc}") from None


def _check_unused(algorithm: Any, requested: dict[str, dict[str, Any]]) -> None:
    """Options of one of our estimators that the selected estimator would silently ignore."""
    estimator = str(config_get(algorithm, "adv_estimator"))
    unused = [
        f"{record.option_section}.{{{', '.join(requested[record.name])}}} acts only with "
        f"algorithm.adv_estimator={record.name}"
        for record in RECORDS
        if requested[record.name] and estimator != record.name and record.options_elsewhere_refused
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


PAPER_REWARD = "pkg://bv_blend.paper.rewards"  # the paper kit's Math-Verify reward (configs/paper/*)


def _check_reward_installed(config: Any) -> None:
    """The paper kit's reward needs math-verify, which the ``[paper]`` extra installs and verl does not: without it a
    run would fail at its first validation, after the model and vLLM have loaded (checked whatever the estimator)."""
    reward = config_value(config, "reward.custom_reward_function.path")
    if str(reward or "").startswith(PAPER_REWARD) and importlib.util.find_spec("math_verify") is None:
        raise ValueError(
            f"reward.custom_reward_function.path={reward} (the paper's Math-Verify reward) needs math-verify, which "
            "is not installed in this Python. Install the paper kit: pip install '.[paper]' in the bv_blend clone "
            "(or pip install 'math-verify>=0.7')."
        )


__all__ = ["Composition", "check_composition", "check_run", "composition_of", "refusals", "requested_options"]

