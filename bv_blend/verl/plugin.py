"""verl entry point of bv_blend: makes our estimators and loss work in every verl process.

``algorithm.adv_estimator=<name>`` for every record of ``bv_blend/verl/records.py``, and
``actor_rollout_ref.actor.policy_loss.loss_mode=<name>`` for its ``POLICY_LOSSES``. verl imports this module from
``verl/__init__.py`` (entry-point group ``verl.plugins``, or ``VERL_USE_EXTERNAL_MODULES=bv_blend.verl.plugin``), in
every process: driver, trainer, FSDP workers, vLLM servers. So it imports nothing heavy and nothing of verl (verl is
half-initialised at that point). It only registers post-import hooks; the work happens when, and only if, the
process imports the verl module concerned:

- ``verl.trainer.ppo.core_algos``: register the records' estimators in verl's advantage-estimator registry and
  the policy losses in its policy-loss registry;
- ``verl.trainer.ppo.ray_trainer``: legacy trainer hooks;
- ``verl.trainer.ppo.v1.trainer_base``: V1 trainer hooks;
- ``verl.trainer.ppo.utils`` (and the modules that bind its ``create_rl_sampler``): the history-driven prompt
  sampler, when ``data.history_sampler.enable`` asks for it.

Importing this module twice, or through both routes, is harmless. A hook that fails is logged at ERROR
(verl itself swallows entry-point errors) and raised when a trainer starts with one of our estimators or our loss;
``bv-blend doctor`` reports all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType

import wrapt

from bv_blend.verl.records import POLICY_LOSSES, RECORDS, resolve

logger = logging.getLogger(__name__)

ENTRY_MODULE = __name__
# name -> "module:function", imported only when verl imports core_algos.
ESTIMATORS = {record.name: record.function for record in RECORDS}


def _register(registry: dict, register: Callable, name: str, fn: Callable, what: str) -> None:
    registered = registry.get(name)
    if registered is fn:
        return
    if registered is not None and getattr(registered, "__qualname__", None) != fn.__qualname__:
        raise ValueError(
            f"Another {what} is already registered as {name!r}: {registered!r}. "
            "Uninstall the package that registers it, or rename it."
        )
    # A reloaded bv_blend module has a new function object: replace ours instead of tripping verl's duplicate check.
    registry.pop(name, None)
    register(name)(fn)


def _register_all(core_algos: ModuleType) -> None:
    failures = []
    for name, reference in ESTIMATORS.items():
        try:
            fn = resolve(reference)
            _register(core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.register_adv_est, name, fn, "advantage estimator")
        except Exception as exc:  # one failure must not keep the others from registering
            failures.append(f"estimator {name}: {type(exc).__name__}: {exc}")
    for name, reference in POLICY_LOSSES.items():
        try:
            fn = resolve(reference)
            _register(core_algos.POLICY_LOSS_REGISTRY, core_algos.register_policy_loss, name, fn, "policy loss")
        except Exception as exc:
            failures.append(f"policy loss {name}: {type(exc).__name__}: {exc}")
    if failures:
        raise RuntimeError("; ".join(failures))


def _install_v1(trainer_base: ModuleType) -> None:
    from bv_blend.verl.hooks import install_v1

    install_v1(trainer_base)


def _install_legacy(ray_trainer: ModuleType) -> None:
    from bv_blend.verl.hooks import install_legacy

    install_legacy(ray_trainer)


def _install_sampler(module: ModuleType) -> None:
    from bv_blend.verl.hooks import install_sampler

    install_sampler(module)


def _guarded(step: Callable[[ModuleType], None], target: str) -> Callable[[ModuleType], None]:
    """Never break verl's own import (other estimators must keep working); record the failure instead."""

    def hook(module: ModuleType) -> None:
        try:
            step(module)
        except Exception as exc:  # reported loudly, and raised at trainer start if one of ours is selected
            from bv_blend.verl import runtime

            runtime.report_hook_error(f"bv_blend hook on {target} failed: {type(exc).__name__}: {exc}")

    return hook


HOOKS = {
    "verl.trainer.ppo.core_algos": _register_all,
    "verl.trainer.ppo.ray_trainer": _install_legacy,
    "verl.trainer.ppo.v1.trainer_base": _install_v1,
    # verl's create_rl_sampler, where it is defined and where the legacy task runner binds it (the prompt sampler)
    "verl.trainer.ppo.utils": _install_sampler,
    "verl.trainer.main_ppo_v0": _install_sampler,
}

for _target, _step in HOOKS.items():
    wrapt.register_post_import_hook(_guarded(_step, _target), _target)
