"""Every JSON file the instruments commit is strict JSON: Python's ``json`` writes NaN and Infinity, which no other
JSON reader accepts. A figure that is not finite (a signal ratio with no group, a curve that never reaches its
target) is written as null; readers that need the float back say what null means there (``finite_or``)."""

from __future__ import annotations

import json
import math
from typing import Any


def strict(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None, through dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value


def strict_dumps(value: Any, indent: int | None = 1) -> str:
    """JSON text of ``value`` that any reader accepts (``allow_nan=False`` proves it)."""
    return json.dumps(strict(value), indent=indent, allow_nan=False)


def finite_or(value: float | None, missing: float) -> float:
    """A strict file's figure back as a float: null reads as ``missing`` (math.inf for a target never reached)."""
    return missing if value is None else float(value)


__all__ = ["finite_or", "strict", "strict_dumps"]
