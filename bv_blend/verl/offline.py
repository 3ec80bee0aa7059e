"""verl's advantage estimators outside its trainer, called exactly as the trainer calls them (for the lab and tests).

verl's trainer computes advantages in ``verl.trainer.ppo.ray_trainer.compute_advantage`` (the V1 trainer calls the
same function). :func:`compute_advantages` mirrors it for outcome-reward estimators: ``grpo`` gets its own branch
with ``norm_adv_by_std_in_grpo`` passed explicitly (Dr.GRPO is ``grpo`` with it off), every other estimator is
looked up in verl's registry and called with ``token_level_rewards``, ``response_mask``, ``config`` (the
``algorithm`` node) and ``index`` (the uids). For ``bv_blend`` it also publishes the uid -> cluster map around the
call, as the bv_blend trainer hooks do.

Estimators with a process-wide history (BV-Blend's session) must start each simulated run afresh:
:func:`reset_history` does it for every estimator listed in :data:`HISTORY_RESETS`.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

import bv_blend.verl.plugin  # noqa: F401  (registers bv_blend when verl's core_algos is imported)
from bv_blend.verl import runtime
from bv_blend.verl.context import batch_context

# Estimators that keep a history between calls, and how to forget it (runtime.reset forgets every process-wide
# estimator, HA-DW's anchor included); the lab refuses to run a stateful estimator without an entry here.
HISTORY_RESETS: dict[str, Callable[[], None]] = {
    "bv_blend": runtime.reset,
    "ha_dw": runtime.reset,
}
# Estimators that need each prompt's cluster id (published as a uid -> cluster map around the call).
NEEDS_CLUSTERS = frozenset({"bv_blend"})


def _core_algos() -> Any:
    from verl.trainer.ppo import core_algos

    return core_algos


def registered_estimators() -> frozenset[str]:
    """Names in verl's advantage-estimator registry of this process (bv_blend included)."""
    return frozenset(_core_algos().ADV_ESTIMATOR_REGISTRY)


@functools.cache
def _verl_algorithm_defaults() -> DictConfig:
    """The ``algorithm`` node of verl's full default trainer config (the file verl generates from its yaml)."""
    text = resources.files("verl.trainer.config").joinpath("_generated_ppo_trainer.yaml").read_text()
    return OmegaConf.create(text).algorithm


def algorithm_config(adv_estimator: str, options: Mapping[str, Any] | None = None) -> DictConfig:
    """verl's default ``config.algorithm`` with ``adv_estimator`` set and ``options`` merged in.

    Example: ``algorithm_config("bv_blend", {"bv_blend": {"num_clusters": 16, "weight_mode": "neff"}})`` or
    ``algorithm_config("grpo", {"norm_adv_by_std_in_grpo": False})`` (Dr.GRPO).
    """
    node = copy.deepcopy(_verl_algorithm_defaults())
    return OmegaConf.merge(node, {"adv_estimator": adv_estimator, **dict(options or {})})


def reset_history(adv_estimator: str) -> None:
    """Forget the process-wide history of this estimator (no-op for stateless ones)."""
    reset = HISTORY_RESETS.get(adv_estimator)
    if reset is not None:
        reset()


def compute_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    uids: np.ndarray,
    algorithm: DictConfig,
    cluster_ids: np.ndarray | None = None,
) -> torch.Tensor:
    """Advantages (B, T) from verl's registered estimator ``algorithm.adv_estimator``, as verl's trainer calls it.

    Args:
        token_level_rewards: (B, T) rewards (an outcome reward sits on the last valid token).
        response_mask: (B, T) mask of valid response tokens.
        uids: (B,) numpy object array of prompt uids (one per prompt and step, as verl makes them).
        algorithm: verl's ``config.algorithm`` node (see :func:`algorithm_config`).
        cluster_ids: (B,) cluster id of each row's prompt; required by estimators in :data:`NEEDS_CLUSTERS`.
    """
    name = str(algorithm.adv_estimator)
    core_algos = _core_algos()
    if name == "grpo":  # verl's compute_advantage: its GRPO branch passes only these four arguments
        advantages, _ = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards,
            response_mask=response_mask,
            index=uids,
            norm_adv_by_std_in_grpo=bool(algorithm.get("norm_adv_by_std_in_grpo", True)),
        )
        return advantages
    estimator = core_algos.get_adv_estimator_fn(name)
    kwargs = {"token_level_rewards": token_level_rewards, "response_mask": response_mask, "config": algorithm}
    kwargs["index"] = uids  # verl passes non_tensor_batch["uid"] whenever the batch has one, as it always does
    if name not in NEEDS_CLUSTERS:
        advantages, _ = estimator(**kwargs)
        return advantages
    if cluster_ids is None:
        raise ValueError(f"adv_estimator={name} needs each row's cluster id: pass cluster_ids (one per row).")
    with batch_context(cluster_map=_uid_to_cluster(uids, cluster_ids)):
        advantages, _ = estimator(**kwargs)
    return advantages


def _uid_to_cluster(uids: np.ndarray, cluster_ids: np.ndarray) -> dict[str, int]:
    if len(uids) != len(cluster_ids):
        raise ValueError(f"uids ({len(uids)}) and cluster_ids ({len(cluster_ids)}) need one entry per row each.")
    mapping: dict[str, int] = {}
    for uid, cluster in zip(uids.tolist(), np.asarray(cluster_ids).tolist(), strict=True):
        if mapping.setdefault(str(uid), int(cluster)) != int(cluster):
            raise ValueError(f"Rows of prompt uid {uid} carry different cluster ids: one prompt has one cluster.")
    return mapping
