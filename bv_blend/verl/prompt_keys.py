"""uid -> prompt key for one batch (history_spec 1), read from each row's prompt (or ``extra_info[field]``).

Both trainers carry the dataset row along with every rollout: ``raw_prompt`` (the prompt's chat messages) and
``extra_info``, on the legacy ``DataProto`` and in V1's TransferQueue. The key is computed once per prompt uid, and
matched to rows by uid as the cluster ids are (``clusters.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from bv_blend.core.rows import is_padding_uid, per_row_from_uids
from bv_blend.history.keys import MissingPromptKeyError, prompt_key

# The row fields a prompt key is read from: the dataset row's messages (or its prompt column), and extra_info.
PROMPT_FIELDS = ("raw_prompt", "prompt", "extra_info")


def build_prompt_keys(columns: Mapping[str, Sequence[Any] | None], key_field: str | None) -> dict[str, str]:
    """uid -> prompt key for the non-padding rows of a batch, from its per-row ``columns`` (``uid`` and
    :data:`PROMPT_FIELDS`)."""
    uids = columns["uid"]
    prompts = columns.get("raw_prompt")
    if prompts is None:
        prompts = columns.get("prompt")
    infos = columns.get("extra_info")
    padding = is_padding_uid(uids).tolist()
    keys: dict[str, str] = {}
    for row, uid in enumerate(uids):
        uid = str(uid)
        if padding[row] or uid in keys:
            continue
        prompt = prompts[row] if prompts is not None else None
        info = infos[row] if infos is not None else None
        keys[uid] = prompt_key(prompt, info, key_field)
    return keys


def prompt_keys_for_rows(
    index: Sequence[Any] | None, response_mask: torch.Tensor, mapping: Mapping[str, str] | None, owner: str
) -> np.ndarray:
    """Per-row prompt keys for the estimator: the uid's key, ``""`` for padding rows (pad uid or empty mask)."""
    if index is None:
        raise ValueError(f"{owner} needs each row's prompt uid (verl passes it as `index`, non_tensor_batch['uid']).")
    keys, unknown = per_row_from_uids(index, response_mask, mapping, fill="", dtype=object)
    if unknown:
        raise MissingPromptKeyError(
            f"{owner} has no prompt key for {len(set(unknown))} prompt uid(s) (e.g. {unknown[0]}). The bv_blend "
            "trainer hooks read each prompt's key from its raw_prompt before verl calls the estimator; "
            + (
                "they did not run for this call (run `bv-blend doctor`). When calling verl's "
                "compute_advantage yourself, wrap it in bv_blend.verl.channel.advantage_step(prompt_keys=...)."
                if mapping is None
                else "these uids were not in the batch they read."
            )
        )
    return keys


__all__ = ["PROMPT_FIELDS", "build_prompt_keys", "prompt_keys_for_rows"]
