"""A local copy of a model with a wider context window: the paper lineage's 16k Qwen2.5-Math.

Qwen2.5-Math-7B and -1.5B ship with a 4,096-token context (``max_position_embeddings``, rope theta 10,000). The
recipe the paper follows (LUFFY, arXiv 2504.14945) trains with 8,192-token responses on a copy whose
``config.json`` says rope theta 40,000 and 16,384 positions, with the weights unchanged: LUFFY's scripts train
``Elliott/Qwen2.5-Math-7B-16k-think`` (``exp_scripts/train.sh``), its SFT baseline ``Elliott/Qwen2.5-Math-7B-SFT``
ships that ``config.json`` (``"rope_theta": 40000.0, "max_position_embeddings": 16384, "sliding_window": null``),
and the authors confirm the same two values for the 1.5B (Simplified-Reasoning/LUFFY issue #43). Their "-think"
copy also changed the chat template to open a ``<think>`` block; this conversion does not (our prompt and reward
need no think block; docs/paper_recipe.md).

Why a copy and not ``actor_rollout_ref.model.override_config``: in verl 0.9.1 the override reaches the actor only
(vLLM never sees it), and transformers 5 ignores a flat ``rope_theta`` (theta lives in ``rope_parameters``).
A copy's ``config.json`` is read the same way by the actor, vLLM, verl's checkpoint merger and our evaluation.

Nothing is downloaded: the source is a local folder. Every file but the edited ones is symlinked (or copied).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LINEAGE_ROPE_THETA = 40000.0
LINEAGE_MAX_POSITIONS = 16384
CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass(frozen=True)
class WidenedModel:
    """What :func:`widen_context` wrote: the folder, each changed value ``{file: {key: (old, new)}}``, and how
    the other files got there."""

    out_dir: Path
    changes: dict[str, dict[str, tuple[Any, Any]]]
    linked: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)


def widened_config(
    config: dict[str, Any], rope_theta: float, max_position_embeddings: int
) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """The edited ``config.json`` and its changes. Theta is written where this config keeps it: the top-level
    ``rope_theta`` (transformers 4 files) and/or ``rope_parameters.rope_theta`` (files saved by transformers 5).

    Raises:
        ValueError: the config already scales its rotary embedding, uses a sliding window, has no
            ``max_position_embeddings``, or the new window would be narrower.
    """
    old_positions = config.get("max_position_embeddings")
    if not isinstance(old_positions, int):
        raise ValueError(f"{CONFIG} has no integer max_position_embeddings ({old_positions!r}): not a model this "
                         "conversion knows (it is meant for Qwen2.5-Math's Qwen2 config).")
    if max_position_embeddings < old_positions:
        raise ValueError(f"--max-position-embeddings {max_position_embeddings} is narrower than the model's "
                         f"{old_positions}; this conversion only widens.")
    parameters = config.get("rope_parameters")
    scaling = config.get("rope_scaling") or (
        parameters if isinstance(parameters, dict) and parameters.get("rope_type", "default") != "default" else None)
    if scaling:
        raise ValueError(f"{CONFIG} already scales its rotary embedding ({scaling}); setting theta on top of that is "
                         "not the lineage's conversion. Use the model's own long-context settings instead.")
    if config.get("use_sliding_window"):
        raise ValueError(f"{CONFIG} enables sliding-window attention (sliding_window={config.get('sliding_window')})"
                         "; widening the positions alone would not widen what a token sees.")

    new = dict(config)
    changes: dict[str, tuple[Any, Any]] = {}

    def put(key: str, value: Any) -> None:
        if new.get(key) != value:
            changes[key] = (new.get(key), value)
        new[key] = value

    if isinstance(parameters, dict):
        new_parameters = {**parameters, "rope_theta": float(rope_theta)}
        if new_parameters != parameters:
            changes["rope_parameters.rope_theta"] = (parameters.get("rope_theta"), float(rope_theta))
        new["rope_parameters"] = new_parameters
    if "rope_theta" in config or not isinstance(parameters, dict):
        put("rope_theta", float(rope_theta))
    put("max_position_embeddings", int(max_position_embeddings))
    if config.get("sliding_window") is not None:
        # Inert while use_sliding_window is false (transformers drops it); null as in the lineage's config, so
        # that no runtime reading the raw value limits attention to the old 4k window.
        put("sliding_window", None)
    return new, changes


def widen_context(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    rope_theta: float = LINEAGE_ROPE_THETA,
    max_position_embeddings: int = LINEAGE_MAX_POSITIONS,
    copy: bool = False,
) -> WidenedModel:
    """Write ``out_dir``: ``model_dir`` with the widened ``config.json`` and every other file symlinked (absolute
    links to the resolved source) or, with ``copy=True``, copied. A ``tokenizer_config.json`` whose
    ``model_max_length`` is below the new window is rewritten too (vLLM caps its window at that value).

    Raises:
        FileNotFoundError: ``model_dir`` is not a folder with a ``config.json``.
        FileExistsError: ``out_dir`` exists and is not empty (nothing is overwritten).
        ValueError: see :func:`widened_config`; or ``out_dir`` is ``model_dir``.
    """
    source = Path(model_dir).expanduser().resolve()
    target = Path(out_dir).expanduser().absolute()
    if not (source / CONFIG).is_file():
        raise FileNotFoundError(f"--model {source} has no {CONFIG}; pass a local Hugging Face model folder.")
    if target.resolve() == source:
        raise ValueError("--out must be a new folder, not the model folder itself (the original stays as it is).")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"--out {target} exists and is not empty; choose a new folder (nothing is overwritten).")

    config, changes = widened_config(json.loads((source / CONFIG).read_text()), rope_theta, max_position_embeddings)
    edited: dict[str, tuple[dict[str, Any], dict[str, tuple[Any, Any]]]] = {CONFIG: (config, changes)}
    tokenizer_file = source / TOKENIZER_CONFIG
    if tokenizer_file.is_file():
        tokenizer = json.loads(tokenizer_file.read_text())
        limit = tokenizer.get("model_max_length")
        if isinstance(limit, (int, float)) and limit < max_position_embeddings:
            edited[TOKENIZER_CONFIG] = (
                {**tokenizer, "model_max_length": int(max_position_embeddings)},
                {"model_max_length": (limit, int(max_position_embeddings))},
            )

    target.mkdir(parents=True, exist_ok=True)
    result = WidenedModel(target, {name: change for name, (_, change) in edited.items()})
    for name, (content, _) in edited.items():
        (target / name).write_text(json.dumps(content, indent=2) + "\n")
    for entry in sorted(source.iterdir()):
        if entry.name in edited:
            continue
        if copy:
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, target / entry.name)
            result.copied.append(entry.name)
        else:
            (target / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
            result.linked.append(entry.name)
    return result
