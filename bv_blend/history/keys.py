"""The prompt key (history_spec 1): the same for the same prompt in every epoch, on every rank and after a resume, and
different for different prompts.

By default it is a stable hash of the prompt's text: the dataset's raw prompt, or the last user message of a chat
prompt, stripped of surrounding whitespace, as SPO's recipe does (``raw_prompt[0]["content"].strip()``). It never
depends on Python's per-process hash seed: ``hashlib`` digests are the same in every process. With a field name, the
key is ``str(extra_info[field])`` instead (``index``, which verl's example preprocessors write, is the usual one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bv_blend.core.rows import Rows, per_group

# 16 bytes of BLAKE2b: collisions are out of reach for any training set (2^64 prompts for a 50% chance).
DIGEST_BYTES = 16


class MissingPromptKeyError(ValueError):
    """A row reached a per-prompt history without a prompt key."""


def prompt_text(prompt: Any) -> str:
    """The text a prompt's key hashes: a string as it is, or the last user message of a chat prompt; stripped.

    Raises:
        MissingPromptKeyError: the prompt has no text (``None``, an empty chat, a chat without a user message).
    """
    if hasattr(prompt, "tolist") and not isinstance(prompt, str):  # numpy arrays of messages, as verl batches hold
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, Sequence) and prompt:
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if not users:
            raise MissingPromptKeyError(f"A chat prompt without a user message has no prompt key: {prompt!r:.200}.")
        content = users[-1].get("content")
        text = content if isinstance(content, str) else _content_text(content)
    else:
        raise MissingPromptKeyError(f"A row's prompt {prompt!r:.200} has no text to key its history by.")
    return text.strip()


def _content_text(content: Any) -> str:
    """Multi-part content (``[{"type": "text", "text": ...}, ...]``): its text parts, joined."""
    if isinstance(content, Sequence):
        parts = [p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        if parts:
            return "\n".join(parts)
    raise MissingPromptKeyError(f"A user message's content {content!r:.200} has no text to key its history by.")


def text_key(text: str) -> str:
    """The stable key of a prompt text (hex BLAKE2b digest)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=DIGEST_BYTES).hexdigest()


def prompt_key(prompt: Any = None, extra_info: Mapping[str, Any] | None = None, field: str | None = None) -> str:
    """One row's prompt key: ``str(extra_info[field])`` when ``field`` is given, else the hash of its prompt's text.

    Raises:
        MissingPromptKeyError: the field is absent from the row's ``extra_info``, or the prompt has no text.
    """
    if field is not None:
        value = extra_info.get(field) if isinstance(extra_info, Mapping) else None
        if value is None:
            raise MissingPromptKeyError(
                f"A row has no extra_info[{field!r}] to key its prompt history by (prompt_key_field={field}). "
                "Write the field into every training row, or leave prompt_key_field unset to key by the prompt's text."
            )
        return str(value)
    return text_key(prompt_text(prompt))


def group_prompt_keys(rows: Rows, keys: Sequence[str] | np.ndarray, owner: str) -> np.ndarray:
    """(G,) each group's prompt key; every valid row needs one, and the rows of one group share it.

    Raises:
        MissingPromptKeyError: a valid row without a key (``None`` or ``""``).
        ValueError: the rows of one group carry different keys.
    """
    keys = np.asarray(keys, dtype=object)
    if keys.ndim != 1:
        raise ValueError(f"prompt_keys must be 1-D (one key per row), got shape {keys.shape}.")
    has_key = np.fromiter((isinstance(k, str) and k != "" for k in keys), dtype=bool, count=len(keys))
    missing = np.flatnonzero(rows.valid & ~has_key)
    if missing.size:
        raise MissingPromptKeyError(
            f"Rows {missing[:5].tolist()} have no prompt key (got {keys[missing[0]]!r}): {owner} keeps a history per "
            "prompt, so every valid row needs its prompt's key (history_spec 1)."
        )
    return per_group(rows, keys, "", "prompt keys")


__all__ = ["DIGEST_BYTES", "MissingPromptKeyError", "group_prompt_keys", "prompt_key", "prompt_text", "text_key"]
