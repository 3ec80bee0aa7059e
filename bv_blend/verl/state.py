"""The histories of our stateful estimators in verl checkpoints: one file per estimator in ``global_step_N/``.

| estimator  | file                | what it holds                                        |
|------------|---------------------|------------------------------------------------------|
| ``bv_blend`` | ``bv_blend_state.pt`` | the per-cluster moments, K, the codebook hash, options |
| ``ha_dw``    | ``ha_dw_state.pt``    | the anchor history and its options                   |

(``maxnorm_ac`` has no state.) The file is written by the ``_save_checkpoint`` hook *before* verl's own save, so that
whenever verl's tracker ``latest_checkpointed_iteration.txt`` names step N (verl writes it last), our file for N
already exists. It is restored by the ``_load_checkpoint`` hook after verl's own load, from the folder verl
resolves for ``trainer.resume_mode`` (``auto`` / ``resume_path`` / ``disable``), with the same rules. A missing or
mismatched state is an error, unless ``algorithm.<options>.allow_state_reset`` is true.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bv_blend.blend.config import config_mismatch
from bv_blend.verl import runtime
from bv_blend.verl.glue import ha_dw
from bv_blend.verl.overrides import override_value
from bv_blend.verl.versions import installed_version

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


@dataclass(frozen=True)
class EstimatorState:
    """How one stateful estimator's history goes into a checkpoint.

    Attributes:
        label: the estimator's name in messages.
        file: the file in ``global_step_N/``.
        format: the marker that identifies the file.
        section: where its options live (``algorithm.bv_blend``); ``<section>.allow_state_reset`` opts out.
        payload: algorithm config -> what to save (the estimator's state and what a resume must match).
        restore: (algorithm config, payload, path) -> checks everything, then loads; raises ``ValueError``.
        allows_reset: algorithm config -> whether ``allow_state_reset`` is set.
    """

    label: str
    file: str
    format: str
    section: str
    payload: Callable[[Any], dict[str, Any]]
    restore: Callable[[Any, dict[str, Any], str], None]
    allows_reset: Callable[[Any], bool]

    def reset_hint(self) -> str:
        return (
            f"To start the {self.label} history afresh on purpose (the advantages of the next steps then differ "
            f"from an uninterrupted run), set {self.section}.allow_state_reset=true."
        )


# ------------------------------------------------------------------------------------------------ BV-Blend
def _bv_blend_payload(algorithm: Any) -> dict[str, Any]:
    process = runtime.estimator_for(algorithm)
    return {
        "num_clusters": process.num_clusters,
        "codebook_hash": process.codebook_hash,
        "estimator_config": process.estimator_config.to_dict(),
        "estimator": process.estimator.state_dict(),
    }


def _bv_blend_restore(algorithm: Any, payload: dict[str, Any], path: str) -> None:
    process = runtime.estimator_for(algorithm)
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
    process.estimator.load_state_dict(payload["estimator"])


STATEFUL: dict[str, EstimatorState] = {
    "bv_blend": EstimatorState(
        label="BV-Blend",
        file="bv_blend_state.pt",
        format="bv_blend.verl_state",
        section="algorithm.bv_blend",
        payload=_bv_blend_payload,
        restore=_bv_blend_restore,
        allows_reset=lambda algorithm: runtime.estimator_for(algorithm).glue.allow_state_reset,
    ),
    ha_dw.ESTIMATOR_NAME: EstimatorState(
        label="HA-DW",
        file="ha_dw_state.pt",
        format="bv_blend.ha_dw_state",
        section=ha_dw.SECTION,
        payload=ha_dw.state_payload,
        restore=ha_dw.restore_payload,
        allows_reset=ha_dw.allows_state_reset,
    ),
}
STATE_FILE = STATEFUL["bv_blend"].file  # BV-Blend's, the name earlier releases exported


def state_of(config: Any) -> EstimatorState | None:
    """The checkpointed state of the estimator ``config`` selects, or ``None`` when it keeps none."""
    return STATEFUL.get(str(config.algorithm.adv_estimator))


def step_folder(config: Any, global_step: int) -> str:
    """``{trainer.default_local_dir}/global_step_{N}``, exactly the path verl's ``_save_checkpoint`` uses."""
    return os.path.join(config.trainer.default_local_dir, f"global_step_{global_step}")


def save_state(trainer: Any) -> str | None:
    """Write the estimator state of ``trainer``'s run into its current ``global_step_N/``; returns the path
    (``None`` when the selected estimator keeps no state)."""
    kind = state_of(trainer.config)
    if kind is None:
        return None
    folder = step_folder(trainer.config, trainer.global_steps)
    os.makedirs(folder, exist_ok=True)
    payload = {
        "format": kind.format,
        "format_version": FORMAT_VERSION,
        "global_step": int(trainer.global_steps),
        "bv_blend_version": installed_version("bv-blend"),
        "verl_version": installed_version("verl"),
        **kind.payload(trainer.config.algorithm),
    }
    path = os.path.join(folder, kind.file)
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written state under the final name
    logger.info("%s state of step %d saved to %s", kind.label, trainer.global_steps, path)
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
    """Load the estimator state of the checkpoint verl just resumed from; returns the file read (or ``None``).

    Raises:
        FileNotFoundError: the checkpoint has no state of this estimator (unless ``allow_state_reset``).
        ValueError: the state was made with other options (or K, codebook) (unless ``allow_state_reset``).
        RuntimeError: verl resumed from another step than the folder resolved here.
    """
    kind = state_of(trainer.config)
    folder = resume_folder(trainer.config) if kind is not None else None
    if folder is None:
        return None
    step = int(folder.rstrip("/").split("global_step_")[-1])
    if step != trainer.global_steps:
        raise RuntimeError(
            f"bv_blend resolved the resume folder {folder} (step {step}) but verl resumed at step "
            f"{trainer.global_steps}: this verl version resolves checkpoints differently; please report it."
        )
    algorithm = trainer.config.algorithm
    path = os.path.join(folder, kind.file)
    try:
        kind.restore(algorithm, _read(path, kind), path)
    except (FileNotFoundError, ValueError) as exc:
        if not kind.allows_reset(algorithm):
            raise type(exc)(f"{exc} {kind.reset_hint()}") from exc
        logger.warning("%s history starts afresh (allow_state_reset=true): %s", kind.label, exc)
        return None
    logger.info("%s state of step %d restored from %s", kind.label, step, path)
    return path


def _read(path: str, kind: EstimatorState) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"verl resumes from {os.path.dirname(path)} but it has no {kind.label} state {kind.file}: the "
            "checkpoint was written without bv_blend's hooks (another estimator, or bv_blend not installed). "
            "Resume from a checkpoint of a run of this estimator "
            "(trainer.resume_mode=resume_path trainer.resume_from_path=...)."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt files; all mean "unreadable"
        raise ValueError(f"{path} is not a readable {kind.label} state ({exc}).") from exc
    if not isinstance(payload, dict) or payload.get("format") != kind.format:
        raise ValueError(f"{path} is not a {kind.label} state file (format marker {kind.format!r} missing).")
    if payload.get("format_version") != FORMAT_VERSION:
        found = payload.get("format_version")
        raise ValueError(f"{path} has state format {found}; this bv_blend reads {FORMAT_VERSION}.")
    return payload


def _absolute(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
