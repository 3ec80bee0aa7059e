"""verl entry point of bv_blend: makes ``algorithm.adv_estimator=bv_blend`` work in every verl process.

verl imports this module from ``verl/__init__.py`` (entry-point group ``verl.plugins``, or
``VERL_USE_EXTERNAL_MODULES=bv_blend.verl.plugin``), in every process: driver, trainer, FSDP workers, vLLM servers.
So it imports nothing heavy and nothing of verl (verl is half-initialised at that point). It only registers
post-import hooks; the work happens when, and only if, the process imports the verl module concerned:

- ``verl.trainer.ppo.core_algos``: register ``bv_blend`` in verl's advantage-estimator registry;
- ``verl.trainer.ppo.ray_trainer``: legacy trainer hooks;
- ``verl.trainer.ppo.v1.trainer_base``: V1 trainer hooks.

Importing this module twice, or through both routes, is harmless. A hook that fails is logged at ERROR
(verl itself swallows entry-point errors) and raised when a trainer starts with ``adv_estimator=bv_blend``;
``python -m bv_blend.verl.doctor`` reports all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType

import wrapt

logger = logging.getLogger(__name__)

ENTRY_MODULE = __name__


def _register_estimator(core_algos: ModuleType) -> None:
    from bv_blend.verl.advantage import compute_bv_blend_advantage
    from bv_blend.verl.options import ESTIMATOR_NAME

    registered = core_algos.ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR_NAME)
    if registered is compute_bv_blend_advantage:
        return
    if registered is not None and getattr(registered, "__qualname__", None) != compute_bv_blend_advantage.__qualname__:
        raise ValueError(
            f"Another advantage estimator is already registered as {ESTIMATOR_NAME!r}: {registered!r}. "
            "Uninstall the package that registers it, or rename it."
        )
    # A reloaded bv_blend module has a new function object: replace ours instead of tripping verl's duplicate check.
    core_algos.ADV_ESTIMATOR_REGISTRY.pop(ESTIMATOR_NAME, None)
    core_algos.register_adv_est(ESTIMATOR_NAME)(compute_bv_blend_advantage)


def _install_v1(trainer_base: ModuleType) -> None:
    from bv_blend.verl.hooks import install_v1

    install_v1(trainer_base)


def _install_legacy(ray_trainer: ModuleType) -> None:
    from bv_blend.verl.hooks import install_legacy

    install_legacy(ray_trainer)


def _guarded(step: Callable[[ModuleType], None], target: str) -> Callable[[ModuleType], None]:
    """Never break verl's own import (other estimators must keep working); record the failure instead."""

    def hook(module: ModuleType) -> None:
        try:
            step(module)
        except Exception as exc:  # reported loudly, and raised at trainer start if bv_blend is selected
            from bv_blend.verl import runtime

            runtime.report_hook_error(f"bv_blend hook on {target} failed: {type(exc).__name__}: {exc}")

    return hook


HOOKS = {
    "verl.trainer.ppo.core_algos": _register_estimator,
    "verl.trainer.ppo.ray_trainer": _install_legacy,
    "verl.trainer.ppo.v1.trainer_base": _install_v1,
}

for _target, _step in HOOKS.items():
    wrapt.register_post_import_hook(_guarded(_step, _target), _target)
