"""The estimator's history in verl checkpoints: ``global_step_N/bv_blend_state.pt``.

Written by the ``_save_checkpoint`` hook *before* verl's own save, so that whenever verl's tracker
``latest_checkpointed_iteration.txt`` names step N (verl writes it last), our file for N already exists.
Restored by the ``_load_checkpoint`` hook after verl's own load, from the folder verl resolves for
``trainer.resume_mode`` (``auto`` / ``resume_path`` / ``disable``), with the same rules.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from bv_blend.config import config_mismatch
from bv_blend.verl import runtime
from bv_blend.verl.overrides import override_value
from bv_blend.verl.versions import installed_version

logger = logging.getLogger(__name__)

STATE_FILE = "bv_blend_state.pt"
FORMAT = "bv_blend.verl_state"
FORMAT_VERSION = 1
RESET_HINT = (
    "To start the BV-Blend history afresh on purpose (the advantages of the next steps then differ from an "
    "uninterrupted run), set algorithm.bv_blend.allow_state_reset=true."
)


def step_folder(config: Any, global_step: int) -> str:
    """``{trainer.default_local_dir}/global_step_{N}``, exactly the path verl's ``_save_checkpoint`` uses."""
    return os.path.join(config.trainer.default_local_dir, f"global_step_{global_step}")


def save_state(trainer: Any) -> str:
    """Write the estimator state of ``trainer``'s run into its current ``global_step_N/``; returns the path."""
    process = runtime.estimator_for(trainer.config.algorithm)
    folder = step_folder(trainer.config, trainer.global_steps)
    os.makedirs(folder, exist_ok=True)
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "global_step": int(trainer.global_steps),
        "num_clusters": process.num_clusters,
        "codebook_hash": process.codebook_hash,
        "estimator_config": process.estimator_config.to_dict(),
        "bv_blend_version": installed_version("bv-blend"),
        "verl_version": installed_version("verl"),
        "estimator": process.estimator.state_dict(),
    }
    path = os.path.join(folder, STATE_FILE)
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written state under the final name
    logger.info("BV-Blend state of step %d saved to %s", trainer.global_steps, path)
    return path


def resume_folder(config: Any) -> str | None:
    """The ``global_step_N`` folder verl resumes from, or ``None`` when it starts from scratch.

    Mirrors ``_load_checkpoint`` of verl 0.9.1 (V1 and legacy): relative paths are taken against the cwd.
    """
    # Imported here: this module is loaded by the trainer hooks, where verl's checkpoint utils already are.
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    mode = config.trainer.resume_mode
    if mode == "disable":
        return None
    if mode == "auto":
        return find_latest_ckpt_path(_absolute(config.trainer.default_local_dir))
    if mode == "resume_path":
        return _absolute(config.trainer.resume_from_path)
    raise ValueError(f"Unknown trainer.resume_mode={mode!r}; verl supports auto, resume_path and disable.")


def restore_state(trainer: Any) -> str | None:
    """Load the BV-Blend state of the checkpoint verl just resumed from; returns the file read (or ``None``).

    Raises:
        FileNotFoundError: the checkpoint has no BV-Blend state (unless ``allow_state_reset``).
        ValueError: the state was made with another K, codebook or estimator config (unless ``allow_state_reset``).
        RuntimeError: verl resumed from another step than the folder resolved here.
    """
    folder = resume_folder(trainer.config)
    if folder is None:
        return None
    step = int(folder.rstrip("/").split("global_step_")[-1])
    if step != trainer.global_steps:
        raise RuntimeError(
            f"bv_blend resolved the resume folder {folder} (step {step}) but verl resumed at step "
            f"{trainer.global_steps}: this verl version resolves checkpoints differently; please report it."
        )
    process = runtime.estimator_for(trainer.config.algorithm)
    path = os.path.join(folder, STATE_FILE)
    try:
        payload = _read(path)
        _check_compatible(payload, process, path)
        process.estimator.load_state_dict(payload["estimator"])
    except (FileNotFoundError, ValueError) as exc:
        if not process.glue.allow_state_reset:
            raise type(exc)(f"{exc} {RESET_HINT}") from exc
        logger.warning("BV-Blend history starts afresh (allow_state_reset=true): %s", exc)
        return None
    logger.info("BV-Blend state of step %d restored from %s", step, path)
    return path


def _read(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"verl resumes from {os.path.dirname(path)} but it has no BV-Blend state {STATE_FILE}: the checkpoint "
            "was written without bv_blend's hooks (another estimator, or bv_blend not installed). Resume from a "
            "checkpoint of a bv_blend run (trainer.resume_mode=resume_path trainer.resume_from_path=...)."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt files; all mean "unreadable"
        raise ValueError(f"{path} is not a readable BV-Blend state ({exc}).") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a BV-Blend state file (format marker {FORMAT!r} missing).")
    if payload.get("format_version") != FORMAT_VERSION:
        found = payload.get("format_version")
        raise ValueError(f"{path} has state format {found}; this bv_blend reads {FORMAT_VERSION}.")
    return payload


def _check_compatible(payload: dict[str, Any], process: runtime.ProcessEstimator, path: str) -> None:
    if payload["num_clusters"] != process.num_clusters:
        raise ValueError(
            f"{path} holds a BV-Blend state with K={payload['num_clusters']} clusters, but this run has "
            f"K={process.num_clusters}. Resume with the run's original codebook / algorithm.bv_blend.num_clusters."
        )
    if payload["codebook_hash"] != process.codebook_hash:
        raise ValueError(
            f"{path} was written with codebook hash {payload['codebook_hash']}, but this run's codebook "
            f"({process.glue.codebook_path}) has hash {process.codebook_hash}: cluster ids would mean other "
            "clusters. Resume with the original algorithm.bv_blend.codebook_path."
        )
    mismatch = config_mismatch(
        payload["estimator_config"],
        process.estimator_config.to_dict(),
        lambda name, value: f"algorithm.bv_blend.{name}={override_value(value)}",
    )
    if mismatch:
        raise ValueError(f"{path} was written with {mismatch}.")


def _absolute(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)

