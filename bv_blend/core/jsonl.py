"""JSON Lines as verl writes them: one record per ``\\n``, and only there.

verl's rollout and validation dumps are written with ``ensure_ascii=False``, so a model's output keeps its characters
as they are. ``str.splitlines()`` also breaks at U+2028, U+2029, U+0085 and the ASCII separators, which a model emits
(SmolLM2 did, in a validation dump of the pretrained-LM comparison) and which JSON allows unescaped inside a string:
split there, one record becomes two broken ones. Every JSONL reader in the package and its instruments goes through
:func:`jsonl_lines`, or :func:`jsonl_records` where every line must parse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def jsonl_lines(path: str | Path) -> list[str]:
    """The lines of a JSON Lines file, split at ``\\n`` only (a ``\\r`` left at an end is JSON whitespace)."""
    return Path(path).read_text(encoding="utf-8").split("\n")


def jsonl_records(path: str | Path) -> list[Any]:
    """Every non-blank line of a JSON Lines file, parsed; json.JSONDecodeError for a line that does not parse."""
    return [json.loads(line) for line in jsonl_lines(path) if line.strip()]
