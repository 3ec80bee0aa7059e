"""The histories of our stateful estimators in verl checkpoints: one file per estimator in ``global_step_N/``.

Each estimator's record names its file (``bv_blend_state.pt``, ``ha_dw_state.pt``, ...; ``records.py``) and its
options class says what the file holds (``GlueOptions.save`` / ``restore``). The file is written by the
``_save_checkpoint`` hook *before* verl's own save, so that whenever verl's tracker
``latest_checkpointed_iteration.txt`` names step N (verl writes it last), our file for N already exists. It is restored
by the ``_load_checkpoint`` hook after verl's own load, from the folder verl resolves for ``trainer.resume_mode``
(``auto`` / ``resume_path`` / ``disable``), with the same rules. A missing or mismatched state is an error, unless
``algorithm.<section>.allow_state_reset`` is true.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from bv_blend.verl import runtime
from bv_blend.verl.options import selected_record
from bv_blend.verl.records import EstimatorRecord
from bv_blend.verl.versions import installed_version

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


def reset_hint(record: EstimatorRecord) -> str:
    return (
        f"To start the {record.label} history afresh on purpose (the advantages of the next steps then differ "
        f"from an uninterrupted run), set {record.option_section}.allow_state_reset=true."
    )


def stateful_record(config: Any) -> EstimatorRecord | None:
    """The record of the estimator ``config`` selects, when it keeps a history; else ``None``."""
    record = selected_record(config)
    return record if record is not None and record.stateful else None


def step_folder(config: Any, global_step: int) -> str:
    """``{trainer.default_local_dir}/global_step_{N}``, exactly the path verl's ``_save_checkpoint`` uses."""
    return os.path.join(config.trainer.default_local_dir, f"global_step_{global_step}")


def save_state(trainer: Any) -> str | None:
    """Write the estimator state of ``trainer``'s run into its current ``global_step_N/``; returns the path
    (``None`` when the selected estimator keeps no state)."""
    record = stateful_record(trainer.config)
    if record is None:
        return None
    folder = step_folder(trainer.config, trainer.global_steps)
    os.makedirs(folder, exist_ok=True)
    process = runtime.process_for(record.name, trainer.config.algorithm)
    payload = {
        "format": record.state_format,
        "format_version": FORMAT_VERSION,
        "global_step": int(trainer.global_steps),
        "bv_blend_version": installed_version("bv-blend"),
        "verl_version": installed_version("verl"),
        **process.options.save(process.estimator),
    }
    path = os.path.join(folder, record.state_file)
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written state under the final name
    logger.info("%s state of step %d saved to %s", record.label, trainer.global_steps, path)
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
    record = stateful_record(trainer.config)
    folder = resume_folder(trainer.config) if record is not None else None
    if folder is None:
        return None
    step = int(folder.rstrip("/").split("global_step_")[-1])
    if step != trainer.global_steps:
        raise RuntimeError(
            f"bv_blend resolved the resume folder {folder} (step {step}) but verl resumed at step "
            f"{trainer.global_steps}: this verl version resolves checkpoints differently; please report it."
        )
    process = runtime.process_for(record.name, trainer.config.algorithm)
    path = os.path.join(folder, record.state_file)
    try:
        process.options.restore(process.estimator, _read(path, record), path)
    except (FileNotFoundError, ValueError) as exc:
        if not process.options.allow_state_reset:
            raise type(exc)(f"{exc} {reset_hint(record)}") from exc
        logger.warning("%s history starts afresh (allow_state_reset=true): %s", record.label, exc)
        return None
    logger.info("%s state of step %d restored from %s", record.label, step, path)
    return path


def _read(path: str, record: EstimatorRecord) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"verl resumes from {os.path.dirname(path)} but it has no {record.label} state {record.state_file}: the "
            "checkpoint was written without bv_blend's hooks (another estimator, or bv_blend not installed). "
            "Resume from a checkpoint of a run of this estimator "
            "(trainer.resume_mode=resume_path trainer.resume_from_path=...)."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt files; all mean "unreadable"
        raise ValueError(f"{path} is not a readable {record.label} state ({exc}).") from exc
    if not isinstance(payload, dict) or payload.get("format") != record.state_format:
        raise ValueError(f"{path} is not a {record.label} state file (format marker {record.state_format!r} missing).")
    if payload.get("format_version") != FORMAT_VERSION:
        found = payload.get("format_version")
        raise ValueError(f"{path} has state format {found}; this bv_blend reads {FORMAT_VERSION}.")
    return payload


def _absolute(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
