"""Hydra command-line overrides for verl's trainer, written from Python values (no verl import).

One rule for every launcher (the paper's ``scripts/train.py``, the CPU launcher): a string stays bare when
hydra's override grammar reads it back as that same string, and is single-quoted (with hydra's escapes)
otherwise; booleans, ``None``, numbers, lists and mappings take hydra's own spelling.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

# Bare strings: start like a name or a path, then name/path characters only. "1e-3", "true", "null", "a b",
# "x:y" or "${...}" would read back as something else (a number, a bool, null, two values, an interpolation).
_BARE = re.compile(r"[A-Za-z_/.][\w./+-]*")
_NOT_STRINGS = {"true", "false", "null", "nan", "inf"}


def override_value(value: Any) -> str:
    """``value`` as the right-hand side of a hydra override (``key=<this>``), read back by hydra as ``value``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else {"inf": "inf", "-inf": "-inf"}.get(repr(value), "nan")
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{override_value(str(k))}:{override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ",".join(override_value(item) for item in value) + "]"
    return quote(str(value))


def quote(text: str) -> str:
    """A string for an override: bare when hydra reads it back unchanged, else single-quoted.

    Inside quotes hydra unescapes only backslashes that precede a quote: those (and the quote) are escaped.
    """
    if _BARE.fullmatch(text) and text.lower() not in _NOT_STRINGS:
        return text
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)  # they precede the closing quote
    return f"'{escaped}'"


def dotted_leaves(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}`` for every leaf of a nested mapping (a dict or an OmegaConf ``DictConfig``)."""
    leaves: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            leaves.update(dotted_leaves(value, name))
        else:
            leaves[name] = value
    return leaves


def config_overrides(node: Mapping[str, Any], prefix: str = "++") -> list[str]:
    """Every leaf of ``node`` as an override, ``++key=value`` by default (add or replace)."""
    return [f"{prefix}{key}={override_value(value)}" for key, value in dotted_leaves(node).items()]


__all__ = ["config_overrides", "dotted_leaves", "override_value", "quote"]
