"""A sparse per-prompt table: a few float64 columns for every prompt seen so far, looked up by its key.

SPO's Beta tracker (alpha, beta) and BV-Blend's prompt moments (N, m1, m2) are such tables. A prompt enters the table
at its first visit (or from a prior file) and is never aged between visits: a prompt comes back about once an epoch.

Like the per-cluster moments, a table is changed only by :meth:`PromptTable.commit`, after a call has computed every
new value, so a call that fails changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch


class PromptTable:
    """``columns`` of float64 per prompt key, for the prompts seen so far.

    Args:
        columns: the column names (``("alpha", "beta")``).
        label: the owner's name in error messages (``"SPO"``).
    """

    def __init__(self, columns: Sequence[str], label: str) -> None:
        self.columns = tuple(columns)
        self.label = label
        self.keys: list[str] = []
        self.values = np.zeros((len(self.columns), 0))  # (C, P)
        self._row: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.keys)

    def rows_of(self, keys: Iterable[str]) -> np.ndarray:
        """(n,) int64: each key's row in the table, -1 for a prompt not in it."""
        if not self._row:
            return np.full(len(keys), -1, dtype=np.int64) if hasattr(keys, "__len__") else np.full(0, -1)
        return np.fromiter((self._row.get(key, -1) for key in keys), dtype=np.int64)

    def column(self, name: str, rows: np.ndarray, missing: float | np.ndarray) -> np.ndarray:
        """Column ``name`` at ``rows`` (from :meth:`rows_of`), ``missing`` where a row is -1."""
        values = self.values[self.columns.index(name)]
        return np.where(rows >= 0, values[np.maximum(rows, 0)] if values.size else 0.0, missing)

    def commit(self, keys: Sequence[str], new_values: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Write (C, n) ``new_values`` for ``keys`` (unique): overwrite the prompts in the table, append the others.
        ``rows``: the keys' :meth:`rows_of`, when the caller has them already."""
        rows = self.rows_of(keys) if rows is None else rows.copy()
        fresh = np.flatnonzero(rows < 0)
        if fresh.size:
            start = len(self.keys)
            for offset, position in enumerate(fresh.tolist()):
                self._row[keys[position]] = start + offset
                self.keys.append(keys[position])
            rows[fresh] = np.arange(start, start + fresh.size)
            self.values = np.concatenate((self.values, np.zeros((len(self.columns), fresh.size))), axis=1)
        self.values[:, rows] = new_values

    def state_dict(self) -> dict[str, Any]:
        """Plain values for ``torch.save(..., weights_only=True)``: the keys and one float64 tensor per column."""
        return {"keys": list(self.keys), **{name: torch.from_numpy(self.values[c].copy()) for c, name in
                                            enumerate(self.columns)}}  # fmt: skip

    def validated(self, state: Mapping[str, Any]) -> tuple[list[str], np.ndarray]:
        """Check a saved table without changing anything; return its keys and (C, P) values."""
        keys = state.get("keys")
        if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys) or len(set(keys)) != len(keys):
            raise ValueError(f"{self.label} state 'keys' must be a list of distinct prompt keys; the file is corrupt.")
        values = np.zeros((len(self.columns), len(keys)))
        for c, name in enumerate(self.columns):
            column = state.get(name)
            if not isinstance(column, torch.Tensor) or column.shape != (len(keys),):
                got = tuple(column.shape) if isinstance(column, torch.Tensor) else type(column).__name__
                raise ValueError(f"{self.label} state '{name}' must be a tensor of shape ({len(keys)},), got {got}.")
            values[c] = column.detach().to("cpu", torch.float64).numpy()
        if not np.isfinite(values).all():
            raise ValueError(f"{self.label} state holds NaN or infinite prompt values; the file is corrupt.")
        return keys, values

    def load(self, keys: list[str], values: np.ndarray) -> None:
        """Replace the table by a validated one (from :meth:`validated`)."""
        self.keys, self.values = list(keys), values
        self._row = {key: row for row, key in enumerate(self.keys)}


def group_visits(keys: np.ndarray, sums: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Per distinct key of ``keys`` (one per group), the sums of its groups: one visit per prompt and call.

    Returns the distinct keys in order of first appearance, a (len(sums), n) array of their summed statistics, and
    the position of each of ``keys`` among the distinct ones.
    """
    codes, distinct = pd.factorize(np.asarray(keys, dtype=object), sort=False)
    totals = np.stack([np.bincount(codes, weights=values, minlength=len(distinct)) for values in sums])
    return [str(key) for key in distinct], totals, codes.astype(np.int64, copy=False)


__all__ = ["PromptTable", "group_visits"]
