"""Seeded random permutation of multiple-choice options, against position bias, with the gold letter remapped."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def option_letter(index: int) -> str:
    return chr(ord("A") + index)


def permute_options(
    options: Sequence[str], gold_index: int, seed: int, key: str
) -> tuple[list[str], int, list[int]]:
    """Shuffle ``options`` with a generator seeded by ``(seed, key)`` and return where the gold one went.

    ``key`` (the problem id) makes each problem's order independent of the others and of the file's row
    order, so the same seed gives the same permutation for a problem whatever else is evaluated.

    Returns:
        (shuffled options, new gold index, order) with ``shuffled[i] == options[order[i]]``.
    """
    if not 0 <= gold_index < len(options):
        raise ValueError(f"gold_index {gold_index} is outside the {len(options)} options of problem {key!r}.")
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    order = [int(i) for i in rng.permutation(len(options))]
    return [options[i] for i in order], order.index(gold_index), order
