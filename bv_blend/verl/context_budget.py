"""Refuse a prompt-plus-response budget that the model's context cannot hold, before any worker starts.

verl 0.9.1 caps generation silently: with ``rollout.max_model_len`` unset it takes the model's
``max_position_embeddings`` (``workers/rollout/vllm_rollout/vllm_async_server.py:1104``), and each request then
gets ``max_tokens = min(response_length, max_model_len - len(prompt_ids))`` (lines 593-617) without a word. With
Qwen2.5-Math-7B (4,096 tokens) and ``data.max_response_length=8192`` every response stops at 4,096 minus its
prompt, and ``response_length/clip_ratio`` does not even count it as clipped. verl raises only when
``rollout.max_model_len`` is set above the context, and only once the rollout server starts.

The model's context is read the way verl reads it (``workers/rollout/utils.py:get_max_position_embeddings``):
``max_position_embeddings`` of ``config.json``, or of its ``text_config``.

Where it runs (docs/paper_recipe.md, "The context check"):
- ``bv_blend.paper.launch`` (``scripts/train.py``, ``scripts/run_paper.py``): every paper config, before anything
  is started;
- the trainer's ``__init__`` hook (``bv_blend/verl/hooks.py``), through :func:`check_run`: every run that uses
  bv_blend (one of its estimators or its loss, or the paper kit's reward). Other runs are left alone, as every hook
  leaves them.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from bv_blend.verl.options import selected_record, uses_ntf

WIDEN_HINT = (
    "use a copy of the model with a longer window (Qwen2.5-Math: `python scripts/widen_context.py --model DIR "
    "--out DIR-16k`, rope theta 40000 and 16384 positions, as the paper's lineage does; docs/paper_recipe.md)"
)
# override_config keys that would change the context or the rotary embedding. verl applies them to the actor's
# config only: vLLM never sees them (verl passes no hf_overrides), and under transformers 5 a flat rope_theta is
# ignored (theta lives in rope_parameters) while a nested rope_parameters breaks verl's update_model_config.
CONTEXT_OVERRIDES = ("max_position_embeddings", "rope_theta", "rope_parameters", "rope_scaling")
OUR_REWARD_PREFIX = "pkg://bv_blend"


class ContextBudgetError(ValueError):
    """The configured lengths do not fit the model's context (or change it by a route that does not work)."""


class ContextBudgetWarning(UserWarning):
    """The check could not run: the model's config.json is not on this machine."""


@dataclass(frozen=True)
class ModelContext:
    """A model's context length and where it was read."""

    tokens: int
    source: str  # "<path>/config.json: max_position_embeddings" (or text_config.max_position_embeddings)


def read_model_context(model: str | Path) -> ModelContext | None:
    """The context of a local model folder, or of a hub id already in the local Hugging Face cache.

    Returns ``None`` when no ``config.json`` is found here (nothing is downloaded).

    Raises:
        ContextBudgetError: the ``config.json`` is not JSON or names no ``max_position_embeddings`` (verl's
            rollout would stop on it too, once the model is loaded).
    """
    config_file = _config_file(str(model))
    if config_file is None:
        return None
    try:
        config = json.loads(Path(config_file).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ContextBudgetError(f"{config_file} is not readable JSON ({exc}); check the model folder.") from exc
    for prefix, node in (("", config), ("text_config.", config.get("text_config"))):
        value = node.get("max_position_embeddings") if isinstance(node, dict) else None
        if value is not None:
            return ModelContext(int(value), f"{config_file}: {prefix}max_position_embeddings")
    raise ContextBudgetError(
        f"{config_file} has no max_position_embeddings (nor text_config.max_position_embeddings), which verl 0.9.1 "
        "needs to size the rollout window; pass a Hugging Face causal LM folder."
    )


def _config_file(model: str) -> str | None:
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path / "config.json") if (path / "config.json").is_file() else None
    try:  # a hub id: only a copy already cached counts (verl downloads it later, on the workers)
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(repo_id=model, filename="config.json")
    except ValueError:  # not a valid repo id (an hdfs:// path, say)
        return None
    return cached if isinstance(cached, str) else None


def check_context_budget(config: Any, model: str | Path | None = None) -> ModelContext | None:
    """Raise unless ``data.max_prompt_length + data.max_response_length`` fits the model's context.

    ``config`` is the full trainer config; ``model`` defaults to ``actor_rollout_ref.model.path``. Also checked:
    ``rollout.max_model_len``, when set, lies between that budget and the context; ``model.override_config``
    does not try to change the context (it cannot: see :data:`CONTEXT_OVERRIDES`).

    Returns the context it checked against, or ``None`` (with a :class:`ContextBudgetWarning`) when the model's
    ``config.json`` is not on this machine (a hub id not yet downloaded, a remote path).

    Raises:
        ContextBudgetError: naming both numbers and the fix.
    """
    model_cfg = config_value(config, "actor_rollout_ref.model")
    model = str(model if model is not None else config_value(model_cfg, "path"))
    _refuse_context_overrides(config_value(model_cfg, "override_config"))
    prompt = int(config_value(config, "data.max_prompt_length"))
    response = int(config_value(config, "data.max_response_length"))
    budget = prompt + response
    max_model_len = config_value(config, "actor_rollout_ref.rollout.max_model_len")
    lengths = f"data.max_prompt_length {prompt} + data.max_response_length {response} = {budget} tokens"

    context = read_model_context(model)
    if context is None:
        consequence = ("verl will cut every response short without a word" if max_model_len is None else
                       f"verl will refuse actor_rollout_ref.rollout.max_model_len {int(max_model_len)} once the "
                       "rollout server starts, after the weights have loaded")
        warnings.warn(
            f"Could not check {lengths} against the context of {model}: its config.json is not on this machine. "
            f"If the model's context is smaller, {consequence}; {WIDEN_HINT} or lower data.max_response_length.",
            ContextBudgetWarning,
            stacklevel=2,
        )
        return None
    if budget > context.tokens:  # the root problem first: the lengths do not fit the model
        raise _over_budget(lengths, model, context.tokens, context.source, prompt)
    if max_model_len is not None:
        if int(max_model_len) > context.tokens:
            raise ContextBudgetError(
                f"actor_rollout_ref.rollout.max_model_len {int(max_model_len)} exceeds the {context.tokens}-token "
                f"context of {model} ({context.source}); verl would refuse it once the rollout server starts. Set "
                f"it to at most {context.tokens} (or null: the model's context)."
            )
        if budget > int(max_model_len):
            raise _over_budget(lengths, model, int(max_model_len), "actor_rollout_ref.rollout.max_model_len", prompt)
    return context


def _over_budget(lengths: str, model: str, window: int, what: str, prompt: int) -> ContextBudgetError:
    return ContextBudgetError(
        f"{lengths} exceed the {window}-token window of {model} ({what}). verl would cut every response at "
        f"{window} minus its prompt's tokens without a word, and count none of them as clipped. Either "
        f"{WIDEN_HINT}, or set data.max_response_length <= {window - prompt}."
    )


def _refuse_context_overrides(override_config: Any) -> None:
    if not override_config:
        return
    nested = config_value(override_config, "model_config")  # verl applies this entry instead, when present
    applied = nested if nested is not None else override_config
    found = [key for key in CONTEXT_OVERRIDES if config_value(applied, key) is not None]
    if found:
        raise ContextBudgetError(
            f"actor_rollout_ref.model.override_config sets {', '.join(found)}: verl 0.9.1 applies it to the actor "
            "only (vLLM never sees it), and transformers 5 ignores a flat rope_theta, so training and rollout "
            f"would disagree about positions. Remove it and {WIDEN_HINT}."
        )


def config_value(node: Any, dotted: str) -> Any:
    """``node.a.b`` for ``dotted="a.b"`` on dicts and DictConfigs (struct mode included); ``None`` when absent."""
    for key in dotted.split("."):
        if node is None:
            return None
        node = node.get(key) if isinstance(node, (Mapping, DictConfig)) else getattr(node, key, None)
    return node


def uses_our_code(config: Any) -> bool:
    """A run that uses bv_blend beyond having it installed: one of its estimators or its loss, or the paper kit's
    reward."""
    reward_path = config_value(config, "reward.custom_reward_function.path")
    ours = selected_record(config) is not None or uses_ntf(config)
    return ours or str(reward_path or "").startswith(OUR_REWARD_PREFIX)


def check_run(config: Any) -> ModelContext | None:
    """The trainer hook's entry: :func:`check_context_budget` for runs that use bv_blend, nothing for others."""
    if not uses_our_code(config):
        return None
    return check_context_budget(config)
