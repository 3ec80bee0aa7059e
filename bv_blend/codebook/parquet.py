"""Read a local parquet file, or fail with an error that names the file and the fix (shared by the data loaders)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def read_parquet(
    path: str | os.PathLike,
    required_columns: Sequence[str],
    *,
    what: str,
    hint: str,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The table in ``path`` (only ``columns`` if given), after checking that it has ``required_columns``.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: it is not parquet, or lacks a required column; the message says which, and ``hint``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"parquet file {path} does not exist")
    try:  # a missing column raises a plain ValueError, which passes through (ArrowInvalid is its subclass)
        schema = pq.read_schema(path)
        missing = [name for name in required_columns if name not in schema.names]
        if missing:
            raise ValueError(f"{path} lacks {what} columns {missing} (it has {schema.names}); {hint}")
        return pq.read_table(path, columns=None if columns is None else list(columns))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{path} is not a readable parquet file: {exc}") from exc
