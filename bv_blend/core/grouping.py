"""Turn group ids as verl passes them (uuid strings in a numpy object array) or as tests pass them (ints)
into contiguous integer codes, and spot verl's padding rows by their uid.

Ids are factorised with ``pandas.factorize`` (a hash table) rather than sorted with ``np.unique`` as verl's
``grpo_vectorized`` does: on big batches it is the largest single cost of a call (docs/estimator.md, "Speed").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from bv_blend.core.host import any_true

# verl's V1 trainer names the uid of each synthetic padding row f"pad{uuid4().hex}"
# (verl/trainer/ppo/padding_utils.py, upsample_batch_to_divisible_size).
PADDING_UID_PREFIX = "pad"

GroupIds = np.ndarray | torch.Tensor | Sequence[Any]


def factorize_groups(group_ids: GroupIds) -> tuple[np.ndarray, int, np.ndarray | None]:
    """Map group ids to codes 0..G-1 (in order of first appearance) and flag padding uids.

    Returns:
        codes: (B,) int64 array.
        num_groups: G.
        padding: (B,) bool array of rows whose uid starts with "pad", or None when no uid does (or ids are
            integers).
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dtype.is_floating_point or group_ids.dtype.is_complex or group_ids.dim() != 1:
            raise TypeError(
                f"group_ids as a tensor must be 1-D integers, got dtype {group_ids.dtype} and shape "
                f"{tuple(group_ids.shape)}. Pass uid strings as a numpy object array instead."
            )
        group_ids = group_ids.detach().cpu().numpy()

    ids = np.asarray(group_ids) if not isinstance(group_ids, np.ndarray) else group_ids
    if ids.ndim != 1:
        raise ValueError(f"group_ids must be 1-D (one id per row), got shape {ids.shape}.")
    if ids.dtype.kind in "fc":
        raise TypeError("group_ids must be strings or integers, got floats. Pass verl's uid array as it is.")
    codes, uniques = pd.factorize(ids, sort=False)
    if any_true(codes < 0):  # pandas codes a missing id as -1
        row = int(np.flatnonzero(codes < 0)[0])
        raise ValueError(
            f"group_ids must not be missing: row {row} holds {ids[row]!r}. Give every row its prompt's uid."
        )
    codes = codes.astype(np.int64, copy=False)
    if ids.dtype.kind in "iub":
        return codes, len(uniques), None
    # Test the G unique ids, not the B rows: a group has one id however many rows it has.
    padding_unique = is_padding_uid(uniques)
    return codes, len(uniques), padding_unique[codes] if any_true(padding_unique) else None


def is_padding_uid(uids: np.ndarray | Sequence[Any]) -> np.ndarray:
    """(N,) bool: which of ``uids`` name one of verl's synthetic padding rows (``pad<hex>``)."""
    return np.asarray(uids).astype(f"U{len(PADDING_UID_PREFIX)}") == PADDING_UID_PREFIX
