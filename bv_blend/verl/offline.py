"""verl's advantage estimators outside its trainer, called exactly as the trainer calls them (for the lab and tests).

verl's trainer computes advantages in ``verl.trainer.ppo.ray_trainer.compute_advantage`` (the V1 trainer calls the
same function). :func:`compute_advantages` mirrors it for outcome-reward estimators: ``grpo`` gets its own branch
with ``norm_adv_by_std_in_grpo`` passed explicitly (Dr.GRPO is ``grpo`` with it off), every other estimator is
looked up in verl's registry and called with ``token_level_rewards``, ``response_mask``, ``config`` (the
``algorithm`` node) and ``index`` (the uids). Around the call it opens the step's channel with the inputs that the
estimator's record asks for (uid -> cluster), as the trainer hooks do, and returns the metrics the call reported.

Estimators with a process-wide history must start each simulated run afresh: :func:`reset_history` forgets it, and
:func:`start_run` does what verl's trainer start does with the training files (BV-Blend's prior file at a cluster level
pools its prompts by their clusters), with the training prompts given.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from importlib import resources
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

import bv_blend.verl.plugin  # noqa: F401  (registers our estimators when verl's core_algos is imported)
from bv_blend.verl import runtime
from bv_blend.verl.channel import advantage_step
from bv_blend.verl.records import CLUSTER_IDS, PROMPT_KEYS, record_for


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
    """Forget the process-wide history of this estimator (no-op for verl's own estimators)."""
    if record_for(adv_estimator) is not None:
        runtime.reset(adv_estimator)


def start_run(algorithm: DictConfig, prompts: Mapping[str, int | None]) -> None:
    """Start a fresh history of ``algorithm.adv_estimator`` as verl's trainer start does, with the run's training
    prompts given instead of read from ``data.train_files``: prompt key -> cluster id (``None``: none).

    BV-Blend with ``prior_file`` at a cluster level needs it before its first call (the priors of a cluster are its
    training prompts' pooled scores); for the others it reports the prior file's prompts that no training prompt has.
    No-op for verl's own estimators.
    """
    record = record_for(str(algorithm.adv_estimator))
    if record is None:
        return
    runtime.reset(record.name)
    process = runtime.process_for(record.name, algorithm)
    process.options.start(process.estimator, prompts)


def needed_inputs(adv_estimator: str, algorithm: DictConfig | None = None) -> frozenset[str]:
    """The per-batch inputs ``adv_estimator`` (with these options) needs: ``records.CLUSTER_IDS``, ``PROMPT_KEYS``."""
    record = record_for(adv_estimator)
    if record is None:
        return frozenset()
    return record.inputs if algorithm is None else runtime.process_for(record.name, algorithm).options.inputs()


def compute_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    uids: np.ndarray,
    algorithm: DictConfig,
    cluster_ids: np.ndarray | None = None,
    metrics: dict[str, float] | None = None,
    prompt_keys: np.ndarray | None = None,
) -> torch.Tensor:
    """Advantages (B, T) from verl's registered estimator ``algorithm.adv_estimator``, as verl's trainer calls it.

    Args:
        token_level_rewards: (B, T) rewards (an outcome reward sits on the last valid token).
        response_mask: (B, T) mask of valid response tokens.
        uids: (B,) numpy object array of prompt uids (one per prompt and step, as verl makes them).
        algorithm: verl's ``config.algorithm`` node (see :func:`algorithm_config`).
        cluster_ids: (B,) cluster id of each row's prompt; required by estimators that need clusters.
        metrics: if given, receives the metrics the estimator reported in this call.
        prompt_keys: (B,) each row's prompt key (history_spec 1); required by estimators with a prompt history.
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
    # verl passes non_tensor_batch["uid"] as index whenever the batch has one, as it always does
    kwargs = {"token_level_rewards": token_level_rewards, "response_mask": response_mask, "config": algorithm}
    inputs: dict[str, Any] = {}
    needed = needed_inputs(name, algorithm)
    if CLUSTER_IDS in needed:
        if cluster_ids is None:
            raise ValueError(f"adv_estimator={name} needs each row's cluster id: pass cluster_ids (one per row).")
        inputs["cluster_map"] = _per_uid(uids, cluster_ids, "cluster ids")
    if PROMPT_KEYS in needed:
        if prompt_keys is None:
            raise ValueError(f"adv_estimator={name} needs each row's prompt key: pass prompt_keys (one per row).")
        inputs["prompt_keys"] = _per_uid(uids, prompt_keys, "prompt keys")
    with advantage_step(**inputs) as step:
        advantages, _ = estimator(index=uids, **kwargs)
    if metrics is not None:
        metrics.update(step.metrics)
    return advantages
def success_estimates(
    algorithm: DictConfig, prompt_keys: np.ndarray, cluster_ids: np.ndarray | None = None
) -> np.ndarray:
    """Each prompt's estimated success rate p^ by the sampler's rule (history_spec 5), from the history that the
    process's estimator ``algorithm.adv_estimator`` holds (empty before its first call)."""
    from bv_blend.verl.sampler import success_estimates as estimate

    return estimate(algorithm, np.asarray(prompt_keys, dtype=object), cluster_ids)


def _per_uid(uids: np.ndarray, values: np.ndarray, what: str) -> dict[str, Any]:
    if len(uids) != len(values):
        raise ValueError(f"uids ({len(uids)}) and {what} ({len(values)}) need one entry per row each.")
    mapping: dict[str, Any] = {}
    for uid, value in zip(uids.tolist(), np.asarray(values).tolist(), strict=True):
        if mapping.setdefault(str(uid), value) != value:
            raise ValueError(f"Rows of prompt uid {uid} carry different {what}: one prompt has one of each.")
    return mapping
