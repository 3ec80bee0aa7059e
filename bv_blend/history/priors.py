"""Offline priors for the cold start (history_spec 4): a file of each training prompt's scores under the initial policy.

The file is JSON, ``{prompt key: [score, ...]}``, one list of scores in [0, 1] per prompt (N samples each; SPO's
recipe uses N = 8). ``scripts/offline_priors.py`` writes it from verl's own validation-only generation over the
training prompts. SPO takes it as its prior (``algorithm.spo.offline_values``), BV-Blend as the start of its prompt
and cluster moments (``algorithm.bv_blend.prior_file``). A malformed file is a clear error before any worker starts.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np


def load_priors(path: str | Path, option: str) -> dict[str, np.ndarray]:
    """The prior file at ``path``: prompt key -> float64 scores; ``option`` names the setting in errors.

    Raises:
        ValueError: the file is missing, not JSON, not a mapping of keys to non-empty lists of numbers in [0, 1].
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{option}={path} does not exist. Write it with scripts/offline_priors.py, or unset {option}.")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{option}={path} is not a JSON file of prompt scores ({error}).") from error
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{option}={path} must be a non-empty JSON object {{prompt key: [score, ...]}}.")
    priors = {}
    for key, scores in data.items():
        if not isinstance(scores, list) or not scores or not all(_is_score(s) for s in scores):
            raise ValueError(
                f"{option}={path}: prompt {key!r} holds {scores!r:.80}; each prompt needs a non-empty list of scores "
                "in [0, 1] (0/1 from a verifier)."
            )
        priors[key] = np.asarray(scores, dtype=np.float64)
    return priors


def priors_hash(priors: Mapping[str, np.ndarray]) -> str:
    """A content hash of a prior file's values, saved with a state so that a resume uses the same priors."""
    digest = hashlib.blake2b(digest_size=16)
    for key in sorted(priors):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(priors[key], dtype=np.float64).tobytes())
    return digest.hexdigest()


def unmatched(priors: Mapping[str, np.ndarray], training_keys: Iterable[str]) -> int:
    """How many of the file's prompts no training row has (counted and reported, not an error)."""
    return len(set(priors) - set(training_keys))


def write_priors(path: str | Path, scores: Mapping[str, list[float]]) -> None:
    """Write a prior file (atomically: a half-written file is never left under the final name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({key: [float(s) for s in values] for key, values in scores.items()}, sort_keys=True))
    tmp.replace(path)


def _is_score(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1


__all__ = ["load_priors", "priors_hash", "unmatched", "write_priors"]
